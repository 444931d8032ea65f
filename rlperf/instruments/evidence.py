"""Evidence cProfile cannot give, recorded inside the profiled script's process.

Every top-level ``nn.Module`` call (a module called by your code, not by another module) is
recorded by its call site -- the line of your code that made it: how often it ran, with grad mode
on or off (``torch.is_grad_enabled()``, read as it ran), whether a backward pass later reached its
output (a hook on the output's ``grad_fn``), its time, and the batch size of its first input. When
the script ends, the same module is micro-benchmarked on the same inputs: the forward with grad
against it under ``torch.inference_mode()`` (for call sites whose graphs no backward read), and
one forward on the stacked batch against one per sample (for call sites fed one sample at a
time). :mod:`rlperf.instruments.foreign` turns these figures into findings.

Cheap by design: one Python wrapper around ``nn.Module.__call__`` (a submodule's call goes straight
through) and a frame walk per top-level call. Nothing
here imports torch: it is installed only when the script has imported it.

:class:`LineSampler` samples which line of your code the script is on, which cProfile (calls, not
lines) cannot say: where in a hot function its time goes, whether that is inside a loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPEATS = 5
"""Interleaved repeats of each micro-benchmark (the median is kept)."""
BENCH_BUDGET_S = 0.4
"""Wall time all the micro-benchmarks together may take at the script's end (a new one starts only
before it runs out)."""
BENCH_S = 0.12
"""Wall time one micro-benchmark aims at (its calls per repeat are cut to fit; one call at least)."""


class Site:
    """One line of your code that calls a module."""

    __slots__ = ("args", "backward_reached", "batch", "calls", "chain", "file", "function", "grad_calls", "grad_seconds",
                 "line", "module", "one_calls", "one_seconds", "seconds", "single")

    def __init__(self, file: str, line: int, function: str) -> None:
        self.file, self.line, self.function = file, line, function
        self.chain: list[tuple[str, int, str]] = []  # your frames above this line, innermost first
        self.calls = self.grad_calls = self.backward_reached = 0
        self.seconds = self.grad_seconds = 0.0
        self.batch: int | None = None  # of the first call
        self.module: Any = None
        self.args: tuple[Any, ...] = ()
        # the calls fed one sample (a line may call modules on batches and on single samples: a
        # library's loop called from it), and the first of them, (module, args)
        self.one_calls, self.one_seconds = 0, 0.0
        self.single: tuple[Any, tuple[Any, ...]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "calls": self.calls,
                "grad_calls": self.grad_calls, "backward_reached": self.backward_reached, "seconds": self.seconds,
                "grad_seconds": self.grad_seconds, "batch": self.batch, "one_sample_calls": self.one_calls,
                "one_sample_seconds": self.one_seconds, "chain": [list(f) for f in self.chain]}


class Forwards:
    """The forward hooks (a wrapper of ``nn.Module.__call__``): call sites of top-level module calls by (file, line)."""

    def __init__(self, is_user: Callable[[str], bool]) -> None:
        self.is_user = is_user
        self.sites: dict[tuple[str, int], Site] = {}
        self.wrapper: Any = None

    def install(self, torch: Any) -> None:
        """Wrap ``nn.Module.__call__`` (the class's, so nothing is copied or pickled with a module):
        a call made inside another module's call goes straight through. Global module hooks would do
        the same bookkeeping but send every submodule call through torch's slow path (3-4x the
        wrapper's cost per top-level call of a 5-layer MLP)."""
        module_class = torch.nn.Module
        self.torch, self.module_class, self.original = torch, module_class, module_class.__call__
        original, pre, post = self.original, self._pre, self._post
        inside = threading.local()  # per thread: a module running in a worker thread hides none of the others' calls

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "now", False):  # a submodule of a module already being called
                return original(module, *args, **kwargs)
            inside.now = True
            try:
                started = pre(module, args)
                output = original(module, *args, **kwargs)
                post(started, output)
                return output
            finally:
                inside.now = False

        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        module_class.__call__ = __call__
        self.wrapper = __call__

    def remove(self) -> None:
        """Put ``nn.Module.__call__`` back (unless something wrapped it again since)."""
        wrapper = self.wrapper
        if wrapper is not None and self.module_class.__call__ is wrapper:
            self.module_class.__call__ = self.original
        self.wrapper = None

    def _site(self) -> Site | None:
        frame: Any = sys._getframe(3)  # _site <- _pre <- the wrapper <- the caller
        for _ in range(12):
            if frame is None:
                return None
            code = frame.f_code
            if self.is_user(code.co_filename):
                key = (code.co_filename, frame.f_lineno)
                site = self.sites.get(key)
                if site is None:
                    site = self.sites[key] = Site(code.co_filename, frame.f_lineno, code.co_name)
                    site.chain = self._chain(frame.f_back)
                return site
            frame = frame.f_back
        return None

    def _chain(self, frame: Any, depth: int = 4) -> list[tuple[str, int, str]]:
        """Your frames above a call site (the first time it is seen): where the loop calls it."""
        chain: list[tuple[str, int, str]] = []
        for _ in range(16):
            if frame is None or len(chain) >= depth:
                break
            if self.is_user(frame.f_code.co_filename):
                chain.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        return chain

    def _pre(self, module: Any, args: tuple[Any, ...]) -> tuple[Site, float, bool] | None:
        site = self._site()
        if site is None:
            return None
        first: Any = args[0] if args else None
        ndim = getattr(first, "ndim", 0)
        batch = int(first.shape[0]) if ndim >= 2 else 1 if ndim == 1 else None
        if site.module is None:
            site.module, site.args, site.batch = module, args, batch
        if batch == 1 and site.single is None:
            site.single = module, args
        return site, time.perf_counter(), batch == 1

    def _post(self, started: tuple[Site, float, bool] | None, output: Any) -> None:
        if started is None:
            return
        site, since, one = started
        seconds = time.perf_counter() - since
        site.calls += 1
        site.seconds += seconds
        if one:
            site.one_calls += 1
            site.one_seconds += seconds
        if self.torch.is_grad_enabled() and not self.torch.is_inference_mode_enabled():
            site.grad_calls += 1
            site.grad_seconds += seconds
            out = output[0] if isinstance(output, (tuple, list)) and output else output
            node = getattr(out, "grad_fn", None)
            if node is not None:
                node.register_prehook(lambda grads, s=site: _reached(s))

    def collect(self) -> dict[str, Any]:
        """Every call site, with the micro-benchmarks of the two fixes where they apply."""
        self.remove()
        out = []
        deadline = time.perf_counter() + BENCH_BUDGET_S
        for site in sorted(self.sites.values(), key=lambda s: -s.seconds):
            entry = site.as_dict()
            if site.module is not None and time.perf_counter() < deadline:
                if site.grad_calls and site.backward_reached < 0.1 * site.grad_calls:
                    entry["no_grad_bench"] = _guarded(self._bench_no_grad, site)
                if site.single is not None:
                    entry["batch_bench"] = _guarded(self._bench_batch, site)
            out.append(entry)
        found: dict[str, Any] = {"forwards": out}
        threads, cpus = self.torch.get_num_threads(), _cpus()
        busiest = max((s for s in self.sites.values() if s.module is not None), key=lambda s: s.seconds, default=None)
        if threads > cpus and busiest is not None:
            found["threads_bench"] = _guarded(self._bench_threads, busiest, max(1, int(cpus)))
        return found

    def _bench_threads(self, site: Site, fewer: int) -> dict[str, Any]:
        """The busiest call site's forward (and backward, where its graph was used) with the script's
        threads against ``fewer``."""
        torch = self.torch
        threads = torch.get_num_threads()
        backward = site.backward_reached > 0

        def work() -> None:
            with torch.enable_grad():
                out = site.module(*site.args)
                out = out[0] if isinstance(out, (tuple, list)) else out
                if backward and getattr(out, "requires_grad", False):
                    out.float().sum().backward()

        def slow() -> None:
            torch.set_num_threads(threads)
            work()

        def fast() -> None:
            torch.set_num_threads(fewer)
            work()

        try:
            result = _interleaved(slow, fast, calls=10)
        finally:
            torch.set_num_threads(threads)
        return result | {"threads": threads, "fewer": fewer, "site": f"{site.file}:{site.line}"}

    def _bench_no_grad(self, site: Site) -> dict[str, Any]:
        torch = self.torch

        def slow() -> None:
            with torch.enable_grad():
                site.module(*site.args)

        def fast() -> None:
            with torch.inference_mode():
                site.module(*site.args)

        return _interleaved(slow, fast)

    def _bench_batch(self, site: Site) -> dict[str, Any]:
        torch = self.torch
        n = 32
        assert site.single is not None
        module, (first, *rest) = site.single
        single = first if first.ndim >= 2 else first.unsqueeze(0)
        stacked = torch.cat([single] * n)

        def slow() -> None:
            with torch.inference_mode():
                for _ in range(n):
                    module(first, *rest)

        def fast() -> None:
            with torch.inference_mode():
                module(stacked, *rest)

        result = _interleaved(slow, fast)
        result["n"] = n
        return result


