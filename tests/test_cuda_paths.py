"""Every knob's CUDA path through the real CLI: AMP, each compile mode and TorchScript, the host
storages and the Gymnasium backends with a CUDA learner, the async learner, checkpoint and resume
(and the refusal to resume across device types), a real CUDA out-of-memory, torch.profiler with CUDA
activities. Each is a small `rlperf` run on the smoke config; all skip without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def rlperf(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlperf", *args], capture_output=True, text=True, timeout=timeout)


def train(out: Path, *sets: str, extra: tuple[str, ...] = ()) -> dict:
    args = ["train", "--config", "smoke", "--device", "cuda", "--out", str(out), *extra]
    for s in sets:
        args += ["--set", s]
    proc = rlperf(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return json.loads(max(out.rglob("run.json"), key=lambda p: p.stat().st_mtime).read_text())


@pytest.mark.parametrize("sets", [
    ("train.amp=fp16",), ("train.amp=bf16",), ("train.compile=default",), ("train.compile=reduce-overhead",),
    ("train.compile=jit",), ("buffer.storage=numpy",), ("buffer.storage=list",), ("env.backend=gym-sync",),
    ("env.backend=gym-async", "env.num_envs=4"), ("train.update=torch", "env.kernel=ops"),
], ids=lambda sets: ",".join(sets))
def test_a_knob_runs_to_completion_on_cuda(tmp_path: Path, sets: tuple[str, ...]) -> None:
    record = train(tmp_path, *sets)
    assert record["status"] == "completed" and record["system"]["device"].startswith("cuda")
    assert record["totals"]["updates"] > 0
    expected = "graph" if not any(s.startswith(("train.amp", "train.compile", "train.update")) for s in sets) else "torch"
    assert record["update"]["form"] == expected, record["update"]


def test_the_async_learner_trains_on_cuda(tmp_path: Path) -> None:
    record = train(tmp_path, "run.mode=async", "async.actors=2", "async.envs_per_actor=8")
    assert record["status"] == "completed" and record["totals"]["updates"] > 0


def test_a_cuda_run_resumes_on_cuda_and_is_refused_on_the_cpu(tmp_path: Path) -> None:
    first = train(tmp_path, "train.steps=1024")
    run_dir = Path(first["run_dir"])
    refused = rlperf("train", "--resume", str(run_dir), "--device", "cpu", "--steps", "2048")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "cuda" in refused.stderr and "--device cuda" in refused.stderr, refused.stderr
    resumed = rlperf("train", "--resume", str(run_dir), "--steps", "2048")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "completed" and record["resumed"]


def test_a_real_cuda_out_of_memory_is_one_line(tmp_path: Path) -> None:
    """The caching allocator capped at a sliver of the GPU (a genuine torch OutOfMemoryError), and a
    run that passes the up-front estimate (which reads the device's free memory) but not the cap."""
    code = ("import sys, torch; torch.cuda.set_per_process_memory_fraction(0.001); "
            "from rlperf.__main__ import main; sys.argv = ['rlperf'] + sys.argv[1:]; main()")
    proc = subprocess.run([sys.executable, "-c", code, "train", "--config", "smoke", "--device", "cuda", "--set",
                           "env.num_envs=1048576", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "memory" in proc.stderr.lower(), proc.stderr[-2000:]


def test_profile_torch_records_cuda_activities_on_cuda(tmp_path: Path) -> None:
    proc = rlperf("profile", "--config", "smoke", "--device", "cuda", "--torch", "--out", str(tmp_path), timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = [p for p in tmp_path.rglob("*") if p.is_file() and "trace" in p.name]
    assert traces, sorted(p.name for p in tmp_path.rglob("*"))
    text = traces[0].read_text(errors="replace") if traces[0].suffix == ".json" else ""
    assert not text or "cuda" in text.lower() or "kernel" in text.lower()
