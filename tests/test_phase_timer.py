"""The public :class:`rlperf.PhaseTimer` on loops written by anyone: ``num_envs`` checked, nested
phases timed as self time, threads timed per thread, a CUDA timer refused where there is no CUDA,
and the record's per-interval phase series."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rlperf
from rlperf.errors import ConfigError, DeviceError, RlperfError


def busy(seconds: float) -> None:
    """Spin (not sleep): the time is the thread's own work."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("num_envs", [-1, 0, 1.5, True, 10**30, "8", None])
def test_num_envs_must_be_a_positive_whole_number(num_envs: object, tmp_path: Path) -> None:
    timer = rlperf.PhaseTimer("cpu")
    with timer.phase("step"):
        pass
    timer.step_done()
    with pytest.raises(ConfigError, match="num_envs must be a whole number from 1 to"):
        timer.record(num_envs=num_envs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_envs"):  # a ValueError too, for code that catches those
        timer.save(tmp_path / "runs", num_envs=num_envs)  # type: ignore[arg-type]
    assert not (tmp_path / "runs").exists()  # refused before the run directory was made


def test_num_envs_takes_numpy_integers() -> None:
    timer = rlperf.PhaseTimer("cpu")
    for _ in range(3):
        timer.step_done()
    assert timer.record(num_envs=np.int64(16))["totals"]["env_steps"] == 48


def test_nested_phases_are_self_time_and_add_up_to_the_measured_time_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]  # a clock the test moves: exact figures on a loaded machine
    monkeypatch.setattr("rlperf.external.perf_counter", lambda: clock[0])
    timer = rlperf.PhaseTimer("cpu")
    for _ in range(5):
        with timer.phase("train"):
            clock[0] += 4.0
            with timer.phase("backward"):
                clock[0] += 6.0
            clock[0] += 1.0
        with timer.phase("log"):
            clock[0] += 1.0
        timer.step_done()
    stats = timer.stats()
    assert stats["backward"].total_s == 30.0 and stats["backward"].p50_ms == 6000.0
    assert stats["train"].total_s == 25.0 and stats["train"].calls == 5  # without backward's 30 s
    assert sum(s.total_s for s in stats.values()) == clock[0] == 60.0  # the measured time, once
    assert stats["train"].share == pytest.approx(25 / 60)
    assert timer.nested == {"backward": "train"}
    assert timer.record()["timing"]["nested"] == {"backward": "train"}


def test_two_threads_in_the_same_phase_both_count() -> None:
    timer = rlperf.PhaseTimer("cpu")

    def work() -> None:
        for _ in range(10):
            with timer.phase("rollout"):
                time.sleep(0.02)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    timer.step_done()
    rollout = timer.stats()["rollout"]
    assert rollout.calls == 20
    assert rollout.total_s >= 20 * 0.02 * 0.95  # a shared start time loses about a quarter of it
    assert rollout.p50_ms >= 19


def test_nesting_is_refused_in_cuda_events_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from tests.test_timers import _FakeEvent

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    timer = rlperf.PhaseTimer(torch.device("cuda"))
    assert timer.mode == "events"
    with timer.phase("train"):
        pass
    with timer.phase("train"), pytest.raises(ConfigError, match=r'CUDA events cannot time nested phases.*mode="sync"'):
        with timer.phase("backward"):
            pass


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "auto"])
def test_a_cuda_timer_without_cuda_is_refused_when_made(device: str) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if device == "auto":  # auto picks the CPU here: nothing to refuse
        assert rlperf.PhaseTimer(device).mode == "cpu"
        return
    with pytest.raises(DeviceError, match="CUDA is not available on this machine") as exc:
        rlperf.PhaseTimer(device)
    assert isinstance(exc.value, RlperfError) and isinstance(exc.value, ValueError)
    assert rlperf.PhaseTimer(device, enabled=False).phase("step") is not None  # a disabled timer times nothing