def profiler_cost(entries: int = 2000, depth: int = 3, calls: int = 6000) -> dict[str, Any]:
    """What cProfile adds to one recorded call here: calls timed with a profiler on and off (median of
    5 interleaved repeats), so the report can say what the profile itself cost and the savings can
    leave it out. The calls are made as a script's are: through ``entries`` distinct functions (a
    torch script's profile holds a few thousand: cProfile's cost per call grows with its tables), each
    a chain ``depth`` deep ending in a builtin; one function called in a tight loop costs it half as much."""
    import cProfile
    from types import FunctionType

    def leaf() -> int:
        return len(())

    def link() -> int:
        return inner()  # type: ignore[name-defined]  # noqa: F821 -- each copy's own global

    n = max(100, min(entries, 3000))
    chains = []
    for i in range(n):
        f = FunctionType(leaf.__code__.replace(co_name=f"leaf{i}"), {"len": len})
        for d in range(depth - 1):
            f = FunctionType(link.__code__.replace(co_name=f"link{i}_{d}"), {"inner": f})
        chains.append(f)
    order = chains * max(1, calls // n)

    def timed(profiled: bool) -> float:
        profiler = cProfile.Profile()
        if profiled:
            profiler.enable()
        started = time.perf_counter()
        for f in order:
            f()
        seconds = time.perf_counter() - started
        if profiled:
            profiler.disable()
        return seconds

    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(5):
        for profiled in (False, True):
            times[profiled].append(timed(profiled))
    on, off = (sorted(times[k])[2] for k in (True, False))
    recorded = (depth + 1) * len(order)
    return {"per_call_s": max(0.0, on - off) / recorded, "calls": recorded, "entries": n}


def _reached(site: Site) -> None:
    site.backward_reached += 1


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; all of them where the platform cannot say)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _cpus() -> float:
    from rlperf.system import effective_cpus

    return effective_cpus()


