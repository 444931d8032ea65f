"""``rlperf profile`` end to end on small runs: record, artifacts, advisor, py-spy paths, bad input."""

from __future__ import annotations

import gc
import json
import os
import pstats
import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch

from rlperf.cli import main
from rlperf.instruments.profilers import CallStats, find_pyspy

ROOT = Path(__file__).resolve().parents[1]
# The naive config scaled down: 64 boards, 8 updates per vector step, a narrower network and an
# earlier start; every slow form of configs/naive.toml, in seconds. fast.toml likewise.
SMALL = ["--set", "train.learning_starts=200", "--set", "buffer.capacity=5000", "--set", "agent.hidden=[64,64]",
         "--set", "run.threads=1"]
NAIVE = ["--config", str(ROOT / "configs" / "naive.toml"), "--envs", "64", "--steps", "3200", "--train-ratio", "8", *SMALL]
FAST = ["--config", str(ROOT / "configs" / "fast.toml"), "--envs", "32", "--steps", "1600", *SMALL]
SEED_001 = {"buffer.push=batch", "train.train_ratio=4", "env.flood_fill=tensor"}


@pytest.fixture(autouse=True)
def _restore_threads() -> Any:
    """run.threads=1 sets torch's and OpenMP's thread counts for the process: put them back."""
    threads = torch.get_num_threads()
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    yield
    torch.set_num_threads(threads)
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", *args])
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def profile_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> dict[str, Any]:
    # The suite's process holds every earlier test's objects, which a fresh `rlperf profile` does
    # not: frozen, they are not traversed by a full collection that lands in the profiled loop.
    gc.collect()
    gc.freeze()
    try:
        code, out, err = run(capsys, *args, "--out", str(tmp_path), "--json")
    finally:
        gc.unfreeze()
    assert code == 0, err
    return json.loads(out)  # --json: the record and nothing else on stdout


def findings(record: dict[str, Any]) -> set[str]:
    return {f["knob"] for f in record["profile"]["advisor"]["findings"]}


