"""The machine a timing was taken on, without importing torch (external records need it too)."""

from __future__ import annotations

import functools
import os
import platform


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
