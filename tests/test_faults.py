"""Faults a long run meets: full disks, signals in every command, damaged state, hung actors.

The fault-injection suite. Every case injects one fault and asserts what a user sees and what is
left on disk:

- **disk**: a real tmpfs of a few hundred KiB (when this process may mount one), else a
  fault-injecting writer that gives ``rlperf.run.files`` the same small filesystem (ENOSPC after a
  partial write, no free inodes); plus a read-only mount.
- **signals**: SIGINT/SIGTERM at seeded random points (during start-up, during the run) to the
  process or its whole group, for train, profile (in-process and under py-spy), sweep, compare,
  and a Ray sweep. ``RLPERF_FAULT_SEED`` picks another schedule.
- **checkpoints**: bit flips at seeded random offsets (inside tensors and anywhere), zeroed bytes,
  hand-edited fields.
- **async**: SIGKILL of the whole process group, then ``/dev/shm``; a stopped (SIGSTOP) actor.

Each case asserts the exit code, one line on stderr where there is an error (never a traceback),
and a consistent run directory (:func:`assert_consistent`): a record that reads back, a checkpoint
whose digest holds, whole metrics rows, no temp or 0-byte file -- or nothing at all.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from conftest import run_cli as run_main
from rlperf import atomic
from rlperf.config import config_from
from rlperf.run import files as files_mod
from rlperf.run.checkpoint import check_digest, state_digest, with_digest
from rlperf.run.files import METRICS_NAME, RECORD_NAME, STATUSES, read_record
from rlperf.run.lifecycle import train_run
from rlperf.run.record import METRICS_FIELDS

SEED = int(os.environ.get("RLPERF_FAULT_SEED", "18"))
BASE = ["-c", "smoke", "--set", "run.device=cpu", "--set", "run.threads=1"]


# -- what every case checks ----------------------------------------------------------------------



def one_line(err: str, *names: str) -> str:
    """stderr is exactly one line (no traceback) mentioning each of ``names``; returns it."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    return lines[0]


def files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def assert_consistent(run_dir: Path) -> dict[str, Any] | None:
    """A run directory as a user may find it after any fault; returns its record (or None)."""
    names = {p.name for p in run_dir.iterdir()}
    assert not [n for n in names if n.endswith(".tmp")], f"temp files left: {names}"
    assert not [p.name for p in run_dir.iterdir() if p.is_file() and p.stat().st_size == 0], f"0-byte files: {names}"
    record = read_record(run_dir) if RECORD_NAME in names else None
    if record is not None:
        assert record["status"] in STATUSES
        if record["status"] == "failed":
            assert record.get("error")
    if "checkpoint.pt" in names:
        state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
        check_digest(state, run_dir / "checkpoint.pt")
        if record is not None and record.get("checkpoint") and "progress" in state:
            assert record["checkpoint"]["env_steps"] == state["progress"]["env_steps"]
    if METRICS_NAME in names:
        data = (run_dir / METRICS_NAME).read_bytes()
        assert data.endswith(b"\n"), "metrics.csv ends inside a row"
        rows = list(csv.reader(data.decode().splitlines()))
        assert rows[0] == list(METRICS_FIELDS)
        if record is not None and len(rows) > 1:
            assert int(rows[-1][0]) <= record["totals"]["vector_steps"]
    return record


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


# -- disks -----------------------------------------------------------------------------------------


class InjectedDisk:
    """A fault-injecting writer: what ``rlperf.run.files`` sees of the filesystem under ``root`` is
    ``size`` bytes and ``inodes`` files, as on a small disk -- a write past the end writes what fits
    and the next one fails with ENOSPC; a file or directory past the inodes fails to be created.
    It stands in for ``os`` in that module (every write rlperf makes goes through it)."""

    def __init__(self, root: Path, size: int, inodes: int | None = None) -> None:
        self.root, self.size, self.inodes = str(root), size, inodes

    def _mine(self, path: Any) -> bool:
        return os.path.abspath(os.fspath(path)).startswith(self.root)

    def _fd_mine(self, fd: int) -> bool:
        try:
            return self._mine(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return False

    def used(self) -> tuple[int, int]:
        total, count = 0, 0
        for folder, dirs, names in os.walk(self.root):
            count += len(dirs) + len(names)
            total += sum(os.lstat(os.path.join(folder, n)).st_size for n in names)
        return total, count

    def _room(self) -> int:
        return self.size - self.used()[0]

    def _inode(self, path: Any) -> None:
        if self.inodes is not None and self._mine(path) and not os.path.exists(path) and self.used()[1] >= self.inodes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))

    def open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if flags & os.O_CREAT:
            self._inode(path)
        return os.open(path, flags, mode, **kw)

    def mkdir(self, path: Any, mode: int = 0o777, **kw: Any) -> None:
        self._inode(path)
        os.mkdir(path, mode, **kw)

    def write(self, fd: int, data: Any) -> int:
        if not self._fd_mine(fd):
            return os.write(fd, data)
        room = self._room()
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, bytes(data)[:room])

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        if self._fd_mine(fd) and length > self._room():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, offset, length)

    def fdopen(self, fd: int, *args: Any, **kw: Any) -> Any:
        f = os.fdopen(fd, *args, **kw)
        return _BudgetedFile(f, self) if self._fd_mine(fd) else f

    def statvfs(self, path: Any) -> Any:
        if not self._mine(path):
            return os.statvfs(path)
        real, (used, count) = os.statvfs(path), self.used()
        free_inodes = max(0, self.inodes - count) if self.inodes is not None else real.f_favail
        blocks = self.size // real.f_frsize
        free = max(0, self.size - used) // real.f_frsize
        return os.statvfs_result((real.f_bsize, real.f_frsize, blocks, free, free, real.f_files, free_inodes,
                                  free_inodes, real.f_flag, real.f_namemax))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


