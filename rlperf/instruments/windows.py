"""cProfile in windows, for a script's long runs: exact over the first :data:`WHOLE_S` seconds, then on
for about a tenth of the time, in short windows at random moments; one table for the whole run.

cProfile slows a Python-heavy loop 1.2-2.5x (0.2-0.6 µs on every call). A run's first seconds hold
its start-up and the first steps of its loop, profiled whole; after them the loop repeats itself, and
windows of it, scaled to the time between them, tell the same story at a tenth of the cost.

Imports are not the loop's work, and cProfile slows them most (torch's optimizer imports
``torch._dynamo`` at its first step: 0.7 s alone, 1.1 s profiled). An import of an installed package or
the standard library made from the profiled thread pauses cProfile until it returns (its seconds are
kept apart, ``imports_s``, neither profiled nor scaled); an import of your own code is profiled, its
top level may be the loop. No window opens inside an import (``importlib.import_module`` and the like
included): a lazy import is a one-time cost, never a window scaled as the loop's work.

Two things make a window's table read like a whole run's:

- **Callers** (:func:`stitch`). A profiler switched on mid-loop (a window, or the exact part going
  on after an import) does not know the frames already
  running: every call they make during the window is recorded without a caller. The stack at each
  switch-on is kept (the signal handler's ``frame``), and each such call is given back to a frame of
  those stacks: in proportion to the callers recorded for the same function elsewhere, else to the
  innermost frame of your code whose source calls it by name. The frames of the stacks get the
  window's time as their cumulative time (half of it for a frame that returned during the window).
- **Scale** (:func:`merge`). The windows' calls and seconds are multiplied by the work between windows
  over the work inside them (their time less what the profiler added per call), then added to the
  first seconds' table, which stays as recorded.

The windows are switched by ``SIGALRM`` (an interval timer of the script's process, in its main
thread, where cProfile must be switched; system calls restart after it). A script that uses SIGALRM
or an interval timer itself is profiled whole, as are runs shorter than :data:`WHOLE_S`.
"""

from __future__ import annotations

import builtins
import contextlib
import cProfile
import importlib
import importlib.machinery
import importlib.util
import math
import random
import signal
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from time import perf_counter
from typing import Any

from rlperf.system import open_schedstat, run_queue_s

Key = tuple[str, int, str]
_SUSPENDS = 0x20 | 0x80 | 0x100 | 0x200
"""Code flags of frames that yield (``inspect.CO_GENERATOR``, ``CO_COROUTINE``, ``CO_ITERABLE_COROUTINE``,
``CO_ASYNC_GENERATOR``; inspect itself is not imported into the profiled process): such a frame lives on
while suspended."""
Table = dict[Key, tuple]  # pstats' raw table: key -> (cc, nc, tt, ct, {caller: (cc, nc, tt, ct)})

WHOLE_S = 0.5
"""Seconds of the script's work profiled whole before the windows (imports left out: they do not
count): its start-up and first steps exact, the rest in windows (``rlperf profile --cprofile-whole
inf``: all of it exact). On the corpus of BENCHMARKS.md the advisor reads the windowed tables as it
reads whole ones (every planted bottleneck named first, no finding on a clean loop) whether the
first 2, 0.5 or 0.2 s are whole; each second whole costs a Python-heavy loop up to another second."""
FIRST_WALL_MAX = 4.0
"""The whole first part's wall time at most, in :data:`WHOLE_S` (its work is counted less the time the
script's thread waited for a CPU: on a machine that busy, windows after four times as long)."""
ON_S = 0.05
"""Seconds of one window after the first :data:`WHOLE_S` (short and many: a window that falls on
something rare weighs little)."""
OFF_S = 0.4
"""Mean seconds between two windows (drawn uniformly from half to one and a half times it: a loop's
own period cannot line up with the windows)."""
WAIT_S = 0.02
"""Seconds a window's start waits while a module is being imported (a lazy import is a one-time
cost: scaled as a window it would read as the loop's work)."""


