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