def _guarded(bench: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    try:
        return bench(*args)
    except Exception as exc:  # the module needs more than the recorded inputs: no figure, said why
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _interleaved(slow: Callable[[], None], fast: Callable[[], None], calls: int = 20,
                 budget_s: float = BENCH_S) -> dict[str, Any]:
    """Median seconds per call of each form over :data:`REPEATS` interleaved pairs of repeats (after
    one warm-up), each repeat ``calls`` calls or fewer: as many as fit the budget (a forward of a large
    network on one sample is milliseconds; 20 x 5 x 33 of them would take seconds). ``ratio`` is the
    median of the pairs' fast / slow: a neighbour that comes and goes slows both forms of a pair alike,
    and the ratio keeps only their difference where the two medians may come from different periods.

    Timed in the process's CPU time: beside busy processes a repeat of a few milliseconds loses its
    CPU for whole time slices, and wall time then ranked inference_mode 2x slower than autograd (the
    warm-up too: timed on the wall clock it cut a repeat to one call, shorter than a time slice)."""
    started = time.process_time()
    slow()
    fast()
    warm = time.process_time() - started
    calls = max(1, min(calls, int(budget_s / (REPEATS * max(warm, 1e-9)))))
    times: dict[str, list[float]] = {"slow_s": [], "fast_s": []}
    for _ in range(REPEATS):
        for name, fn in (("slow_s", slow), ("fast_s", fast)):
            started = time.process_time()
            for _ in range(calls):
                fn()
            times[name].append((time.process_time() - started) / calls)
    ranges = {f"{name[:-2]}_range_s": [min(v), max(v)] for name, v in times.items()}
    ratios = sorted(f / s for f, s in zip(times["fast_s"], times["slow_s"], strict=True) if s > 0)
    pairs = {"ratio": ratios[len(ratios) // 2], "ratio_range": [ratios[0], ratios[-1]]} if ratios else {}
    return ({name: sorted(v)[len(v) // 2] for name, v in times.items()} | ranges | pairs
            | {"repeats": REPEATS, "calls": calls})


_FORWARDS: Forwards | None = None


SAMPLE_S = 0.01
"""Seconds of wall time between two wall samples of the script's thread by :class:`LineSampler`; the
unit its rows are counted in."""
CPU_SAMPLE_S = 0.002
"""Seconds of the thread's CPU time between two CPU samples (:func:`cpu_timer`; 4 ms where only a POSIX
CPU-clock timer is at hand): at 10 ms a 300-step run's 30 ms of planted Python got 3 samples, too few
for the gate to test a line; at 1 ms a sample of a deep stack cost the foreign corpus's scripts about
6% more than at 2 ms (1.26x against 1.20x their time alone, three scripts)."""


class LineSampler:
    """Which line of your code the script's thread is on, by two timers that signal that thread: a POSIX
    timer every :data:`SAMPLE_S` of wall time (SIGPROF, :class:`_ThreadTimer`), one every
    :data:`CPU_SAMPLE_S` of the thread's CPU time (SIGVTALRM, :func:`cpu_timer`). A handler runs in the thread between two
    bytecodes and sees the line that was running (a sampling thread waiting for the GIL saw only where
    the script let go of it). A wall sample charges the line its wall time (a line that waits, on a
    queue, a sleep, a pipe, is seen), a CPU sample its CPU time (a line the thread did not run on a busy
    machine is not charged): each counts the timer's expiries since the last sample of its kind, so a
    tick that waited for a C call to return is the C call's alone (weighting one wall tick by the CPU
    spent since the last one charged the C call's line with the Python before it: a pure-Python loop
    between two torch calls read 0.5-0.9x of its CPU beside two busy processes). For the innermost frame
    of your code it counts the line as *inner* (its own time with the library calls it makes), and every
    line of your code on the stack as *inclusive*; in units of :data:`SAMPLE_S`. About 15 µs a sample.
    Without ``timer_create`` (not Linux), outside the main thread, or where the script handles SIGPROF
    or SIGVTALRM itself, nothing is sampled."""

    def __init__(self, own: Callable[[str], bool], thread_id: int) -> None:
        self.own, self.thread_id = own, thread_id
        self.mine: dict[Any, bool] = {}  # code object -> your code?
        # key -> [inner CPU, inclusive CPU, inner wall, inclusive wall] in seconds
        self.seconds: dict[tuple[str, int, str], list[float]] = {}
        self.samples = 0
        self.cpu_s = self.wall_s = 0.0
        self.timers: list[_ThreadTimer] = []
        self.running = False
        self.busy = False  # a tick during the other kind's sample leaves its expiries to the next

    def start(self) -> None:
        import signal

        if threading.get_ident() != self.thread_id or threading.current_thread() is not threading.main_thread():
            return  # a Python signal handler runs only in the main thread
        for signo in (signal.SIGPROF, signal.SIGVTALRM):
            handler = signal.getsignal(signo)
            if handler not in (signal.SIG_DFL, signal.SIG_IGN, None) and not isinstance(
                    getattr(handler, "__self__", None), (LineSampler, WorkerSampler)):
                return  # the script's own
        try:
            self.timers.append(_ThreadTimer(SAMPLE_S, cpu=False, signo=signal.SIGPROF))
            self.timers.append(cpu_timer(CPU_SAMPLE_S, signal.SIGVTALRM))
        except (OSError, AttributeError):
            self.close_timers()
            return
        self.running = True
        for signo, tick in ((signal.SIGPROF, self._wall_tick), (signal.SIGVTALRM, self._cpu_tick)):
            signal.signal(signo, tick)
            signal.siginterrupt(signo, False)  # system calls go on after a tick
        for timer in self.timers:
            timer.start()

    def stop(self) -> None:
        """No more samples. The handlers stay (no-ops): a tick already on its way would otherwise find
        the signal's default action, which ends the process."""
        self.running = False
        self.close_timers()

    def close_timers(self) -> None:
        for timer in self.timers:
            timer.close()
        self.timers = []

    def _wall_tick(self, signum: int, frame: Any) -> None:
        self._charge(0, frame)

    def _cpu_tick(self, signum: int, frame: Any) -> None:
        self._charge(1, frame)

    def _charge(self, kind: int, frame: Any) -> None:
        """The line ``frame`` is on charged the expiries of timer ``kind`` (0 wall, 1 CPU) since the last."""
        if self.running and frame is not None and not self.busy:
            self.busy = True
            try:
                seconds = self.timers[kind].expired()
                self.sample(frame, wall=0.0 if kind else seconds, cpu=seconds if kind else 0.0)
            finally:
                self.busy = False

    def sample(self, frame: Any, wall: float = SAMPLE_S, cpu: float = SAMPLE_S) -> None:
        seen: set[tuple[str, int, str]] = set()
        first = True
        while frame is not None:
            code = frame.f_code
            mine = self.mine.get(code)
            if mine is None:
                mine = self.mine[code] = self.own(code.co_filename)
            if mine:
                key = (code.co_filename, frame.f_lineno or 0, code.co_name)
                row = self.seconds.get(key)
                if row is None:
                    row = self.seconds[key] = [0.0, 0.0, 0.0, 0.0]
                if first:
                    row[0] += cpu
                    row[2] += wall
                    first = False
                if key not in seen:
                    seen.add(key)
                    row[1] += cpu
                    row[3] += wall
            frame = frame.f_back
        self.samples += 1
        self.cpu_s += cpu
        self.wall_s += wall

    def to_dict(self) -> dict[str, Any]:
        """Per line: inner and inclusive CPU, then inner and inclusive wall, in samples of ``interval_s``."""
        rows = sorted(self.seconds.items())
        return {"interval_s": SAMPLE_S, "samples": self.samples, "cpu_s": self.cpu_s, "wall_s": self.wall_s,
                "lines": [[*key, *(round(v / SAMPLE_S, 3) for v in row)] for key, row in rows]}


WORKERS_ENV = "RLPERF_WORKER_SAMPLES"
"""The folder where the processes the script forks or starts write their samples (:class:`WorkerSampler`)."""
ROOTS_ENV = "RLPERF_WORKER_ROOTS"
"""Your code's folders, for the Python processes the script starts (:func:`sample_started_process`)."""
STARTUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")
"""The folder of the ``sitecustomize`` that samples them."""
FLUSH_S = 0.2
"""Seconds of a worker's CPU between two writes of its samples at most; a tenth of what it has sampled
at least (0.02 s at first). A worker ended by SIGTERM (a Pool's terminate(), rlperf's stop) loses what
it sampled since: a Pool worker that ran 0.25 s of tasks, then waited for more, lost all of them at
0.2 s (a handler of SIGTERM in every worker would make its end wait for Python: a Pool's terminate()
joins its workers). About 0.7 ms a write of 250 entries."""


class _ThreadTimer:
    """A POSIX timer that sends a signal (SIGPROF unless told) to the calling thread (Linux's ``timer_create`` with
    ``SIGEV_THREAD_ID``, through ctypes), on the thread's CPU clock (``cpu``) or the wall clock. Unlike
    ``setitimer(ITIMER_PROF)`` it leaves the process's CPU clock exact (an armed ITIMER_PROF makes
    ``time.process_time()`` step by 4 ms ticks here), a fork does not inherit it and exec deletes it.
    On the CPU clock it fires at the kernel's tick, and beside busy processes not fairly: see
    :class:`_TaskClock`, which :func:`cpu_timer` prefers."""

    def __init__(self, interval_s: float, cpu: bool, signo: int = 0) -> None:
        import ctypes
        import ctypes.util

        class Sigevent(ctypes.Structure):
            _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                        ("tid", ctypes.c_int), ("pad", ctypes.c_int * 11)]

        class Timespec(ctypes.Structure):
            _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

        class Itimerspec(ctypes.Structure):
            _fields_ = [("interval", Timespec), ("value", Timespec)]

        import signal

        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        event = Sigevent(signo=signo or signal.SIGPROF, notify=4, tid=threading.get_native_id())  # SIGEV_THREAD_ID
        self._id = ctypes.c_void_p()
        clock = 3 if cpu else 1  # CLOCK_THREAD_CPUTIME_ID, CLOCK_MONOTONIC
        if libc.timer_create(clock, ctypes.byref(event), ctypes.byref(self._id)) != 0:
            raise OSError(ctypes.get_errno(), "timer_create")
        period = Timespec(int(interval_s), int(interval_s % 1 * 1e9))
        self._spec, self._off = Itimerspec(period, period), Itimerspec()
        self._setup(interval_s, cpu, libc)

    def _setup(self, interval_s: float, cpu: bool, libc: Any) -> None:
        import ctypes

        self.interval_s, self._clock = interval_s, (time.thread_time if cpu else time.perf_counter)
        self._origin, self._fired = 0.0, 0
        self._libc, self._ctypes = libc, ctypes
        self._pid = os.getpid()

    def start(self) -> None:
        self._origin, self._fired = self._clock(), 0
        self._libc.timer_settime(self._id, 0, self._ctypes.byref(self._spec), None)

    def expired(self) -> float:
        """Seconds of the timer's expiries since the last call (more than one interval where a C call held
        the signal), counted on its clock from :meth:`start`; in the thread that made it (its CPU clock)."""
        count = int((self._clock() - self._origin) / self.interval_s)
        new, self._fired = max(0, count - self._fired), max(count, self._fired)
        return new * self.interval_s

    def stop(self) -> None:
        self._libc.timer_settime(self._id, 0, self._ctypes.byref(self._off), None)

    def close(self) -> None:
        """Stopped and deleted (in the process that made it: a fork has no such timer)."""
        if os.getpid() == self._pid:
            self.stop()
            self._libc.timer_delete(self._id)


class _TaskClock(_ThreadTimer):
    """A signal to the calling thread every ``interval_s`` of its CPU time from the kernel's ``task-clock``
    software event (``perf_event_open``, through ctypes: the event's file signals its owner thread on
    each overflow, ``F_SETSIG``/``F_SETOWN_EX``). Its period is a high-resolution timer that runs while
    the thread runs, so a sample lands anywhere in the thread's CPU time; a POSIX CPU-clock timer is
    checked only at the kernel's tick while the thread holds the CPU, and beside two busy processes a
    pure-Python line between two torch calls got 0.03-0.51x of its CPU in samples from one (this:
    0.9-1.1x). Kernel time is sampled too where the system allows it (``perf_event_paranoid`` <= 1,
    or root), else user time only; raises OSError where the event cannot be opened (a container's
    seccomp filter, ``perf_event_paranoid`` 3)."""

    def __init__(self, interval_s: float, signo: int) -> None:
        import ctypes
        import ctypes.util
        import fcntl

        class Attr(ctypes.Structure):  # struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1)
            _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                        ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                        ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                        ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
                        ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64)]

        class Owner(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("pid", ctypes.c_int)]

        number = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
        if number is None:
            raise OSError("perf_event_open: unknown system call number")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        self._fd = -1
        for exclude_kernel in (0, 1):  # flags: disabled (bit 0), exclude_kernel (bit 5), exclude_hv (bit 6)
            attr = Attr(type=1, size=ctypes.sizeof(Attr), config=1,  # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK
                        sample_period=int(interval_s * 1e9), wakeup_events=1,
                        flags=1 | exclude_kernel << 5 | exclude_kernel << 6)
            self._fd = libc.syscall(number, ctypes.byref(attr), 0, -1, -1, 8)  # this thread, any CPU, FD_CLOEXEC
            if self._fd >= 0:
                break
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "perf_event_open")
        try:
            owner = Owner(1, threading.get_native_id())  # F_OWNER_TID
            if libc.fcntl(self._fd, 15, ctypes.byref(owner)) != 0 or libc.fcntl(self._fd, 10, signo) != 0:
                raise OSError(ctypes.get_errno(), "fcntl")  # F_SETOWN_EX, F_SETSIG
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) | os.O_ASYNC)
        except OSError:
            os.close(self._fd)
            raise
        self._setup(interval_s, True, libc)
        # Expiries are counted on the event's own count, not time.thread_time(): the two drift apart by
        # most of a millisecond in a second, and a sample held by a C call then took the next one's credit
        # (a pure-Python loop between two torch calls read 0.3-0.7x of its CPU beside two busy processes).
        # Read through PyDLL, which keeps the GIL: os.read lets it go and takes it back at once, and done
        # every millisecond that starved a thread waiting for it (a learner spinning on queue.empty()
        # while its actor thread waited forever to put the next item).
        self._count = ctypes.c_uint64()
        self._read_count = ctypes.PyDLL(ctypes.util.find_library("c") or None).read
        self._read_count.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        self._read_count.restype = ctypes.c_ssize_t
        self._clock = self._read

    def _read(self) -> float:
        self._read_count(self._fd, self._ctypes.byref(self._count), 8)
        return self._count.value / 1e9

    def start(self) -> None:
        self._origin, self._fired = self._clock(), 0
        self._libc.ioctl(self._fd, 0x2400, 0)  # PERF_EVENT_IOC_ENABLE

    def stop(self) -> None:
        self._libc.ioctl(self._fd, 0x2401, 0)  # PERF_EVENT_IOC_DISABLE

    def close(self) -> None:
        """Stopped and closed; a fork closes its copy of the file only (disabling it would stop the parent's)."""
        if self._fd >= 0:
            if os.getpid() == self._pid:
                self.stop()
            os.close(self._fd)
            self._fd = -1


