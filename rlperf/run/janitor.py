"""What an async run owns outside its process, removed even when the whole run is killed.

An async run creates a shared-memory segment, named semaphores (the replay lock, the learner's
wake-up) and actor processes. Its own teardown removes them; Python's resource tracker would remove
the names of a learner that died alone. Neither survives ``kill -9`` of the whole process group (a
terminal's Ctrl-\\, a CI job cancelled, the OOM killer taking the group): the tracker is in that
group too.

The janitor is a small process in a session of its own, out of reach of the group's signals. The
learner tells it, one line each on its stdin, every name and pid the run owns; it waits for
end-of-file, which comes when the learner's process is gone, however it went. A run that ended in
order writes ``done`` first and the janitor leaves without touching anything; otherwise it unlinks
the segment and semaphore names and kills the actors that are still alive (the same processes:
their start times are checked). It imports nothing of rlperf's, so it starts in tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import IO

SHM_DIR = "/dev/shm"


class Janitor:
    """The learner's side: start the janitor, tell it what the run owns, and dismiss it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin: IO[bytes] | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-c", "from rlperf.run.janitor import main; main()"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            )
        except OSError:  # no janitor: the run's own teardown and the next run's stale sweep remain
            return
        self._stdin = self._proc.stdin

    def _tell(self, line: str) -> None:
        if self._stdin is None:
            return
        try:
            self._stdin.write(line.encode() + b"\n")
            self._stdin.flush()
        except OSError:
            self._stdin = None

    def shm(self, name: str) -> None:
        """A shared-memory segment's name (as ``SharedMemory`` takes it, without the leading slash)."""
        self._tell(f"shm {name.lstrip('/')}")

    def semaphore(self, name: str | None) -> None:
        """A named POSIX semaphore (``multiprocessing``'s ``/mp-...``)."""
        if name:
            self._tell(f"sem {name}")

    def process(self, pid: int | None) -> None:
        """A process to kill if the run is killed (an actor)."""
        if pid:
            self._tell(f"pid {pid} {_start_time(pid)}")

    def dismiss(self) -> None:
        """The run ended in order and removed what it owned: the janitor leaves doing nothing."""
        self._tell("done")
        if self._stdin is not None:
            with contextlib.suppress(OSError):
                self._stdin.close()
            self._stdin = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), or ``-`` where unknown: with the
    pid it names one process, not a later one that was given the same number."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:].split()[19].decode()
    except (OSError, ValueError, IndexError):
        return "-"


def main() -> None:
    """The janitor process: read what the run owns until end-of-file, then clean up unless told ``done``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its own session already; belt and braces
    shm: list[str] = []
    sems: list[str] = []
    pids: list[tuple[int, str]] = []
    done = False
    for raw in sys.stdin.buffer:
        kind, _, value = raw.decode(errors="replace").strip().partition(" ")
        if kind == "done":
            done = True
        elif kind == "shm" and value and "/" not in value:
            shm.append(value)
        elif kind == "sem" and value:
            sems.append(value)
        elif kind == "pid":
            pid, _, start = value.partition(" ")
            if pid.isdigit():
                pids.append((int(pid), start))
    if done:
        return
    for pid, start in pids:
        if start == "-" or _start_time(pid) == start:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    for name in shm:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
    if sems:
        try:
            from _multiprocessing import sem_unlink
        except ImportError:
            return
        for name in sems:
            with contextlib.suppress(OSError):
                sem_unlink(name)


if __name__ == "__main__":
    main()
