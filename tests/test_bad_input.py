"""Bad input to ``rlperf train``: one line naming the key or file, exit code 2, no traceback, nothing
written (DESIGN §7). Table-driven; most cases run ``rlperf.cli.main`` in-process, a few run
``python -m rlperf`` in real subprocesses to prove the same end to end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import run_cli as run_main
from rlperf.config import config_from
from rlperf.atomic import write_json_atomic
from rlperf.run.lifecycle import train_run


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    names: tuple[str, ...]  # what the one line must mention: the key, flag or file
    files: dict[str, str] | None = None  # files to create in the case's folder first ({name} in args)


# Keeps every valid run tiny; each case breaks one thing on top of it.
BASE = ("-c", "smoke", "--set", "run.device=cpu", "--set", "run.threads=1")

TRAIN_CASES = [
    # --set: keys and values
    Case("unknown-key", ("--set", "train.stpes=10"), ("train.stpes", "did you mean 'train.steps'")),
    Case("unknown-section", ("--set", "trian.steps=10"), ("trian", "train.steps")),
    Case("key-without-section", ("--set", "steps=10"), ("steps",)),
    Case("override-without-equals", ("--set", "train.steps"), ("train.steps", "=")),
    Case("string-for-int", ("--set", "env.num_envs=many"), ("env.num_envs",)),
    Case("float-for-int", ("--set", "env.num_envs=2.5"), ("env.num_envs",)),
    Case("not-a-bool", ("--set", "train.checkpoint=maybe"), ("train.checkpoint",)),
    Case("unknown-choice", ("--set", "buffer.storage=disk"), ("buffer.storage",)),
    Case("list-for-int", ("--set", "buffer.batch_size=[1,2]"), ("buffer.batch_size",)),
    # out-of-range values, through flags and --set
    Case("envs-zero", ("--envs", "0"), ("env.num_envs",)),
    Case("envs-negative", ("--envs", "-4"), ("env.num_envs",)),
    Case("episodes-zero", ("--episodes", "0"), ("train.episodes",)),
    Case("episodes-negative", ("--episodes", "-1"), ("train.episodes",)),
    Case("steps-negative", ("--steps", "-100"), ("train.steps",)),
    Case("train-ratio-negative", ("--train-ratio", "-0.5"), ("train.train_ratio",)),
    Case(
        "buffer-smaller-than-batch",
        ("--set", "buffer.capacity=16", "--set", "buffer.batch_size=32"),
        ("buffer.capacity", "buffer.batch_size"),
    ),
    Case("board-too-small", ("--set", "env.size=3"), ("env.size",)),
    Case("snake-longer-than-board", ("--set", "env.initial_length=9"), ("env.initial_length", "env.size")),
    Case("lr-zero", ("--set", "agent.lr=0"), ("agent.lr",)),
    Case("gamma-above-one", ("--set", "agent.gamma=1.5"), ("agent.gamma",)),
    Case("no-hidden-layers", ("--set", "agent.hidden=[]"), ("agent.hidden",)),
    Case("threads-negative", ("--set", "run.threads=-1"), ("run.threads",)),
    # devices and knobs that cannot apply here
    Case("device-unknown", ("--device", "tpu"), ("run.device",)),
    Case("amp-fp16-on-cpu", ("--set", "train.amp=fp16"), ("train.amp",)),
    Case("compile-cuda-graphs-on-cpu", ("--set", "train.compile=reduce-overhead"), ("train.compile",)),
    # memory: refused before allocation, with the size asked for and what is free
    Case("replay-too-big", ("--set", "buffer.capacity=100000000000000"), ("buffer.capacity", "TiB", "free")),
    Case("network-too-big", ("--set", "agent.hidden=[10000000,10000000]"), ("agent.hidden", "TiB", "free")),
    Case("too-many-boards", ("--envs", "100000000000"), ("env.num_envs", "TiB", "free")),
    # config files
    Case("config-missing", ("-c", "{dir}/nope.toml"), ("nope.toml",)),
    Case("config-malformed", ("-c", "{dir}/bad.toml"), ("bad.toml", "malformed"), {"bad.toml": "[train\nsteps = "}),
    Case(
        "config-unknown-key",
        ("-c", "{dir}/typo.toml"),
        ("typo.toml", "train.stesp", "did you mean"),
        {"typo.toml": "[train]\nsteps = 100\nstesp = 5\n"},
    ),
    Case("config-unknown-section", ("-c", "{dir}/sec.toml"), ("sec.toml", "trian"), {"sec.toml": "[trian]\nsteps = 100\n"}),
    Case(
        "config-wrong-type",
        ("-c", "{dir}/type.toml"),
        ("type.toml", "env.num_envs"),
        {"type.toml": '[train]\nsteps = 100\n[env]\nnum_envs = "256"\n'},
    ),
    Case("config-is-a-directory", ("-c", "{dir}"), ("config path",)),
    Case("config-not-utf8", ("-c", "{dir}/latin1.toml"), ("latin1.toml",), {"latin1.toml": "# caf\udce9\n"}),
    # option parsing (click) errors, also one line
    Case("envs-not-a-number", ("--envs", "abc"), ("--envs",)),
    Case("unknown-option", ("--stesp", "5"), ("--stesp", "--steps")),
    Case("option-without-value", ("--steps",), ("--steps",)),
    # where the run would be written
    Case("name-with-slash", ("--name", "a/b"), ("a/b",)),
    Case("out-is-a-file", ("--out", "{dir}/file"), ("file",), {"file": "not a directory\n"}),
    # bounds a run could not use: counters past 64 bits, a vector step of hours, a replay that never fills
    Case("steps-above-2**63", ("--steps", str(2**63)), ("train.steps", "2**63-1")),
    Case("episodes-above-2**63", ("--episodes", str(2**64)), ("train.episodes", "2**63-1")),
    Case("train-ratio-huge", ("--set", "train.train_ratio=1e9"), ("train.train_ratio", "10,000")),
    Case("learning-starts-above-capacity", ("--set", "train.learning_starts=6000"),
         ("train.learning_starts", "buffer.capacity", "never train")),
]

if not torch.cuda.is_available():
    TRAIN_CASES.append(Case("cuda-without-cuda", ("--device", "cuda"), ("cuda", "--device cpu")))



def assert_one_line_error(code: int, out: str, err: str, names: tuple[str, ...]) -> None:
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rlperf: error: ")
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"


def prepare(case: Case, folder: Path) -> tuple[list[str], Path]:
    """The case's argv (its files created in ``folder``) and the --out folder that must stay empty."""
    for name, text in (case.files or {}).items():
        (folder / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    args = [a.format(dir=folder) for a in case.args]
    out = folder / "out"
    if "--out" not in args:
        args += ["--out", str(out)]
    return ["train", *BASE, *args], out


def nothing_written(out: Path, folder: Path, case: Case) -> bool:
    if "--out" in case.args:  # the case's own --out is a file, which must be left as it was
        return (folder / "file").read_text() == "not a directory\n" and sorted(p.name for p in folder.iterdir()) == ["file"]
    return not out.exists() or not any(out.iterdir())


def test_at_least_25_train_cases() -> None:
    assert len(TRAIN_CASES) >= 25
    assert len({c.id for c in TRAIN_CASES}) == len(TRAIN_CASES)


@pytest.mark.parametrize("case", TRAIN_CASES, ids=lambda c: c.id)
def test_train_bad_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, out = prepare(case, tmp_path)
    code, stdout, stderr = run_main(argv, capsys)
    assert_one_line_error(code, stdout, stderr, case.names)
    assert nothing_written(out, tmp_path, case)


# -- --resume ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = config_from("smoke", ["run.device=cpu", "run.threads=1", "train.log_every=2"], steps=64)
    return train_run(cfg, out=tmp_path_factory.mktemp("runs"), quiet=True, dashboard=False).run_dir


def _edit_checkpoint(run_dir: Path, edit: object) -> None:
    """A checkpoint as rlperf would have written it with the edit: its digest matches (a damaged
    digest is a case of its own, in test_faults.py)."""
    from rlperf.run.checkpoint import with_digest

    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    edit(state)  # type: ignore[operator]
    torch.save(with_digest(state), run_dir / "checkpoint.pt")


def _newer_checkpoint(run_dir: Path) -> None:
    _edit_checkpoint(run_dir, lambda s: s.update(schema=s["schema"] + 1))


def _other_board_checkpoint(run_dir: Path) -> None:
    _edit_checkpoint(run_dir, lambda s: s["config"]["env"].update(size=8))


def _newer_record(run_dir: Path) -> None:
    import json

    record = json.loads((run_dir / "run.json").read_text())
    write_json_atomic(run_dir / "run.json", {**record, "schema": record["schema"] + 1})


class Planted:
    """A class a raw-pickle checkpoint names: loading it would run whatever its module does."""


def _pickled_checkpoint(run_dir: Path) -> None:
    torch.save({"schema": 1, "planted": Planted()}, run_dir / "checkpoint.pt")


def _metrics_through_a_link(run_dir: Path) -> None:
    outside = run_dir.parent / "outside.csv"
    (run_dir / "metrics.csv").rename(outside)
    (run_dir / "metrics.csv").symlink_to(outside)


def _metrics_cut_short(run_dir: Path) -> None:
    path = run_dir / "metrics.csv"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # the last row, at env step 64, is gone


RESUME_CASES = [
    # (id, how to damage a copy of a finished run, extra args, names in the line)
    ("not-a-run-directory", lambda d: [p.unlink() for p in d.iterdir()], (), ("not a run directory",)),
    ("no-checkpoint", lambda d: (d / "checkpoint.pt").unlink(), (), ("checkpoint.pt",)),
    (
        "corrupt-checkpoint",
        lambda d: (d / "checkpoint.pt").write_bytes(b"not a checkpoint"),
        (),
        ("checkpoint.pt", "cannot read"),
    ),
    ("newer-checkpoint-schema", _newer_checkpoint, (), ("checkpoint.pt", "schema 2")),
    ("newer-record-schema", _newer_record, (), ("run.json", "schema 2")),
    ("checkpoint-from-another-config", _other_board_checkpoint, (), ("env.size=8", "incompatible")),
    ("changed-board-size", None, ("--set", "env.size=8"), ("env.size", "cannot change")),
    ("changed-envs", None, ("--envs", "32"), ("env.num_envs", "cannot change")),
    ("changed-seed", None, ("--seed", "7"), ("run.seed", "cannot change")),
    ("unknown-key", None, ("--set", "train.stepz=9"), ("train.stepz", "did you mean")),
    ("with-config", None, ("-c", "smoke"), ("--config", "--resume")),
    ("with-name", None, ("--name", "x"), ("--name", "--resume")),
    ("already-complete", None, (), ("train.steps=64", "--steps")),
    ("shorter-than-done", None, ("--steps", "32"), ("train.steps=32",)),
    # torch's whole caution, not cut at "Re-running torch.load with weights_only set to False".
    ("raw-pickle-checkpoint", _pickled_checkpoint, ("--steps", "128"),
     ("weights_only", "arbitrary code execution", "Do it only if you got the file from a trusted source")),
    ("metrics-csv-symlink", _metrics_through_a_link, ("--steps", "128"), ("metrics.csv", "symbolic link")),
    # --out with --resume is refused, not ignored: the resume writes into RUN_DIR
    ("with-out", None, ("--out", "elsewhere", "--steps", "128"), ("--out", "--resume")),
    # a learning curve that lost rows before the checkpoint: the resumed curve would have a gap
    ("metrics-csv-cut-short", _metrics_cut_short, ("--steps", "128"), ("metrics.csv", "env step 64", "gap")),
    ("metrics-csv-missing", lambda d: (d / "metrics.csv").unlink(), ("--steps", "128"), ("metrics.csv", "no rows", "gap")),
    ("metrics-csv-emptied", lambda d: (d / "metrics.csv").write_bytes(b""), ("--steps", "128"),
     ("metrics.csv", "no rows", "gap")),
]


@pytest.mark.parametrize("case", RESUME_CASES, ids=lambda c: c[0])
def test_resume_bad_input(case: tuple, finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, damage, args, names = case
    run_dir = tmp_path / finished_run.name
    shutil.copytree(finished_run, run_dir)
    if damage is not None:
        damage(run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}  # through a link: the file outside
    code, stdout, stderr = run_main(["train", "--resume", str(run_dir), *args], capsys)
    assert_one_line_error(code, stdout, stderr, names)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # nothing written


@pytest.mark.parametrize("target", ["missing", "file"])
def test_resume_from_a_path_that_is_not_a_directory(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    if target == "file":
        path.write_text("{}")
    code, stdout, stderr = run_main(["train", "--resume", str(path)], capsys)
    assert_one_line_error(code, stdout, stderr, (str(path), "no such directory" if target == "missing" else "not a directory"))


# -- end to end, in real processes -------------------------------------------------------------


def test_bad_input_end_to_end_in_subprocesses(tmp_path: Path) -> None:
    """``python -m rlperf train`` with each kind of mistake: exit 2, one line, no traceback, no files."""
    (tmp_path / "bad.toml").write_text("[train]\nsteps = 1\nstesp = 2\n")
    cases = {  # three kinds: a config file's key, an option's value, a resume target
        "config-file": (["-c", str(tmp_path / "bad.toml")], "train.stesp"),
        "option-value": (["--envs", "abc"], "--envs"),
        "resume-not-a-run": (["--resume", str(tmp_path)], "not a run directory"),
    }
    env = {k: v for k, v in os.environ.items() if k != "RLPERF_DEBUG"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "rlperf", "train", *args, "--out", str(tmp_path / name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name, (args, _) in cases.items()
    }
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert_one_line_error(proc.returncode, stdout, stderr, (cases[name][1],))
        assert not (tmp_path / name).exists()