TICK_S = 0.004
"""The kernel's tick at 250 Hz: a POSIX CPU-clock timer fires no finer."""


def cpu_timer(interval_s: float, signo: int) -> _ThreadTimer:
    """A timer on the calling thread's CPU clock: :class:`_TaskClock` every ``interval_s``, else (no
    ``perf_event_open``) a POSIX CPU-clock timer no finer than the tick."""
    try:
        return _TaskClock(interval_s, signo)
    except (OSError, AttributeError):
        return _ThreadTimer(max(interval_s, TICK_S), cpu=True, signo=signo)


class WorkerSampler:
    """Where a process the script forked (a multiprocessing worker or actor, a vector env's worker, a
    Pool's) spends its CPU: its stack every :data:`SAMPLE_S` of its thread's CPU time (:class:`_ThreadTimer`),
    each sample weighted by the timer's expiries since the one before (more than one where a C call held
    the tick), so neither a busy machine nor a worker blocked on its pipe moves the shares. The handler
    runs in the worker's thread between two bytecodes and sees the line that was running; a sampling
    thread, waiting for the GIL, saw only where the worker released it (a vector env's pipe, between
    steps of pure Python). For the frames of your code it keeps the innermost line (with the library
    calls it makes), each function on the stack, and each call between two of your frames or from yours
    into a library's, with the caller's line; a sample inside a module's first import is counted apart
    (``imports_s``), not as the worker's work. Written to ``worker-PID.json`` in the folder every
    :data:`FLUSH_S` and as the process exits."""

    def __init__(self, own: Callable[[str], bool], folder: str, inherited: list[Any] | None = None) -> None:
        self.own = own
        # The frames that called fork: the parent's, still on this stack (main() and the Pool's start
        # under the worker's loop). A walk stops there; held, so that no new frame takes their ids.
        self.inherited = inherited or []
        self.stop_at = {id(f) for f in self.inherited}
        self.pid = os.getpid()
        self.path = os.path.join(folder, f"worker-{self.pid}.json")
        self.mine: dict[Any, bool] = {}
        self.cpu_s = self.imports_s = 0.0
        self.lines: dict[tuple[str, int, str, int], float] = {}  # (file, first line, function, line)
        self.functions: dict[tuple[str, int, str], float] = {}
        self.edges: dict[tuple[str, int, str, str, int, str], float] = {}  # caller (file, line, fn) -> callee
        self.samples = 0
        self.flushed = 0.0  # the CPU sampled at the last write
        self.busy = False  # a tick that interrupted a tick's sample waits for the next
        self.timer: _ThreadTimer | None = None
        self.flushing = False  # a tick during a flush (at exit) leaves the writing to it

    def start(self) -> None:
        import atexit
        import signal

        handler = signal.getsignal(signal.SIGPROF)
        if handler not in (signal.SIG_DFL, None) and not isinstance(getattr(handler, "__self__", None),
                                                                   (LineSampler, WorkerSampler)):
            return  # the script samples its workers itself (a fork inherits the script's or a worker's handler)
        try:
            self.timer = cpu_timer(SAMPLE_S, signal.SIGPROF)
        except (OSError, AttributeError):  # no timer_create (not Linux): the workers are not sampled
            return
        signal.signal(signal.SIGPROF, self._tick)
        signal.siginterrupt(signal.SIGPROF, False)  # system calls go on after a tick
        # A fork that returns to the script's code and exits; a multiprocessing worker ends with os._exit
        # instead (rlperf.instruments.child's, which calls worker_ends(): multiprocessing drops finalizers).
        atexit.register(self.stop)
        self.timer.start()

    def stop(self) -> None:
        """No more ticks (at the interpreter's end SIGPROF's default action would end the process),
        and the samples written."""
        if self.timer is not None and os.getpid() == self.pid:
            self.timer.stop()
        self.flush()

    def _tick(self, signum: int, frame: Any) -> None:
        if self.busy or frame is None or self.timer is None:
            return  # its expiries go to the next
        seconds = self.timer.expired()
        self.busy = True
        try:
            self.sample(frame, seconds)
        finally:
            self.busy = False
        if self.cpu_s - self.flushed >= min(FLUSH_S, max(0.02, 0.1 * self.cpu_s)):
            self.flush()

    def sample(self, frame: Any, seconds: float) -> None:
        outer = frame
        while outer is not None and id(outer) not in self.stop_at:
            if outer.f_code.co_filename.startswith("<frozen importlib"):
                # a module's first import (a started worker imports numpy or torch anew): a one-time cost,
                # not the worker's work, kept apart as the main process's imports are
                self.imports_s += seconds
                return
            outer = outer.f_back
        callee: tuple[str, int, str] | None = None  # the frame the one at hand called (the walk goes outwards)
        found = False
        seen: set[Any] = set()
        while frame is not None and id(frame) not in self.stop_at:
            code = frame.f_code
            mine = self.mine.get(code)
            if mine is None:
                mine = self.mine[code] = self.own(code.co_filename)
            here = (code.co_filename, code.co_firstlineno, code.co_name)
            if mine:
                line = frame.f_lineno or 0
                if not found:
                    self.lines[(*here, line)] = self.lines.get((*here, line), 0.0) + seconds
                    found = True
                if here not in seen:
                    seen.add(here)
                    self.functions[here] = self.functions.get(here, 0.0) + seconds
                if callee is not None:
                    edge = (code.co_filename, line, code.co_name, *callee)
                    if edge not in seen:
                        seen.add(edge)
                        self.edges[edge] = self.edges.get(edge, 0.0) + seconds
            callee = here  # what the next frame out called: yours, or a library's function called from your line
            frame = frame.f_back
        self.cpu_s += seconds
        self.samples += 1

    def flush(self) -> None:
        """Write the samples (from a tick, atexit or the worker's end: the dicts are copied whole first,
        which a tick cannot interrupt)."""
        if self.flushing or os.getpid() != self.pid:
            return
        self.flushing = True
        try:
            cpu, samples = self.cpu_s, self.samples
            lines, functions, edges = dict(self.lines), dict(self.functions), dict(self.edges)
            data = {"pid": self.pid, "cpu_s": cpu, "imports_s": self.imports_s, "samples": samples,
                    "lines": [[*k, v] for k, v in lines.items()],
                    "functions": [[*k, v] for k, v in functions.items()],
                    "edges": [[*k, v] for k, v in edges.items()]}
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except OSError:  # the folder is gone (rlperf ended first): nobody reads it
            pass
        finally:
            self.flushed = self.cpu_s
            self.flushing = False