WATCH_S = 0.05
"""Seconds between two looks at which frames of a part's stack still run (see :meth:`WindowedProfiler._watch`)."""

LOOK_RACE_S = 0.02
"""A look this recent at the run's end may have seen the moment after the loop returned (four GIL
switch intervals); the look before it counts too."""


MAX_SLOWDOWN = 3.0
"""The most cProfile is taken to slow the windows (their work is their time over this at least)."""


Stack = tuple[list[tuple[Key, bool]], float]  # (the frames running at a switch-on, each alive at the end?; seconds)


class WindowedProfiler:
    """cProfile over the first ``whole_s`` seconds, then in windows of ``on_s`` every ``off_s`` or so;
    paused while an installed package is imported (``own(file)``: whether a module's file is your
    code, whose imports are profiled; None: no file is)."""

    def __init__(self, whole_s: float = WHOLE_S, on_s: float = ON_S, off_s: float = OFF_S,
                 own: Callable[[str], bool] | None = None) -> None:
        self.whole_s, self.on_s, self.off_s = whole_s, on_s, off_s
        self.own = own
        self.first = cProfile.Profile()
        self.resumed: list[cProfile.Profile] = []  # the exact part after each import: its own stack's
        self.resumed_stacks: list[Stack] = []
        self.windows: list[cProfile.Profile] = []  # one a window: a window's loose calls are its own stack's
        self.current: cProfile.Profile | None = None  # the one recording (first, resumed or a window)
        self.state = "idle"  # first, on, off, import (paused), done
        self.since = 0.0
        self.timed = {"first": 0.0, "on": 0.0, "off": 0.0, "imports": 0.0}
        # of which the profiled thread was ready to run and waited for a CPU (other processes had them)
        self.waited = {"first": 0.0, "on": 0.0, "off": 0.0, "imports": 0.0}
        self.since_waited = 0.0
        self._schedstat: Any = None  # the profiled thread's /proc schedstat, open (Linux)
        self.stacks: list[Stack] = []
        self._stack: list[Any] = []  # the frames running when the current part opened, outermost first
        self._alive: set[int] = set()  # those of them seen running at the last look (rlperf-stack-watch)
        self._before: set[int] = set()  # and at the look before it
        self._looked = 0.0  # when the last look was (perf_counter)
        self._watcher: threading.Thread | None = None
        self._done = threading.Event()  # set at stop: the watcher ends without waiting out its sleep
        self.windowing = False
        self.rng = random.Random(0)
        self._recorded: tuple[Table, list[Table], list[Table]] | None = None
        self._thread = 0
        self._imports: tuple[Any, Any] | None = None  # builtins.__import__ and importlib.import_module, ours replaced
        self._theirs: dict[str, bool] = {}  # top-level package -> not your code (its imports pause cProfile)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.start()
        try:
            yield
        finally:
            self.stop()

    @property
    def stitched(self) -> bool:
        """Whether some part of the table was recorded switched on mid-run (its callers are stitched)."""
        return bool(self.stacks or self.resumed_stacks)

    def start(self) -> None:
        """Profile from now; windows after ``whole_s`` where this is the main thread and SIGALRM is free."""
        free = (math.isfinite(self.whole_s) and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
                and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
        if free:
            signal.signal(signal.SIGALRM, self._tick)
            signal.siginterrupt(signal.SIGALRM, False)
            signal.setitimer(signal.ITIMER_REAL, max(self.whole_s, 1e-3))  # 0 would disarm it
            self.windowing = True
        self._thread = threading.get_ident()
        self._wrap_imports()
        self._schedstat = open_schedstat()
        self._enter("first")
        self.current = self.first
        self.first.enable()

    def stop(self) -> None:
        """Stop profiling and the timer (the script's end, however it came)."""
        self.first.disable()
        if self.current is not None:
            self.current.disable()
        now = perf_counter()
        self._unwrap_imports()
        if self.windowing:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if signal.getsignal(signal.SIGALRM) == self._tick:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
        self._close(now, None)
        self.state = "done"
        if self._schedstat is not None:
            with contextlib.suppress(OSError):
                self._schedstat.close()
            self._schedstat = None
        self._done.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=1.0)  # see LineSampler.stop: nothing of ours runs at the teardown

    def forked(self) -> None:
        """In a process forked from the script's (a multiprocessing worker): the profile is the script's
        process's, and the fork would run on under the cProfile it inherited (a loop several times
        slower than alone), resuming it after each import: all of it off there."""
        if self.state != "done":
            # The watcher is not in the fork, and its event's lock may have been held at the fork.
            self._done, self._watcher = threading.Event(), None
            self.stop()

    def _enter(self, state: str, now: float | None = None) -> None:
        self.state, self.since = state, perf_counter() if now is None else now
        self.since_waited = run_queue_s(self._schedstat) or 0.0

    def _close(self, now: float, frame: Any) -> None:
        seconds = now - self.since
        if self.state in self.timed:
            self.timed[self.state] += seconds
            self.waited[self.state] += max((run_queue_s(self._schedstat) or 0.0) - self.since_waited, 0.0)
        if self.state == "first" and self._stack:
            self.resumed_stacks.append(self._ended(frame, seconds))
        elif self.state == "on":
            self.stacks.append(self._ended(frame, seconds))

    def _ended(self, frame: Any, seconds: float) -> Stack:
        """The stack the part opened on, each frame alive or not at its end (``frame``: None, the run's
        end, when every frame has returned: those the watcher last saw running count as alive)."""
        if frame is not None:
            alive = {id(f) for f in _frames(frame)}
        elif perf_counter() - self._looked < LOOK_RACE_S:
            # the last look may have come between the loop's return and this end (a GIL switch away):
            # a frame seen at the look before it ran on to the end too (1 run in 5 on a loaded machine, before)
            alive = self._alive | self._before
        else:
            alive = self._alive
        # a generator's frame held at the open runs only to its next yield: each resumption after it is
        # a call cProfile records (the frame does not run through the part, however long it lives)
        stack = [(_key(f.f_code), id(f) in alive and not f.f_code.co_flags & _SUSPENDS) for f in self._stack]
        # the frames are held until here: a new frame cannot take a held one's id
        self._stack, self._alive, self._before = [], set(), set()
        return stack, seconds

    def _held(self, frame: Any) -> None:
        """Hold the stack a part opens on (outermost first), and watch which of its frames keep running."""
        self._stack = list(reversed(_frames(frame)))
        self._alive = self._before = {id(f) for f in self._stack}
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="rlperf-stack-watch", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """Which frames of the current part's stack still run, every :data:`WATCH_S` seconds: at the
        run's end every frame has returned, and one that returned long before (the call that made a
        lazy import) must not be taken for one that ran to the end (the loop)."""
        while not self._done.wait(WATCH_S):
            stack = self._stack
            frame = sys._current_frames().get(self._thread)
            if stack and frame is not None:
                running = {id(f) for f in _frames(frame)}
                if stack is self._stack:  # the part did not end meanwhile
                    self._alive, self._before = {id(f) for f in stack} & running, self._alive
                    self._looked = perf_counter()
            del stack, frame  # the script's frames are not held across the wait (see LineSampler._run)

    def _tick(self, signum: int, frame: Any) -> None:
        if self.state == "import" or (self.state in ("first", "off") and _importing(frame)):
            signal.setitimer(signal.ITIMER_REAL, WAIT_S)  # profiled whole, or not at all, till it ends
            return
        if self.state == "first":  # a window at once: a run that ends before the next one is scaled too
            now = perf_counter()
            wall = self.timed["first"] + now - self.since
            waited = self.waited["first"] + max((run_queue_s(self._schedstat) or 0.0) - self.since_waited, 0.0)
            if wall - waited < self.whole_s - 1e-3 and wall < FIRST_WALL_MAX * self.whole_s:
                # seconds of work, not of waiting for a CPU that other processes held: on a loaded machine
                # the same first steps are whole (a planted env loop was windowed, misread, 4 runs in 6)
                signal.setitimer(signal.ITIMER_REAL, max(self.whole_s - (wall - waited), 1e-3))
                return
            assert self.current is not None
            self.current.disable()
            self._close(perf_counter(), frame)
            self._open(frame)
        elif self.state == "on":
            assert self.current is not None
            self.current.disable()
            self._close(perf_counter(), frame)
            self._enter("off")
            signal.setitimer(signal.ITIMER_REAL, self._between())
        elif self.state == "off":
            self._close(perf_counter(), frame)
            self._open(frame)

    def _between(self) -> float:
        return self.off_s * (0.5 + self.rng.random())

    def _open(self, frame: Any) -> None:
        self._held(frame)
        signal.setitimer(signal.ITIMER_REAL, self.on_s)
        self.current = cProfile.Profile()
        self.windows.append(self.current)
        self._enter("on")
        self.current.enable()  # last: nothing of this handler is recorded but enable's own return

    # -- imports: cProfile paused while an installed package is imported --------------------------

    def _wrap_imports(self) -> None:
        original_import, original_module = self._imports = (builtins.__import__, importlib.import_module)
        profiler = self

        def __import__(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
            package = (globals or {}).get("__package__") if level else None
            if not profiler._pauses(name, package, level):
                return original_import(name, globals, locals, fromlist, level)
            was = profiler._pause(sys._getframe(1))
            try:
                return original_import(name, globals, locals, fromlist, level)
            finally:
                profiler._resume(was, sys._getframe(1))

        def import_module(name: str, package: str | None = None) -> Any:
            level = len(name) - len(name.lstrip("."))
            if not profiler._pauses(name[level:], package, level):
                return original_module(name, package)
            was = profiler._pause(sys._getframe(1))
            try:
                return original_module(name, package)
            finally:
                profiler._resume(was, sys._getframe(1))

        builtins.__import__ = __import__
        importlib.import_module = import_module
        self._wrappers = (__import__, import_module)

    def _unwrap_imports(self) -> None:
        if self._imports is None:
            return
        if builtins.__import__ is self._wrappers[0]:  # the script may have put its own in since
            builtins.__import__ = self._imports[0]
        if importlib.import_module is self._wrappers[1]:
            importlib.import_module = self._imports[1]
        self._imports = None

    def _pauses(self, name: str, package: str | None, level: int) -> bool:
        """Whether importing ``name`` pauses cProfile: a module not imported yet, of a package not
        yours, imported from the profiled thread while cProfile records or waits for a window."""
        if self.state not in ("first", "on", "off") or threading.get_ident() != self._thread:
            return False
        if level:
            if not package:
                return False
            try:
                name = importlib.util.resolve_name("." * level + name, package)
            except (ImportError, ValueError):
                return False
        if not name or name in sys.modules:
            return False
        top = name.partition(".")[0]
        theirs = self._theirs.get(top)
        if theirs is None:
            theirs = self._theirs[top] = not self._is_own(top)
        return theirs

    def _is_own(self, top: str) -> bool:
        """Whether the top-level package ``top`` is your code (its file is under the script's folder)."""
        if self.own is None:
            return False
        module = sys.modules.get(top)
        try:
            spec = module.__spec__ if module is not None else importlib.machinery.PathFinder.find_spec(top)
        except (ImportError, ValueError, AttributeError):
            return False
        if spec is None:
            return False
        places = [spec.origin] if spec.origin not in (None, "built-in", "frozen") else []
        places += list(spec.submodule_search_locations or [])
        return any(self.own(str(place)) for place in places)

    def _pause(self, frame: Any) -> str:
        """cProfile off for an import (the part recording ends there); returns the state it paused."""
        was = self.state
        if was in ("first", "on") and self.current is not None:
            self.current.disable()
        self._close(perf_counter(), frame)
        self._enter("import")
        return was

    def _resume(self, was: str, frame: Any) -> None:
        """After an import: the exact part goes on (a new part, its own stack), or the windows' wait."""
        if self.state != "import":  # stopped meanwhile (the script exited inside the import)
            return
        now = perf_counter()
        self.timed["imports"] += now - self.since
        if was != "first":
            self._enter("off", now)
            if was == "on":  # the window ended at the import: the next one after a wait
                signal.setitimer(signal.ITIMER_REAL, self._between())
            return
        self._held(frame)
        self.current = cProfile.Profile()
        self.resumed.append(self.current)
        if self.windowing:  # the first seconds are seconds profiled: the import's do not count
            signal.setitimer(signal.ITIMER_REAL, max(self.whole_s - self.timed["first"], 1e-3))
        self._enter("first")
        self.current.enable()

    # -- the table ----------------------------------------------------------------------------------

    def recorded(self) -> tuple[Table, list[Table], list[Table]]:
        """What cProfile recorded, less the switches: the first seconds, each window, each exact part
        after an import (read once, after :meth:`stop`)."""
        if self._recorded is None:
            self._recorded = (_without_own(_raw(self.first)), [_without_own(_raw(w)) for w in self.windows],
                              [_without_own(_raw(r)) for r in self.resumed])
        return self._recorded

    def table(self, call_cost: float, calls_by_name: Callable[[Key, str], bool] | None = None) -> Table:
        """The whole run's table: the first seconds as recorded (their parts after imports stitched),
        plus the windows stitched (each with the stack it opened on) and scaled."""
        first, recorded, resumed = self.recorded()
        exact = first
        if resumed:
            exact = _add({}, first)
            for table, stack in zip(resumed, self.resumed_stacks, strict=True):
                part = {k: (*v[:4], dict(v[4])) for k, v in table.items()}
                stitch(part, [stack], first, calls_by_name, after_import=True)
                _add(exact, part)
        if not self.stacks:
            return exact
        stitched: Table = {}
        for table, stack in zip(recorded, self.stacks, strict=True):
            seconds = stack[1]
            # stitched in place (the record stays); no entry longer than the window (a C call left open
            # by an import inside it read 11.9 s in a window of 0.21 s)
            window = {k: _at_most(v, seconds) for k, v in table.items()}
            stitch(window, [stack], exact, calls_by_name)
            # nor the window more time than it lasted (a generator's frame, suspended between its
            # yields, given the window's time besides its resumptions': a sleepy loop read 1.2-1.5x the run)
            total = sum(v[2] for v in window.values())
            _add(stitched, _times(window, seconds / total) if total > seconds > 0 else window)
        return merge(exact, stitched, self.scale(_add({}, *recorded), call_cost))

    def scale(self, windows: Table, call_cost: float) -> float:
        """The work between windows and in them over the work in them (each window's time less the
        profiler's cost for the calls it recorded). Time the script's thread spent waiting for a CPU
        that other processes held is no work: on a loaded machine a few windows of 0.05 s, each
        preempted for milliseconds, read 10-30% short otherwise."""
        calls = sum(v[1] for v in windows.values())
        on = max(self.timed["on"] - self.waited["on"], 1e-9)
        off = max(self.timed["off"] - self.waited["off"], 0.0)
        # cProfile slows a loop 1-3x (BENCHMARKS.md): a cost per call that says more is a loop of
        # calls too small to calibrate against, and the bound keeps the scale from running away
        slowdown = min(max(on / max(on - call_cost * calls, 1e-9), 1.0), MAX_SLOWDOWN)
        return 1.0 + off * slowdown / on

    def summary(self, call_cost: float) -> dict[str, Any]:
        """What the record says of the profile: whole, or its first seconds and windows, the calls
        cProfile recorded (what it cost), the seconds of imports it was paused for, and the factor
        the windows were scaled by."""
        first, tables, resumed = self.recorded()
        windows = _add({}, *tables)
        recorded = sum(v[1] for t in (first, windows, *resumed) for v in t.values())
        out: dict[str, Any] = {"whole": not self.stacks, "whole_s": self.timed["first"], "recorded_calls": recorded,
                               "imports_s": self.timed["imports"]}
        if self.stacks:
            out.update(windows=len(self.stacks), on_s=self.timed["on"], off_s=self.timed["off"],
                       scale=self.scale(windows, call_cost))
        return out


def _frames(frame: Any) -> list[Any]:
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def _importing(frame: Any) -> bool:
    """Whether the frame runs inside an import (importlib's frames under it)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _key(code: Any) -> Key:
    return (code.co_filename, code.co_firstlineno, code.co_name)


def _raw(profile: cProfile.Profile) -> Table:
    profile.create_stats()
    return dict(profile.stats)


def _without_own(table: Table) -> Table:
    """The table less this module's handler and what it called (a window's switch)."""
    mine = {k for k in table if k[0] == __file__}
    out: Table = {}
    for key, (cc, nc, tt, ct, callers) in table.items():
        if key in mine:
            continue
        for caller in mine & set(callers):
            c = callers[caller]  # (nc, cc, tt, ct)
            cc, nc, tt, ct = cc - c[1], nc - c[0], tt - c[2], ct - c[3]
        if nc <= 0:
            continue
        out[key] = (cc, nc, tt, ct, {c: v for c, v in callers.items() if c not in mine})
    return out


def stitch(windows: Table, stacks: list[Stack], known: Table,
           calls_by_name: Callable[[Key, str], bool] | None = None, after_import: bool = False) -> None:
    """Give the windows' calls without a caller to the frames of the stacks they were made from (see
    the module docstring), and those frames their time; in place. ``after_import``: the part after an
    import: what no frame of your code explains is the innermost frame's that ran on to the part's end
    (the one that imported, unless it returned: the loop around it goes on)."""
    present, depth, edges = _stack_frames(stacks, known, windows)
    ran_on = {key for stack, _ in stacks for key, alive in stack if alive} if after_import else None
    given = _give_loose_calls(windows, present, depth, known, calls_by_name, len(stacks), ran_on)
    _time_stack_frames(windows, present, edges, given)


def _stack_frames(stacks: list[Stack], known: Table, windows: Table
                  ) -> tuple[dict[Key, float], dict[Key, int], dict[tuple[Key, Key], float]]:
    """Each stack frame's seconds in the windows, its greatest depth, and each (outer, inner) pair's seconds."""
    present: dict[Key, float] = defaultdict(float)
    depth: dict[Key, int] = {}
    edges: dict[tuple[Key, Key], float] = defaultdict(float)
    for stack, seconds in stacks:
        seen: set[Key] = set()
        previous: Key | None = None
        for i, (key, alive) in enumerate(stack):
            if key in seen:  # recursion: cumulative time counts the outermost call
                continue
            seen.add(key)
            # a call that returned during the window had, on average, half of one call's time left
            part = seconds if alive else min(seconds, 0.5 * _mean_call(key, known, windows))
            present[key] += part
            depth[key] = max(depth.get(key, 0), i)
            if previous is not None:
                edges[(previous, key)] += part
            previous = key
    return present, depth, edges


def _give_loose_calls(windows: Table, present: Mapping[Key, float], depth: Mapping[Key, int], known: Table,
                      calls_by_name: Callable[[Key, str], bool] | None, windows_seen: int,
                      ran_on: set[Key] | None = None) -> dict[Key, float]:
    """Callers for the calls recorded without one (in place); returns the seconds given to each frame."""
    given: dict[Key, float] = defaultdict(float)
    for key in list(windows):
        cc, nc, tt, ct, callers = windows[key]
        loose = nc - sum(v[0] for v in callers.values())  # a caller's figures: (nc, cc, tt, ct)
        if loose <= 0:
            continue
        counts = _callers_of(key, loose, present, depth, windows, known, calls_by_name, windows_seen, ran_on)
        callers = dict(callers)
        explained = sum(v[3] for v in callers.values())
        # the loose calls are outermost: their time is what the recorded callers leave of the cumulative
        # time, which counts outermost calls only (a recursive one: its mean outermost call's)
        cumulative = ct - explained if cc == nc and explained <= ct else ct * min(1.0, loose / max(cc, 1))
        for caller, n in counts.items():
            old = callers.get(caller, (0, 0, 0.0, 0.0))
            part = (tt * n / nc, cumulative * n / loose)
            callers[caller] = (old[0] + n, old[1] + n, old[2] + part[0], old[3] + part[1])
            given[caller] += part[1]
        windows[key] = (cc, nc, tt, ct, callers)
    return given


def _time_stack_frames(windows: Table, present: Mapping[Key, float], edges: Mapping[tuple[Key, Key], float],
                       given: Mapping[Key, float]) -> None:
    """The stack frames' time in the windows (in place): at least what they were seen running, and
    at least their loose calls' and their inner frames' time."""
    # a frame under several parents (stacks caught it in different places) shares its time among them
    into: dict[Key, float] = defaultdict(float)
    for (_parent, child), seconds in edges.items():
        into[child] += seconds
    share = {edge: seconds / into[edge[1]] for edge, seconds in edges.items() if into[edge[1]] > 0}
    children: dict[Key, list[Key]] = defaultdict(list)
    for parent, child in share:
        children[parent].append(child)
    inclusive: dict[Key, float] = {}

    def time_in(key: Key, path: frozenset[Key] = frozenset()) -> float:
        """A stack frame's seconds in the windows: at least its calls' and its inner frames'."""
        if key not in inclusive:
            inclusive[key] = max(present[key], given.get(key, 0.0) + inner(key, path | {key}))
        return inclusive[key]

    def inner(key: Key, path: frozenset[Key] = frozenset()) -> float:
        return sum(time_in(c, path) * share[(key, c)] for c in children[key] if c not in path)

    for key in present:
        cc, nc, tt, ct, callers = windows.get(key, (0, 0, 0.0, 0.0, {}))
        callers = dict(callers)
        for (parent, child), fraction in share.items():
            if child == key:
                old = callers.get(parent, (0, 0, 0.0, 0.0))
                callers[parent] = (old[0], old[1], old[2], old[3] + time_in(key) * fraction)
        own = time_in(key) - given.get(key, 0.0) - inner(key, frozenset({key}))
        windows[key] = (cc, nc, tt + max(0.0, own), ct + time_in(key), callers)


