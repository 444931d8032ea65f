"""Reading a file a user names (a run record, a config): regular files only, and only so many bytes.

A path can name anything: ``/dev/zero`` (endless), a FIFO called ``run.json`` (blocks until a writer
comes, and the open itself ignores SIGTERM), a terminal, a 20 GB log. Every file rlperf reads on a
user's word goes through :func:`read_user_file`, which refuses all but regular files (symbolic
links to one are fine), opens without blocking and reads at most ``limit`` bytes: one line and exit
code 2 otherwise, never a hang or the machine's memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rlperf.errors import RlperfError

RECORD_MAX_BYTES = 16 * 1024 * 1024
"""The largest run record read (rlperf's own are tens of kB: phases, ≤ 128 intervals)."""
CONFIG_MAX_BYTES = 1024 * 1024
"""The largest config read (a packaged config is about 2 kB)."""


def _what_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: Path, what: str, mode: int) -> RlperfError:
    return RlperfError(f"{what} {path} is {_what_kind(mode)}, not a regular file",
                       hint=f"pass the {what} file itself")


def read_user_file(path: str | Path, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (a ``what``: "run record", "config"), at most ``limit``.

    Raises FileNotFoundError as ``open`` does (callers word that case themselves) and RlperfError
    for anything else: not a regular file, larger than ``limit``, unreadable.
    """
    path = Path(path)
    try:
        # stat, not open, first: opening a FIFO blocks and opening a device may have effects.
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(path, what, mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise RlperfError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for something else between the stat and the open
            raise _refuse(path, what, st.st_mode)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise RlperfError(f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise RlperfError(f"{what} {path} is larger than {limit // (1024 * 1024)} MiB, the most a {what} can be",
                          hint=f"pass the {what} file itself")
    return b"".join(chunks)