def sample_worker() -> None:
    """In a process the script forked: sample it (:class:`WorkerSampler`), if the script is sampled."""
    global _SAMPLER, _OWN, _WORKER
    folder = os.environ.get(WORKERS_ENV)
    if _SAMPLER is not None:  # the script's sampler: its timers did not survive the fork
        _SAMPLER.running = False
        _SAMPLER.close_timers()  # a task clock's file is closed here, not stopped (it is the parent's)
        _OWN, _SAMPLER = _SAMPLER.own, None
    if _WORKER is not None and _WORKER.timer is not None and _WORKER.pid != os.getpid():
        _WORKER.timer.close()  # the forking worker's, likewise
    if folder and _OWN is not None:
        here = os.path.dirname(os.path.abspath(__file__))
        inherited: list[Any] = []
        frame: Any = sys._getframe(1)
        while frame is not None:  # from the caller of os.fork out (rlperf's at-fork hook left out)
            if not os.path.abspath(frame.f_code.co_filename).startswith(here + os.sep):
                inherited.append(frame)
            frame = frame.f_back
        _WORKER = WorkerSampler(_OWN, folder, inherited)
        _WORKER.start()


def sample_started_process() -> None:
    """In a Python process the script started (a multiprocessing ``spawn`` or ``forkserver`` worker, the
    forkserver itself, a ``python`` subprocess; called from ``rlperf/instruments/startup/sitecustomize.py``):
    sample it, and the processes it forks, like a fork of the script."""
    global _OWN, _WORKER
    folder, roots = os.environ.get(WORKERS_ENV), os.environ.get(ROOTS_ENV)
    if not folder or not roots or _WORKER is not None:
        return
    from multiprocessing import util

    from rlperf.instruments.profilers import user_code

    _OWN = user_code(roots.split(os.pathsep))
    _WORKER = WorkerSampler(_OWN, folder)
    _WORKER.start()
    os.register_at_fork(after_in_child=sample_worker)
    # A forkserver's worker ends with os._exit, which skips atexit; multiprocessing runs its finalizers
    # first, and clears those a fork inherited, so each worker registers its own.
    util.register_after_fork(_WORKER, _finalize_worker)


