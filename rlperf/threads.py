"""One thread policy for every pool a run's process loads (docs/bottlenecks.md §14).

A run's process holds several thread pools, each sized at the CPU count by default: torch's
intra-op pool (its OpenMP runtime) and inter-op pool, numba's, and the BLAS pools numpy and SciPy
load (the fused update's ``np.dot`` runs in SciPy's OpenBLAS). On a machine where other processes
hold CPUs, every pool of more than one thread stalls at its barriers while one of its threads waits
for a CPU. So a run caps them all at once, through threadpoolctl for the BLAS and OpenMP pools and
torch's and numba's own calls for theirs: :func:`choose` decides the count (``run.threads``, or what
``run.threads=0`` measured best here), :func:`apply` caps the pools, and :func:`restored` undoes it
when the run ends (a sweep runs many in one process).

:func:`apply` also marks where the run starts, so that :func:`record_section` can say what the run's
thread lost to other processes: its run-queue wait (Linux's per-thread schedstat, the reader the
phase timers use), its involuntary context switches and the load average.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rlperf.system import effective_cpus, open_schedstat, run_queue_s

AUTO_CPU = 1
"""The count ``run.threads=0`` takes on the CPU. rlperf's networks are small MLPs whose products are
too small to gain much from a second thread, while a pool of two stalls whenever another process
holds a CPU: beside other work on 2 CPUs the default run's update took 0.59 ms (median) on one thread
per pool and 327 ms on two (docs/bottlenecks.md §14; scripts/bench_busy.py measures it)."""

WHY_AUTO_CPU = (f"auto: {AUTO_CPU} thread on the CPU: rlperf's small networks gain nothing from a second thread, "
                "and a pool of several stalls whenever another process holds one of its CPUs (docs/bottlenecks.md §14)")


@dataclass(frozen=True)
class Policy:
    """How many threads every pool gets (``threads``; None keeps the libraries' defaults) and why."""

    threads: int | None
    why: str


def choose(requested: int, device: Any, *, other_processes: int = 0) -> Policy:
    """The policy for ``run.threads=requested`` on ``device`` (a ``torch.device`` or its type), where
    ``other_processes`` of the run's own (async actors) share the CPUs with this one."""
    kind = getattr(device, "type", str(device))
    if requested > 0:
        return Policy(requested, f"run.threads={requested}")
    if kind == "cpu":
        return Policy(AUTO_CPU, WHY_AUTO_CPU)
    if other_processes:
        free = max(1, int(effective_cpus()) - other_processes)
        return Policy(free, f"auto: on {kind} the host side takes the {free} CPU(s) the run's {other_processes} "
                            "actor process(es) leave free")
    return Policy(None, f"auto: on {kind} the host side keeps the libraries' default pools (the network runs on the "
                        "device; the host launches its work)")


@dataclass
class _Start:
    """Where a run started, read in the thread that runs its loop."""

    tid: int
    schedstat: Any
    waited_s: float | None
    at: float
    loadavg: float
    switches_thread: int | None
    switches_process: int


@dataclass
class Applied:
    """A policy as it was applied: the pools it capped and the run's start marks."""

    policy: Policy
    start: _Start
    interop_note: str | None = None
    _undo: list[Any] = field(default_factory=list)


@dataclass
class _Scope:
    torch_threads: int | None
    numba_threads: int | None
    applied: list[Applied] = field(default_factory=list)


_scopes: list[_Scope] = []


def _torch() -> Any:
    return sys.modules.get("torch")


def _numba() -> Any:
    """numba's module where it was imported (a run that never imports it has no numba pool)."""
    return sys.modules.get("numba")


def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Undo, when the block ends, every :func:`apply` made inside it: the caps on the BLAS/OpenMP pools,
    torch's and numba's thread counts (a run's setting is not the process's from then on)."""
    torch, numba = _torch(), _numba()
    scope = _Scope(torch.get_num_threads() if torch is not None else None,
                   numba.get_num_threads() if numba is not None else None)
    _scopes.append(scope)
    try:
        yield
    finally:
        _scopes.remove(scope)
        for applied in reversed(scope.applied):
            for limiter in reversed(applied._undo):
                limiter.restore_original_limits()
            if applied.start.schedstat is not None:
                applied.start.schedstat.close()
        torch = _torch()
        if torch is not None and scope.torch_threads is not None:
            torch.set_num_threads(scope.torch_threads)
        numba = _numba()
        if numba is not None and scope.numba_threads is not None:
            numba.set_num_threads(scope.numba_threads)


def apply(policy: Policy, preload: tuple[str, ...] = ()) -> Applied:
    """Cap every pool the process has loaded at ``policy.threads`` (None: leave them), after importing
    ``preload`` (modules whose pools the run will use and which load them on first use, so that they
    are capped too: SciPy's BLAS for the fused update). Marks the run's start in the calling thread:
    call it from the thread that runs the loop."""
    for module in preload:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    applied = Applied(policy, _mark())
    n = policy.threads
    if n is not None:
        torch = _torch()
        if torch is not None:
            torch.set_num_threads(n)
            applied.interop_note = _set_interop(torch, n)
        numba = _numba()
        if numba is not None:  # first: its threading layer may load an OpenMP runtime of its own
            numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
        applied._undo.append(_controller().limit(limits=n))
    if _scopes:
        _scopes[-1].applied.append(applied)
    return applied


def _set_interop(torch: Any, n: int) -> str | None:
    """torch's inter-op pool can be sized once per process, before it has run anything in parallel:
    later runs keep the first size (the note says so)."""
    if torch.get_num_interop_threads() == n:
        return None
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:
        return f"torch's inter-op pool keeps {torch.get_num_interop_threads()} threads (it is sized once per process)"
    return None


class PoolSwitch:
    """Switch every pool loaded now to a count, with no undo: for a micro-benchmark that alternates
    counts inside a :func:`restored` block (the loaded libraries are looked up once, and a switch to
    the count already set costs nothing: an interleaved benchmark switches once per block of calls)."""

    def __init__(self) -> None:
        self._controller = _controller()
        self._count: int | None = None

    def __call__(self, n: int) -> None:
        if n == self._count:
            return
        self._count = n
        self._controller.limit(limits=n)
        torch, numba = _torch(), _numba()
        if torch is not None:
            torch.set_num_threads(n)
        if numba is not None:
            numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def current() -> Applied | None:
    """The policy the innermost :func:`restored` block applied last, or None."""
    for scope in reversed(_scopes):
        if scope.applied:
            return scope.applied[-1]
    return None


def pools() -> list[dict[str, Any]]:
    """Every thread pool the process has loaded: threadpoolctl's BLAS and OpenMP pools (library,
    version, threads), torch's intra- and inter-op pools and numba's."""
    out: list[dict[str, Any]] = [
        {"library": p["internal_api"], "api": p["user_api"], "version": p.get("version"), "threads": p["num_threads"],
         "file": os.path.basename(p.get("filepath") or "")}
        for p in _controller().info()]
    torch, numba = _torch(), _numba()
    if torch is not None:
        out.append({"library": "torch intra-op", "api": "torch", "version": torch.__version__,
                    "threads": torch.get_num_threads(), "file": ""})
        out.append({"library": "torch inter-op", "api": "torch", "version": torch.__version__,
                    "threads": torch.get_num_interop_threads(), "file": ""})
    if numba is not None:
        out.append({"library": f"numba ({_numba_layer(numba)})", "api": "numba", "version": numba.__version__,
                    "threads": numba.get_num_threads(), "file": ""})
    return out


def _numba_layer(numba: Any) -> str:
    try:
        return str(numba.threading_layer())
    except ValueError:  # no parallel region has run yet: the layer is chosen at the first
        return str(numba.config.THREADING_LAYER)


def _switches(who: int) -> int | None:
    try:
        return int(resource.getrusage(who).ru_nivcsw)
    except (OSError, ValueError):
        return None


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def _mark() -> _Start:
    schedstat = open_schedstat()
    return _Start(
        tid=threading.get_ident(), schedstat=schedstat, waited_s=run_queue_s(schedstat), at=time.perf_counter(),
        loadavg=_loadavg(), switches_thread=_switches(_RUSAGE_THREAD) if _RUSAGE_THREAD is not None else None,
        switches_process=_switches(resource.RUSAGE_SELF) or 0)


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def contention(start: _Start) -> dict[str, Any]:
    """What the run's thread lost to other processes since ``start``: its run-queue wait (seconds, and
    the share of the wall time), its involuntary context switches (and the process's), and the
    load average at the start and now; None where this platform does not say."""
    wall = max(time.perf_counter() - start.at, 1e-9)
    now_waited = run_queue_s(start.schedstat)
    waited = (max(now_waited - start.waited_s, 0.0)
              if now_waited is not None and start.waited_s is not None else None)
    same_thread = threading.get_ident() == start.tid
    thread_now = _switches(_RUSAGE_THREAD) if same_thread and _RUSAGE_THREAD is not None else None
    process_now = _switches(resource.RUSAGE_SELF)
    return {
        "wall_s": wall,
        "run_queue_wait_s": waited,
        "wait_share": min(waited / wall, 1.0) if waited is not None else None,
        "involuntary_switches": (thread_now - start.switches_thread
                                 if thread_now is not None and start.switches_thread is not None else None),
        "involuntary_switches_process": process_now - start.switches_process if process_now is not None else None,
        "loadavg_1m_start": start.loadavg,
        "loadavg_1m_end": _loadavg(),
        "cpus": effective_cpus(),
    }


def record_section() -> dict[str, Any]:
    """The record's ``threads``: the count the run applied and why, every pool as it is now, and what
    the run's thread lost to other processes (``contention``)."""
    applied = current()
    section: dict[str, Any] = {
        "count": applied.policy.threads if applied is not None else None,
        "why": applied.policy.why if applied is not None else "no thread policy was applied (library defaults)",
        "pools": pools(),
    }
    if applied is not None:
        if applied.interop_note:
            section["note"] = applied.interop_note
        section["contention"] = contention(applied.start)
    return section
