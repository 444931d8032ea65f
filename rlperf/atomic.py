"""Atomic file writes with no run semantics: a file is either the old one or the whole new one.

Every write goes to a temp file in the same directory (``.NAME.<pid>.<hex>.tmp``), is fsynced, and
replaces the target with ``os.replace``; the directory is fsynced after the rename. A write the
filesystem refuses (full disk, quota, read-only, no free inodes) removes the temp file and raises
:class:`rlperf.errors.DiskError`: one line naming the path, the bytes it needed and what was free.
Run directories and records, which build on this, are :mod:`rlperf.run.files`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from rlperf.errors import DiskError

TEMP_NAME = re.compile(r"^\..+\.(\d+)\.[0-9a-f]+\.tmp$")
"""How a temp file of this module (or any file named like one) is named; group 1 is the writer's pid."""


def temp_path(path: Path) -> Path:
    """A fresh temp file's path beside ``path``, named after this process (:data:`TEMP_NAME`)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


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
    tmp = temp_path(path)
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
    fsync_dir(path.parent)


def _size_of(write: Callable[[IO[bytes]], None]) -> int | None:
    """The bytes ``write`` produces (written again into a counter; only on the error path)."""
    sink = _Counting()
    try:
        write(sink)  # type: ignore[arg-type]
    except Exception:
        return None
    return sink.n


def fsync_dir(directory: Path) -> None:
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
