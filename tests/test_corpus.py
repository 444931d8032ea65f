"""The foreign evaluation corpus (tests/foreign/corpus) is whole: its manifest matches the scripts,
every checklist id has a planted case, and the scripts run both ways. Timings are not checked
here (scripts/bench_advisor.py --calibrate measures them); a few scripts run at a tiny scale."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "foreign" / "corpus"

# The foreign-code checklist: every id needs a planted case; hot_spot (no rule covers it) needs two.
CHECKLIST = {"replay_sampling", "host_copy", "update_ratio", "target_copy", "autograd_forward", "small_batch",
             "device_transfer", "env_reset", "rendering", "reward_shaping", "preprocessing", "gc_pauses", "logging",
             "checkpointing", "busy_wait", "threads"}


def _bench():
    spec = importlib.util.spec_from_file_location("bench_advisor", ROOT / "scripts" / "bench_advisor.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()
CASES = bench.load_manifest()


def test_manifest_covers_the_checklist() -> None:
    expected = [case["expected"] for case in CASES]
    assert CHECKLIST <= set(expected), f"no planted case for {sorted(CHECKLIST - set(expected))}"
    assert set(expected) <= CHECKLIST | {"hot_spot"}
    assert expected.count("hot_spot") >= 2
    assert len(CASES) >= 16
    assert len({case["file"] for case in CASES}) == len(CASES)
    assert len({case["style"] for case in CASES}) == len(CASES), "each script in its own style"


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_script_is_marked_and_takes_the_flags(case: dict) -> None:
    path = CORPUS / case["file"]
    assert path.is_file()
    assert case["description"] and case["style"]
    marks = bench.planted_lines(path)
    assert 1 <= len(marks) <= 3, "one to three '# planted: <id>' lines"
    assert set(marks.values()) == {case["expected"]}
    source = path.read_text()
    # The flags as written, or as dataclass fields that become them (the CleanRL style).
    assert re.search(r"--fixed|\bfixed: bool\b", source) and re.search(r"--scale|\bscale: float\b", source)
    if "import torch" in source and case["expected"] != "threads":
        assert "set_num_threads(1)" in source
    calibration = case.get("calibration")
    if calibration is not None:  # written by bench_advisor.py --calibrate --write
        assert calibration["ratio"] == pytest.approx(calibration["planted_s"] / calibration["fixed_s"], abs=0.01)


def test_no_stray_scripts() -> None:
    listed = {case["file"] for case in CASES}
    assert {p.name for p in CORPUS.glob("*.py")} == listed


@pytest.mark.parametrize("name", ["terrain_reset.py", "particle_physics.py", "phasetimer_logging.py"])
@pytest.mark.parametrize("fixed", [False, True], ids=["planted", "fixed"])
def test_script_runs_both_ways(name: str, fixed: bool) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, name, *bench.script_args(0.02, fixed)], cwd=CORPUS, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()


def test_findings_are_read_wherever_they_sit() -> None:
    found = [{"id": "logging", "where": "x.py:12 (main)", "est_saving_s": 1.0}]
    assert bench.find_findings({"profile": {"advisor": {"findings": found}}}) == found
    assert bench.find_findings({"findings": found, "other": {"findings": []}}) == found
    assert bench.find_findings({"profile": {}}) is None


def test_scoring_reads_rank_line_and_estimate() -> None:
    case = next(c for c in CASES if c["file"] == "pixel_cnn.py")
    (line,) = bench.planted_lines(CORPUS / "pixel_cnn.py")
    planted = {"wall_s": 10.0, "script_wall_s": 9.0, "findings": [
        {"id": "hot_spot", "where": "pixel_cnn.py:1 (main)", "est_saving_s": 1.0},
        {"id": "preprocessing", "where": f"pixel_cnn.py:{line} (main)", "est_saving_s": 12.0}]}
    fixed = {"wall_s": 4.0, "script_wall_s": 3.5, "findings": []}
    row = bench.score_case(case, planted, fixed, alone_planted=8.0, alone_fixed=3.0)
    assert row["rank"] == 2 and row["line_ok"] is True and row["clean_ids"] == []
    assert row["est_ratio"] == pytest.approx(12.0 / 5.0) and not row["est_within_2x"]
    assert row["est_over_run"]  # 12 s saved of a 9 s run
    assert row["overhead_planted"] == pytest.approx(10.0 / 8.0)
