"""``rlperf profile --verify K -- python SCRIPT``: fixes applied from outside the script, and the
findings they check measured by running the script again alone."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlperf.instruments import fixes
from rlperf.instruments.script_verify import fix_for

ROOT = Path(__file__).resolve().parents[1]


def test_threads_are_capped_for_the_script_s_own_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy  # noqa: F401  (its BLAS pool, loaded before the fix as the script's top-level imports are)
    from threadpoolctl import threadpool_info, threadpool_limits

    before, set_threads = torch.get_num_threads(), torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", set_threads)  # the fix's wrapper is undone after the test
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(variable, raising=False)  # set by the fix (for the processes the script starts), undone
    pools = threadpool_limits(None)  # the pools as they are, restored after the test
    try:
        fixes.apply(["threads=1"])
        torch.set_num_threads(16)
        assert torch.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
        assert os.environ["OMP_NUM_THREADS"] == os.environ["OPENBLAS_NUM_THREADS"] == "1"
    finally:
        set_threads(before)
        pools.restore_original_limits()


def test_gc_off_turns_the_collector_and_the_script_s_collections_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc, "collect", gc.collect)
    monkeypatch.setattr(gc, "enable", gc.enable)
    try:
        fixes.apply(["gc=off"])
        gc.enable()
        assert not gc.isenabled() and gc.collect() == 0
    finally:
        monkeypatch.undo()
        gc.enable()


def test_no_grad_applies_to_the_forwards_called_from_that_line_only(tmp_path: Path) -> None:
    script = tmp_path / "act.py"
    script.write_text(textwrap.dedent("""
        import torch
        net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        x = torch.zeros(1, 3)

        def run():
            acted = net(x)
            learned = net(x)
            return acted.requires_grad, learned.requires_grad
        """))
    code = (f"import runpy, sys; from rlperf.instruments import fixes; fixes.apply(['no_grad={script}:7']); "
            f"ns = runpy.run_path({str(script)!r}); print(ns['run']())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "(False, True)", out.stderr[-2000:]


def test_only_findings_whose_fix_applies_from_outside_get_one() -> None:
    record = {"profile": {"load": {"cpus": 2.0}, "evidence": {"forwards": [
        {"file": "/x/train.py", "line": 9, "backward_reached": 0},
        {"file": "/x/train.py", "line": 20, "backward_reached": 3}]}}}
    assert fix_for({"id": "threads"}, record) == ["threads=2"]
    assert fix_for({"id": "gc_pauses"}, record) == ["gc=off"]
    assert fix_for({"id": "autograd_forward", "where": "train.py:9 (act)"}, record) == ["no_grad=/x/train.py:9"]
    assert fix_for({"id": "autograd_forward", "where": "train.py:20 (learn)"}, record) is None
    assert fix_for({"id": "logging"}, record) is None
    # a script run by a path under the working directory is named by that path, as the finding names it
    inside = str(Path.cwd() / "sub" / "train.py")
    record["profile"]["evidence"]["forwards"].append({"file": inside, "line": 5, "backward_reached": 0})
    assert fix_for({"id": "autograd_forward", "where": f"{Path('sub', 'train.py')}:5 (act)"}, record) == [
        f"no_grad={inside}:5"]


def test_verify_re_runs_the_script_alone_with_the_fix_and_measures_the_saving(tmp_path: Path) -> None:
    script = tmp_path / "churn.py"
    script.write_text(textwrap.dedent("""
        import gc
        keep = [[i] for i in range(200_000)]
        for step in range(150):
            junk = [{"a": [i]} for i in range(2000)]
            gc.collect()  # a full collection every step, over the 200k lists kept
        print("done")
        """))
    proc = subprocess.run([sys.executable, "-m", "rlperf", "profile", "--out", str(tmp_path / "runs"), "--verify", "1",
                           "--", sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines().count("done") == 1  # the verify runs' output is not shown
    (run_json,) = (tmp_path / "runs").glob("*/run.json")
    record = json.loads(run_json.read_text())
    first = record["profile"]["advisor"]["findings"][0]
    assert first["id"] == "gc_pauses", first
    v = first["verified"]
    assert v["repeats"] == 3 and v["applied"] == ["gc=off"], v
    assert v["saving_s"] > 0.5 * v["baseline_s"], v  # nearly all of it was the collections
    assert record["profile"]["verify"]["ran"] == 1
    assert "measured: saved" in proc.stdout
