"""How a command stops: SIGINT/SIGTERM as a flag checked at step boundaries, and the exit codes.

Every command honours the two signals the same way: it stops at the next boundary (a vector step,
a trial, a run of a comparison), writes what finished, and exits 130 (SIGINT) or 143 (SIGTERM).
:class:`StopSignal` is that flag; a signal only ever sets it (and runs the callbacks that pass it
on: to a py-spy child, to Ray trials), so nothing is torn half written and no exception is raised
inside an extension module (a KeyboardInterrupt raised while torch's C++ is being imported aborts
the process). During start-up (imports, parsing the config) the command checks the flag when it
:meth:`arms <StopSignal.arm>` it, right before anything with side effects (files, processes):
a signal that came earlier ends the command there, one line, nothing written. A second signal
during start-up ends the process at once, with the same line.

Both run modes end with :func:`exit_code`: 0 for a completed run, 130 / 143 for an interrupted
one, 1 for a diverged or failed run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rlperf.errors import RlperfError

EXIT_CODES = {"completed": 0, "interrupted": 130, "diverged": 1, "failed": 1}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(status: str, signum: int | None = None) -> int:
    """The process exit code for a run that ended with ``status`` (143 for an interruption by SIGTERM)."""
    if status == "interrupted" and signum == signal.SIGTERM:
        return 143
    return EXIT_CODES.get(status, 1)


def interrupted_code(signum: int | None) -> int:
    """130 for SIGINT, 143 for SIGTERM: what a command stopped by ``signum`` exits with."""
    return 128 + (signum or signal.SIGINT)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def in_main_thread() -> bool:
    """Signal handlers can only be installed from the main thread (not, e.g., in a Ray worker thread)."""
    return threading.current_thread() is threading.main_thread()


class RunInterrupted(RlperfError):
    """A signal arrived before the run directory existed: the command ends, nothing written."""

    def __init__(self, signum: int, what: str = "the run started") -> None:
        super().__init__(f"interrupted by {signal_name(signum)} before {what}; nothing was written")
        self.exit_code = interrupted_code(signum)
        self.signum = signum


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks at each step boundary.

    ``starting``: the command has not armed it yet (nothing written); a second signal meanwhile
    ends the process at once. ``poll``: a stop that comes from elsewhere (a Ray trial's stop file):
    called at most every ``poll_every_s`` seconds, it returns the signal number to stop with, or None.
    """

    def __init__(self, starting: bool = False, poll: Callable[[], int | None] | None = None,
                 poll_every_s: float = 0.1) -> None:
        self.signum: int | None = None
        self.starting = starting
        self._poll = poll
        self._poll_every_s = poll_every_s
        self._next_poll = 0.0
        self._callbacks: list[Callable[[int], None]] = []

    def __call__(self) -> bool:
        if self.signum is None and self._poll is not None:
            now = time.monotonic()
            if now >= self._next_poll:
                self._next_poll = now + self._poll_every_s
                signum = self._poll()
                if signum:
                    self.set(signum)
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        """130 / 143 for the signal that arrived (the caller checked that one did)."""
        return interrupted_code(self.signum)

    def arm(self, what: str = "the run started") -> None:
        """The command is about to write files or start processes: a signal that came while it was
        starting ends it here (RunInterrupted, nothing written); from now on a signal stops it at
        its next boundary."""
        self.starting = False
        self.raise_if_set(what)

    def on_signal(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(signum)`` when the first signal arrives (at once if it has); returns the undo.

        Callbacks run inside the signal handler: they must be short and must not raise.
        """
        self._callbacks.append(callback)
        if self.signum is not None:
            callback(self.signum)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return remove

    def set(self, signum: int) -> None:
        """Stop as if ``signum`` had arrived (the first one counts; later ones are ignored, so the
        final checkpoint and record are written in full)."""
        if self.signum is not None:
            return
        self.signum = signum
        for callback in list(self._callbacks):
            with contextlib.suppress(Exception):
                callback(signum)

    def raise_if_set(self, what: str = "the run started") -> None:
        """Before anything is written: end the command with nothing written."""
        if self():
            assert self.signum is not None
            raise RunInterrupted(self.signum, what)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.starting and self.signum is not None:  # pressed again while starting: nothing to save
            with contextlib.suppress(OSError):
                os.write(2, f"rlperf: interrupted by {signal_name(signum)} during start-up; nothing was written\n".encode())
            os._exit(interrupted_code(signum))
        self.set(signum)

    def install(self) -> dict[int, Any]:
        """Install the handlers for SIGINT and SIGTERM (main thread only); returns the previous ones."""
        if not in_main_thread():
            return {}
        return {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Install the handlers for SIGINT and SIGTERM (main thread only); the previous ones come back after."""
        previous = self.install()
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def ignore_stop_signals() -> None:
    """SIGINT and SIGTERM ignored for the rest of the process (its last moments, after the command
    ended): SIG_IGN, unlike a Python handler, also holds through the interpreter's finalization."""
    if in_main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
