"""Run records and run directories: the unit of evidence ``compare`` and ``sweep`` read.

A run directory holds ``run.json`` (the record, :mod:`rlperf.run.record`), ``metrics.csv`` (the learning curve),
``config.toml`` and ``checkpoint.pt``. Everything is written atomically (:mod:`rlperf.atomic`) so a
crash or Ctrl-C never leaves a half-written file, and two runs never share a directory.

A write the filesystem refuses raises :class:`rlperf.errors.DiskError` (:func:`rlperf.atomic.disk_error`)
and leaves neither a 0-byte nor a temp file; ``metrics.csv`` is cut back to its last whole row. A temp
file left by a process that was killed (``.NAME.<pid>.<hex>.tmp``, pid dead, directory not locked
by a live run) is removed by the next run started in the same ``--out``.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlperf.atomic import TEMP_NAME, disk_error, temp_path, write_text_atomic
from rlperf.errors import RlperfError
from rlperf.run.schema import (  # noqa: F401 (the names a run directory's readers and writers share)
    CHECKPOINT_NAME, RECORD_NAME, RUN_KINDS, SCHEMA, STATUSES, check_comparable_record, read_record,
)

CONFIG_NAME = "config.toml"
METRICS_NAME = "metrics.csv"

NAME_MAX_BYTES = 200
"""Longest ``--name`` (UTF-8 bytes): the directory adds ``-YYYYmmdd-HHMMSS[-k]`` and must stay
under the 255 bytes most filesystems allow for one name."""

# -- run directories ---------------------------------------------------------------------------


def check_run_name(name: str | None) -> None:
    """Refuse a ``--name`` that cannot be one directory name, before anything is created."""
    if name is None:
        return
    shown = repr(name) if len(name) <= 60 else repr(name[:57] + "...")
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise RlperfError(f"run name {shown} cannot be a directory name", hint="use letters, digits, '-', '_', '.'")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise RlperfError(f"run name {shown} contains a control character (newline, tab, ...)",
                          hint="use letters, digits, '-', '_', '.'")
    size = len(name.encode("utf-8", errors="surrogatepass"))
    if size > NAME_MAX_BYTES:
        raise RlperfError(f"run name {shown} is {size} bytes long, at most {NAME_MAX_BYTES} fit in a directory name",
                          hint="pass a shorter --name")


# The directories make_run_dir created for a run directory (itself and the parents that did not
# exist), so that a run that cannot even start leaves nothing behind.
_CREATED: dict[Path, list[Path]] = {}


def make_run_dir(out: str | Path, name: str | None, prefix: str) -> Path:
    """Create and return a new directory ``out/{name or prefix}-{YYYYmmdd-HHMMSS}[-k]``.

    ``os.mkdir`` fails when the directory exists, so two runs started in the same second with the
    same name (even from threads or processes at once) get ``...-2``, ``...-3`` and never share.
    Temp files that killed processes left in ``out`` are removed first (:func:`tidy_stale_temps`).
    """
    out = Path(out)
    check_run_name(name)
    stem = name or prefix
    check_run_name(stem)
    missing = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RlperfError(f"cannot create output directory {out}: {e.strerror or e}", hint="pass a writable --out") from None
    tidy_stale_temps(out)
    base = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    for k in range(1, 10_000):
        path = out / (base if k == 1 else f"{base}-{k}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        except OSError as e:
            _remove_empty(missing)
            raise RlperfError(f"cannot create run directory {path}: {e.strerror or e}", hint="pass a writable --out") from None
        _CREATED[path] = [path, *missing]
        return path
    raise RlperfError(f"too many runs named {base} in {out}", hint="pass another --name")


def discard_run_dir(run_dir: Path) -> bool:
    """Remove a run directory this process created and that must not stay (the run could not start,
    or could not write anything worth keeping), with the ``--out`` parents it created; True if removed."""
    created = _CREATED.pop(run_dir, None)
    if created is None:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    _remove_empty(created[1:])
    return not run_dir.exists()


def forget_run_dir(run_dir: Path) -> None:
    """The run directory holds a record now: it is the user's, never discarded."""
    _CREATED.pop(run_dir, None)


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # innermost first
        try:
            folder.rmdir()
        except OSError:
            return


_RUN_DIR = re.compile(r"-\d{8}-\d{6}(-\d+)?$")  # what make_run_dir names a directory


