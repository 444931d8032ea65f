"""Fixes ``rlperf profile --verify K -- python SCRIPT`` can apply to a script without editing it.

A finding about your script is verified by running the script again, alone (no profiler), as it is
and with the fix applied from outside, interleaved, and timing both. Only some fixes can be applied
from outside; each is one ``--apply`` value of :mod:`rlperf.instruments.child`, applied after the
script's top-level imports and before its first line runs:

- ``threads=N`` (finding ``threads``): every BLAS and OpenMP pool loaded runs N threads
  (threadpoolctl), the environment variables say N to the libraries loaded later and to the
  processes the script starts, torch runs N threads, and the script's own
  ``torch.set_num_threads(M)`` calls set ``min(M, N)``;
- ``gc=off`` (finding ``gc_pauses``): the collector is off while the script runs and its
  ``gc.collect()`` / ``gc.enable()`` calls do nothing (the most a fix of the pauses can save; memory
  that only a collection frees is not freed);
- ``no_grad=FILE:LINE`` (finding ``autograd_forward``): the modules called from that line of your
  code run with grad off (applied only where no backward pass ever reached their graphs), through
  global module hooks that slow every module call a little: the measured saving is a lower bound.

The other findings' fixes change what the script does (log every N steps, batch the samples,
checkpoint less often) and are left to you: their ``verify`` line says what to change.
"""

from __future__ import annotations

import gc
import sys
from types import FrameType
from typing import Any

VERIFIABLE = {
    "threads": "re-run with every BLAS and OpenMP pool and torch's threads capped at the usable CPUs per process (the "
               "script's set_num_threads calls capped too)",
    "gc_pauses": "re-run with the garbage collector off and the script's gc.collect() calls doing nothing",
    "autograd_forward": "re-run with grad off for the forwards called at that line (no backward reached their graphs), "
                        "by module hooks that cost every module call a few µs themselves: a lower bound",
}
"""The finding ids a script's ``--verify`` can check, and how."""


def apply(fixes: list[str]) -> None:
    """Apply each ``KIND=VALUE`` of ``fixes`` in this process (see the module docstring)."""
    for fix in fixes:
        kind, _, value = fix.partition("=")
        if kind == "threads":
            _cap_threads(int(value))
        elif kind == "gc" and value == "off":
            gc.disable()
            gc.collect = lambda generation=2: 0
            gc.enable = lambda: None
        elif kind == "no_grad":
            file, _, line = value.rpartition(":")
            _no_grad_at(file, int(line))
        else:
            raise SystemExit(f"rlperf.instruments.child: unknown fix {fix!r}")


def _cap_threads(n: int) -> None:
    import os

    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(n)  # called, not entered: the limits stay for the whole run
    if "torch" not in sys.modules:
        return
    import torch

    set_threads = torch.set_num_threads
    set_threads(n)

    def capped(nthreads: int) -> None:
        set_threads(min(int(nthreads), n))

    torch.set_num_threads = capped


def _no_grad_at(file: str, line: int) -> None:
    """Grad off for the top-level module calls made from ``file:line``: a forward pre-hook on every
    module that, outside any other module's forward, finds the first frame outside torch and turns
    grad off when it is that line; the forward hook turns it back."""
    import torch
    from torch.nn.modules import module as torch_module

    depth = [0]
    restore: list[bool | None] = []

    def before(mod: Any, args: Any) -> None:
        depth[0] += 1
        state = None
        if depth[0] == 1:
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename.replace("\\", "/"):
                frame = frame.f_back
            if frame is not None and frame.f_lineno == line and frame.f_code.co_filename.endswith(file):
                state = torch.is_grad_enabled()
                torch.set_grad_enabled(False)
        restore.append(state)

    def after(mod: Any, args: Any, output: Any) -> None:
        depth[0] -= 1
        state = restore.pop() if restore else None
        if state is not None:
            torch.set_grad_enabled(state)

    torch_module.register_module_forward_pre_hook(before)
    torch_module.register_module_forward_hook(after)
