"""What the CUDA code paths do, shown on the CPU: event flushing, CUDA-graph-safe action selection,
out-of-memory handling, free memory that counts PyTorch's cache, and forkserver workers.

The GPU itself is exercised by the tests marked ``cuda`` (they skip without one); these check the
decisions those paths rest on, with CUDA faked where a decision asks whether it is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlperf import device as device_mod
from rlperf.config import config_from
from rlperf.dqn import Agent
from rlperf.run import lifecycle
from rlperf.run.lifecycle import train_run
from rlperf.timers import PhaseTimer

SMOKE = ["run.threads=1", "run.device=cpu"]


def test_the_loop_flushes_the_timer_at_every_log_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In CUDA events mode the pending event pairs are resolved in the log phase of every log
    boundary, also in --quiet/--json runs (no dashboard), not when the pending list overflows."""
    flushed_at: list[int] = []

    class CountingTimer(PhaseTimer):
        def flush(self) -> None:
            flushed_at.append(self.steps)
            super().flush()

    monkeypatch.setattr(lifecycle, "PhaseTimer", CountingTimer)
    cfg = config_from("smoke", [*SMOKE, "train.log_every=5"], steps=16 * 23)
    train_run(cfg, out=tmp_path, quiet=True, dashboard=False)
    in_loop = [s for s in flushed_at if s < 23]
    # steps counts finished vector steps; the log phase of vector step k runs while steps == k - 1.
    assert {4, 9, 14, 19, 22} <= set(in_loop)  # every 5th step, and the last one (the stop)


def test_cuda_graph_modes_select_without_inference_mode() -> None:
    """A module compiled with CUDA graphs and first called under inference_mode cannot then be
    trained; with reduce-overhead/max-autotune selection runs under no_grad instead."""
    obs_shape = (11,)
    plain = Agent(config_from("smoke", ["agent.inference=no_grad"]), obs_shape, torch.device("cpu"))
    assert plain._inference is torch.inference_mode
    for mode in ("reduce-overhead", "max-autotune"):
        agent = Agent(config_from("smoke", ["agent.inference=no_grad", f"train.compile={mode}"]), obs_shape,
                      torch.device("cpu"))
        assert agent._inference is torch.no_grad
    slow = Agent(config_from("smoke", ["agent.inference=grad", "train.compile=reduce-overhead"]), obs_shape,
                 torch.device("cpu"))
    with slow._inference():
        assert torch.is_grad_enabled()  # the slow form stays the slow form


def test_out_of_memory_in_the_first_reset_ends_with_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlperf.env.vector import VectorSnake

    def reset(self: Any, **kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")

    monkeypatch.setattr(VectorSnake, "reset", reset)
    result = train_run(config_from("smoke", SMOKE), out=tmp_path, quiet=True, dashboard=False)
    assert result.exit_code == 1 and result.record["status"] == "failed"
    assert "out of memory" in result.record["error"] and "Tried to allocate 12.00 GiB" in result.record["error"]
    assert (result.run_dir / "run.json").is_file()


@pytest.mark.parametrize("message", [
    "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_NOT_ENOUGH_MEMORY",
    "[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory",
])
def test_library_allocation_failures_count_as_out_of_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             message: str) -> None:
    def update(self: Any, buffer: Any) -> Any:
        raise RuntimeError(message)

    monkeypatch.setattr(Agent, "update", update)
    cfg = config_from("smoke", SMOKE, steps=16 * 400)
    result = train_run(cfg, out=tmp_path, quiet=True, dashboard=False)
    assert result.record["status"] == "failed" and result.record["error"].startswith("out of memory")
    assert not device_mod.is_out_of_memory(RuntimeError("a shape mismatch"))


def test_free_cuda_memory_counts_what_the_cache_holds_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10 * gib)
    # 2 GiB free on the device plus 20 GiB cached by PyTorch but not in use: the allocator hands
    # the cached memory out first, so a 15 GiB buffer fits.
    assert device_mod.available_memory(torch.device("cuda")) == 22 * gib
    device_mod.check_fits("x", {"replay": (15 * gib, "buffer.capacity=1")}, torch.device("cuda"), {})
    with pytest.raises(device_mod.MemoryRefused, match="replay"):
        device_mod.check_fits("x", {"replay": (21 * gib, "buffer.capacity=1")}, torch.device("cuda"), {})


def test_gym_async_workers_start_from_a_fork_server_once_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    import gymnasium

    from rlperf.env import backends

    contexts: list[Any] = []

    class FakeAsync:
        def __init__(self, fns: Any, autoreset_mode: Any, context: Any = None) -> None:
            contexts.append(context)
            self.single_observation_space = self.single_action_space = None

    monkeypatch.setattr(gymnasium.vector, "AsyncVectorEnv", FakeAsync)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    backends.GymVectorBackend("gym-async", 2, torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    backends.GymVectorBackend("gym-async", 2, torch.device("cpu"))
    assert contexts == [None, "forkserver"]