def _mean_call(key: Key, *tables: Table) -> float:
    calls = sum(t[key][1] for t in tables if key in t)
    return sum(t[key][3] for t in tables if key in t) / calls if calls else 0.0


def _callers_of(key: Key, loose: float, present: Mapping[Key, float], depth: Mapping[Key, int], windows: Table,
                known: Table, calls_by_name: Callable[[Key, str], bool] | None, windows_seen: int,
                ran_on: set[Key] | None = None) -> dict[Key, float]:
    """Calls of ``key`` without a caller, by frame of the stacks: those its recorded callers among the
    frames would have made (their calls to it per second times their seconds on the stacks); the rest
    to the innermost frame of your code whose source calls it by name, else (once a window or more) to
    the frame of your code that runs longest through the windows (the loop's); after an import
    (``ran_on``: the stack's frames still running at the part's end), to the innermost of those
    (the frame that imported, or the one it returned to). Else left without a caller (as cProfile
    left them)."""
    expected: dict[Key, float] = defaultdict(float)
    for table in (known, windows):
        for caller, v in (table.get(key, (0, 0, 0, 0, {}))[4]).items():
            if caller in present and caller != key and caller in table and table[caller][3] > 0:
                expected[caller] += v[0] / table[caller][3] * present[caller]
    total = sum(expected.values())
    out = {caller: n * min(1.0, loose / total) for caller, n in expected.items()} if total > 0 else {}
    rest = loose - sum(out.values())
    if rest < 0.5:
        return out
    innermost = sorted(present, key=lambda k: -depth[k])
    frame = None
    if calls_by_name is not None:
        name = _called_as(key)
        frame = next((f for f in innermost if f != key and calls_by_name(f, name)), None)
        if frame is None and rest >= windows_seen:  # called under another name, about once a window at least
            # (a decorated function: ``optimizer.step`` is torch's ``wrapper``)
            frame = max((f for f in innermost if f != key and calls_by_name(f, "")), key=lambda f: present[f],
                        default=None)
    if frame is None and ran_on is not None:
        frame = next((f for f in innermost if f != key and f in ran_on), None) or next(
            (f for f in innermost if f != key), None)
    if frame is not None:
        out[frame] = out.get(frame, 0.0) + rest
    return out


