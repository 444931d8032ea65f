"""The Ray Tune sweep backend, on a real local Ray instance (no mocks). Skipped without Ray.

CI installs the ``ray`` extra, so these run there; they start one Ray instance for the module
(``ray.init(num_cpus=2)``), which is what makes them the slowest sweep tests (~20 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlperf.config import config_from
from rlperf.errors import RlperfError
from rlperf.run.files import read_record
from rlperf.experiments.sweep import Axis, run_sweep

ray = pytest.importorskip("ray", reason="Ray is the optional extra 'ray' (pip install 'rlperf[ray]')")
pytest.importorskip("ray.tune")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


def tiny():
    return config_from("smoke", ["train.learning_starts=64", "train.checkpoint=false", "run.threads=1"],
                       steps=256, envs=8, device="cpu")


def test_ray_sweep_runs_trials_and_records_a_failure(local_ray, tmp_path: Path) -> None:
    # Two real trials, plus a third whose buffer cannot fit in memory: its values are valid, and only
    # a node can judge its memory, so it fails inside its Ray worker, where train_run refuses it.
    # One Tune run keeps the test short.
    events = []
    axis = Axis("buffer.capacity", ("5000", "6000", "1000000000000"))
    result = run_sweep(tiny(), [axis], out=tmp_path, backend="ray", trial_cpus=1,
                       on_trial=lambda event, t: events.append((event, t.index)))
    ok1, ok2, bad = result.trials
    assert (ok1.status, ok2.status, bad.status) == ("completed", "completed", "failed")
    assert "buffer.capacity" in (bad.error or "") and "\n" not in bad.error  # one line, the trial's own error
    assert sorted(i for e, i in events if e == "end") == [0, 1, 2]
    data = json.loads((result.sweep_dir / "sweep.json").read_text())
    assert data["backend"] == "ray" and not data["interrupted"]
    for t, row in zip((ok1, ok2), data["trials"][:2], strict=True):
        run_dir = Path(t.run_dir)
        assert run_dir.parent == result.sweep_dir  # the run directory lives under the sweep directory
        record = read_record(run_dir)
        assert record["kind"] == "sweep" and record["config"]["buffer"]["capacity"] == row["buffer.capacity"]
        assert row["env_steps_per_s"] == record["throughput"]["env_steps_per_s"]
    assert data["trials"][2]["status"] == "failed" and data["trials"][2]["env_steps_per_s"] is None
    assert (result.sweep_dir / "sweep.csv").is_file() and (result.sweep_dir / "sweep.png").is_file()


def test_gpu_request_on_cpu_only_cluster_is_refused_up_front(local_ray, tmp_path: Path) -> None:
    if ray.cluster_resources().get("GPU", 0) > 0:
        pytest.skip("this Ray cluster has a GPU")
    with pytest.raises(RlperfError, match="asks for 1 GPU but the Ray cluster has 0"):
        run_sweep(tiny(), [Axis("train.train_ratio", ("1", "2"))], out=tmp_path / "runs", backend="ray", trial_gpus=1)
    assert not (tmp_path / "runs").exists()  # refused before anything was written
