"""Run directories, atomic writes, record reading, system info, the metrics CSV."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import pytest
import torch

import rlperf
from rlperf.run import files as records
from rlperf.run import record as record_mod
from rlperf.errors import RlperfError
from rlperf.atomic import save_torch_atomic, write_json_atomic, write_text_atomic
from rlperf.run.files import SCHEMA, MetricsCSV, make_run_dir, read_record
from rlperf.run.record import peak_cuda_mb, peak_rss_mb, system_info


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run 'starts in the same second'."""
    monkeypatch.setattr(records.time, "strftime", lambda fmt: "20240101-120000")


def test_make_run_dir_same_name_same_second(tmp_path: Path, frozen_clock: None) -> None:
    out = tmp_path / "runs" / "nested"  # created on demand
    a = make_run_dir(out, "exp", "train")
    b = make_run_dir(out, "exp", "train")
    c = make_run_dir(out, None, "train")
    assert a.name == "exp-20240101-120000"
    assert b.name == "exp-20240101-120000-2"
    assert c.name == "train-20240101-120000"
    assert a.is_dir() and b.is_dir() and c.is_dir()


def test_make_run_dir_from_threads_never_shares(tmp_path: Path, frozen_clock: None) -> None:
    results: list[Path] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def start() -> None:
        barrier.wait()
        path = make_run_dir(tmp_path, "same", "train")
        with lock:
            results.append(path)

    threads = [threading.Thread(target=start) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and len(set(results)) == 16
    assert len(list(tmp_path.iterdir())) == 16


def test_make_run_dir_unwritable_out(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RlperfError, match=str(blocker)) as err:
        make_run_dir(blocker / "runs", "x", "train")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["../escape", "a/b", ".."])
def test_make_run_dir_rejects_path_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(RlperfError, match="run name"):
        make_run_dir(tmp_path, name, "train")


def test_write_json_atomic_round_trip(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "run.json"
    write_json_atomic(path, {"schema": 1, "x": np.float64(1.5), "n": np.int64(3), "p": Path("a/b")})
    assert json.loads(path.read_text()) == {"schema": 1, "x": 1.5, "n": 3, "p": "a/b"}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_atomic_write_keeps_old_file_when_serialisation_fails(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_json_atomic(path, {"schema": 1, "status": "completed"})
    old = path.read_bytes()
    # Encoding fails half way: the first keys were already streamed into the temp file.
    with pytest.raises(TypeError):
        write_json_atomic(path, {"schema": 1, "status": "x" * 10_000, "bad": object()})
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temp file left behind


def test_save_torch_atomic_keeps_old_checkpoint_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_torch_atomic(path, {"w": torch.arange(4)})
    old = path.read_bytes()
    with pytest.raises((AttributeError, pickle.PicklingError)):
        save_torch_atomic(path, {"w": torch.arange(4), "bad": lambda: None})  # lambdas don't pickle
    assert path.read_bytes() == old
    assert torch.load(path, weights_only=True)["w"].tolist() == [0, 1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_write_text_atomic(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write_text_atomic(path, "a = 1\n")
    write_text_atomic(path, "a = 2 # é\n")
    assert path.read_text(encoding="utf-8") == "a = 2 # é\n"


def test_read_record_dir_and_file(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "run.json", {"schema": SCHEMA, "status": "completed"})
    assert read_record(tmp_path)["status"] == "completed"
    assert read_record(tmp_path / "run.json")["status"] == "completed"


def _one_line_error(path: Path, match: str) -> None:
    with pytest.raises(RlperfError, match=match) as err:
        read_record(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message


def test_read_record_errors(tmp_path: Path) -> None:
    _one_line_error(tmp_path / "missing.json", "no run record")
    _one_line_error(tmp_path, "has no run.json")

    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1,')
    _one_line_error(bad, "not valid JSON")

    bad.write_text("[1, 2]")
    _one_line_error(bad, "not a JSON object")

    bad.write_text('{"status": "completed"}')
    _one_line_error(bad, "schema")

    bad.write_text('{"schema": 7}')
    with pytest.raises(RlperfError, match=r"has schema 7, this rlperf reads ≤ 1"):
        read_record(bad)


def test_system_info_keys() -> None:
    info = system_info(torch.device("cpu"))
    assert set(info) >= {
        "rlperf", "python", "platform", "torch", "cuda", "device", "device_name",
        "cpu_model", "cpu_count", "torch_threads", "git_revision", "hostname",
    }  # fmt: skip
    assert info["rlperf"] == rlperf.__version__
    assert info["torch"] == torch.__version__
    assert info["device"] == "cpu"
    assert info["device_name"] == info["cpu_model"] and info["cpu_model"]
    assert info["torch_threads"] == torch.get_num_threads()
    json.dumps(info)


def test_git_revision_outside_a_repo(tmp_path: Path) -> None:
    assert record_mod.git_revision(tmp_path) is None


def test_peak_memory() -> None:
    assert peak_rss_mb() > 10
    assert peak_cuda_mb(torch.device("cpu")) is None


def test_metrics_csv_header_once_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    fields = ["env_steps", "episodes", "loss"]
    with MetricsCSV(path, fields) as csv_:
        csv_.write({"env_steps": 256, "episodes": 0, "loss": 0.5})
        # Flushed at once: readable before close.
        assert path.read_text().splitlines() == ["env_steps,episodes,loss", "256,0,0.5"]
    with MetricsCSV(path, fields) as csv_:
        csv_.write({"env_steps": 512, "episodes": 3})  # a missing field stays empty
    assert path.read_text().splitlines() == ["env_steps,episodes,loss", "256,0,0.5", "512,3,"]


def test_metrics_csv_drops_a_torn_last_row(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("env_steps,loss\n256,0.5\n512,0.")  # killed mid-write
    with MetricsCSV(path, ["env_steps", "loss"]) as csv_:
        csv_.write({"env_steps": 512, "loss": 0.25})
    assert path.read_text().splitlines() == ["env_steps,loss", "256,0.5", "512,0.25"]


def test_metrics_csv_refuses_other_columns(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    MetricsCSV(path, ["a", "b"]).close()
    with pytest.raises(RlperfError, match="has columns a,b"):
        MetricsCSV(path, ["a", "c"])