def test_naive_names_its_bottlenecks_with_evidence_and_consistent_counts(capsys, tmp_path) -> None:
    record = profile_json(capsys, tmp_path, *NAIVE)
    run_dir = Path(record["run_dir"])
    assert record["kind"] == "profile" and record["status"] == "completed"
    assert json.loads((run_dir / "run.json").read_text())["profile"]["advisor"] == record["profile"]["advisor"]

    # The advisor: push loop, train ratio and BFS, each with its evidence, its reference and a compare line.
    assert SEED_001 <= findings(record)
    advice = record["profile"]["advisor"]["findings"]
    savings = [f["est_saving_s"] for f in advice if f["est_saving_s"] is not None]
    assert savings == sorted(savings, reverse=True)
    for f in advice:
        assert f["reference"].startswith("docs/bottlenecks.md §")
        if f["knob"]:
            assert f["command"].startswith(f"rlperf compare {ROOT / 'configs' / 'naive.toml'} --vs {f['knob']} --set ")
            assert "--train-ratio 8" in f["command"]
    by_knob = {f["knob"]: f for f in advice}
    assert (
        "cProfile: the storage's write_one called 4,928 times (64 per vector step)" in by_knob["buffer.push=batch"]["evidence"]
    )
    assert "bfs_count called" in by_knob["env.flood_fill=tensor"]["evidence"]
    # Savings measured: both forms of the push and of the env step timed in this process.
    micro = record["profile"]["microbench"]
    for name, knob in (("push", "buffer.push=batch"), ("flood_fill", "env.flood_fill=tensor")):
        assert micro[name]["slow_s"] > micro[name]["fast_s"] > 0 and micro[name]["repeats"] >= 3
        assert by_knob[knob]["est_saving_s"] > 0 and "micro-benchmarked here" in by_knob[knob]["estimate"]
    assert "per update measured in this run" in by_knob["train.train_ratio=4"]["estimate"]
    # The compare lines measure the profile's window: its env steps, its warm-up left out of the rates.
    assert "--steps 4928 --repeats 3" in by_knob["buffer.push=batch"]["command"]

    # cProfile: profile.prof loads with pstats, its counts match the run.
    assert (run_dir / "profile.prof").is_file() and record["files"]["profile_cprofile"] == "profile.prof"
    pstats.Stats(str(run_dir / "profile.prof"))
    calls = CallStats(pstats.Stats(str(run_dir / "profile.prof")))
    totals = record["totals"]
    # The loop is measured, not start-up: the replay filled to max(learning_starts, batch) = 256
    # transitions (3 vector steps), 10 warm-up steps, then 3,200 env steps = 50 vector steps,
    # extended to the 64 a stable p95 needs.
    window = record["profile"]["window"]
    assert (window["fill_steps"], window["warmup_steps"], window["measured_steps"]) == (3, 10, 64)
    assert window["asked"] == {"env_steps": 3200} and window["asked_steps"] == 50 and window["extended"]
    assert window["measured_env_steps"] == 64 * 64 and window["measured_updates"] == 64 * 8
    assert record["timing"]["warmup_steps"] == 13 and record["timing"]["measured_steps"] == 64
    assert sum(p["calls"] for p in record["phases"].values() if p) == 5 * 64  # every phase once per measured step
    assert totals["vector_steps"] == 77
    assert calls.count("step", "rlperf/env/vector.py") == totals["vector_steps"]  # env step once per vector step
    assert calls.count("run_loop", "rlperf/dqn.py") == 1
    assert calls.count("update", "rlperf/dqn.py") == totals["updates"] > 0
    assert calls.count("write_one", "rlperf/buffer.py") == totals["env_steps"]
    top = record["profile"]["cprofile"]["top"]
    assert len(top) == 20 and top[0]["cumtime"] >= top[-1]["cumtime"]
    own = [row["function"] for row in top if row["own"]]
    assert any("rlperf/dqn.py" in name and "run_loop" in name for name in own)

    # GC evidence and the measured overhead of cProfile.
    gc = record["profile"]["gc"]
    assert gc["total_collections"] == sum(gc["collections"].values()) and gc["loop_wall_s"] > 0
    overhead = record["profile"]["overhead"]
    assert overhead["instruments"] == ["cProfile"] and overhead["ratio"] > 0 and overhead["by_regime"]


def test_fast_config_names_none_of_them(capsys, tmp_path) -> None:
    record = profile_json(capsys, tmp_path, *FAST, "--top", "5", "--sort", "tottime")
    assert not findings(record) & SEED_001
    top = record["profile"]["cprofile"]["top"]
    assert len(top) == 5 and [r["tottime"] for r in top] == sorted((r["tottime"] for r in top), reverse=True)
    if not findings(record):
        assert record["profile"]["advisor"]["none"].startswith("no finding")


