"""How a run stops: SIGINT/SIGTERM as a flag checked at step boundaries, and the exit codes.

Both run modes install :class:`StopSignal` around their loop and end with :func:`exit_code`: 0
for a completed run, 130 for Ctrl-C (SIGINT) and 143 for SIGTERM after the record of an
interrupted run is written, 1 for a diverged or failed run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from rlperf.errors import RlperfError

EXIT_CODES = {"completed": 0, "interrupted": 130, "diverged": 1, "failed": 1}


def exit_code(status: str, signum: int | None = None) -> int:
    """The process exit code for a run that ended with ``status`` (143 for an interruption by SIGTERM)."""
    if status == "interrupted" and signum == signal.SIGTERM:
        return 143
    return EXIT_CODES.get(status, 1)


def in_main_thread() -> bool:
    """Signal handlers can only be installed from the main thread (not, e.g., in a Ray worker thread)."""
    return threading.current_thread() is threading.main_thread()


class RunInterrupted(RlperfError):
    """A signal arrived before the run directory existed: the command ends, nothing written."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name} before the run started; nothing was written")
        self.exit_code = 128 + signum


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks at each step boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    def raise_if_set(self) -> None:
        """Before anything is written: end the command with nothing written."""
        if self.signum is not None:
            raise RunInterrupted(self.signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        def handler(signum: int, frame: Any) -> None:
            if self.signum is None:
                self.signum = signum
            # Later signals are ignored: the final checkpoint and record are written in full.

        if not in_main_thread():
            yield
            return
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
