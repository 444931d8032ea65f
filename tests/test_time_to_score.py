"""Time to score (docs/bottlenecks.md §19): the crossing, the record, compare rows, sweep columns,
the sweep's ``--objective`` ranking and its refusals. Real runs are smoke-sized (a second or two)."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlperf.cli import main
from rlperf.config import config_from
from rlperf.experiments.compare import Side, compare, compare_table
from rlperf.experiments.sweep import Axis, Trial, parse_objective, rank_points, run_sweep, sweep_table
from rlperf.errors import ConfigError
from rlperf.report.tables import render_to_str
from rlperf.run.lifecycle import train_run
from rlperf.score import first_reached, time_to

# A target a smoke run reaches (one fruit in a hundred episodes on a 6x6 board) and one it cannot.
REACHED, UNREACHABLE = 0.05, 100.0
SMOKE = ["train.learning_starts=64", "train.checkpoint=false", "run.threads=1",
         f"train.score_targets=[{REACHED},{UNREACHABLE}]"]


def smoke(*overrides: str, steps: int = 1200) -> Any:
    return config_from("smoke", [*SMOKE, *overrides], steps=steps, device="cpu")


# -- the crossing ---------------------------------------------------------------------------------


def test_first_reached_needs_a_full_window_and_finds_the_exact_episode() -> None:
    # Before 100 episodes nothing counts, however good.
    assert first_reached([], [50.0] * 99, 1.0) is None
    assert first_reached([], [50.0] * 100, 1.0) == 99
    # 99 zeros read earlier; the new read's third episode brings the window's sum to 2 (mean 0.02).
    assert first_reached([0.0] * 99, [0.0, 1.0, 1.0, 5.0], 0.02) == 2
    assert first_reached([0.0] * 99, [0.0, 1.0], 0.02) is None
    # The window slides: old good episodes leave it.
    assert first_reached([3.0] * 150, [0.0], 3.0) is None
    # Against a reference: the plain mean of the last 100 after each episode.
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, 400).astype(float)
    for target in (1.0, 1.5, 1.7, 9.0):
        means = [scores[i - 99:i + 1].mean() for i in range(99, len(scores))]
        expected = next((i + 99 for i, m in enumerate(means) if m >= target), None)
        got = None
        for start in range(0, 400, 37):  # read in chunks, as the loop does
            hit = first_reached(scores[:start], scores[start:start + 37], target)
            if hit is not None:
                got = start + hit
                break
        assert got == expected, target


# -- the record -----------------------------------------------------------------------------------


def test_a_sync_run_records_when_it_reached_each_target(tmp_path: Path) -> None:
    record = train_run(smoke(), out=tmp_path, quiet=True, dashboard=False).record
    section = record["time_to_score"]
    assert section["window_episodes"] == 100 and "warm-up excluded" in section["clock"]
    assert section["resolution"] == "every vector step (16 env steps)"
    hit, miss = section["targets"]
    assert hit["score"] == REACHED and hit["reached"] is True
    assert 0 < hit["wall_s"] <= hit["run_wall_s"] <= record["totals"]["wall_s"]
    assert 100 <= hit["episodes"] <= record["totals"]["episodes"]
    assert 0 < hit["env_steps"] <= record["totals"]["env_steps"] and hit["env_steps"] % 16 == 0
    assert 0 <= hit["updates"] <= record["totals"]["updates"]
    assert miss == {"score": UNREACHABLE, "reached": False, "wall_s": None, "run_wall_s": None, "env_steps": None,
                    "updates": None, "episodes": None}
    assert time_to(record, REACHED) == (True, hit["wall_s"]) and time_to(record, UNREACHABLE) == (False, None)
    assert time_to(record, 7.0) is None  # not tracked


def test_an_async_run_records_it_too(tmp_path: Path) -> None:
    # 32 boards for 3,000 env steps: a few hundred episodes, so the learner reads a full window;
    # few updates, so the run takes seconds.
    cfg = smoke("run.mode=async", "async.actors=1", "async.envs_per_actor=32", "train.log_every=5",
                "train.train_ratio=0.25", steps=3000)
    record = train_run(cfg, out=tmp_path, quiet=True, dashboard=False).record
    assert record["status"] == "completed"
    section = record["time_to_score"]
    assert section["resolution"].startswith("every learner log read")
    hit, miss = section["targets"]
    assert record["totals"]["episodes"] >= 100, record["totals"]
    assert hit["reached"] is True and 100 <= hit["episodes"] and 0 < hit["env_steps"] <= record["totals"]["env_steps"]
    assert hit["wall_s"] <= hit["run_wall_s"]
    assert miss["reached"] is False


# -- compare and sweep, from records --------------------------------------------------------------


def fake_record(reached: dict[float, float | None]) -> dict[str, Any]:
    """A minimal record with a time_to_score section (seconds, or None: not reached)."""
    targets = [{"score": t, "reached": s is not None, "wall_s": s, "run_wall_s": s, "env_steps": 1000 if s else None,
                "updates": 10 if s else None, "episodes": 100 if s else None} for t, s in reached.items()]
    return {"status": "completed", "system": {"device": "cpu"}, "learning": {"mean_score_last_100": 1.0},
            "throughput": {"env_steps_per_s": 1000.0}, "time_to_score": {"targets": targets}}


def test_compare_shows_time_to_score_rows_and_not_reached() -> None:
    a = [fake_record({5.0: 2.0, 20.0: None}) for _ in range(3)]
    b = [fake_record({5.0: 1.0, 20.0: 8.0}), fake_record({5.0: 1.0, 20.0: None}), fake_record({5.0: 1.0, 20.0: 10.0})]
    comparison = compare([Side("a", "a", a), Side("b", "b", b)])
    rows = {row["metric"]: row for row in comparison["rows"]}
    assert rows["time_to_5"]["reached"] == [[3, 3], [3, 3]]
    assert rows["time_to_5"]["ratios"][0]["value"] == pytest.approx(2.0)  # b reached 5 twice as fast
    assert rows["time_to_20"]["reached"] == [[0, 3], [2, 3]]
    text = render_to_str(compare_table(comparison), width=200)
    line20 = next(line for line in text.splitlines() if "time to score 20" in line)
    assert "not reached" in line20 and "(2/3 reached)" in line20
    assert "time to score 5" in text


def trial(point: int, repeat: int, seconds: float | None, score: float = 1.0) -> Trial:
    t = Trial(point * 10 + repeat, point, repeat, [], {"agent.lr": point})
    t.status = "completed"
    t.record = fake_record({20.0: seconds})
    t.record["learning"]["mean_score_last_100"] = score
    return t


def test_sweep_ranking_best_first_unreached_last() -> None:
    trials = [trial(0, 0, None), trial(0, 1, None),  # never reached
              trial(1, 0, 5.0), trial(1, 1, 7.0),  # reached, median 6
              trial(2, 0, 3.0), trial(2, 1, 4.0),  # fastest
              trial(3, 0, 2.0), trial(3, 1, None)]  # half reached: median is infinite, but above never
    for t in trials:
        t.config = config_from("smoke")
    objective = parse_objective("time_to_20", trials)
    assert [p for p, _ in rank_points(trials, objective)] == [2, 1, 3, 0]
    final = parse_objective("final_score", trials)
    trials[0].record["learning"]["mean_score_last_100"] = 9.0  # type: ignore[index]
    assert rank_points(trials, final)[0][0] == 0


def test_sweep_columns_csv_json_and_objective(tmp_path: Path) -> None:
    base = smoke()
    result = run_sweep(base, [Axis("agent.lr", ("0.001", "0.0005"))], out=tmp_path, objective=f"time_to_{REACHED:g}")
    data = result.data()
    assert data["objective"]["name"] == "time_to_0.05" and data["objective"]["better"] == "lower"
    for row in data["trials"]:
        assert row["reached_0.05"] is True and row["time_to_0.05"] > 0
        assert row["reached_100"] is False and row["time_to_100"] is None
    summary = data["summary"]
    assert [e["rank"] for e in summary] == [1, 2]
    assert summary[0]["objective"] <= summary[1]["objective"]
    assert all(e["reached_100"] == [0, 1] and e["time_to_100"] is None for e in summary)
    with open(result.sweep_dir / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"time_to_0.05", "reached_0.05", "time_to_100", "reached_100"} <= set(rows[0])
    assert json.loads((result.sweep_dir / "sweep.json").read_text())["summary"][0]["rank"] == 1
    text = render_to_str(sweep_table(data), width=250)
    assert "t→0.05 (s)" in text and "not reached" in text and "ranked by time_to_0.05" in text


@pytest.mark.parametrize("objective, says", [
    ("fastest", "unknown sweep objective 'fastest'"),
    ("time_to_x", "unknown sweep objective 'time_to_x'"),
    ("time_to_7", "score 7 is not in train.score_targets"),
])
def test_bad_objective_is_one_line_exit_2_and_writes_nothing(
    objective: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--config", "smoke", "--param", "agent.lr=1e-3,1e-4", "--objective", objective,
              "--out", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_bad_targets_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"train\.score_targets"):
        config_from("smoke", ["train.score_targets=[0]"])
    assert config_from("smoke", ["train.score_targets=[20,5,5]"]).train.score_targets == [5.0, 20.0]


def test_resume_keeps_what_was_reached(tmp_path: Path) -> None:
    from rlperf.dqn import Progress

    p = Progress(score_targets=(1.0, 2.0))
    p.add_episodes(np.ones(100), np.ones(100, dtype=np.int64), np.ones(100),
                   clock=lambda: {"wall_s": 1.5, "run_wall_s": 2.0, "env_steps": 160, "updates": 3})
    assert p.time_to_score == {"1": {"wall_s": 1.5, "run_wall_s": 2.0, "env_steps": 160, "updates": 3, "episodes": 100}}
    q = Progress(score_targets=(1.0, 2.0))
    q.load_state_dict(copy.deepcopy(p.state_dict()))
    assert q.time_to_score == p.time_to_score and q.score_targets == (1.0, 2.0)
