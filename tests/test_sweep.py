"""``rlperf sweep`` on the local backend: the grid, its files, failed trials, Ctrl-C, bad input.

Every trial is a real (tiny) training run: 8 boards, 256 env transitions, one thread.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import sys
from pathlib import Path

import pytest

import rlperf.run.lifecycle
from conftest import run_cli
from rlperf.report.units import format_number, pick_unit
from rlperf.config import config_from
from rlperf.errors import ConfigError
from rlperf.run.files import read_record
from rlperf.experiments.sweep import Axis, run_sweep, split_values

TINY = ["--config", "smoke", "--steps", "256", "--device", "cpu", "--set", "train.learning_starts=64",
        "--set", "train.checkpoint=false", "--set", "run.threads=1", "--set", "train.log_every=8"]


def tiny_config():
    return config_from("smoke", ["train.learning_starts=64", "train.checkpoint=false", "run.threads=1",
                                 "train.log_every=8"], steps=256, device="cpu")



def table_row(text: str, first_cells: list[str]) -> list[str]:
    """The cells of the table row whose leading cells are ``first_cells``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells[: len(first_cells)] == first_cells:
            return cells
    raise AssertionError(f"no row {first_cells} in:\n{text}")


def test_grid_2x2_with_repeats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["sweep", *TINY, "--train-ratio", "1,2", "--envs", "4,8", "--repeats", "2",
                              "--out", str(tmp_path)], capsys)
    assert code == 0, err
    (sweep_dir,) = tmp_path.iterdir()
    for name in ("sweep.csv", "sweep.json", "sweep.png"):
        assert (sweep_dir / name).stat().st_size > 0
    assert (sweep_dir / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    run_dirs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(run_dirs) == 8
    records = {str(p): read_record(p) for p in run_dirs}

    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert data["axes"] == {"train.train_ratio": [1, 2], "env.num_envs": [4, 8]}
    assert [t["status"] for t in data["trials"]] == ["completed"] * 8
    seeds = {}
    for t in data["trials"]:
        record = records[t["run_dir"]]
        assert record["config"]["train"]["train_ratio"] == t["train.train_ratio"]
        assert record["config"]["env"]["num_envs"] == t["env.num_envs"]
        assert t["env_steps_per_s"] == record["throughput"]["env_steps_per_s"]  # read back, not recomputed
        assert t["updates_per_s"] == record["throughput"]["updates_per_s"]
        assert t["mean_score"] == record["learning"]["mean_score_last_100"]
        seeds.setdefault(t["point"], []).append(record["config"]["run"]["seed"])
    assert all(s == [0, 1] for s in seeds.values())  # repeat k runs with seed + k

    with open(sweep_dir / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    for row in rows:
        assert float(row["env_steps_per_s"]) == records[row["run_dir"]]["throughput"]["env_steps_per_s"]

    # The table shows, per grid point, the median and spread of the records' own figures.
    scale, _ = pick_unit("rate", [p["env_steps_per_s"]["median"] for p in data["summary"]])
    for point in data["summary"]:
        mine = [records[t["run_dir"]]["throughput"]["env_steps_per_s"] for t in data["trials"] if t["point"] == point["point"]]
        assert point["env_steps_per_s"]["median"] == statistics.median(mine)
        assert point["env_steps_per_s"]["spread"] == (max(mine) - min(mine)) / 2
        params = point["params"]
        cells = table_row(out, [str(int(params["train.train_ratio"])), str(params["env.num_envs"])])
        assert cells[2] == format_number(statistics.median(mine), (max(mine) - min(mine)) / 2, scale, compact=True)
        assert cells[-1] == "2/2 ok"
    assert "sweep: 8 trials" in err


def test_every_grid_point_is_validated_before_the_first_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # batch_size 8000 exceeds smoke's buffer.capacity (5000): the second point is refused, and the
    # first, valid, one does not run either.
    code, out, err = run_cli(
        ["sweep", *TINY, "--param", "buffer.batch_size=16,8000", "--out", str(tmp_path / "runs"), "--json"], capsys
    )
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "sweep point batch_size=8000: buffer.capacity (5000) is smaller than buffer.batch_size (8000)" in err
    assert not (tmp_path / "runs").exists()


def test_injected_failure_is_recorded_and_the_sweep_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = rlperf.run.lifecycle.train_run

    def flaky(cfg, **kwargs):
        if cfg.buffer.push == "loop":
            raise RuntimeError("injected failure")
        return real(cfg, **kwargs)

    monkeypatch.setattr(rlperf.run.lifecycle, "train_run", flaky)
    events = []
    result = run_sweep(
        tiny_config(),
        [Axis("buffer.push", ("loop", "batch"))],
        out=tmp_path,
        on_trial=lambda event, t: events.append((event, t.name, t.status)),
    )
    bad, ok = result.trials
    assert (bad.status, bad.error) == ("failed", "RuntimeError: injected failure")
    assert ok.status == "completed" and read_record(ok.run_dir)["config"]["buffer"]["push"] == "batch"
    assert events == [
        ("start", "trial000", "pending"),
        ("end", "trial000", "failed"),
        ("start", "trial001", "pending"),
        ("end", "trial001", "completed"),
    ]
    data = json.loads((result.sweep_dir / "sweep.json").read_text())
    assert [t["status"] for t in data["trials"]] == ["failed", "completed"]
    assert (result.sweep_dir / "sweep.png").is_file()  # categorical x axis


def test_ctrl_c_keeps_finished_trials_and_the_partial_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = rlperf.run.lifecycle.train_run
    calls = []

    def interrupted_second(cfg, **kwargs):
        calls.append(cfg)
        if len(calls) == 2:  # Ctrl-C during the second trial's loop: the runner stops it cleanly
            kwargs["hooks"] = rlperf.run.lifecycle.RunHooks(on_step=lambda: os.kill(os.getpid(), signal.SIGINT))
        return real(cfg, **kwargs)

    monkeypatch.setattr(rlperf.run.lifecycle, "train_run", interrupted_second)
    code, out, err = run_cli(["sweep", *TINY, "--train-ratio", "1,2,4", "--out", str(tmp_path)], capsys)
    assert code == 130
    (sweep_dir,) = tmp_path.iterdir()
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert data["interrupted"] is True
    assert [t["status"] for t in data["trials"]] == ["completed", "interrupted", "not run"]
    assert read_record(data["trials"][0]["run_dir"])["status"] == "completed"
    assert read_record(data["trials"][1]["run_dir"])["status"] == "interrupted"
    assert table_row(out, ["1"])[-1] == "ok" and "interrupted: partial results" in out
    assert "interrupted" in err


def test_split_values_keeps_lists_whole() -> None:
    assert split_values("1, 4,16") == ["1", "4", "16"]
    assert split_values("[64,64],[128, 128]") == ["[64,64]", "[128, 128]"]
    assert split_values('"a,b",c') == ['"a,b"', "c"]
    with pytest.raises(ConfigError, match="empty value"):
        split_values("1,,2")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--param", "buffer.pushh=loop,batch"], "unknown config key 'buffer.pushh' (did you mean 'buffer.push'?)"),
        (["--param", "buffer.push"], "--param 'buffer.push' has no '='"),
        (["--train-ratio", "1,2", "--repeats", "0"], "--repeats must be at least 1"),
        ([], "nothing to sweep"),
        (["--train-ratio", "1,2", "--backend", "slurm"], "unknown sweep backend 'slurm'"),
        (["--train-ratio", "a,b"], 'sweep point train_ratio=a: train.train_ratio = "a" is invalid'),
        (["--train-ratio", "1,-2"], "sweep point train_ratio=-2: train.train_ratio = -2"),
        (["--param", "train.amp=off,fp16"], "sweep point amp=fp16: train.amp=fp16 needs a CUDA device"),
        (["--param", "buffer.capacity=1000,1000000000000"], "sweep point capacity=1000000000000:"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["sweep", *TINY, *args, "--out", str(tmp_path / "runs")], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "runs").exists()


def test_missing_ray_gives_an_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError, installed or not
    code, _, err = run_cli(
        ["sweep", *TINY, "--train-ratio", "1,2", "--backend", "ray", "--out", str(tmp_path / "runs")], capsys
    )
    assert code == 2 and err.count("\n") == 1
    assert "pip install 'rlperf[ray]'" in err
    assert not (tmp_path / "runs").exists()


def test_a_trial_does_not_leak_its_thread_count_into_the_next(tmp_path: Path) -> None:
    import torch

    from rlperf.threads import AUTO_CPU

    before = torch.get_num_threads()
    result = run_sweep(tiny_config(), [Axis("run.threads", ("2", "0"))], out=tmp_path)
    first, second = (read_record(t.run_dir)["system"]["torch_threads"] for t in result.trials)
    assert first == 2 and second == AUTO_CPU  # 0 = rlperf's own choice on the CPU, not the previous trial's 2
    assert torch.get_num_threads() == before
