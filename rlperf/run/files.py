"""Run records and run directories: the unit of evidence ``compare`` and ``sweep`` read.

A run directory holds ``run.json`` (the record, :mod:`rlperf.run.record`), ``metrics.csv`` (the learning curve),
``config.toml`` and ``checkpoint.pt``. Everything here is written atomically (temp file in the
same directory, fsync, ``os.replace``) so a crash or Ctrl-C never leaves a half-written file, and
two runs never share a directory.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from rlperf.errors import RlperfError

SCHEMA = 1
"""Version of the record and checkpoint layouts; bump it when a reader would misread an older one."""

RECORD_NAME = "run.json"
CONFIG_NAME = "config.toml"
METRICS_NAME = "metrics.csv"
CHECKPOINT_NAME = "checkpoint.pt"


# -- run directories ---------------------------------------------------------------------------


def make_run_dir(out: str | Path, name: str | None, prefix: str) -> Path:
    """Create and return a new directory ``out/{name or prefix}-{YYYYmmdd-HHMMSS}[-k]``.

    ``os.mkdir`` fails when the directory exists, so two runs started in the same second with the
    same name (even from threads or processes at once) get ``...-2``, ``...-3`` and never share.
    """
    out = Path(out)
    stem = name or prefix
    if not stem or stem in (".", "..") or "/" in stem or "\\" in stem or "\0" in stem:
        raise RlperfError(f"run name {stem!r} cannot be a directory name", hint="use letters, digits, '-', '_', '.'")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RlperfError(f"cannot create output directory {out}: {e.strerror or e}", hint="pass a writable --out") from None
    base = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    for k in range(1, 10_000):
        path = out / (base if k == 1 else f"{base}-{k}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        except OSError as e:
            raise RlperfError(f"cannot create run directory {path}: {e.strerror or e}", hint="pass a writable --out") from None
        return path
    raise RlperfError(f"too many runs named {base} in {out}", hint="pass another --name")


# -- atomic writes -----------------------------------------------------------------------------


def _write_atomic(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through ``write(file)`` so that it is either the old file or the whole new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # os.open with 0o666 honours the umask, unlike mkstemp's 0o600.
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise RlperfError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


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


def save_torch_atomic(path: str | Path, obj: Any) -> None:
    """``torch.save(obj)`` to ``path`` atomically (a checkpoint is never half written)."""
    import torch  # here, not at the top: a run directory for an external record needs no torch

    _write_atomic(path, lambda f: torch.save(obj, f))


# -- reading records ---------------------------------------------------------------------------


def read_record(path: str | Path) -> dict[str, Any]:
    """Load a run record from a run directory or a ``run.json`` and check its schema."""
    path = Path(path)
    file = path / RECORD_NAME if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        where = f"{path} has no {RECORD_NAME}" if path.is_dir() else f"no run record at {path}"
        raise RlperfError(where, hint="pass a run directory or its run.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RlperfError(f"cannot read run record {file}: {getattr(e, 'strerror', None) or e}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise RlperfError(f"run record {file} is not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(record, dict):
        raise RlperfError(f"run record {file} is not a JSON object")
    schema = record.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise RlperfError(f"run record {file} has no valid schema version (got {schema!r})")
    if schema > SCHEMA:
        raise RlperfError(f"record {file} has schema {schema}, this rlperf reads ≤ {SCHEMA}", hint="upgrade rlperf")
    return record


# -- learning curve ----------------------------------------------------------------------------


class MetricsCSV:
    """Appends learning-curve rows to a CSV file, flushed on every row.

    The header is written once; reopening an existing file (``--resume``) checks that the header
    matches, or is the start of the columns (a file written before columns were added keeps its
    own), and appends below it. A last line cut short by a crash is dropped on reopening.
    Missing fields are left empty; unknown fields are an error.
    """

    def __init__(self, path: str | Path, fieldnames: Iterable[str]) -> None:
        self.path = Path(path)
        self.fieldnames = list(fieldnames)
        existing = self._existing_header()
        try:
            self._file = open(self.path, "a", newline="", encoding="utf-8")
        except OSError as e:
            raise RlperfError(f"cannot write {self.path}: {e.strerror or e}") from None
        # A file written before columns were added keeps its columns (a resumed older run).
        columns = existing if existing is not None else self.fieldnames
        self._writer = csv.DictWriter(self._file, fieldnames=columns, restval="",
                                      extrasaction="ignore" if columns != self.fieldnames else "raise")
        if existing is None:
            self._writer.writeheader()
            self._file.flush()

    def _existing_header(self) -> list[str] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RlperfError(f"cannot read {self.path}: {e.strerror or e}") from None
        if not data.strip():
            return None
        if not data.endswith(b"\n"):
            # Crashed mid-row: drop the partial row so the resumed run continues a clean file.
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
            data = data[: data.rfind(b"\n") + 1]
            if not data:
                return None
        header = next(csv.reader([data.split(b"\n", 1)[0].decode("utf-8").rstrip("\r")]))
        if header != self.fieldnames[: len(header)]:
            raise RlperfError(
                f"{self.path} has columns {','.join(header)}, expected {','.join(self.fieldnames)}",
                hint="resume into the run directory that wrote it",
            )
        return header

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row and flush it to the OS."""
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsCSV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
