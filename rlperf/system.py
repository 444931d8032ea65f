"""The machine a timing was taken on, without importing torch (external records need it too)."""

from __future__ import annotations

import functools
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
