"""``rlperf train``: the run directory, the record (DESIGN §4), --json, and runs never sharing a directory."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlperf import cli
from rlperf.run import files as records
from rlperf.config import config_from, config_to_dict, load_config
from rlperf.run.files import read_record
from rlperf.run.lifecycle import METRICS_FIELDS, train_run
from rlperf.timers import PHASES

TINY = ["-c", "smoke", "--set", "run.device=cpu", "--set", "run.threads=1"]
RECORD_KEYS = {"schema", "kind", "name", "run_dir", "status", "command", "started_at", "resumed", "config", "system",
               "timing", "totals", "throughput", "phases", "intervals", "learning", "memory", "checkpoint", "files", "env"}
PHASE_KEYS = {"total_s", "share", "calls", "mean_ms", "p50_ms", "p95_ms"}


@pytest.fixture(scope="module")
def json_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """One small run through the CLI with --json: 30 vector steps of 16 boards, a log row every 5."""
    out = tmp_path_factory.mktemp("runs")
    stdout = io.StringIO()  # capsys is function-scoped; this fixture is shared by the module
    code = 0
    with contextlib.redirect_stdout(stdout):
        try:
            cli.main(
                ["train", *TINY, "--steps", "480", "--set", "train.log_every=5", "--out", str(out), "--name", "t", "--json"]
            )
        except SystemExit as exc:
            code = int(exc.code or 0)
    (run_dir,) = out.iterdir()
    return code, stdout.getvalue(), run_dir


def test_run_directory_holds_record_metrics_config_and_checkpoint(json_run: tuple[int, str, Path]) -> None:
    code, _, run_dir = json_run
    assert code == 0
    assert run_dir.name.startswith("t-")
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint.pt", "config.toml", "metrics.csv", "run.json", "run.png"]


def test_json_prints_the_record_and_nothing_else(json_run: tuple[int, str, Path]) -> None:
    _, stdout, run_dir = json_run
    assert json.loads(stdout) == read_record(run_dir)


def test_record_has_every_section(json_run: tuple[int, str, Path]) -> None:
    _, _, run_dir = json_run
    r = read_record(run_dir)
    assert RECORD_KEYS <= set(r)
    assert r["schema"] == records.SCHEMA and r["kind"] == "train" and r["status"] == "completed"
    assert r["run_dir"] == str(run_dir) and r["name"] == run_dir.name
    assert r["command"] and all(isinstance(arg, str) for arg in r["command"])  # sys.argv (checked end to end below)
    assert r["resumed"] == []
    assert r["config"] == config_to_dict(load_config(run_dir / "config.toml"))
    assert r["config"]["train"]["steps"] == 480

    assert {"rlperf", "python", "torch", "device", "cpu_model", "torch_threads", "git_revision"} <= set(r["system"])
    assert r["system"]["device"] == "cpu"
    # env.kernel=auto on the CPU: the fused kernel ran, and the record says why.
    assert r["env"]["kernel"] == "fused" and r["env"]["reason"].startswith("auto: numba")

    totals = r["totals"]
    assert (totals["env_steps"], totals["vector_steps"]) == (480, 30)
    assert totals["episodes"] > 0 and totals["updates"] > 0 and totals["wall_s"] > 0

    assert set(r["phases"]) == set(PHASES) and list(r["phases"]) == list(PHASES)
    for name, stats in r["phases"].items():
        assert set(stats) == PHASE_KEYS, name
        assert stats["calls"] >= 30 - r["timing"]["warmup_steps"]
        assert 0 <= stats["p50_ms"] <= stats["p95_ms"]
    assert math.isclose(sum(s["share"] for s in r["phases"].values()), 1.0, rel_tol=1e-6)

    t = r["throughput"]
    assert {"env_steps_per_s", "updates_per_s", "episodes_per_s", "s_per_1000_env_steps", "s_per_1000_episodes",
            "replay_ratio"} <= set(t)
    assert t["env_steps_per_s"] > 0
    assert math.isclose(t["replay_ratio"], totals["updates"] * 32 / 480)

    learning = r["learning"]
    assert {
        "mean_score_last_100",
        "mean_return_last_100",
        "best_score",
        "mean_episode_length",
        "final_epsilon",
        "last_loss",
    } <= set(learning)
    assert math.isfinite(learning["last_loss"]) and learning["best_score"] >= 0

    assert r["memory"]["peak_rss_mb"] > 0 and r["memory"]["peak_cuda_mb"] is None and r["memory"]["replay_mb"] > 0
    assert r["checkpoint"] == {"file": "checkpoint.pt", "env_steps": 480, "vector_steps": 30}
    assert r["files"] == {
        "record": "run.json",
        "metrics": "metrics.csv",
        "config": "config.toml",
        "checkpoint": "checkpoint.pt",
    }


def test_metrics_csv_has_a_row_per_log_interval(json_run: tuple[int, str, Path]) -> None:
    _, _, run_dir = json_run
    with open(run_dir / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == METRICS_FIELDS
        rows = list(reader)
    assert [int(row["vector_steps"]) for row in rows] == [5, 10, 15, 20, 25, 30]
    assert [int(row["env_steps"]) for row in rows] == [16 * v for v in (5, 10, 15, 20, 25, 30)]
    record = read_record(run_dir)
    assert int(rows[-1]["episodes"]) == record["totals"]["episodes"]
    assert int(rows[-1]["updates"]) == record["totals"]["updates"]
    epsilons = [float(row["epsilon"]) for row in rows]
    assert epsilons == sorted(epsilons, reverse=True)
    assert math.isfinite(float(rows[-1]["loss"]))

    # Episode length per interval: the rows and the record's intervals agree with the totals.
    intervals = record["intervals"]
    assert [i["env_steps"] for i in intervals] == [int(row["env_steps"]) for row in rows]
    assert sum(i["episodes"] for i in intervals) == record["totals"]["episodes"]
    lengths = [(i["episodes"], i["mean_episode_length"]) for i in intervals if i["episodes"]]
    assert sum(n * m for n, m in lengths) / sum(n for n, _ in lengths) == pytest.approx(
        record["learning"]["mean_episode_length"])
    for row, interval in zip(rows, intervals, strict=True):
        assert (row["mean_episode_length"] == "") == (interval["mean_episode_length"] is None)
        if interval["mean_episode_length"] is not None:
            assert float(row["mean_episode_length"]) == pytest.approx(interval["mean_episode_length"])
        assert interval["s_per_1000_env_steps"] > 0
    t = record["throughput"]
    assert t["s_per_1000_env_steps"] == pytest.approx(1000 / t["env_steps_per_s"])


def test_checkpoint_loads_safely_and_matches_the_record(json_run: tuple[int, str, Path]) -> None:
    _, _, run_dir = json_run
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert {"schema", "config", "agent", "buffer", "env", "progress", "timer", "rng", "run"} <= set(state)
    assert state["progress"]["env_steps"] == 480
    assert state["config"] == read_record(run_dir)["config"]


def test_two_runs_with_the_same_name_in_the_same_second_both_keep_their_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records.time, "strftime", lambda fmt: "20240101-120000")
    cfg = config_from("smoke", ["run.device=cpu", "run.threads=1"], steps=32)
    a = train_run(cfg, out=tmp_path, name="same", quiet=True, dashboard=False)
    b = train_run(cfg, out=tmp_path, name="same", quiet=True, dashboard=False)
    assert (a.run_dir.name, b.run_dir.name) == ("same-20240101-120000", "same-20240101-120000-2")
    assert read_record(a.run_dir)["run_dir"] == str(a.run_dir)
    assert read_record(b.run_dir)["run_dir"] == str(b.run_dir)


def test_json_end_to_end_prints_only_the_record(tmp_path: Path) -> None:
    """``python -m rlperf train --json`` in a real process: stdout is one JSON document, the record."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "rlperf", "train", *TINY, "--steps", "64", "--out", str(tmp_path), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["status"] == "completed"
    assert record["command"][1:] == argv[3:]  # python -m rlperf <these>
    assert record == read_record(record["run_dir"])
    assert "Traceback" not in proc.stderr


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_has_sb3_and_cleanrl_tags_and_a_point_per_episode(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    code = _main(["train", *TINY, "--steps", "800", "--set", "train.log_every=10", "--tensorboard", "--out",
                  str(tmp_path), "--name", "tb", "--json"])
    assert code == 0
    (run_dir,) = tmp_path.iterdir()
    record, scalars = read_record(run_dir), _scalars(run_dir / "tb")
    for tag in ("rollout/ep_rew_mean", "rollout/ep_len_mean", "train/loss", "time/fps", "rlperf/mean_score_100",
                "rlperf/loss", "charts/episodic_return", "charts/episodic_length"):
        assert scalars.get(tag), tag
    episodes = scalars["charts/episodic_return"]
    assert len(episodes) == record["totals"]["episodes"] > 0  # one point per finished episode
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    # Each point at the env step its episode ended: inside the run, in order, a vector step (16 boards) apart.
    steps = [s for s, _ in episodes]
    assert steps == sorted(steps) and 0 < steps[0] and steps[-1] <= record["totals"]["env_steps"]
    assert all(s % 16 == 0 for s in steps) and len(set(steps)) > len(rows)  # finer than the log rows
    assert [s for s, _ in scalars["time/fps"]] == [int(r["env_steps"]) for r in rows]
    last = rows[-1]
    assert scalars["rollout/ep_rew_mean"][-1][1] == pytest.approx(float(last["mean_return_100"]), rel=1e-5)
    assert scalars["train/loss"][-1][1] == pytest.approx(float(last["loss"]), rel=1e-5)
    returns = [v for _, v in episodes][-100:]
    assert scalars["rollout/ep_rew_mean"][-1][1] == pytest.approx(sum(returns) / len(returns), rel=1e-4)


def _main(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


def test_episodes_read_every_few_steps_keep_the_env_step_each_one_ended() -> None:
    """The device path reads finished episodes once per log interval: each keeps its own end step."""
    import numpy as np

    from rlperf.dqn import EpisodeLog, Progress
    from rlperf.run.tensorboard import episode_rows

    log, n = EpisodeLog(3, 4, torch.device("cpu")), 4
    for done in ([1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]):
        mask = torch.tensor(done, dtype=torch.bool)
        log.record({"_final_info": mask, "final_info": {"score": mask.float(), "steps": mask.long() * 7,
                                                        "return": mask.float() * 2}})
    p = Progress()
    p.env_steps = 3 * n
    p.add_episodes(*log.flush(p.env_steps))
    rows = episode_rows(p.take_episodes())
    assert rows.tolist() == [[4, 2.0, 7], [12, 2.0, 7], [12, 2.0, 7]] and p.take_episodes() == []
    assert "new_episodes" not in p.state_dict() and np.isclose(p.mean_return, 2.0)
    one = EpisodeLog(1, 4, torch.device("cpu"))  # the CPU reads every step: all at this step, no array built
    mask = torch.tensor([0, 1, 1, 0], dtype=torch.bool)
    one.record({"_final_info": mask, "final_info": {"score": mask.float(), "steps": mask.long(), "return": mask.float()}})
    *_, ends = flushed = one.flush(16)
    assert ends is None
    p.add_episodes(*flushed)
    assert episode_rows(p.take_episodes()).tolist() == [[12, 1.0, 1], [12, 1.0, 1]]  # ends None: the read's step


@pytest.mark.parametrize("command", [["train"], ["profile"]])
def test_quiet_prints_only_the_final_summary_line(command: list[str], tmp_path: Path) -> None:
    """``-q`` from a pipe: one line on stdout (the run, its figures), nothing on stderr for a completed run."""
    proc = subprocess.run([sys.executable, "-m", "rlperf", *command, "--config", "smoke", "--set", "run.device=cpu",
                           "--set", "run.threads=1", "--out", str(tmp_path), "-q"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    (run_dir,) = tmp_path.iterdir()
    assert line.startswith(f"run {run_dir.name}: completed -> {run_dir}") and "env steps/s" in line, line
    assert _beyond_compile_notices(proc.stderr) == [], proc.stderr
    if command == ["profile"]:
        assert "finding" in line


def test_quiet_sweep_prints_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rlperf", "sweep", "--config", "smoke", "--set", "run.device=cpu",
                           "--set", "run.threads=1", "--steps", "400", "--train-ratio", "1,2", "--objective",
                           "env_steps_per_s", "--out", str(tmp_path), "--no-plot", "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("sweep: 2 trials -> ") and "; best: train.train_ratio=" in line
    assert _beyond_compile_notices(proc.stderr) == [], proc.stderr


def _beyond_compile_notices(stderr: str) -> list[str]:
    """stderr's lines but numba's first-run compile notices (rlperf.env.fused.compile_notice), which a
    cold cache prints once whatever the options."""
    return [line for line in stderr.splitlines() if not line.startswith(("rlperf: compiled ", "rlperf: compiling "))]
