"""Run records and run directories: the unit of evidence ``compare`` and ``sweep`` read.

A run directory holds ``run.json`` (the record, :mod:`rlperf.run.record`), ``metrics.csv`` (the learning curve),
``config.toml`` and ``checkpoint.pt``. Everything here is written atomically (temp file in the
same directory, fsync, ``os.replace``) so a crash or Ctrl-C never leaves a half-written file, and
two runs never share a directory.

A write the filesystem refuses (full disk, quota, read-only, no free inodes) raises
:class:`rlperf.errors.DiskError`: one line naming the path, the bytes it needed and what was free.
The temp file is removed first, so a refused write leaves neither a 0-byte nor a temp file, and
``metrics.csv`` is cut back to its last whole row. A temp file left by a process that was killed
(``.NAME.<pid>.<hex>.tmp``, pid dead, directory not locked by a live run) is removed by the next
run started in the same ``--out``.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import io
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from rlperf.errors import DiskError, RlperfError
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


_TEMP = re.compile(r"^\..+\.(\d+)\.[0-9a-f]+\.tmp$")
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
        stale = [f for f in os.listdir(folder) if (m := _TEMP.match(f)) and not pid_alive(int(m.group(1)))]
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


# -- disk errors -------------------------------------------------------------------------------


def _free(path: Path) -> tuple[int, int] | None:
    """Free bytes and free inodes on the filesystem holding ``path`` (or its nearest existing parent)."""
    for folder in (path, *path.parents):
        try:
            st = os.statvfs(folder)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize, st.f_favail
    return None


def disk_error(path: str | Path, nbytes: int | None, err: OSError) -> DiskError:
    """The one-line error for a write the filesystem refused."""
    path = Path(path)
    reason = err.strerror or str(err)
    wanted = f"{nbytes:,} bytes to write" if nbytes is not None else "bytes to write unknown"
    free = _free(path)
    if free is None:
        where = wanted
    elif free[1] == 0 and err.errno == errno.ENOSPC:
        where = f"{wanted}, no free inodes"
    else:
        where = f"{wanted}, {free[0]:,} bytes free"
    hints = {errno.ENOSPC: "free some space or pass another --out", errno.EDQUOT: "raise the quota or pass another --out",
             errno.EROFS: "pass a writable --out"}
    return DiskError(f"cannot write {path}: {reason} ({where})", hint=hints.get(err.errno or 0, "pass a writable --out"))


class _Recording:
    """A file that remembers the first OSError its ``write`` raised: libraries such as ``torch.save``
    wrap it in their own exception, and the disk error must still be told as one."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.error: OSError | None = None
        self.written = 0

    def write(self, data: Any) -> int:
        try:
            n = self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise
        self.written += n or 0
        return n

    def flush(self) -> None:
        try:
            self._f.flush()
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class _Counting:
    """A sink that only counts the bytes written to it (the size of a write that failed)."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.n += size
        return size

    def flush(self) -> None:
        pass


# -- atomic writes -----------------------------------------------------------------------------


def _write_atomic(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through ``write(file)`` so that it is either the old file or the whole new one.

    A refused write (full disk, quota, read-only, no inodes) removes the temp file and raises
    DiskError with the bytes the whole file needs.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # os.open with 0o666 honours the umask, unlike mkstemp's 0o600.
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise disk_error(path, _size_of(write), e) from None
    f: _Recording | None = None
    try:
        with os.fdopen(fd, "wb") as raw:
            f = _Recording(raw)
            write(f)  # type: ignore[arg-type]
            f.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        cause = f.error if f is not None and f.error is not None else exc if isinstance(exc, OSError) else None
        if cause is not None:
            raise disk_error(path, _size_of(write), cause) from None
        raise
    _fsync_dir(path.parent)


def _size_of(write: Callable[[IO[bytes]], None]) -> int | None:
    """The bytes ``write`` produces (written again into a counter; only on the error path)."""
    sink = _Counting()
    try:
        write(sink)  # type: ignore[arg-type]
    except Exception:
        return None
    return sink.n


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _json_default(obj: Any) -> Any:
    """Encode the values a record naturally holds: numpy scalars/arrays, paths, devices, dataclasses."""
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy scalar or array, 0-d tensor
        return obj.tolist()
    if isinstance(obj, Path) or type(obj).__name__ == "device":  # a path, a torch.device
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""

    def write(f: IO[bytes]) -> None:
        # Streams into the temp file: an unencodable value deep inside fails after the file was
        # opened, which is exactly the case the atomic write protects ``path`` from.
        text = _TextSink(f)
        json.dump(obj, text, indent=2, default=_json_default)
        text.write("\n")

    _write_atomic(path, write)


class _TextSink:
    """Minimal text writer over a binary file (what ``json.dump`` needs)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def write(self, s: str) -> int:
        return self._f.write(s.encode("utf-8"))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")

    def write(f: IO[bytes]) -> None:
        f.write(data)

    _write_atomic(path, write)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""

    def write(f: IO[bytes]) -> None:
        f.write(data)

    _write_atomic(path, write)


def copy_atomic(source: str | Path, path: str | Path) -> None:
    """Copy the file ``source`` to ``path`` atomically (an artifact made in a scratch folder)."""

    def write(f: IO[bytes]) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)

    _write_atomic(path, write)


def save_torch_atomic(path: str | Path, obj: Any) -> None:
    """``torch.save(obj)`` to ``path`` atomically (a checkpoint is never half written)."""
    import torch  # here, not at the top: a run directory for an external record needs no torch

    _write_atomic(path, lambda f: torch.save(obj, f))


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
        self.path: Path | None = run_dir / f".reserve.{os.getpid()}.{secrets.token_hex(4)}.tmp"
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
