"""The machine a timing was taken on, without importing torch (external records need it too)."""

from __future__ import annotations

import functools
import os
import platform
import threading
from collections.abc import Mapping
from typing import Any


@functools.cache
def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 7B13"), or the best this platform offers."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity (``taskset``, a container's cpuset), as records keep it."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """The CPU a timing taken here depends on, under a record's ``system`` keys."""
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpus_usable": usable_cpus()}


def machine_text(system: Mapping[str, Any]) -> str:
    """``Intel Xeon, 2 CPUs, 2 usable`` from a record's ``system`` section; ``unknown`` where it has none of them."""
    model, count, usable = (system.get(k) for k in ("cpu_model", "cpu_count", "cpus_usable"))
    if model is None and count is None and usable is None:
        return "unknown"
    count, usable = ("?" if v is None else v for v in (count, usable))
    return f"{model or 'unknown CPU'}, {count} CPUs, {usable} usable"


def effective_cpus() -> float:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except AttributeError:
        cpus = float(os.cpu_count() or 1)
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max", encoding="ascii").read().split()[:2]
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cpus


def open_schedstat() -> Any:
    """The calling thread's scheduler statistics, open for reading (Linux; None elsewhere)."""
    try:
        return open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb", buffering=0)
    except (OSError, AttributeError):
        return None


def run_queue_s(schedstat: Any) -> float | None:
    """Seconds the thread of ``schedstat`` (:func:`open_schedstat`) has so far spent ready to run,
    waiting for a CPU (the second field, in nanoseconds); None where that is not known."""
    if schedstat is None:
        return None
    try:
        return int(os.pread(schedstat.fileno(), 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
