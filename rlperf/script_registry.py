"""What ``rlperf profile -- python SCRIPT`` keeps of the script's :class:`rlperf.PhaseTimer` timers.

The profile's child opens the registry (:func:`open_registry`) before the script runs and
:mod:`rlperf.external` adds every timer the script makes to it. Nothing here imports NumPy: the child
opens it without loading NumPy's thread pool before the script's first line, so a script that sets
``OMP_NUM_THREADS`` before it imports numpy or torch gets the pool it asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SUBPROCESS_TIMERS_ENV = "RLPERF_SUBPROCESS_TIMERS"
"""Set by ``rlperf profile -- python ...`` to a folder: a process the script starts (multiprocessing,
forked or spawned, or another python) that makes a timer writes its timers there as
``timers-PID.json`` when it ends, for the profile's phase table."""


@dataclass
class Registry:
    """The script's timers (kept strongly: a timer inside the script's main() is gone with its frame
    otherwise), the process they belong to (a fork has the list too) and what runs after each step."""

    pid: int
    on_step: Callable[[Any], None] | None = None
    timers: list[Any] = field(default_factory=list)


current: Registry | None = None
"""The registry of this process's profiled script, if it is one."""


def open_registry(pid: int, on_step: Callable[[Any], None] | None = None) -> Registry:
    """Keep the timers process ``pid`` makes from now on."""
    global current
    current = Registry(pid, on_step)
    return current


_before_sigterm: list[Callable[[], None]] = []  # this process's writers (a fork starts with none)
_before_sigterm_pid: int | None = None
_writing = 0  # writers running in this process now (atexit's, the end of a multiprocessing worker)
_end_after_write = False  # and a SIGTERM came meanwhile


def before_sigterm(write: Callable[[], None]) -> None:
    """In a process that SIGTERM would end outright (a multiprocessing.Pool's workers, which
    ``Pool.terminate()`` and ``with Pool(...)`` end so, often while they are exiting): run ``write``
    first (with the other writers given here: the process's timers, its samples), then end as
    SIGTERM ends it. A handler of the script's own is left alone; so is a process whose SIGTERM
    cannot be handled here (this is not its main thread)."""
    import os
    import signal

    global _before_sigterm_pid
    if _before_sigterm_pid != os.getpid():  # a fork inherits the list: its parent's writers are not its own
        _before_sigterm.clear()
        _before_sigterm_pid = os.getpid()
    try:
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, _on_sigterm):
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:
        return
    _before_sigterm.append(write)


def _on_sigterm(signum: int, frame: Any) -> None:
    import os
    import signal
    import threading

    global _end_after_write
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    if _writing:  # this thread was writing: it ends the process once the write is done (writing())
        _end_after_write = True
        return

    def write_all() -> None:
        for write in list(_before_sigterm):
            try:
                write()
            except Exception:  # the process is ending: one writer's failure stops no other
                pass

    # From a thread, for at most 2 s: the thread this interrupts may hold a lock a writer needs.
    writer = threading.Thread(target=write_all, name="rlperf-write-on-sigterm", daemon=True)
    writer.start()
    writer.join(2.0)
    os.kill(os.getpid(), signal.SIGTERM)


class writing:
    """``with writing():`` around a write a SIGTERM must not cut short: one that comes meanwhile ends
    the process when the write is done."""

    def __enter__(self) -> None:
        global _writing
        _writing += 1

    def __exit__(self, *exc: object) -> None:
        global _writing
        _writing -= 1
        if not _writing and _end_after_write:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