def test_torch_profiler_trace_has_the_phase_ranges(capsys, tmp_path) -> None:
    code, out, err = run(capsys, "--config", "smoke", "--steps", "480", "--torch", "--no-cprofile", "--set", "run.threads=1",
                         "--out", str(tmp_path))
    assert code == 0, err
    assert "timing: cpu" in out and "torch.profiler: top ops by self CPU time" in out and "aten::" in out
    assert "USDT" not in err and "ActivityProfiler" not in err  # kineto's chatter is kept back
    run_dir = next(tmp_path.iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    section = record["profile"]["torch"]
    assert section["recorded"] and section["file"] == "trace.json" and section["top_ops"]
    assert section["steps"] == [14, 18]  # after the fill (12 steps: learning_starts=200 / 16 boards) and 2 warm-up steps
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {f"phase:{p}" for p in ("select", "step", "push", "train", "log")} <= names
    assert "cprofile" not in record["profile"] and not (run_dir / "profile.prof").exists()


def test_py_spy_records_a_flamegraph_and_speedscope(capsys, tmp_path) -> None:
    if find_pyspy() is None:
        pytest.skip("py-spy is not installed")
    # Long enough for py-spy's samples to land in the loop: 4,800 steps took 0.06 s (12 of 314 samples, none once in
    # CI under load); 64,000 take ~0.6 s, ~70 samples, and the whole run stays ~6 s (imports dominate it).
    code, out, err = run(capsys, "--config", "smoke", "--steps", "64000", "--no-cprofile", "--py-spy", "--set",
                         "run.threads=1", "--out", str(tmp_path))
    assert code == 0, err
    record = json.loads((next(tmp_path.iterdir()) / "run.json").read_text())
    spy = record["profile"]["py_spy"]
    if "skipped" in spy:
        pytest.skip(f"py-spy cannot sample here: {spy['skipped']}")
    run_dir = Path(record["run_dir"])
    svg = ET.parse(run_dir / "pyspy.svg").getroot()
    assert svg.tag.endswith("svg") and spy["samples"] > 0
    assert "run_loop" in (run_dir / "pyspy.svg").read_text()
    speedscope = json.loads((run_dir / "pyspy.speedscope.json").read_text())
    assert speedscope["profiles"] and speedscope["shared"]["frames"]
    assert "py-spy> " not in err and "py-spy> " not in out
    assert "py-spy flamegraph:" in out and record["profile"]["options"]["py_spy"] is True


def test_py_spy_missing_is_one_line_and_the_run_goes_on(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _out, err = run(
        capsys, "--config", "smoke", "--steps", "160", "--no-cprofile", "--py-spy", "--set", "run.threads=1",
        "--out", str(tmp_path / "runs"),
    )
    assert code == 0
    lines = [line for line in err.splitlines() if "py-spy" in line]
    assert lines == ["rlperf: py-spy skipped: not found on PATH (pip install py-spy)"]
    record = json.loads((next((tmp_path / "runs").iterdir()) / "run.json").read_text())
    assert record["status"] == "completed" and "not found" in record["profile"]["py_spy"]["skipped"]


def test_py_spy_refused_is_one_line_with_the_fix(capsys, tmp_path, monkeypatch) -> None:
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Error: Failed to open process: Operation not permitted (os error 1)' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    code, out, err = run(
        capsys, "--config", "smoke", "--steps", "160", "--no-cprofile", "--py-spy", "--set", "run.threads=1",
        "--out", str(tmp_path / "runs"),
    )
    assert code == 0
    lines = [line for line in err.splitlines() if "py-spy" in line]
    assert len(lines) == 1 and lines[0].startswith("rlperf: py-spy skipped: refused (Error: Failed to open process")
    assert "SYS_PTRACE" in lines[0] and "phases" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sort", "calls"], "unknown --sort key 'calls'"),
        (["--top", "0"], "--top must be at least 1"),
        (["--native"], "--native applies to --py-spy"),
    ],
)
def test_bad_options_are_one_line_exit_2(capsys, tmp_path, args, message) -> None:
    code, out, err = run(capsys, "--config", "smoke", "--out", str(tmp_path / "runs"), *args)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_unwritable_out_is_one_line_exit_2(capsys, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for extra in ([], ["--py-spy"]):
        code, out, err = run(capsys, "--config", "smoke", "--steps", "160", "--out", str(blocker / "runs"), *extra)
        assert code == 2 and out == "", err
        assert len(err.strip().splitlines()) == 1 and "cannot create output directory" in err


def test_episodes_are_counted_in_the_measured_window_and_the_output_says_so(capsys, tmp_path) -> None:
    code, out, err = run(capsys, "--config", "smoke", "--episodes", "20", "--no-cprofile", "--set", "run.threads=1",
                         "--out", str(tmp_path))
    assert code == 0, err
    record = json.loads((next(tmp_path.iterdir()) / "run.json").read_text())
    window = record["profile"]["window"]
    # smoke: 16 boards, learning_starts 200 -> 12 fill steps, then train.warmup_steps = 2.
    assert (window["fill_steps"], window["warmup_steps"]) == (12, 2)
    assert window["measured_steps"] == 64 and window["extended"] and window["measured_episodes"] >= 20
    assert record["totals"]["episodes"] > window["measured_episodes"]  # the fill's episodes are not counted
    assert record["totals"]["updates"] > 0 and window["measured_updates"] > 0
    text = " ".join(out.split())
    assert "after filling the replay to train.learning_starts=200 (12 vector steps" in text
    assert "--episodes 20 took" in text and "so the window was extended to 64" in text


def test_verify_runs_the_top_findings_compare_line_and_keeps_both_figures(capsys, tmp_path) -> None:
    record = profile_json(capsys, tmp_path, "--config", "smoke", "--set", "env.flood_fill=bfs", "--set", "run.threads=1",
                          "--no-cprofile", "--verify", "1")
    # --verify runs the top findings that have a knob: on a busy machine a knob-less "waiting for a
    # CPU" finding may rank above the flood fill, and is skipped.
    findings = record["profile"]["advisor"]["findings"]
    top = next(f for f in findings if f.get("knob"))
    assert top["knob"] == "env.flood_fill=tensor" and top["est_saving_s"] > 0  # the estimate, kept
    verified = top["verified"]
    assert verified["repeats"] == 3 and verified["speedup"] > 0 and verified["spread"] is not None
    assert verified["inside_noise"] in (True, False)
    assert all(f["verified"] is None for f in findings if f is not top)  # only the top 1 ran
    section = record["profile"]["verify"]
    assert section["ran"] == 1 and section["repeats"] == 3
    runs = sorted(Path(section["compare_dir"]).iterdir())
    assert len(runs) == 6  # the profiled config and the variant, interleaved, 3 repeats each
    for run_dir in runs:  # each measured what the profile measured: its env steps, its warm-up left out
        r = json.loads((run_dir / "run.json").read_text())
        assert r["totals"]["env_steps"] == record["totals"]["env_steps"]
        assert r["timing"]["warmup_steps"] == record["timing"]["warmup_steps"]
    assert json.loads((Path(record["run_dir"]) / "run.json").read_text())["profile"]["verify"] == section


def test_the_torch_profilers_own_collections_are_not_the_loops(capsys, tmp_path) -> None:
    """torch.profiler parsing its events after the loop makes a great many objects: the collections
    that starts are the instrument's, counted apart, and never a GC finding (it ranked first at
    "could save ~0.36 s of 0.10 s")."""
    record = profile_json(capsys, tmp_path, "--config", "smoke", "--steps", "480", "--torch", "--set",
                          "buffer.push=loop", "--set", "run.threads=1")
    gc = record["profile"]["gc"]
    assert gc["during_instruments"]["collections"] > 0
    assert gc["total_collections"] < gc["during_instruments"]["collections"]
    advisor = record["profile"]["advisor"]
    assert "gc_pauses" not in {f["id"] for f in advisor["findings"]}
    assert all(f["est_saving_s"] <= advisor["measured_phase_s"] for f in advisor["findings"] if f["est_saving_s"])


def test_no_estimate_exceeds_the_time_it_is_a_share_of() -> None:
    from rlperf.config import config_from, config_to_dict
    from rlperf.instruments.advisor import advise, measured_total

    cfg = config_from("smoke")
    record = {
        "config": config_to_dict(cfg),
        "phases": {name: {"total_s": 0.02, "share": 0.2, "calls": 100} for name in ("select", "step", "push", "train", "log")},
        "timing": {"mode": "cpu", "warmup_steps": 2, "warmup_s": 0.0, "measured_steps": 100},
        "totals": {"vector_steps": 102, "updates": 100, "env_steps": 1632},
        "throughput": {"replay_ratio": 2.0},
        "system": {"device": "cpu", "torch_threads": 1},
        "profile": {"microbench": {}},
    }
    gc = {"share_of_loop": 3.6, "total_s": 0.36, "total_collections": 89, "max_pause_ms": 417.0,
          "collections": {"gen0": 81, "gen1": 7, "gen2": 1}}
    findings = advise(record, None, gc)
    assert [f.id for f in findings] == ["gc_pauses"]
    assert findings[0].est_saving_s == measured_total(record) == pytest.approx(0.1)