@pytest.mark.parametrize("interval_s", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_interval_s_must_be_a_positive_number(interval_s: object) -> None:
    with pytest.raises(ConfigError, match="interval_s"):
        rlperf.PhaseTimer("cpu", interval_s=interval_s)  # type: ignore[arg-type]


def test_the_record_keeps_per_interval_phase_series(tmp_path: Path) -> None:
    timer = rlperf.PhaseTimer("cpu", warmup_steps=2, interval_s=0.03)
    for i in range(20):
        with timer.phase("step"):
            busy(0.004)
        if i % 2:
            with timer.phase("train"):
                busy(0.002)
        timer.step_done()
    record = json.loads((timer.save(tmp_path, num_envs=8) / "run.json").read_text())
    rows = record["intervals"]
    assert 2 <= len(rows) <= 20
    assert set(rows[0]) == {"env_steps", "wall_s", "episodes", "mean_episode_length", "s_per_1000_env_steps",
                            "phase_s"}
    assert rows[-1]["env_steps"] == 20 * 8 and all(r["env_steps"] % 8 == 0 for r in rows)
    assert [r["env_steps"] for r in rows] == sorted({r["env_steps"] for r in rows})  # cumulative, rising
    assert all(r["episodes"] is None and r["mean_episode_length"] is None for r in rows)
    assert all(r["s_per_1000_env_steps"] > 0 for r in rows)
    # The rows split the whole run: warm-up included, nothing counted twice.
    warm = record["timing"]["warmup_s"]
    phased = sum(p["total_s"] for p in record["phases"].values()) + warm
    assert sum(sum(r["phase_s"].values()) for r in rows) == pytest.approx(phased, rel=1e-9)
    assert sum(r["phase_s"]["train"] for r in rows) >= record["phases"]["train"]["total_s"]
    assert rows[-1]["wall_s"] >= record["totals"]["wall_s"] * 0.9


def test_intervals_past_the_limit_are_merged_evenly() -> None:
    from rlperf.external import MAX_INTERVALS

    timer = rlperf.PhaseTimer("cpu", interval_s=1e-9)  # an interval at every step
    for _ in range(1000):
        with timer.phase("step"):
            pass
        timer.step_done()
    rows = timer.record(num_envs=4)["intervals"]
    assert len(rows) == MAX_INTERVALS and rows[-1]["env_steps"] == 4000
    steps = np.diff([0] + [r["env_steps"] for r in rows])
    assert steps.min() > 0 and steps.max() <= 3 * steps.min()  # evenly spread, each covering whole intervals
    assert sum(r["phase_s"]["step"] for r in rows) == pytest.approx(timer.stats()["step"].total_s, rel=1e-9)


def test_the_interval_limit_is_the_run_records() -> None:
    pytest.importorskip("torch")
    from rlperf.external import MAX_INTERVALS
    from rlperf.run import record

    assert MAX_INTERVALS == record.MAX_INTERVALS


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.cuda
@pytest.mark.skipif(not _has_cuda(), reason="needs CUDA")
def test_on_cuda_sync_mode_nests_events_mode_times_threads_and_a_missing_device_is_refused() -> None:
    import torch

    a = torch.randn(512, 512, device="cuda")
    timer = rlperf.PhaseTimer("cuda", mode="sync")
    for _ in range(5):
        with timer.phase("train"):
            a @ a
            with timer.phase("backward"):
                for _ in range(8):
                    a @ a
        timer.step_done()
    stats = timer.stats()
    assert timer.nested == {"backward": "train"} and stats["backward"].total_s > stats["train"].total_s
    events = rlperf.PhaseTimer("cuda")
    assert events.mode == "events"
    with events.phase("step"):
        a @ a
    events.step_done()
    assert events.stats()["step"].calls == 1
    with pytest.raises(DeviceError, match="CUDA device"):
        rlperf.PhaseTimer(f"cuda:{torch.cuda.device_count()}")
