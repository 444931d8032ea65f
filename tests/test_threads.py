"""The thread policy (rlperf/threads.py): every pool the run's process loads is capped when the run
starts, restored when it ends, and the record lists the pools, why the count was chosen and what the
run's thread lost to other processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlperf import threads
from rlperf.config import config_from
from rlperf.run.files import read_record
from rlperf.run.lifecycle import train_run

# A fresh process: which pools are loaded, and at what size, is process state.
_PROBE = textwrap.dedent("""
    import json, sys, torch, threadpoolctl
    from rlperf.config import config_from
    from rlperf.run.common import prepare, thread_settings_restored

    def pools():
        return {p["filepath"]: p["num_threads"] for p in threadpoolctl.threadpool_info()}

    cfg = config_from("smoke", ["run.device=cpu", *sys.argv[2:]], steps=64)
    before, torch_before = pools(), torch.get_num_threads()
    with thread_settings_restored():
        prepare(cfg)
        during = pools()
        import numba
        numba_during = numba.get_num_threads()
        torch_during = torch.get_num_threads()
    after = pools()
    json.dump({"before": before, "during": during, "after": after, "torch_before": torch_before,
               "torch_during": torch_during, "torch_after": torch.get_num_threads(), "numba_during": numba_during},
              open(sys.argv[1], "w"))
""")


def _probe(tmp_path: Path, *overrides: str) -> dict[str, object]:
    out = tmp_path / "pools.json"
    subprocess.run([sys.executable, "-c", _PROBE, str(out), *overrides], check=True, timeout=300)
    return dict(json.loads(out.read_text()))


@pytest.mark.parametrize("overrides,expected", [((), threads.AUTO_CPU), (("run.threads=2",), 2)])
def test_every_pool_is_capped_when_the_run_starts_and_restored_after(
        tmp_path: Path, overrides: tuple[str, ...], expected: int) -> None:
    seen = _probe(tmp_path, *overrides)
    during, before, after = seen["during"], seen["before"], seen["after"]
    assert isinstance(during, dict) and isinstance(before, dict) and isinstance(after, dict)
    # SciPy's BLAS (the fused update's np.dot) is loaded and capped with the others.
    assert any("scipy_openblas-" in path for path in during), during
    assert set(during.values()) == {expected}, during
    assert seen["torch_during"] == expected and seen["numba_during"] == expected
    assert seen["torch_after"] == seen["torch_before"]
    assert {path: after[path] for path in before} == before  # the pools loaded before the run, as they were


def test_the_record_lists_the_pools_why_and_the_contention(tmp_path: Path) -> None:
    cfg = config_from("smoke", ["run.device=cpu", "train.log_every=100"], steps=640)
    torch_before = torch.get_num_threads()
    result = train_run(cfg, out=tmp_path, quiet=True, dashboard=False)
    assert torch.get_num_threads() == torch_before
    section = read_record(result.run_dir)["threads"]
    assert section["count"] == threads.AUTO_CPU and section["why"].startswith("auto:")
    libraries = {p["library"] for p in section["pools"]}
    assert {"openblas", "torch intra-op", "torch inter-op"} <= libraries
    assert any(name.startswith("numba") for name in libraries)
    assert all(p["threads"] == threads.AUTO_CPU for p in section["pools"] if p["library"] != "torch inter-op")
    contention = section["contention"]
    for key in ("run_queue_wait_s", "wait_share", "involuntary_switches", "involuntary_switches_process",
                "loadavg_1m_start", "loadavg_1m_end", "cpus", "wall_s"):
        assert key in contention
    if sys.platform == "linux":
        assert contention["run_queue_wait_s"] is not None and 0 <= contention["wait_share"] <= 1
        assert contention["involuntary_switches"] is not None and contention["involuntary_switches"] >= 0


def test_auto_chooses_one_thread_on_the_cpu_and_keeps_the_defaults_on_cuda() -> None:
    assert threads.choose(0, torch.device("cpu")) == threads.Policy(threads.AUTO_CPU, threads.WHY_AUTO_CPU)
    assert threads.choose(3, torch.device("cpu")).threads == 3
    assert threads.choose(0, torch.device("cuda")).threads is None
    assert threads.choose(0, "cuda", other_processes=1).threads is not None


def test_restored_undoes_what_apply_capped() -> None:
    torch_before = torch.get_num_threads()
    with threads.restored():
        threads.apply(threads.Policy(1, "test"))
        assert threads.current() is not None and torch.get_num_threads() == 1
    assert threads.current() is None and torch.get_num_threads() == torch_before


def test_the_threads_benchmark_times_the_update_on_the_runs_threads_and_on_one() -> None:
    from rlperf.instruments.microbench import BENCHES, run_benches

    cfg = config_from("smoke", ["run.device=cpu", "run.threads=2"], steps=64)
    record = {"system": {"device": "cpu", "torch_threads": 2}, "threads": {"count": 2}, "update": {"form": "fused"}}
    torch_before = torch.get_num_threads()
    out = run_benches(cfg, torch.device("cpu"), record, tuple(b for b in BENCHES if b.name == "threads"))
    entry = out["threads"]
    assert "error" not in entry and entry["slow_s"] > 0 and entry["fast_s"] > 0
    assert (entry["slow"], entry["fast"]) == ("2 threads per pool", "1 thread per pool")
    assert torch.get_num_threads() == torch_before and threads.current() is None