def _finalize_worker(_: Any) -> None:
    from multiprocessing import util

    util.Finalize(None, worker_ends, exitpriority=0)


def worker_ends() -> None:
    """In a fork that ends: its samples written (see :func:`sample_worker`)."""
    if _WORKER is not None and _WORKER.pid == os.getpid():
        _WORKER.stop()


def worker_samples(folder: str | None = None) -> dict[str, Any] | None:
    """What the script's forked processes wrote (:class:`WorkerSampler`), summed over the processes
    (the same code in each): None when none was sampled."""
    folder = folder or os.environ.get(WORKERS_ENV)
    if not folder or not os.path.isdir(folder):
        return None
    total: dict[str, Any] = {"processes": 0, "cpu_s": 0.0, "imports_s": 0.0, "samples": 0}
    sums: dict[str, dict[tuple[Any, ...], float]] = {"lines": {}, "functions": {}, "edges": {}}
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("worker-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        total["imports_s"] += float(data.get("imports_s") or 0.0)
        if not data.get("samples"):
            continue
        total["processes"] += 1
        total["cpu_s"] += float(data["cpu_s"])
        total["samples"] += int(data["samples"])
        for kind, rows in sums.items():
            for *key, seconds in data.get(kind) or []:
                rows[tuple(key)] = rows.get(tuple(key), 0.0) + float(seconds)
    if not total["processes"]:
        return None
    return total | {"interval_s": SAMPLE_S} | {kind: [[*k, v] for k, v in sorted(rows.items(), key=lambda kv: -kv[1])]
                                              for kind, rows in sums.items()}


_SAMPLER: LineSampler | None = None
_OWN: Callable[[str], bool] | None = None  # in a fork: what is your code (a fork of a worker is sampled too)
_WORKER: WorkerSampler | None = None  # in a fork: its sampler


def sample_lines(kind: str, name: str, workers: Path | None = None) -> None:
    """Start sampling the calling thread's lines of your code (see :class:`LineSampler`); the
    processes the script forks write their samples into ``workers`` (:class:`WorkerSampler`)."""
    global _SAMPLER
    from rlperf.instruments.profilers import user_code

    roots = script_roots(kind, name)
    if workers is not None:
        with contextlib.suppress(OSError):
            workers.mkdir(exist_ok=True)
            os.environ[WORKERS_ENV] = str(workers)
            os.environ[ROOTS_ENV] = os.pathsep.join(roots)
            # the processes the script starts run startup/sitecustomize.py first (sample_started_process)
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (STARTUP, os.environ.get("PYTHONPATH"))))

    _SAMPLER = LineSampler(user_code(roots), threading.get_ident())
    _SAMPLER.start()