class _BudgetedFile:
    def __init__(self, f: Any, disk: InjectedDisk) -> None:
        self._f, self._disk = f, disk

    def write(self, data: Any) -> int:
        data = bytes(data)
        self._f.flush()
        room = self._disk._room()
        if len(data) > room:
            if room > 0:
                self._f.write(data[:room])
                self._f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __enter__(self) -> _BudgetedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _mount(folder: Path, options: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@contextlib.contextmanager
def small_disk(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int,
               inodes: int | None = None, read_only: bool = False) -> Iterator[Path]:
    """A directory on a filesystem of ``size`` bytes (and ``inodes`` files): a real tmpfs, or the
    fault-injecting writer over a plain directory."""
    folder = tmp_path / f"disk-{kind}"
    if kind == "tmpfs":
        options = f"size={size}" + (f",nr_inodes={inodes + 1}" if inodes is not None else "")  # + the root
        if not _mount(folder, options):
            pytest.skip("cannot mount a tmpfs here (not root); the injected-writer variant covers this case")
        try:
            if read_only:
                subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, timeout=10)
            yield folder
        finally:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=10)
    else:
        if read_only:
            pytest.skip("read-only is a mount option: tmpfs only")
        folder.mkdir(parents=True)
        injected = InjectedDisk(folder, size, inodes)
        for module in (files_mod, atomic):  # run directories, and the atomic writes under them
            monkeypatch.setattr(module, "os", injected)
        yield folder


DISKS = ["tmpfs", "injected"]
# 16 boards x 6x6, capacity 5000: the checkpoint is about 300 KB, the record 5 KB, a metrics row 100 B.
TRAIN = ["train", *BASE, "--quiet"]