def _called_as(key: Key) -> str:
    """The name a call site uses: a function's own, a builtin's last word (``<method 'item' of ...>``)."""
    if key[0] != "~":
        return key[2]
    text = key[2].strip("<>")
    if "'" in text:
        return text.split("'")[1]
    return text.rsplit(".", 1)[-1].split()[-1]


def _add(into: Table, *tables: Table) -> Table:
    """``tables`` added into ``into``, caller by caller (in place; returns it)."""
    for table in tables:
        for key, (cc, nc, tt, ct, callers) in table.items():
            old = into.get(key, (0, 0, 0.0, 0.0, {}))
            both = dict(old[4])
            for caller, c in callers.items():
                o = both.get(caller, (0, 0, 0.0, 0.0))
                both[caller] = tuple(a + b for a, b in zip(o, c, strict=True))
            into[key] = (old[0] + cc, old[1] + nc, old[2] + tt, old[3] + ct, both)
    return into


def _at_most(v: tuple, seconds: float) -> tuple:
    """A table entry whose times (and its callers') are at most ``seconds``."""
    return (v[0], v[1], min(v[2], seconds), min(v[3], seconds),
            {c: (a[0], a[1], min(a[2], seconds), min(a[3], seconds)) for c, a in v[4].items()})


def _times(table: Table, factor: float) -> Table:
    """``table``'s times (not its counts) times ``factor``."""
    return {k: (v[0], v[1], v[2] * factor, v[3] * factor,
                {c: (a[0], a[1], a[2] * factor, a[3] * factor) for c, a in v[4].items()}) for k, v in table.items()}


def merge(first: Table, windows: Table, scale: float) -> Table:
    """``first`` plus ``windows`` times ``scale`` (calls rounded), caller by caller."""

    def scaled(v: tuple) -> tuple:
        return (round(v[0] * scale), round(v[1] * scale), v[2] * scale, v[3] * scale)

    out: Table = {k: (v[0], v[1], v[2], v[3], dict(v[4])) for k, v in first.items()}
    for key, v in windows.items():
        cc, nc, tt, ct = scaled(v[:4])
        old = out.get(key, (0, 0, 0.0, 0.0, {}))
        callers = old[4]
        for caller, c in v[4].items():
            s = scaled(c)
            o = callers.get(caller, (0, 0, 0.0, 0.0))
            callers[caller] = tuple(a + b for a, b in zip(o, s, strict=True))
        # a frame running through the windows only was called once at least
        out[key] = (max(old[0] + cc, 1), max(old[1] + nc, 1), old[2] + tt, old[3] + ct, callers)
    return out