def script_roots(kind: str, name: str) -> list[str]:
    """Your code: what lives under the script's folder (the working directory for a module) or the working directory."""
    return [os.path.dirname(os.path.abspath(name)) if kind == "script" else os.getcwd(), os.getcwd()]


def install(kind: str, name: str) -> None:
    """Install the forward hooks for a script (``kind`` "script", ``name`` its path) or a module
    (``kind`` "module"), when it has imported torch (a no-op otherwise): your code is what lives
    under the script's folder or the working directory, as in the profile's tables."""
    global _FORWARDS
    from rlperf.instruments.profilers import user_code

    torch = sys.modules.get("torch")
    if torch is None:
        return
    _FORWARDS = Forwards(user_code(script_roots(kind, name)))
    _FORWARDS.install(torch)


def collect() -> dict[str, Any]:
    """What the hooks recorded (none when torch was never imported), and what a profiled call costs."""
    if _SAMPLER is not None:  # first: the micro-benchmarks below are not the script's time
        _SAMPLER.stop()
    found = _FORWARDS.collect() if _FORWARDS is not None else {}
    if _SAMPLER is not None:
        found["line_samples"] = _SAMPLER.to_dict()
    workers = worker_samples()
    if workers is not None:
        found["workers"] = workers
    return found | {"profiler_cost": profiler_cost()}