@pytest.mark.parametrize("kind", DISKS)
def test_disk_smaller_than_a_record_leaves_nothing(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with small_disk(kind, tmp_path, monkeypatch, size=48 * 1024) as disk:
        out = disk / "runs"
        code, stdout, err = run_main([*TRAIN, "--steps", "320", "--out", str(out)], capsys)
        assert code == 2 and stdout == ""
        one_line(err, "cannot write", "run.json", "bytes to write", "bytes free")
        assert files_in(disk) == [] and not out.exists()  # nothing at all, the --out it created included


@pytest.mark.parametrize("kind", DISKS)
def test_no_free_inodes_leaves_nothing(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    # The run directory and the record's reserve fit; config.toml's temp file does not.
    with small_disk(kind, tmp_path, monkeypatch, size=4 * 2**20, inodes=2) as disk:
        code, _, err = run_main([*TRAIN, "--steps", "320", "--out", str(disk)], capsys)
        assert code == 2
        one_line(err, "config.toml", "no free inodes")
        assert list(disk.iterdir()) == []


@pytest.mark.parametrize("kind", DISKS)
def test_final_checkpoint_on_a_full_disk_fails_the_run_and_keeps_the_last_good_one(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The first checkpoint (10 vector steps: a nearly empty replay) fits; the final one (2000 steps) does not.
    with small_disk(kind, tmp_path, monkeypatch, size=200 * 1024) as disk:
        code, _, err = run_main([*TRAIN, "--set", "train.log_every=10", "--out", str(disk)], capsys)
        assert code == 2
        line = one_line(err, "checkpoint.pt", "No space left on device", "bytes to write", "run.json says failed",
                        "checkpoint.pt is from env step 160")
        (run_dir,) = run_dirs(disk)
        record = assert_consistent(run_dir)
        assert record is not None and record["status"] == "failed" and "checkpoint.pt" in record["error"]
        assert record["checkpoint"]["env_steps"] == 160 < record["totals"]["env_steps"] == 2000
        assert "free some space" in line


@pytest.mark.parametrize("kind", DISKS)
def test_first_checkpoint_on_a_full_disk_fails_the_run_with_its_record(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A bigger board: the first checkpoint (replay of 12 x 7 x 7 grid observations) is already too big.
    with small_disk(kind, tmp_path, monkeypatch, size=160 * 1024) as disk:
        code, _, err = run_main([*TRAIN, "--set", "train.log_every=4", "--set", "env.obs=grid", "--set", "env.size=7",
                                 "--steps", "640", "--out", str(disk)], capsys)
        assert code == 2
        line = one_line(err, "checkpoint.pt", "No space left on device", "run.json says failed", "there is no checkpoint")
        (run_dir,) = run_dirs(disk)
        record = assert_consistent(run_dir)
        assert record is not None and record["status"] == "failed" and record["checkpoint"] is None
        assert not (run_dir / "checkpoint.pt").exists()
        assert "bytes to write" in line


@pytest.mark.parametrize("kind", DISKS)
def test_metrics_filling_the_disk_still_gets_a_failed_record(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with small_disk(kind, tmp_path, monkeypatch, size=112 * 1024) as disk:
        code, _, err = run_main([*TRAIN, "--steps", "40000", "--set", "train.log_every=1", "--set",
                                 "train.checkpoint=false", "--out", str(disk)], capsys)
        assert code == 2
        one_line(err, "metrics.csv", "No space left on device", "run.json says failed")
        (run_dir,) = run_dirs(disk)
        record = assert_consistent(run_dir)  # metrics.csv was cut back to its last whole row
        assert record is not None and record["status"] == "failed" and "metrics.csv" in record["error"]
        assert 0 < record["totals"]["env_steps"] < 40000


@pytest.mark.parametrize("kind", DISKS)
def test_resume_onto_a_full_disk_changes_nothing(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with small_disk(kind, tmp_path, monkeypatch, size=1024 * 1024) as disk:
        cfg = config_from("smoke", ["run.device=cpu", "run.threads=1", "train.log_every=10"], steps=320)
        run_dir = train_run(cfg, out=disk, quiet=True, dashboard=False).run_dir
        (disk / "filler").write_bytes(b"\0" * (1024 * 1024 - sum(p.stat().st_size for p in files_in(disk)) - 16 * 1024))
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        code, _, err = run_main(["train", "--resume", str(run_dir), "--steps", "640", "--quiet"], capsys)
        assert code == 2
        one_line(err, "No space left on device")
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # not "interrupted" vs a newer curve
        assert_consistent(run_dir)


@pytest.mark.parametrize("case", ["new-run-no-checkpoint", "new-run-with-checkpoint", "resume"])
def test_a_record_that_cannot_be_written_leaves_nothing_or_a_resumable_run(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The filesystem refuses run.json itself (gone read-only, or full despite the reserve)."""
    import rlperf.run.core as core

    out = tmp_path / "runs"
    sets = ["--set", "train.log_every=10", "--steps", "320"]
    resumed = None
    if case == "resume":
        cfg = config_from("smoke", ["run.device=cpu", "run.threads=1", "train.log_every=10"], steps=320)
        resumed = train_run(cfg, out=out, quiet=True, dashboard=False).run_dir
        before = snapshot(resumed)
    real = core.write_json_atomic

    def refused(path: Any, obj: Any) -> None:
        if Path(path).name == RECORD_NAME:
            raise atomic.disk_error(path, 4096, OSError(errno.EROFS, os.strerror(errno.EROFS)))
        real(path, obj)

    monkeypatch.setattr(core, "write_json_atomic", refused)
    if resumed is not None:
        argv = ["train", "--resume", str(resumed), "--steps", "640", "--quiet"]
    else:
        argv = [*TRAIN, *sets, *(["--set", "train.checkpoint=false"] if "no-checkpoint" in case else []), "--out", str(out)]
    code, _, err = run_main(argv, capsys)
    assert code == 2
    line = one_line(err, "run.json", "Read-only file system")
    if case == "new-run-no-checkpoint":
        assert "nothing of it was kept" in line and not out.exists()
    elif case == "new-run-with-checkpoint":
        (run_dir,) = run_dirs(out)
        assert f"continue it with rlperf train --resume {run_dir}" in line
        assert assert_consistent(run_dir) is None and (run_dir / "checkpoint.pt").exists()
        assert metrics_rows(run_dir) == 2  # the curve stays whole: a resume drops what follows the checkpoint
    else:  # its final checkpoint was written: the run is finished but unrecorded, and a resume records it
        assert resumed is not None
        assert {k: v for k, v in snapshot(resumed).items() if k not in ("checkpoint.pt", "config.toml", METRICS_NAME)} \
            == {k: v for k, v in before.items() if k not in ("checkpoint.pt", "config.toml", METRICS_NAME)}
        monkeypatch.undo()
        code, _, err = run_main(["train", "--resume", str(resumed), "--steps", "640", "--quiet"], capsys)
        assert code == 0, err
        record = assert_consistent(resumed)
        assert record is not None and record["recovered"] and record["totals"]["env_steps"] == 640


def test_read_only_out_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with small_disk("tmpfs", tmp_path, monkeypatch, size=2**20, read_only=True) as disk:
        code, _, err = run_main([*TRAIN, "--steps", "320", "--out", str(disk / "runs")], capsys)
        assert code == 2
        one_line(err, str(disk / "runs"), "Read-only file system")
        assert list(disk.iterdir()) == []


@pytest.mark.parametrize("kind", DISKS)
def test_sweep_on_a_full_disk_stops_with_consistent_trials(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with small_disk(kind, tmp_path, monkeypatch, size=600 * 1024) as disk:
        # Each trial's final checkpoint is about 300 KB: the second one does not fit.
        code, _, err = run_main(["sweep", *BASE, "--set", "train.log_every=25", "--train-ratio", "1,2,3",
                                 "--out", str(disk), "--quiet"], capsys)
        assert code == 2
        one_line(err, "No space left on device")
        (sweep_dir,) = run_dirs(disk)
        assert not list(sweep_dir.glob(".*.tmp"))
        trials = run_dirs(sweep_dir)
        assert trials
        records = [assert_consistent(d) for d in trials]
        assert records[0] is not None and records[0]["status"] == "completed"
        assert any(r is not None and r["status"] == "failed" for r in records)
        if (sweep_dir / "sweep.json").exists():  # written if it fit: the failed trial, and the rest not run
            data = json.loads((sweep_dir / "sweep.json").read_text())
            assert [t["status"] for t in data["trials"]] == ["completed", "failed", "not run"]


# -- damaged state ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished smoke run (checkpoint, record, metrics) that cases copy and damage."""
    cfg = config_from("smoke", ["run.device=cpu", "run.threads=1", "train.log_every=10"], steps=640)
    return train_run(cfg, out=tmp_path_factory.mktemp("finished"), quiet=True, dashboard=False).run_dir


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / run_dir.name
    shutil.copytree(run_dir, target)
    return target


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: (p.read_bytes() if p.is_file() else b"<dir>") for p in run_dir.iterdir()}


def tensor_spans(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of each tensor's bytes inside a torch zip checkpoint (stored uncompressed)."""
    spans = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if "/data/" not in info.filename or info.file_size < 8:
                continue
            f.seek(info.header_offset + 26)
            name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
            spans.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    return spans


def _flips() -> list[tuple[str, int]]:
    rng = random.Random(SEED)
    return [("tensor" if i % 2 == 0 else "anywhere", rng.randrange(2**31)) for i in range(16)]


@pytest.mark.parametrize(("where", "draw"), _flips(), ids=lambda v: str(v))
def test_a_flipped_bit_in_the_checkpoint_is_refused_or_harmless(
        where: str, draw: int, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_run(finished, tmp_path)
    path = run_dir / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    if where == "tensor":
        offset, size = random.Random(draw).choice(tensor_spans(path))
        at = offset + draw % size
    else:
        at = draw % len(data)
    data[at] ^= 1 << (draw % 8)
    path.write_bytes(bytes(data))
    original = torch.load(finished / "checkpoint.pt", weights_only=True)
    try:  # what the flip did: nothing (a byte no reader looks at), or damage
        harmless = state_digest(torch.load(path, weights_only=True)) == state_digest(original)
    except Exception:
        harmless = False
    before = snapshot(run_dir)
    code, _, err = run_main(["train", "--resume", str(run_dir), "--steps", "800", "--quiet"], capsys)
    if harmless:
        assert code == 0, err
        assert read_record(run_dir)["totals"]["env_steps"] == 800
    else:
        assert code == 2
        one_line(err, "checkpoint")
        assert snapshot(run_dir) == before  # refused before anything was written


def test_zeroed_bytes_inside_a_tensor_are_refused(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """8 zeroed bytes inside a tensor still unpickle; the digest catches them."""
    run_dir = copy_run(finished, tmp_path)
    path = run_dir / "checkpoint.pt"
    offset, size = max(tensor_spans(path), key=lambda span: span[1])
    data = bytearray(path.read_bytes())
    at = next(i for i in range(offset + size // 2, offset + size - 8) if any(data[i:i + 8]))  # bytes that change
    data[at:at + 8] = bytes(8)
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True)  # it still loads
    code, _, err = run_main(["train", "--resume", str(run_dir), "--steps", "800", "--quiet"], capsys)
    assert code == 2
    one_line(err, "checkpoint.pt is damaged", "digest")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    section, key = path.split(".")
    return lambda state: state[section].__setitem__(key, value)


TAMPERED = [
    ("negative-env-steps", _set("progress.env_steps", -100), "progress.env_steps = -100"),
    ("env-steps-as-text", _set("progress.env_steps", "528"), "progress.env_steps = '528'"),
    ("missing-episodes", lambda s: s["progress"].pop("episodes"), "progress.episodes missing"),
    ("unknown-device", _set("run.device", "banana"), "run.device = 'banana'"),
    ("steps-disagree", _set("progress.env_steps", 48), "vector_steps x env.num_envs"),
    ("updates-disagree", _set("agent.updates", 3), "agent.updates = 3"),
    ("epsilon-out-of-range", _set("progress.epsilon", 7.0), "progress.epsilon = 7.0"),
    ("wall-time-not-finite", _set("run.wall_s", float("inf")), "run.wall_s"),
    ("unknown-progress-key", _set("progress.hacked", 1), "progress.hacked"),
    ("no-digest", lambda s: s.pop("digest"), "no digest"),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in TAMPERED], ids=[c[0] for c in TAMPERED])
def test_tampered_checkpoint_fields_are_refused_in_one_line(
        edit: Callable[[dict[str, Any]], None], message: str, finished: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_run(finished, tmp_path)
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    edit(state)
    # Re-digested (a careful hand edit, or another program): the fields themselves must be checked.
    torch.save(with_digest(state) if "digest" in state else state, run_dir / "checkpoint.pt")
    before = snapshot(run_dir)
    code, _, err = run_main(["train", "--resume", str(run_dir), "--steps", "800", "--quiet"], capsys)
    assert code == 2
    one_line(err, "checkpoint.pt", message)
    assert snapshot(run_dir) == before


METRICS_DAMAGE = [
    ("random-bytes", lambda p: p.write_bytes(random.Random(SEED).randbytes(300)), "not a metrics file"),
    ("directory", lambda p: (p.unlink(), p.mkdir()), "is a directory"),
    ("foreign-header", lambda p: p.write_text("a,b,c\n1,2,3\n"), "has columns a,b,c"),
]


@pytest.mark.parametrize(("damage", "message"), [c[1:] for c in METRICS_DAMAGE], ids=[c[0] for c in METRICS_DAMAGE])
def test_resume_with_a_damaged_metrics_file_writes_nothing(
        damage: Callable[[Path], Any], message: str, finished: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_run(finished, tmp_path)
    damage(run_dir / METRICS_NAME)
    before = snapshot(run_dir)
    code, _, err = run_main(["train", "--resume", str(run_dir), "--steps", "800", "--quiet"], capsys)
    assert code == 2
    one_line(err, "metrics.csv", message)
    assert snapshot(run_dir) == before  # config.toml included


@pytest.mark.parametrize("record", ["missing", "stale"])
def test_a_finished_run_killed_before_its_record_gets_it_from_resume(
        record: str, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kill -9 between the final checkpoint's rename and run.json: the record is missing, or is the
    previous segment's (an interrupted run that was resumed to the end)."""
    run_dir = copy_run(finished, tmp_path)
    original = read_record(run_dir)
    if record == "missing":
        (run_dir / RECORD_NAME).unlink()
        code, _, err = run_main(["compare", str(run_dir), str(finished)], capsys)
        assert code == 2
        one_line(err, "has no run.json yet", f"rlperf train --resume {run_dir}")
    else:
        stale = {**original, "status": "interrupted", "checkpoint": {**original["checkpoint"], "env_steps": 320}}
        (run_dir / RECORD_NAME).write_text(json.dumps(stale))
    metrics = (run_dir / METRICS_NAME).read_bytes()
    code, _, err = run_main(["train", "--resume", str(run_dir), "--quiet"], capsys)
    assert code == 0, err
    recovered = assert_consistent(run_dir)
    assert recovered is not None and recovered["status"] == "completed" and recovered["recovered"]["from"] == "checkpoint.pt"
    for key in ("totals", "learning", "phases", "config", "started_at", "resumed"):
        if key == "totals":
            assert {k: v for k, v in recovered[key].items() if k != "wall_s"} == \
                {k: v for k, v in original[key].items() if k != "wall_s"}
        else:
            assert recovered[key] == original[key], key
    assert recovered["memory"]["peak_rss_mb"] is None and recovered["memory"]["rss_scope"] == "not measured"
    assert (run_dir / METRICS_NAME).read_bytes() == metrics  # nothing trained
    code, _, err = run_main(["train", "--resume", str(run_dir), "--quiet"], capsys)
    assert code == 2
    one_line(err, "already reached train.steps=640")  # recorded now: a second resume has nothing to do


# -- signals at seeded random points, every command ------------------------------------------------

LONG = ["--set", "train.log_every=5", "--quiet"]
COMMANDS: dict[str, list[str]] = {
    "train": ["train", *BASE, "--steps", "400000", *LONG],
    "profile": ["profile", *BASE, "--steps", "400000", *LONG],
    "profile-pyspy": ["profile", *BASE, "--steps", "400000", "--py-spy", *LONG],
    "sweep": ["sweep", *BASE, "--steps", "100000", "--train-ratio", "1,2,3", *LONG],
    "compare": ["compare", *BASE, "--steps", "100000", "--vs", "train.train_ratio=2", *LONG],
}


@dataclass
class Scenario:
    command: str
    point: str  # "startup": a delay after the process installed its handlers; "running": after metrics rows
    signum: int
    group: bool  # to the whole process group (a terminal's Ctrl-C) or to the process alone
    delay: float
    rows: int = 0

    @property
    def id(self) -> str:
        to = "group" if self.group else "proc"
        return f"{self.command}-{self.point}-{signal.Signals(self.signum).name}-{to}"


@dataclass
class Outcome:
    code: int
    stderr: str
    out: Path
    pid: int
    descendants: set[int] = field(default_factory=set)


def schedule() -> list[Scenario]:
    """Each command gets SIGINT at one point and SIGTERM at the other (which is which, the target
    and the delays are drawn from SEED); py-spy also gets the three ways of stopping it explicitly."""
    rng = random.Random(SEED)
    plan = []
    for command in COMMANDS:
        kinds = [signal.SIGINT, signal.SIGTERM]
        rng.shuffle(kinds)
        plan.append(Scenario(command, "startup", kinds[0], rng.random() < 0.5, rng.uniform(0.0, 1.5)))
        if command != "profile-pyspy":
            plan.append(Scenario(command, "running", kinds[1], rng.random() < 0.5, rng.uniform(0.0, 0.05),
                                 rng.randint(1, 4)))
    # py-spy: three ways of stopping it (Ctrl-C to the group, SIGTERM or SIGINT to rlperf alone).
    plan += [Scenario("profile-pyspy", "running", s, g, rng.uniform(0.0, 0.05), rng.randint(1, 4))
             for s, g in ((signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGINT, False))]
    return plan


def handlers_installed(pid: int) -> bool:
    """Whether the process catches SIGTERM yet (rlperf's handler, installed first thing)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def metrics_rows(out: Path) -> int:
    return max((p.read_bytes().count(b"\n") - 1 for p in out.rglob(METRICS_NAME) if p.is_file()), default=0)


def play(scenario: Scenario, base: Path) -> Outcome:
    out = base / scenario.id
    env = {k: v for k, v in os.environ.items() if k != "RLPERF_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "rlperf", *COMMANDS[scenario.command], "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    seen: set[int] = set()
    next_watch = 0.0

    def watch(force: bool = False) -> None:  # every process the command started, seen now and then
        nonlocal next_watch
        if force or time.monotonic() >= next_watch:
            next_watch = time.monotonic() + 0.25
            with contextlib.suppress(psutil.Error):
                seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))

    deadline = time.monotonic() + 180
    def ready() -> bool:
        return handlers_installed(proc.pid) if scenario.point == "startup" else metrics_rows(out) >= scenario.rows

    while not ready():
        watch()
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{scenario.id}: ended or timed out before the signal: {proc.communicate()[1][-2000:]}")
        time.sleep(0.005 if scenario.point == "startup" else 0.02)
    time.sleep(scenario.delay)
    watch(force=True)
    if scenario.group:
        os.killpg(proc.pid, scenario.signum)
    else:
        proc.send_signal(scenario.signum)
    while proc.poll() is None:
        watch()
        time.sleep(0.05)
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    return Outcome(proc.returncode, err, out, proc.pid, seen)


SCENARIOS = schedule()


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every scenario, four at a time (each is a real ``python -m rlperf`` process)."""
    from concurrent.futures import ThreadPoolExecutor

    base = tmp_path_factory.mktemp("signals")
    wanted = [s for s in SCENARIOS if "pyspy" not in s.command or shutil.which("py-spy")]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {s.id: pool.submit(play, s, base) for s in wanted}
    return {name: f.result() for name, f in futures.items()}


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_a_signal_stops_every_command_cleanly(scenario: Scenario, played: dict[str, Outcome]) -> None:
    if scenario.id not in played:
        pytest.skip("py-spy is not installed")
    o = played[scenario.id]
    name = signal.Signals(scenario.signum).name
    assert o.code == 128 + scenario.signum, f"exit {o.code}: {o.stderr[-2000:]}"
    assert "Traceback" not in o.stderr and "KeyboardInterrupt" not in o.stderr, o.stderr
    written = files_in(o.out)
    if not written:  # stopped while starting: one line, nothing written
        one_line(o.stderr, f"interrupted by {name}", "nothing was written")
    else:
        assert not [p for p in written if p.name.endswith(".tmp")], written
        folders = {p.parent for p in written if p.name in (RECORD_NAME, "config.toml", METRICS_NAME)}
        records = [assert_consistent(d) for d in sorted(folders)]
        statuses = [r["status"] for r in records if r is not None]
        assert all(s in ("completed", "interrupted") for s in statuses), statuses
        assert statuses.count("interrupted") <= 1  # only the run in progress was cut
        assert len(statuses) == len(records), "a run directory without its record"
        if scenario.command == "sweep":
            (sweep_dir,) = run_dirs(o.out)
            assert all((sweep_dir / f).is_file() for f in ("sweep.json", "sweep.csv", "sweep.png"))
            data = json.loads((sweep_dir / "sweep.json").read_text())
            assert data["interrupted"] and data["trials"][-1]["status"] in ("not run", "interrupted")
            assert f"{name}" in o.stderr or "interrupted" in o.stderr
        if scenario.command.startswith("profile") and statuses:
            record = read_record(next(iter(folders)))
            assert "profile" in record  # the profile section of what was measured
            if scenario.command == "profile-pyspy":
                assert record["profile"]["py_spy"].get("svg") == "pyspy.svg", record["profile"]["py_spy"]
                assert "py-spy skipped" not in o.stderr  # never run again in-process
    left = [p for p in o.descendants if _running(p)]
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _running(p)]
    assert not left, f"processes left behind: {left}"
    import tempfile

    assert not list(Path(tempfile.gettempdir()).glob(f"rlperf-*-{o.pid}-*")), "scratch folder left behind"


def test_the_schedule_covers_every_command_both_signals_and_both_points() -> None:
    for command in COMMANDS:
        mine = [s for s in SCENARIOS if s.command == command]
        assert {s.signum for s in mine} == {signal.SIGINT, signal.SIGTERM}
        assert {s.point for s in mine} == {"startup", "running"}


# -- async: a killed process group, a stalled actor ---------------------------------------------------

ASYNC = ["train", *BASE, "--steps", "1000000000", "--quiet", "--set", "run.mode=async", "--set", "async.actors=2",
         "--set", "async.envs_per_actor=8", "--set", "train.log_every=5"]
SHM = Path("/dev/shm")


def _start_async(out: Path, *sets: str) -> subprocess.Popen[bytes]:
    args = [a for item in sets for a in ("--set", item)]
    env = {k: v for k, v in os.environ.items() if k != "RLPERF_DEBUG"}
    return subprocess.Popen([sys.executable, "-m", "rlperf", *ASYNC, *args, "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _actor_steps(proc: subprocess.Popen[bytes], sets: tuple[str, ...]) -> list[tuple[int, int, int]] | None:
    """(pid, state, vector steps) of each actor, read from the run's shared segment like any observer."""
    import numpy as np

    from rlperf.dqn import QNetwork
    from rlperf.env.vector import observation_shape
    from rlperf.run.actors import SLOT, layout_for

    found = list(SHM.glob(f"rlperf_{proc.pid}_*_run"))
    if not found:
        return None
    flags = [a for item in sets for a in ("--set", item)]
    argv = [*ASYNC, *flags]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cfg = config_from("smoke", overrides, steps=10**9)
    shape = observation_shape(cfg.env.size, cfg.env.obs, cfg.env.flood_fill)
    layout = layout_for(cfg, shape, sum(p.numel() for p in QNetwork(shape, 3, list(cfg.agent.hidden)).parameters()))[0]
    try:
        slots = layout.views(np.memmap(found[0], dtype=np.uint8, mode="r", shape=(layout.nbytes,)))["slots"].copy()
    except (OSError, ValueError):
        return None
    return [(int(row[SLOT["pid"]]), int(row[SLOT["state"]]), int(row[SLOT["vector_steps"]])) for row in slots]


def _wait_stepping(proc: subprocess.Popen[bytes], sets: tuple[str, ...]) -> list[int]:
    """Until every actor has taken a few steps; returns their pids."""
    from rlperf.run.actors import RUNNING

    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        actors = _actor_steps(proc, sets)
        if actors and all(state == RUNNING and steps >= 3 for _, state, steps in actors):
            return [pid for pid, _, _ in actors]
        time.sleep(0.1)


def _semaphores(pid: int) -> list[Path]:
    """The named semaphores a process has open: /dev/shm/sem.* files with the inodes of its mappings
    (glibc maps a semaphore through a temp name, so the mapping shows the inode, not the name)."""
    with open(f"/proc/{pid}/maps") as f:
        inodes = {int(line.split()[4]) for line in f if "/dev/shm/sem." in line}
    return [p for p in SHM.glob("sem.*") if p.stat().st_ino in inodes]


@pytest.fixture(scope="module")
def async_faults(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two async runs at once: one whose whole process group gets SIGKILL, one whose actor gets SIGSTOP."""
    base = tmp_path_factory.mktemp("async")
    killed_sets, stalled_sets = ("async.buffer=locked",), ("async.stall_timeout_s=3",)
    killed = _start_async(base / "killed", *killed_sets)
    stalled = _start_async(base / "stalled", *stalled_sets)
    try:
        _wait_stepping(killed, killed_sets)
        owned = [*SHM.glob(f"rlperf_{killed.pid}_*"), *_semaphores(killed.pid)]
        group = [p.pid for p in psutil.Process(killed.pid).children(recursive=True)]
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(10)
        victim = _wait_stepping(stalled, stalled_sets)[0]
        stalled_group = [p.pid for p in psutil.Process(stalled.pid).children(recursive=True)]
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, err = stalled.communicate(timeout=120)
        ended_after = time.monotonic() - stopped_at
    finally:
        for proc in (killed, stalled):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return {"owned": owned, "group": group, "killed_out": base / "killed", "stalled_code": stalled.returncode,
            "stalled_err": err.decode(), "victim": victim, "ended_after": ended_after, "stalled_out": base / "stalled",
            "stalled_group": stalled_group}


def test_sigkill_of_an_async_group_leaves_no_shared_memory_semaphore_or_actor(async_faults: dict[str, Any]) -> None:
    owned = async_faults["owned"]
    assert any(p.name.startswith("rlperf_") for p in owned) and any(p.name.startswith("sem.") for p in owned), owned
    deadline = time.monotonic() + 10  # the janitor acts when the learner's pipe closes
    while any(p.exists() for p in owned) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in owned if p.exists()], "left in /dev/shm"
    assert not [p for p in async_faults["group"] if _running(p)], "processes left behind"
    (run_dir,) = run_dirs(async_faults["killed_out"])
    # What the next run in this --out does first: the killed run's temp files (its record's reserve) go.
    stale = sorted(p.name for p in run_dir.glob(".*.tmp"))
    assert sorted(p.name for p in files_mod.tidy_stale_temps(async_faults["killed_out"])) == stale
    assert_consistent(run_dir)  # killed: no record, whole rows, no temp files left


def test_a_stalled_actor_is_detected_within_its_timeout_and_ends_the_run(async_faults: dict[str, Any]) -> None:
    assert async_faults["stalled_code"] == 1, async_faults["stalled_err"]
    assert async_faults["ended_after"] < 3 + 9  # the timeout, a check interval, and stopping the others
    (run_dir,) = run_dirs(async_faults["stalled_out"])
    record = assert_consistent(run_dir)
    assert record is not None and record["status"] == "failed"
    victim = async_faults["victim"]
    assert f"(pid {victim}) took no step for" in record["error"] and "async.stall_timeout_s=3" in record["error"]
    failure = record["async"]["failure"]
    assert failure["pid"] == victim and failure["exit_code"] == -signal.SIGKILL and failure["stalled_s"] >= 3
    assert "Traceback" not in async_faults["stalled_err"]
    time.sleep(0.5)
    assert not [p for p in async_faults["stalled_group"] if _running(p)], "processes left behind"


# -- Ray sweeps ------------------------------------------------------------------------------------

RAY_SWEEP = ["sweep", *BASE, "--steps", "400000", "--backend", "ray", "--train-ratio", "1,2,4", "--set",
             "train.checkpoint=false", *LONG]


@pytest.fixture(scope="module")
def ray_signals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Two Ray sweeps at once (each its own local Ray instance): Ctrl-C to the whole group while
    trials run, and SIGTERM to the driver alone."""
    pytest.importorskip("ray.tune", reason="Ray is the optional extra 'ray'")
    from concurrent.futures import ThreadPoolExecutor

    base = tmp_path_factory.mktemp("ray")
    COMMANDS["ray-sweep"] = RAY_SWEEP
    scenarios = [Scenario("ray-sweep", "running", signal.SIGINT, True, 0.0, 2),
                 Scenario("ray-sweep", "running", signal.SIGTERM, False, 0.0, 2)]
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {s.id: pool.submit(play, s, base) for s in scenarios}
        return {name: f.result() for name, f in futures.items()}
    finally:
        COMMANDS.pop("ray-sweep")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c-to-group", "sigterm-to-driver"])
def test_a_signal_stops_a_ray_sweep_with_its_trials_recorded(signum: int, ray_signals: dict[str, Outcome]) -> None:
    name = signal.Signals(signum).name
    o = ray_signals[f"ray-sweep-running-{name}-{'group' if signum == signal.SIGINT else 'proc'}"]
    assert o.code == 128 + signum, o.stderr[-3000:]
    one_line(o.stderr, "sweep: 3 trials, interrupted")  # no Ray messages, no traceback
    (sweep_dir,) = run_dirs(o.out)
    assert all((sweep_dir / f).is_file() for f in ("sweep.json", "sweep.csv", "sweep.png"))
    assert not (sweep_dir / ".stop").exists()
    data = json.loads((sweep_dir / "sweep.json").read_text())
    statuses = [t["status"] for t in data["trials"]]
    assert data["interrupted"] and "interrupted" in statuses and set(statuses) <= {"interrupted", "not run"}, statuses
    for t in data["trials"]:
        if t["status"] == "interrupted":  # stopped at a step boundary, its record written
            assert read_record(t["run_dir"])["status"] == "interrupted"
            assert_consistent(Path(t["run_dir"]))
        else:
            assert t["run_dir"] is None
    left = [p for p in o.descendants if _running(p)]
    deadline = time.monotonic() + 20  # Ray's own processes wind down after ray.shutdown()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if _running(p)]
    assert not left, f"processes left behind: {[psutil.Process(p).cmdline() for p in left if _running(p)]}"


# -- other defects a long run met, one test each -----------------------------------------------------

TINY = [*BASE, "--steps", "256", "--set", "train.learning_starts=64", "--set", "train.checkpoint=false",
        "--set", "train.log_every=8", "--quiet"]


def _signal_in_trial(monkeypatch: pytest.MonkeyPatch, which: int, signals: list[int]) -> None:
    """The ``which``-th run (1-based) gets ``signals`` at its third vector step, from inside the loop."""
    import rlperf.run.lifecycle as lifecycle

    real, calls = lifecycle.train_run, []

    def train_run_with_signal(cfg: Any, **kwargs: Any) -> Any:
        calls.append(cfg)
        if len(calls) == which:
            steps: list[int] = []

            def on_step() -> None:
                steps.append(1)
                if len(steps) == 3:
                    for signum in signals:
                        os.kill(os.getpid(), signum)

            kwargs["hooks"] = lifecycle.RunHooks(on_step=on_step)
        return real(cfg, **kwargs)

    monkeypatch.setattr(lifecycle, "train_run", train_run_with_signal)


def test_sigterm_stops_a_sweep_with_143_and_a_double_ctrl_c_keeps_every_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _signal_in_trial(monkeypatch, 2, [signal.SIGTERM])
    code, _, err = run_main(["sweep", *TINY, "--train-ratio", "1,2,4", "--out", str(tmp_path / "term")], capsys)
    assert code == 143, err
    _signal_in_trial(monkeypatch, 2, [signal.SIGINT, signal.SIGINT])  # Ctrl-C pressed twice
    code, stdout, err = run_main(["sweep", *TINY, "--train-ratio", "1,2,4", "--out", str(tmp_path / "twice")], capsys)
    assert code == 130, err
    for out in ("term", "twice"):
        (sweep_dir,) = run_dirs(tmp_path / out)
        assert all((sweep_dir / f).is_file() for f in ("sweep.json", "sweep.csv", "sweep.png"))
        statuses = [t["status"] for t in json.loads((sweep_dir / "sweep.json").read_text())["trials"]]
        assert statuses == ["completed", "interrupted", "not run"]
    # The summary line survives the second Ctrl-C (with --quiet it is the one line on stdout).
    assert "sweep: 3 trials, interrupted" in stdout


def test_sigterm_stops_a_comparison_with_143(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _signal_in_trial(monkeypatch, 3, [signal.SIGTERM])
    code, _, err = run_main(["compare", *TINY, "--vs", "train.train_ratio=2", "--repeats", "2",
                             "--out", str(tmp_path)], capsys)
    assert code == 143, err
    assert "compare: interrupted; the table holds the runs that finished" in err
    (folder,) = run_dirs(tmp_path)
    assert sorted(read_record(d)["status"] for d in run_dirs(folder)) == ["completed", "completed", "interrupted"]


@pytest.mark.parametrize("args", [
    ["--seed", "18446744073709551616"],
    ["--seed", "-9223372036854775809"],
    ["--seed", "-1"],
    ["--set", "run.seed=99999999999999999999999"],
], ids=["2**64", "below-int64", "negative", "set-huge"])
def test_seeds_outside_the_range_are_one_line(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["train", *TINY, *args, "--out", str(tmp_path / "runs")], capsys)
    assert code == 2 and out == ""
    one_line(err, "run.seed")
    assert not (tmp_path / "runs").exists()


def test_the_largest_seed_runs_and_its_repeats_are_refused_up_front(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["train", *TINY, "--seed", str(2**63 - 1), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err
    code, _, err = run_main(["sweep", *TINY, "--seed", str(2**63 - 1), "--train-ratio", "1,2", "--repeats", "2",
                             "--out", str(tmp_path / "runs")], capsys)
    assert code == 2
    one_line(err, "run.seed", "--repeats 2")
    assert not (tmp_path / "runs").exists()


def test_compare_refuses_what_is_not_a_run_record(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep-x"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"schema": 1, "kind": "sweep", "trials": [], "summary": []}))
    schema_only = tmp_path / "schema.json"
    schema_only.write_text('{"schema": 1}')
    listed = tmp_path / "listed" / RECORD_NAME
    listed.parent.mkdir()
    listed.write_text(json.dumps({**read_record(finished), "phases": [1, 2]}))
    code, _, _ = run_main(["compare", str(finished), str(finished), "--json"], capsys)
    assert code == 0  # a real record compares
    for bad, names in ((sweep / "sweep.json", ("sweep's summary", "trial000")), (schema_only, ("not a run record",)),
                       (listed, ("damaged", "phases"))):
        code, out, err = run_main(["compare", str(finished), str(bad), "--out", str(tmp_path / "runs")], capsys)
        assert code == 2 and out == ""
        one_line(err, str(bad), *names)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("argv", "names"), [
    (["bogus"], ("No such command 'bogus'", "commands: train, profile, sweep, compare")),
    (["--bogus"], ("No such option: --bogus",)),
    (["train", *TINY, "--name", "x" * 300], ("is 300 bytes long",)),
    (["train", *TINY, "--name", "two\nlines"], ("control character",)),
    (["profile", *TINY, "--name", "x" * 300], ("is 300 bytes long",)),
    (["sweep", *TINY, "--train-ratio", "1,2", "--name", "a/b"], ("cannot be a directory name",)),
    (["compare", *TINY, "--vs", "train.train_ratio=2", "--name", "x" * 300], ("is 300 bytes long",)),
    (["sweep", *TINY, "--envs", "1,x"], ("env.num_envs", '"x"')),
], ids=["unknown-command", "unknown-option", "long-name", "newline-name", "profile-long-name", "sweep-slash-name",
        "compare-long-name", "sweep-bad-value"])
def test_user_errors_are_one_line_and_write_or_run_nothing(argv: list[str], names: tuple[str, ...], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out" / "runs"
    code, stdout, err = run_main([*argv, "--out", str(out)] if argv[0] in COMMANDS else argv, capsys)
    assert code == 2 and stdout == ""
    one_line(err, *names)
    assert not (tmp_path / "out").exists()  # not even the --out tree: no run or trial started


def test_stale_temp_files_of_killed_processes_are_tidied_at_the_next_start(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    old = copy_run(finished, out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = old / f".checkpoint.pt.{dead}.0123abcd.tmp"
    stale.write_bytes(b"x" * 1000)  # what kill -9 during a checkpoint write leaves
    live = old / f".run.json.{os.getpid()}.0123abcd.tmp"  # a live process's write in progress
    live.write_bytes(b"{")
    cfg = config_from("smoke", ["run.device=cpu", "run.threads=1"], steps=64)
    train_run(cfg, out=out, quiet=True, dashboard=False)
    assert not stale.exists() and live.exists()
    live.unlink()
    assert_consistent(old)


@pytest.mark.parametrize("presses", [1, 2])
def test_signal_during_start_up_is_one_line(presses: int, tmp_path: Path) -> None:
    """Ctrl-C while the command is importing torch: one line, not a KeyboardInterrupt traceback (nor
    an abort from an exception thrown through torch's C++). Once: the command stops before writing
    anything; twice: at once."""
    proc = subprocess.Popen([sys.executable, "-m", "rlperf", *TRAIN, "--out", str(tmp_path / "runs")],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    while not handlers_installed(proc.pid) and proc.poll() is None:
        time.sleep(0.002)
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    one_line(err, "interrupted by SIGINT", "nothing was written")
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def output_faults(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """train and compare with an ASCII-only stdout, a closed stdout, and a pipe closed after one byte."""
    base = tmp_path_factory.mktemp("output")
    env = {k: v for k, v in os.environ.items() if k != "RLPERF_DEBUG"}
    train = [sys.executable, "-m", "rlperf", *TRAIN[:-1], "--steps", "256"]
    cases = {
        "ascii-train": ([*train, "--out", str(base / "ascii-train")], {"PYTHONIOENCODING": "ascii"}, {}),
        "ascii-compare": ([sys.executable, "-m", "rlperf", "compare", "smoke", "--vs", "train.train_ratio=2", "--steps",
                           "256", "--set", "run.threads=1", "--set", "run.device=cpu", "--out", str(base / "ascii-compare")],
                          {"PYTHONIOENCODING": "ascii", "LC_ALL": "C"}, {}),
        "closed-stdout": ([*train, "--out", str(base / "closed-stdout")], {}, {"stdout": None}),
        "broken-pipe": ([*train, "--json", "--out", str(base / "broken-pipe")], {}, {"stdout": "pipe"}),
    }
    procs = {}
    for name, (argv, extra, how) in cases.items():
        kwargs: dict[str, Any] = {"stderr": subprocess.PIPE, "env": {**env, **extra}, "text": True}
        if how.get("stdout") is None and "stdout" in how:
            kwargs["pass_fds"], kwargs["stdout"] = (), None
            kwargs["preexec_fn"] = lambda: os.close(1)  # rlperf ... >&-
        elif how.get("stdout") == "pipe":
            kwargs["stdout"] = subprocess.PIPE
        else:
            kwargs["stdout"] = subprocess.PIPE
        procs[name] = subprocess.Popen(argv, **kwargs)
    reader = procs["broken-pipe"]
    assert reader.stdout is not None
    reader.stdout.close()  # like `| head -c 0`: the reader is gone before the record is printed
    results = {}
    for name, proc in procs.items():
        stdout, err = proc.communicate(timeout=180) if name != "broken-pipe" else (None, proc.stderr.read())
        proc.wait(timeout=180)
        results[name] = (proc.returncode, (stdout or "") + "\n" + err, base / name)
    return results


@pytest.mark.parametrize("case", ["ascii-train", "ascii-compare", "closed-stdout", "broken-pipe"])
def test_output_that_cannot_be_written_never_fails_a_finished_run(case: str, output_faults: dict[str, Any]) -> None:
    code, text, out = output_faults[case]
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    dirs = run_dirs(out)
    assert dirs
    for d in dirs:
        if (d / RECORD_NAME).exists() or (d / "config.toml").exists():
            assert assert_consistent(d) is not None
        else:  # a comparison's folder
            assert all(assert_consistent(r) is not None for r in run_dirs(d))


def test_an_interrupted_run_suggests_resume_only_when_it_can_be_resumed() -> None:
    from rlperf.cli.train import status_line

    record = {"name": "r", "run_dir": "runs/r", "status": "interrupted", "checkpoint": {"env_steps": 64},
              "config": {"run": {"mode": "sync"}, "env": {"backend": "tensor"}}}
    assert "continue with: rlperf train --resume runs/r" in (status_line(record, quiet=True) or "")
    for backend in ("gym-sync", "gym-async"):
        gym = {**record, "config": {"run": {"mode": "sync"}, "env": {"backend": backend}}}
        assert "--resume" not in (status_line(gym, quiet=True) or "")