def tidy_stale_temps(out: str | Path, depth: int = 2) -> list[Path]:
    """Remove temp files left by killed processes in the run directories under ``out`` (and the run
    directories under a sweep's or comparison's folder): a temp whose writer's pid is gone, in a
    directory no live rlperf run holds locked. Only directories named like run directories are
    looked into. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(out))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not _RUN_DIR.search(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
        except OSError:
            continue
        removed += _tidy_dir(Path(entry.path))
        if depth > 1:
            removed += tidy_stale_temps(entry.path, depth - 1)
    return removed


def _tidy_dir(folder: Path) -> list[Path]:
    try:
        stale = [f for f in os.listdir(folder) if (m := TEMP_NAME.match(f)) and not pid_alive(int(m.group(1)))]
    except OSError:
        return []
    if not stale:
        return []
    try:
        fd = lock_run_dir(folder)
    except (RlperfError, OSError):  # a live run holds it (or it cannot be opened): leave it alone
        return []
    removed = []
    try:
        for name in stale:
            with contextlib.suppress(OSError):
                os.unlink(folder / name)
                removed.append(folder / name)
    finally:
        os.close(fd)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- learning curve ----------------------------------------------------------------------------


def read_metrics_header(path: str | Path, fieldnames: Iterable[str]) -> list[str] | None:
    """The header of an existing ``metrics.csv`` (None when there is none yet), checked against
    ``fieldnames``; raises RlperfError (one line) for a file that is not this run's learning curve.
    Reads only: a resume checks this before it writes anything."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RlperfError(f"cannot read {path}: {e.strerror or e}") from None
    # Rows are appended through this name: a symbolic link (or a second hard link) would write them
    # into a file outside the run directory, a FIFO or a device would block or swallow them.
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        what = ("a directory" if stat.S_ISDIR(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode)
                else "a file with other hard links" if stat.S_ISREG(st.st_mode) else "not a regular file")
        raise RlperfError(f"{path} is {what}, not the run's own metrics file",
                          hint="move it away; the run's learning curve cannot be continued there")
    try:
        with open(path, "rb") as f:
            head = f.readline(1 << 16)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RlperfError(f"cannot read {path}: {e.strerror or e}") from None
    if not head.strip():
        return None
    if not head.endswith(b"\n"):
        return None  # the header itself was cut short: the file is started again
    try:
        line = head.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise RlperfError(f"{path} is not a metrics file (not UTF-8 text)",
                          hint="resume into the run directory that wrote it") from None
    header = next(csv.reader([line]))
    expected = list(fieldnames)
    if header != expected[: len(header)]:  # a file written before columns were added keeps its own
        shown = ",".join(header)
        raise RlperfError(
            f"{path} has columns {shown if len(shown) <= 120 else shown[:117] + '...'}, expected {','.join(expected)}",
            hint="resume into the run directory that wrote it",
        )
    return header


class MetricsCSV:
    """Appends learning-curve rows to a CSV file, each row one ``write`` to the OS.

    A new file is created with its header atomically (never a 0-byte file); reopening an existing
    file (``--resume``) checks that the header matches, or is the start of the columns (a file
    written before columns were added keeps its own), and appends below it. A last line cut short
    by a crash is dropped on reopening. A row the filesystem refuses is cut back out (the file ends
    at its last whole row) and raises DiskError. Missing fields are left empty; unknown fields are
    an error.
    """

    def __init__(self, path: str | Path, fieldnames: Iterable[str]) -> None:
        self.path = Path(path)
        self.fieldnames = list(fieldnames)
        existing = read_metrics_header(self.path, self.fieldnames)
        self.columns = existing if existing is not None else self.fieldnames
        if existing is None:
            write_text_atomic(self.path, self._encode(None))
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
            size = os.fstat(self._fd).st_size
            if existing is not None:
                with open(self.path, "rb") as f:
                    data = f.read()
                size = data.rfind(b"\n") + 1  # crashed mid-row: continue a clean file
                if size < len(data):
                    os.ftruncate(self._fd, size)
        except OSError as e:
            raise disk_error(self.path, None, e) from None
        self.started_at = self.size = size

    def _encode(self, row: Mapping[str, Any] | None) -> str:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.columns, restval="", lineterminator="\r\n",
                                extrasaction="ignore" if self.columns != self.fieldnames else "raise")
        if row is None:
            writer.writeheader()
        else:
            writer.writerow(row)
        return text.getvalue()

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row; a refused write is cut back out and raises DiskError."""
        data = memoryview(self._encode(row).encode("utf-8"))
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, data[done:])
        except OSError as e:
            self._cut(self.size)
            raise disk_error(self.path, len(data), e) from None
        self.size += len(data)

    def rollback(self) -> None:
        """Cut the file back to what it held when it was opened (a resume that could not be recorded)."""
        self._cut(self.started_at)
        self.size = self.started_at

    def _cut(self, size: int) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> MetricsCSV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- space for the record -----------------------------------------------------------------------

RESERVE_BYTES = 64 * 1024
"""Space a run holds back from its start so that its record can be written when the disk fills up."""


class SpaceReserve:
    """A hidden file of :data:`RESERVE_BYTES` in the run directory, allocated when the run starts
    and removed right before the record is written: a run that fills the disk can still say so in
    its ``run.json``. Named like a temp file, so one left by a killed process is tidied like one."""

    def __init__(self, run_dir: Path, nbytes: int = RESERVE_BYTES) -> None:
        self.path: Path | None = temp_path(run_dir / "reserve")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            self.path = None
            raise disk_error(run_dir / RECORD_NAME, nbytes, e) from None
        try:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.write(fd, bytes(nbytes))  # a filesystem without fallocate: real zeros
        except OSError as e:
            os.close(fd)
            self.release()
            raise disk_error(run_dir / RECORD_NAME, nbytes, e) from None
        os.close(fd)

    def release(self) -> None:
        """Give the space back (idempotent)."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.path = None


# -- locking ------------------------------------------------------------------------------------


def lock_run_dir(run_dir: Path) -> int:
    """Hold an exclusive lock on the run directory (released when the fd closes or the process ends,
    however it ends); returns the fd to close."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RlperfError(f"run {run_dir} is in use by another rlperf process",
                          hint="wait for it to end or stop it first") from None
    return fd