def schedstat(tid: int) -> tuple[float, float, int] | None:
    """Thread ``tid`` of this process, from the kernel's scheduler statistics: CPU seconds, seconds it
    was ready to run and waited for a CPU, and the time slices it ran. None where Linux does not say."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
            run, wait, slices = f.read().split()[:3]
        return int(run) / 1e9, int(wait) / 1e9, int(slices)
    except (OSError, ValueError):
        return None


class CpuWait:
    """What one thread (the script's) lost to other processes from :meth:`start` on: the seconds it
    waited for a CPU while ready to run, and in how many waits (time slices). cProfile charges a
    function the wall time it took, so a wait lands on whatever call was running: the advisor reads
    these figures to tell a share that a few waits could have made from one the work made."""

    def __init__(self, tid: int | None = None) -> None:
        self.tid = threading.get_native_id() if tid is None else tid
        self.started: tuple[float, float, int] | None = None
        self.wall = 0.0

    def start(self) -> None:
        self.started, self.wall = schedstat(self.tid), time.perf_counter()

    def to_dict(self) -> dict[str, Any]:
        end = schedstat(self.tid)
        if self.started is None or end is None:
            return {}
        return {"cpu_s": end[0] - self.started[0], "wait_s": end[1] - self.started[1],
                "slices": end[2] - self.started[2], "wall_s": time.perf_counter() - self.wall}


CENSUS_S = 0.5
"""Seconds between two counts of the threads the script's processes kept busy (:class:`ThreadCensus`)."""
GROUP_EVERY = 2
"""Counts between two looks for the processes of the script's group (a worker is seen within a second)."""
EXCESS_THREADS = 0.5
"""How far the threads kept busy must exceed the usable CPUs, on average over a census interval, for
the interval to count as oversubscribed (a thread that wakes to wait on another adds a little)."""


class ThreadCensus:
    """How many threads the script kept busy at once, against the CPUs it may use: every
    :data:`CENSUS_S`, each thread of the script's process and of the processes it started (its process
    group: multiprocessing workers, vector-env workers, DataLoader workers) is read from the kernel's
    scheduler statistics; a thread's demand in the interval is the CPU it ran plus the time it waited,
    ready, for one. A sum above the usable CPUs (by :data:`EXCESS_THREADS`) is the script's own threads
    oversubscribing them (BLAS or OpenMP pools each at the CPU count, or workers each with full pools),
    whatever else runs. rlperf's own threads are left out. A count reads the script's threads (tens of
    µs each); the processes of the group are looked for every :data:`GROUP_EVERY` counts (a pass over
    /proc: about 2 ms with a hundred processes on the machine)."""

    def __init__(self, cpus: float) -> None:
        self.cpus = cpus
        self.last: dict[tuple[int, int], float] = {}  # (pid, tid) -> CPU + wait seconds at the last count
        self.when = 0.0
        self.counts = self.over = self.max_processes = 0
        self.demand_s = self.over_s = self.max_demand = self.watched_s = 0.0
        self.most_threads: dict[int, int] = {}  # pid -> the most threads it had
        self.group: list[int] = []  # the processes of the script's group, as last looked for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.count()
        self._thread = threading.Thread(target=self._run, name="rlperf-thread-census", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stop.wait(CENSUS_S):
            self.count()

    def count(self) -> None:
        now, seen = time.perf_counter(), {}
        me = os.getpid()
        ours = {t.native_id for t in threading.enumerate() if t.name.startswith("rlperf-")}
        if self.counts % GROUP_EVERY == 0 or not self.group:
            self.group = _process_group()
        for pid in self.group:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            self.most_threads[pid] = max(self.most_threads.get(pid, 0), len(tids))
            for tid in tids:
                if pid == me and int(tid) in ours:
                    continue
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                        run, wait = f.read().split()[:2]
                except (OSError, ValueError):
                    continue
                seen[(pid, int(tid))] = (int(run) + int(wait)) / 1e9
        if self.when:
            span = now - self.when
            demand = sum(v - self.last.get(k, v) for k, v in seen.items()) / span if span > 0 else 0.0
            self.counts += 1
            self.watched_s += span
            self.demand_s += demand * span
            self.max_demand = max(self.max_demand, demand)
            if demand > self.cpus + EXCESS_THREADS:
                self.over += 1
                self.over_s += span
        self.max_processes = max(self.max_processes, len({pid for pid, _ in seen}))
        self.last, self.when = seen, now

    def to_dict(self) -> dict[str, Any]:
        workers = [n for pid, n in self.most_threads.items() if pid != os.getpid()]
        return {"interval_s": CENSUS_S, "counts": self.counts, "cpus": self.cpus, "watched_s": self.watched_s,
                "oversubscribed_s": self.over_s,
                "oversubscribed_counts": self.over, "max_threads_busy": self.max_demand,
                "max_processes": self.max_processes, "worker_processes": len(workers),
                "most_threads_per_worker": max(workers, default=0),
                "threads": self.most_threads.get(os.getpid(), 0)}


def _process_group() -> list[int]:
    """This process and the others of its process group (what the script started, unless it made a group of its own)."""
    me, group = os.getpid(), os.getpgrp()
    found = [me]
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == group:
            found.append(int(name))
    return found


def thread_pools() -> dict[str, Any]:
    """The thread pools the process ended with: every BLAS and OpenMP library loaded (threadpoolctl:
    its library, version, threads and the package that ships it), torch's intra- and inter-op threads
    when torch was imported, the CPUs the process may use and the load average."""
    pools = []
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    for info in threadpool_info() if threadpool_info is not None else []:
        pools.append({"api": info.get("user_api"), "library": info.get("internal_api"), "prefix": info.get("prefix"),
                      "version": info.get("version"), "threads": int(info.get("num_threads") or 1),
                      "package": _package_of(str(info.get("filepath") or ""))})
    torch = sys.modules.get("torch")
    return {"pools": pools,
            "torch": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
            if torch is not None else None,
            "cpus": usable_cpus(), "loadavg_1m": os.getloadavg()[0]}


def _package_of(path: str) -> str:
    """The installed package a shared library ships with (``numpy`` for ``site-packages/numpy.libs/...``)."""
    parts = path.replace(os.sep, "/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return parts[i + 1].removesuffix(".libs")
    return os.path.basename(path)

