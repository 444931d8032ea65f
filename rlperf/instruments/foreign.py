"""The advisor on your own code: the bottleneck checklist as rules over a script's profile.

``rlperf profile -- python train.py`` knows nothing of the script's config, so these rules read
only what the run measured: cProfile's call graph (which of *your* functions -- files under the
script's folder or the working directory -- call what, how often, for how long), the GC monitor
(with the allocations that triggered collections), the forward hooks of
:mod:`rlperf.instruments.evidence` (grad mode as each forward ran, whether a backward used it,
micro-benchmarks of the same module on the same inputs) and the loop's step count (the script's
``timer.step_done()`` calls, else the env's ``step`` calls). Every bottleneck is defined once, in
:mod:`rlperf.instruments.catalogue`: a finding here reads as the same finding on rlperf's own loop.

Each finding names the offending line: the call inside your code (``train.py:42 (push)``), found
from cProfile's caller information -- the first of your functions above the library call -- and
the line of that call in the function's source. Its saving is charged against the time of that
call site, never the whole enclosing ``main()``, is at most that time, and its ``estimate`` says how
it was measured.

Precision before recall: a rule fires only when the pattern is unambiguous and its saving is at
least :data:`MIN_SHARE` of the script's time (a bottleneck worth fixing costs far more), so a clean
loop gets no finding; when no rule fires and one place still holds :data:`HOT_SHARE` of the
script, the finding is ``hot_spot``, never a clean bill.
"""

from __future__ import annotations

import ast
import functools
import math
import os
import re
import shlex
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rlperf.instruments.advisor import call_time, effective_cpus
from rlperf.instruments.catalogue import Finding, finding
from rlperf.instruments.profilers import CallStats
from rlperf.instruments.sources import Sources
from rlperf.report.units import percent_short, seconds_short

Key = tuple[str, int, str]
MIN_SHARE = 0.04
"""A finding's estimated saving must reach this share of the script's time (a planted or real
bottleneck worth a fix costs several times more; a clean loop's incidental costs stay below)."""
MIN_SAMPLES = 20
"""Line samples a function needs before the advisor reads where in it the time goes (0.2 s at the sampler's rate)."""
HOT_SHARE = 0.25
"""A function whose own Python time holds this share of the script is a hot spot when no rule explains it."""
LIBRARY_HOT_SHARE = 0.4
"""A library call is a hot spot from this share: a clean loop's replay or env library can hold a third."""


def callee_name(key: Key) -> str:
    """The name a call of ``key`` has in source: ``item``, ``print``, ``tensor``, ``load_state_dict``."""
    if key[0] != "~":
        return key[2]
    text = key[2]
    m = re.match(r"<method '(\w+)' of", text) or re.match(r"<built-in method ([\w.]+)", text)
    return m.group(1).rsplit(".", 1)[-1] if m else text


def short_file(file: str) -> str:
    """The script's path as the user gave it: relative to the working directory, else its basename."""
    cwd = os.getcwd() + os.sep
    return file[len(cwd):] if file.startswith(cwd) else os.path.basename(file)


# -- the call graph ---------------------------------------------------------------------------------


@dataclass
class Edge:
    """Your function ``caller`` calling ``callee`` (directly, or through library frames): how often, how long."""

    caller: Key
    callee: Key
    calls: int
    seconds: float


class ScriptProfile:
    """A script's cProfile table, read as a call graph: who calls what, how often, for how long."""

    def __init__(self, calls: CallStats, sources: Sources | None = None, call_cost: float = 0.0) -> None:
        self.raw: Mapping[Key, tuple] = calls.entries
        # What cProfile adds per recorded call (evidence.profiler_cost): times below leave it out, so a
        # Python-heavy call site is charged what it costs alone, not what it cost under the profiler.
        self.call_cost = call_cost
        self._under: dict[Key, float] = {}
        self.own = calls.own
        self.sources = sources or Sources()
        # The script's time without imports (of its own modules, and of packages imported inside
        # functions): the shares below are of the work the script does.
        self._holder: Key | None = None
        self.callees: dict[Key, list[tuple[Key, int, float]]] = defaultdict(list)
        for key, (_cc, _nc, _tt, _ct, callers) in self.raw.items():
            for caller, (_ccc, nc, _ttt, ct) in callers.items():
                self.callees[caller].append((key, nc, ct))
        total = calls.total_s or sum(v[2] for v in self.raw.values())
        imports = [k for k in self.raw if k[2] == "_find_and_load" and "importlib" in k[0]]
        importing = sum(self.raw[k][3] for k in imports)
        # cProfile's cost for the calls outside the imports (those under them left with the imports' time),
        # the calls taken as spread over the time (importing makes calls faster than a loop: a little more
        # than its share of them is left out here)
        counted = calls.total_calls * max(0.0, total - importing) / total if total > 0 else 0.0
        self.total = max(total - importing - call_cost * counted, 0.05 * (total - importing), 1e-9)
        self.raw_total = max(total - importing, 1e-9)  # the same, cProfile's cost left in
        # The line sampler's (rlperf.instruments.evidence.LineSampler): (file, function) -> line -> samples with
        # that line of the function on the stack, weighted by the thread's CPU (line_samples) and by wall time
        # (line_wall). Empty without samples (a script profiled in-process).
        self.line_samples: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
        self.line_wall: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)

    def add_line_samples(self, samples: Mapping[str, Any] | None) -> None:
        for row in (samples or {}).get("lines") or []:
            file, line, function, inclusive = row[0], int(row[1]), row[2], float(row[4])
            self.line_samples[(file, function)][line] = inclusive
            self.line_wall[(file, function)][line] = float(row[6]) if len(row) >= 7 else inclusive

    def _main_module(self, run_by: Key) -> Key | None:
        """The script's own top level among the modules ``run_by`` (exec) ran: the longest."""
        ran = [k for k in self.raw if k[2] == "<module>" and run_by in self.raw[k][4]]
        return max(ran, key=self.cumtime, default=None)

    def imported_only(self, key: Key) -> bool:
        """Whether every call of ``key`` came from a module's top level run by an import (time the
        script's total leaves out with the imports)."""
        def imported(module: Key) -> bool:  # importlib runs a module's top level through exec
            callers = self.raw.get(module, (0, 0, 0, 0, {}))[4]
            if any("importlib" in c[0] for c in callers):
                return True
            for c in (c for c in callers if "exec" in c[2]):
                runs = self.raw.get(c, (0, 0, 0, 0, {}))[4]  # who called exec: importlib, runpy (the script)
                if any("importlib" in cc[0] for cc in runs):
                    # exec ran the script (runpy) and imported modules both: the script's top level is
                    # the module of the longest run among those exec ran
                    return not (any("runpy" in cc[0] for cc in runs) and module == self._main_module(c))
            return False

        callers = self.raw[key][4] if key in self.raw else {}
        return bool(callers) and all(c[2] == "<module>" and imported(c) for c in callers)

    def hottest_line(self, fn: Key) -> int | None:
        """The line of ``fn`` that holds most of its wall time, as sampled (None without samples): where
        its time goes, as cProfile's time of it counts it, waits included."""
        lines = self.line_wall.get((fn[0], fn[2]))
        return max(lines, key=lambda line: lines[line]) if lines else None

    def loop_share(self, fn: Key) -> float | None:
        """The share of ``fn``'s CPU samples on lines inside its loops: near 1 when its time is a Python loop,
        small when a loop of it runs few times (None under :data:`MIN_SAMPLES` samples)."""
        lines = self.line_samples.get((fn[0], fn[2])) or {}
        n = sum(lines.values())
        if n < MIN_SAMPLES:
            return None
        return sum(c for line, c in lines.items() if self.sources.in_loop(fn, line)) / n

    def compiled(self, fn: Key) -> bool:
        """Whether ``fn``'s loops run compiled (numba): cProfile charges a jitted call to the function's
        Python key, but none of its time is Python bytecode. (The line sampler cannot tell: a jitted
        function has no Python frame, its samples land on the line that called it.)"""
        return self.sources.jit_compiled(fn)

    def calls(self, key: Key) -> int:
        return int(self.raw[key][1]) if key in self.raw else 0

    def cumtime(self, key: Key) -> float:
        if key not in self.raw:
            return 0.0
        return max(0.0, float(self.raw[key][3]) - self.call_cost * (self.calls(key) + self.calls_under(key)))

    def calls_under(self, key: Key) -> float:
        """Calls made beneath ``key`` in all, each callee's shared out by the calls that reached it."""
        if key in self._under:
            return self._under[key]
        self._under[key] = 0.0  # a recursive call adds nothing more
        total = 0.0
        try:
            for k, nc, _ in self.callees.get(key, []):
                total += nc + self.calls_under(k) * nc / max(1, self.calls(k))
        except RecursionError:
            pass
        self._under[key] = total
        return total

    def tottime(self, key: Key) -> float:
        return float(self.raw[key][2]) if key in self.raw else 0.0

    def is_user(self, key: Key) -> bool:
        return self.own(key[0])

    def keys(self, name: str | None = None, path: str | None = None, builtin: str | None = None) -> list[Key]:
        """Functions called ``name`` in a file whose path contains ``path``, or builtins whose name contains ``builtin``."""
        found = []
        for key in self.raw:
            file = key[0].replace(os.sep, "/")
            if builtin is not None:
                if key[0] == "~" and builtin in key[2]:
                    found.append(key)
            elif (name is None or key[2] == name) and (path is None or path in file):
                found.append(key)
        return found

    def edges(self, keys: Iterable[Key], depth: int = 0, net: bool = True) -> list[Edge]:
        """Your functions' calls of ``keys``: directly, or through up to ``depth`` library frames (the
        first of your functions above the library call is where the call site is). ``net``: their time
        less the profiler's cost for the calls recorded (not for a poll, whose time is the wait's)."""
        out: dict[tuple[Key, Key], Edge] = {}
        for key in set(keys):
            frontier, seen = [key], {key}
            for level in range(depth + 1):
                nxt = []
                for k in frontier:
                    for caller, (_cc, nc, _tt, ct) in self.raw.get(k, (0, 0, 0, 0, {}))[4].items():
                        if self.is_user(caller):
                            edge = out.setdefault((caller, k), Edge(caller, k, 0, 0.0))
                            edge.calls += int(nc)
                            profiled = nc * (1 + self.calls_under(k) / max(1, self.calls(k)))
                            edge.seconds += max(0.0, float(ct) - self.call_cost * profiled * net)
                        elif level < depth and caller not in seen:
                            seen.add(caller)
                            nxt.append(caller)
                frontier = nxt
        return list(out.values())

    def calls_any(self, caller: Key, keys: Iterable[Key]) -> bool:
        wanted = set(keys)
        return any(k in wanted for k, _, _ in self.callees.get(caller, []))

    def subtree(self, key: Key, depth: int = 6) -> set[Key]:
        """Everything ``key`` calls, down to ``depth`` levels."""
        seen, frontier = {key}, [key]
        for _ in range(depth):
            frontier = [k for f in frontier for k, _, _ in self.callees.get(f, []) if k not in seen]
            seen.update(frontier)
        return seen

    def where(self, caller: Key, callee: Key | Iterable[str] | None = None) -> str:
        """``train.py:42 (push)``: the line in ``caller`` that calls ``callee`` (a key or names)."""
        line = self.line(caller, callee)
        name = caller[2]
        if name.startswith("<") and name != "<module>":  # a comprehension: the function it is in
            name = self.sources.enclosing_function(caller[0], caller[1]) or name
        return f"{short_file(caller[0])}:{line} ({name})"

    def line(self, caller: Key, callee: Key | Iterable[str] | None = None) -> int:
        """The line in ``caller`` that calls ``callee`` (its def line when the source does not say)."""
        if isinstance(callee, tuple) and callee[0] == caller[0] and callee[2].startswith("<"):
            return callee[1]  # a comprehension or lambda: the line it is on
        if callee is None:
            return caller[1]
        if isinstance(callee, tuple):
            names = [callee_name(callee)]
            if callee[2] == "__init__":
                names.append(self.sources.class_of(callee) or "__init__")
        else:
            names = list(callee)
        # A method: the calls on the names bound to its class first (``rb.sample()``, not ``space.sample()``).
        cls = self.sources.class_of(callee) if isinstance(callee, tuple) and callee[2] != "__init__" else None
        receivers = self.sources.bound_to(caller[0], cls) if cls else frozenset()
        lines = self.sources.call_lines(caller, names, receivers=receivers)
        if not lines and isinstance(callee, tuple):  # a decorator's wrapper: the name of what it wraps
            lines = self.sources.call_lines(caller, [callee_name(k) for k, _, _ in self.callees.get(callee, [])])
        return lines[0] if lines else caller[1]

    def loop_site(self, fn: Key) -> tuple[Key, int]:
        """Where the loop calls your function ``fn`` (through your other functions): the loop's function
        and the line; ``fn`` and its def line when it holds the loop itself."""
        holder, line, _ = self.loop_call(fn)
        return holder, line

    def loop_call(self, fn: Key) -> tuple[Key, int, Key]:
        """:meth:`loop_site`, with the function the loop's line calls (``fn`` or one of yours above it)."""
        holder = self.loop_holder()
        child, current, seen = fn, fn, {fn}
        for _ in range(8):
            if current == holder:
                break
            callers = [(c, v[3]) for c, v in self.raw.get(current, (0, 0, 0, 0, {}))[4].items()
                       if self.is_user(c) and c not in seen]
            if not callers:
                break
            child, current = current, max(callers, key=lambda t: t[1])[0]
            seen.add(current)
        if current == fn:
            return fn, fn[1], fn
        return current, self.line(current, child), child

    def python_time(self, fn: Key) -> float:
        """``fn``'s own Python time: its bytecode's and its comprehensions' (whoever drives them: a
        generator is resumed by the ``sum`` that consumes it)."""
        node = self.sources.function(fn)
        end = getattr(node, "end_lineno", None) or fn[1]
        return self.tottime(fn) + sum(self.tottime(k) for k in self.raw if k[0] == fn[0] and k[2].startswith("<")
                                      and k[2] != "<module>" and fn[1] <= k[1] <= end)

    def offending(self, caller: Key, callee: Key) -> str:
        """The offending line of your function ``caller`` calling ``callee``: the call itself when a loop
        is around it (or ``caller`` holds the loop), else the loop's call of ``caller`` (a save() helper
        called every step)."""
        looped = self.sources.enclosing_loop(caller[0], self.line(caller, callee)) is not None
        if looped or caller == self.loop_holder() or self.loop_site(caller)[0] == caller:
            return self.where(caller, callee)  # (no known caller of ``caller``: its call, not its def line)
        return self.loop_where(caller)

    def loop_where(self, fn: Key) -> str:
        """``train.py:149 (main)``: the line of the loop that calls ``fn``."""
        caller, line = self.loop_site(fn)
        return f"{short_file(caller[0])}:{line} ({caller[2]})"

    def loop_holder(self) -> Key | None:
        """Your function that holds the loop (``main``, ``Trainer.train``, ``<module>``): from the one with
        the most time, down through functions called once or twice that hold most of their caller's."""
        if self._holder is None:
            current = max((k for k in self.raw if self.is_user(k)), key=self.cumtime, default=None)
            while current is not None:
                kids = [(k, ct) for k, _, ct in self.callees.get(current, [])
                        if self.is_user(k) and self.calls(k) <= 2 and not k[2].startswith("<")]
                best = max(kids, key=lambda t: t[1], default=None)
                importing = sum(ct for k, _, ct in self.callees.get(current, []) if k[2] == "_find_and_load")
                if best is None or best[1] < 0.5 * (self.cumtime(current) - importing):
                    break
                current = best[0]
            self._holder = current
        return self._holder


def script_steps(record: Mapping[str, Any], calls: CallStats | None) -> tuple[int, str] | None:
    """The loop's steps, and how they were counted: the script's ``timer.step_done()`` calls, else the
    env's ``step`` calls (a vector env's first, then a single env's or your own ``step`` methods)."""
    steps = int((record.get("totals") or {}).get("vector_steps") or 0)
    if steps:
        return steps, "timer.step_done() calls"
    if calls is None:
        return None
    p = ScriptProfile(calls)
    for path, basis in (("gymnasium/vector/", "VectorEnv.step calls"), ("gymnasium/", "Env.step calls")):
        most = max((p.calls(k) for k in p.keys("step", path)), default=0)
        if most:
            return most, basis
    most = max((p.calls(k) for k in p.keys("step") if p.is_user(k)), default=0)
    if most:
        return most, "calls of your step method"
    # A functional env: your function that steps it (env_step, step_env), not an update's step.
    stepping = [k for k in p.raw if p.is_user(k) and "step" in k[2].lower()
                and not any(w in k[2].lower() for w in ("train", "update", "optim", "learn", "grad"))]
    most = max((p.calls(k) for k in stepping), default=0)
    return (most, f"calls of {max(stepping, key=p.calls)[2]}") if most else None


def _optimizer_steps(p: ScriptProfile) -> int:
    keys = [k for k in p.keys("step", "torch/optim/") if "lr_scheduler" not in k[0]]
    return max((p.calls(k) for k in keys), default=0)


def _share(p: ScriptProfile, seconds: float) -> str:
    return f"{seconds_short(seconds)}, {percent_short(min(1.0, seconds / p.total))} of the script"


def _total(edges: Iterable[Edge]) -> tuple[int, float]:
    edges = list(edges)
    return sum(e.calls for e in edges), sum(e.seconds for e in edges)


def _by_caller(edges: Iterable[Edge]) -> dict[Key, list[Edge]]:
    out: dict[Key, list[Edge]] = defaultdict(list)
    for e in edges:
        out[e.caller].append(e)
    return out


def _top(edges: list[Edge]) -> Edge:
    return max(edges, key=lambda e: e.seconds)


def _per_step(n: int, steps: tuple[int, str] | None) -> str:
    return f", {n / steps[0]:,.1f} per step ({steps[1]})" if steps else ""


# -- the rules ----------------------------------------------------------------------------------

@dataclass
class Evidence:
    """What the rules read: the call graph, the GC monitor, the forward hooks, the step count."""

    record: Mapping[str, Any]
    p: ScriptProfile | None
    gc: Mapping[str, Any] | None
    steps: tuple[int, str] | None
    hooks: Mapping[str, Any]

    @property
    def counts_estimated(self) -> bool:
        """Whether the call counts are estimates: cProfile ran in windows, scaled to the run
        (rlperf.instruments.windows). A threshold on a ratio of counts then wants a margin."""
        windows = ((self.record.get("profile") or {}).get("cprofile") or {}).get("windows") or {}
        return windows.get("whole") is False

    def _cpu_wait(self) -> tuple[float, int]:
        """What the script's thread waited for a CPU (rlperf.instruments.evidence.CpuWait): seconds, waits."""
        wait = (self.record.get("profile") or {}).get("cpu_wait") or {}
        return float(wait.get("wait_s") or 0.0), int(wait.get("slices") or 0)

    def own_total(self) -> float:
        """The script's profiled time less what its thread waited for a CPU: about what it takes on a
        machine of its own, which a saving is a share of (a saving is measured in the script's own work;
        beside busy processes the wall time grows by the waits, and a 4% floor of it would drop a real
        bottleneck). Never under a tenth of the profiled time, should the two clocks disagree."""
        if self.p is None:
            return 0.0
        return max(self.p.total - self._cpu_wait()[0], 0.1 * self.p.total)

    def clears(self, seconds: float, threshold_s: float) -> bool:
        """Whether ``seconds`` of the profile reach ``threshold_s`` beyond what waiting for a CPU could
        have put there: cProfile charges a call the wall time it took, so on a busy machine each of
        the script's waits (their seconds and number, :meth:`_cpu_wait`) lands on whatever call was
        running. Taken as landing at random, in proportion to time, the waits that land in a part
        holding a share q of the script spread by sqrt(q (1 − q) / waits) × the seconds waited; a part
        must clear the threshold by twice that. On a quiet machine, nothing."""
        waited, waits = self._cpu_wait()
        if self.p is None or waited <= 0 or waits <= 0:
            return seconds >= threshold_s
        q = min(1.0, max(0.0, seconds / self.p.total))
        return seconds - 2 * waited * math.sqrt(q * (1 - q) / waits) >= threshold_s


COUNT_MARGIN = 0.1
"""How much a ratio of estimated counts must clear a rule's threshold by (windows: counts a few percent off)."""

ScriptRule = Callable[[Evidence], "Finding | None"]

HOST_COPIES = ("item", "cpu", "numpy", "tolist")


def _tensor_methods(p: ScriptProfile, names: Iterable[str]) -> list[Key]:
    wanted = set(names)
    return [k for k in p.raw if k[0] == "~" and "Tensor" in k[2] and callee_name(k) in wanted]


def host_copy(ev: Evidence) -> Finding | None:
    """One of your functions loops over items, copying each to the host (docs/bottlenecks.md §1)."""
    p, steps = ev.p, ev.steps
    if p is None:
        return None
    best = None
    for caller, edges in _by_caller(p.edges(_tensor_methods(p, HOST_COPIES))).items():
        n, _ = _total(edges)
        calls = p.calls(caller)
        # A loop over items: many copies per call of the function, and (when the steps are known) per
        # step too -- the loop function itself makes one copy per step in a single call.
        per_step_ok = n / steps[0] >= 16 if steps else calls >= 2
        if not calls or n / calls < 16 or not per_step_ok:
            continue
        # The loop costs the copies and the Python around them: the function's own time, shared
        # among the calls it makes in proportion to the copies' number.
        # A helper called each step (push) is the loop: its time. The loop's holder (main) is not: the
        # calls it makes per item (the copies, and what they feed: an add per item, an array per
        # field), and its own time shared among its calls in proportion to theirs.
        if caller != p.loop_holder():
            charged = p.cumtime(caller)
        else:
            kids = p.callees.get(caller, [])
            per_item = [(nc, ct) for k, nc, ct in kids if nc >= 0.2 * min(e.calls for e in edges)]
            made = sum(nc for _, nc, _ in kids) or n
            item_calls, item_s = sum(nc for nc, _ in per_item), sum(ct for _, ct in per_item)
            charged = min(p.cumtime(caller), item_s + p.tottime(caller) * item_calls / made)
        if best is None or charged > best[1]:
            best = (caller, charged, edges, n)
    if best is None:
        return None
    caller, charged, edges, n = best
    per_call = n / p.calls(caller)
    counted = ", ".join(f".{callee_name(e.callee)}() {e.calls:,}" for e in sorted(edges, key=lambda e: -e.calls))
    saving = charged * (1 - 1 / per_call)
    return finding(
        "host_copy",
        f"{p.where(caller, [callee_name(e.callee) for e in edges])} calls {counted} times in {p.calls(caller):,} calls: "
        f"{per_call:,.0f} host copies per call{_per_step(n, steps)}; the copies and the loop around them took "
        f"{_share(p, charged)}",
        saving,
        f"the per-item calls' own time and their share of {caller[2]}'s own time, {seconds_short(charged)} (cProfile), × "
        f"(1 − 1/{per_call:,.0f}): one batched copy instead of {per_call:,.0f}",
        where=p.where(caller, [callee_name(e.callee) for e in edges]))


def update_ratio(ev: Evidence) -> Finding | None:
    """Many optimizer steps per env step (docs/bottlenecks.md §3)."""
    p, steps = ev.p, ev.steps
    # Env steps counted: the timer's, or an env's step calls. A loop's iterations are not env steps
    # (a learner fed by an actor thread ran 50,706 iterations, its print block's 52 were taken for them).
    if p is None or steps is None or steps[1].startswith("iterations of the loop"):
        return None
    updates = _optimizer_steps(p)
    ratio = updates / steps[0]
    callers = _by_caller(p.edges(p.keys("backward", "torch/_tensor.py")))
    if ratio <= 4 * (1 + COUNT_MARGIN * ev.counts_estimated) or not callers:
        return None
    update_fn = max(callers, key=lambda k: _total(callers[k])[0])
    # The call site: where the loop calls the update (the update function itself when it holds the loop).
    # The offending line is the loop that repeats the update: the innermost loop around its call.
    holder, call = p.loop_site(update_fn)
    if holder == update_fn:
        call = p.line(update_fn, ["backward"])
    line = p.sources.enclosing_loop(holder[0], call) or call
    where = f"{short_file(holder[0])}:{line} ({holder[2]})"
    charged = p.cumtime(update_fn)
    return finding(
        "update_ratio",
        f"{updates:,} optimizer steps over {steps[0]:,} env steps ({steps[1]}): {ratio:.1f} per env step; the updates "
        f"({update_fn[2]}, repeated by the loop at {where}) took {_share(p, charged)}",
        charged * (1 - 1 / ratio),
        f"the updates' measured {seconds_short(charged)} × (1 − 1/{ratio:.1f}): their cost per update, one update "
        f"per env step", where=where, fix=f"1 update per env step instead of {ratio:.0f}")


def target_copy(ev: Evidence) -> Finding | None:
    """``load_state_dict`` / ``deepcopy`` of a network on (nearly) every update (docs/bottlenecks.md §7)."""
    p = ev.p
    if p is None:
        return None
    updates, per = _optimizer_steps(p), "optimizer steps"
    if updates < 10 and ev.steps is not None:  # no torch optimizer (a NumPy network): per step of the loop
        updates, per = ev.steps[0], f"steps ({ev.steps[1]})"
    copies = p.edges(p.keys("load_state_dict", "torch/nn/modules/module.py") + p.keys("deepcopy", "copy.py"))
    copies = [e for e in copies if e.callee[2] == "load_state_dict" or e.seconds > 0]
    n, copied_s = _total(copies)
    if updates < 10 or n < 0.5 * updates:
        return None
    if per != "optimizer steps" and copied_s < 0.1 * p.total:  # a deepcopy each step of something small
        return None
    callers = {e.caller for e in copies}
    # The state_dict() read that feeds each copy is part of it.
    reads = [e for e in p.edges(p.keys("state_dict", "torch/nn/modules/module.py")) if e.caller in callers]
    n_copies, seconds = _total(copies)
    seconds += _total(reads)[1]
    top = _top(copies)
    return finding(
        "target_copy",
        f"{p.where(top.caller, top.callee)} copies a network {n_copies:,} times for {updates:,} {per}; the "
        f"copies took {_share(p, seconds)}",
        seconds * (1 - 1 / 100),
        f"the copies' measured {seconds_short(seconds)} (cProfile) × (1 − 1/100): one copy every 100 updates",
        where=p.where(top.caller, top.callee))


def _unprofiled(seconds: float, calls: int, per_call_alone: float) -> float:
    """``calls`` taking ``seconds`` under the profiler, as they take alone: at most ``calls`` × the same
    call's time micro-benchmarked without a profiler (cProfile slows a forward's many small Python
    calls several times more than the calibration of its cost per call says)."""
    return min(seconds, calls * per_call_alone) if per_call_alone > 0 else seconds


def _noise(saving: float | None) -> str:
    return "; no saving: the two forms' repeats overlap" if saving == 0.0 else ""


def _kept(bench: Mapping[str, Any]) -> float:
    """What a micro-benchmark's fast form keeps of the slow one's time: the median of its interleaved
    pairs' fast / slow (rlperf.instruments.evidence._interleaved), else the ratio of the two medians."""
    return float(bench["ratio"]) if bench.get("ratio") is not None else bench["fast_s"] / bench["slow_s"]


def _factor(bench: Mapping[str, Any]) -> str:
    """``(1 − kept)`` as an estimate prints it, with the times per call it came from."""
    pairs = f", the median of {bench['repeats']} interleaved pairs" if bench.get("ratio") is not None else ""
    return f"(1 − {_kept(bench):.2f}: {call_time(bench['fast_s'])} against {call_time(bench['slow_s'])} per call{pairs})"


def _bench_saving(seconds: float, bench: Mapping[str, Any] | None) -> float | None:
    """``seconds`` × (1 − :func:`_kept`) of a micro-benchmark; nothing when that is under 10% and the
    two forms overlap (a small difference inside its noise): a pair found the fast form no faster, or,
    without pairs, the repeats' ranges overlap."""
    if not bench or not bench.get("slow_s") or not bench.get("fast_s"):
        return None
    gain = max(0.0, 1 - _kept(bench))
    pairs, slow, fast = bench.get("ratio_range"), bench.get("slow_range_s"), bench.get("fast_range_s")
    inside = pairs[1] >= 1.0 if pairs else bool(slow and fast and fast[1] >= slow[0])
    if gain < 0.1 and inside:
        return 0.0
    return seconds * gain


def _site_where(site: Mapping[str, Any]) -> str:
    return f"{short_file(site['file'])}:{site['line']} ({site['function']})"


def autograd_forward(ev: Evidence) -> Finding | None:
    """Forwards that ran with grad enabled and whose graph no backward read (docs/bottlenecks.md §8)."""
    best = None
    for site in ev.hooks.get("forwards") or []:
        grad = site["grad_calls"]
        if grad < max(10, 0.5 * site["calls"]) or site["backward_reached"] >= 0.1 * grad:
            continue
        bench = site.get("no_grad_bench") or {}
        alone = _unprofiled(site["grad_seconds"], grad, float(bench.get("slow_s") or 0.0))
        saving = _bench_saving(alone, bench)
        if best is None or (saving or 0.0) > (best[1] or 0.0):
            best = (site, saving, alone, bench)
    if best is None or (ev.p is not None and best[0]["grad_seconds"] < MIN_SHARE * ev.p.total):
        return None
    site, saving, alone, bench = best
    estimate = (f"the forwards' {seconds_short(alone)} without the profiler ({site['grad_calls']:,} × "
                f"{call_time(bench['slow_s'])}, at most the {seconds_short(site['grad_seconds'])} measured under it) × "
                f"{_factor(bench)}: the same module on the same inputs under inference_mode against with grad, "
                f"micro-benchmarked after the script{_noise(saving)}"
                if saving is not None else f"not measured ({bench.get('error', 'no micro-benchmark')}): at most part of "
                f"the forwards' {seconds_short(site['grad_seconds'])}")
    return finding(
        "autograd_forward",
        f"{_site_where(site)} ran a module {site['calls']:,} times, {site['grad_calls']:,} with grad enabled "
        f"(torch.is_grad_enabled() read as each ran), and a backward pass reached {site['backward_reached']:,} of "
        f"those graphs; the forwards took {seconds_short(site['grad_seconds'])}",
        saving, estimate, where=_site_where(site))


def small_batch(ev: Evidence) -> Finding | None:
    """A module called one sample at a time, many times per step (docs/bottlenecks.md §12)."""
    steps = ev.steps
    best = None
    for whole in ev.hooks.get("forwards") or []:
        # the line's calls fed one sample, not all its calls (SB3's learn() both acts on one
        # observation and trains on batches of 256, every module called from that one line)
        site = {**whole, "calls": whole.get("one_sample_calls", 0), "seconds": whole.get("one_sample_seconds", 0.0)}
        if not site["calls"]:
            continue
        per_step = site["calls"] / steps[0] if steps else None
        if (per_step is not None and per_step < 4) or (per_step is None and site["calls"] < 1000):
            continue
        bench = site.get("batch_bench")
        saving = _bench_saving(_alone_forwards(site), bench)
        if best is None or (saving or 0.0) > (best[1] or 0.0):
            best = (site, saving, per_step)
    if best is None:
        return None
    site, saving, per_step = best
    where, seconds = _per_sample_loop(ev, site)
    bench = site.get("batch_bench") or {}
    # Without the profiler: the helper called per sample (not only its forward) slowed as its forward was.
    alone = seconds * _alone_forwards(site) / site["seconds"] if site["seconds"] > 0 else seconds
    if saving is not None:
        saving = _bench_saving(alone, bench)
    estimate = (f"the per-sample calls' {seconds_short(alone)} without the profiler (the {seconds_short(seconds)} measured "
                f"under it, scaled as the forward's {call_time(site['seconds'] / site['calls'])} per call under it is "
                f"{call_time(bench['slow_s'] / bench['n'])} alone) × {_factor(bench)}: one forward of {bench['n']} "
                f"stacked samples against {bench['n']} forwards "
                f"of one, the same module micro-benchmarked after the script{_noise(saving)}" if saving is not None else
                f"not measured ({bench.get('error', 'no micro-benchmark')})")
    often = f", {per_step:,.0f} per step ({steps[1]})" if per_step is not None and steps else ""
    return finding(
        "small_batch",
        f"{_site_where(site)} ran a module on one sample at a time {site['calls']:,} times{often}; the forwards took "
        f"{seconds_short(site['seconds'])}", saving, estimate, where=where)


def _alone_forwards(site: Mapping[str, Any]) -> float:
    """A call site's forwards without the profiler, from its batch micro-benchmark's time per forward."""
    bench = site.get("batch_bench") or {}
    per_call = float(bench.get("slow_s") or 0.0) / int(bench.get("n") or 1)
    return _unprofiled(site["seconds"], site["calls"], per_call)


def _per_sample_loop(ev: Evidence, site: Mapping[str, Any]) -> tuple[str, float]:
    """The line that loops over samples -- the call site itself, or the first of your frames above it
    whose line is inside a loop (a helper called once per sample) -- and the time of those calls
    (cProfile's time of the helper called from there; the forwards' own time at the call site)."""
    p = ev.p
    if p is None:
        return _site_where(site), site["seconds"]
    frames = [(site["file"], site["line"], site["function"]), *(site.get("chain") or [])]
    for i, (file, line, function) in enumerate(frames):
        if p.sources.enclosing_loop(file, line) is None:
            continue
        seconds = site["seconds"]
        if i > 0:  # the helper (the frame below) as called from this function
            inner = frames[i - 1]
            for key in p.keys(inner[2]):
                if key[0] == inner[0]:
                    seconds = max(seconds, sum(v[3] for c, v in p.raw[key][4].items() if c[0] == file and c[2] == function))
        return f"{short_file(file)}:{line} ({function})", seconds
    return _site_where(site), site["seconds"]


def _calls_charged(ev: Evidence, finding_id: str, keys: list[Key], what: str, depth: int = 0, min_calls: int = 2,
                   keep: tuple[Callable[[int], float], str] | None = None, min_share: float = 0.1,
                   site: Callable[[Edge], bool] = lambda e: True, direct: list[Key] | None = None,
                   net: bool = True) -> Finding | None:
    """The common form of a rule over library calls made from your code: their measured time is the
    saving, less what the fix keeps (``keep``: the share kept as a function of the calls, and why),
    charged to the costliest call site.
    ``min_share``: the share of the script the calls must hold (a clean loop makes the same calls in
    small doses: a render every few hundred episodes, a checkpoint at the end); ``site``: which call
    sites count; ``direct``: keys that count only when your code calls them itself (depth 0)."""
    p = ev.p
    if p is None:
        return None
    edges = [e for e in p.edges(keys, depth, net) + p.edges(direct or [], net=net) if site(e)]
    n, seconds = _total(edges)
    if n < min_calls or not edges or seconds < min_share * (p.total if net else p.raw_total):
        return None
    top = _top(edges)
    kept = keep[0](n) if keep else 0.0
    where = p.offending(top.caller, top.callee)
    sites = len({(e.caller, e.callee) for e in edges})
    names = ", ".join(sorted({callee_name(e.callee) + "()" for e in edges}))
    return finding(
        finding_id,
        f"{what} ({names}): {n:,} calls{_per_step(n, ev.steps)} from {sites} call site(s) in your code took "
        f"{_share(p, seconds)}; the costliest, {p.where(top.caller, top.callee)}, {seconds_short(top.seconds)}",
        seconds * (1 - kept),
        f"the calls' measured {seconds_short(seconds)} (cProfile, at their call sites)"
        + (f" × (1 − {kept:.2g}): {keep[1]}" if keep else ": the fix takes them out of the loop"),
        where=where)


def checkpointing(ev: Evidence) -> Finding | None:
    """torch.save / pickle / np.save in the loop (the checklist: checkpointing)."""
    p = ev.p
    if p is None:
        return None
    keys = (p.keys("save", "torch/serialization.py") + p.keys(builtin="_pickle.dump") + p.keys("dump", "pickle.py")
            + p.keys("save", "numpy/") + p.keys("savez", "numpy/") + p.keys("save_file", "safetensors/"))
    return _calls_charged(ev, "checkpointing", keys, "torch.save / pickle / np.save", depth=1, min_calls=3,
                          keep=(lambda n: 1 / n, "one save kept, at the end"))


def rendering(ev: Evidence) -> Finding | None:
    """env.render() and frame drawing in the loop (the checklist: rendering)."""
    p = ev.p
    if p is None:
        return None
    return _calls_charged(ev, "rendering", _drawing(p), "render() and drawing calls")


def _drawing(p: ScriptProfile) -> list[Key]:
    """render() and the drawing libraries' calls."""
    keys = [k for k in p.keys("render") if "torch/" not in k[0]]
    keys += [k for k in p.raw if not p.is_user(k) and any(
        lib in k[0].replace(os.sep, "/") for lib in ("pygame/", "matplotlib/pyplot", "PIL/ImageDraw", "cv2"))]
    keys += [k for k in p.raw if k[0] == "~" and any(s in k[2] for s in ("pygame.", "cv2."))]
    return keys


def env_reset(ev: Evidence) -> Finding | None:
    """Env resets (or re-creations) that cost a large share of the loop (the checklist: env reset)."""
    p = ev.p
    if p is None:
        return None
    keys = [k for k in p.keys("reset") if not any(s in k[0].replace(os.sep, "/") for s in ("torch/", "/optim", "wrappers/"))]
    keys += p.keys("make", "gymnasium/envs/registration.py") + p.keys("make", "gym/envs/registration.py")
    keys += p.keys("make_vec", "gymnasium/")
    keys += [k for k in p.keys("__init__") if p.is_user(k) and {"step", "reset"} <= p.sources.methods(k)]
    # A function of yours that builds an env (it calls make()) and is called again and again: the whole
    # build is its time (the wrappers, a normalizer primed from a dataset: 39% of an offline-RL script
    # whose make() calls took next to nothing). Its own make() calls are then inside it.
    builders = {e.caller for e in p.edges(k for k in keys if k[2] in ("make", "make_vec"))
                if e.caller[2] not in ("<lambda>", "__init__", "<module>") and p.calls(e.caller) >= 2}
    # Envs made while building the vector env (a lambda, a constructor) are set-up, not the loop.
    return _calls_charged(ev, "env_reset", keys + sorted(builders), "env reset() / make() calls", min_calls=10,
                          min_share=0.1, site=lambda e: e.caller[2] not in ("<lambda>", "__init__")
                          and not (e.caller in builders and e.callee[2] in ("make", "make_vec")))


def busy_wait(ev: Evidence) -> Finding | None:
    """Polling sleeps, spinning on a queue or flag, and lock waits in the loop (docs/bottlenecks.md §16)."""
    p = ev.p
    if p is None:
        return None
    keys = p.keys(builtin="time.sleep") + p.keys(builtin="'acquire' of '_thread")
    for name, path in (("empty", "queue"), ("qsize", "queue"), ("poll", "multiprocessing/connection.py"),
                       ("is_set", "threading.py")):
        keys += p.keys(name, path)
    # A condition's or event's wait made by your code; not one inside a blocking queue.get(): that is the
    # fix (a learner blocked on its actors' queue waits for data, it does not spin)
    # A spin lasts as long as the wait it spins through, alone or profiled: its calls' time is not net of
    # cProfile's cost (15.7 M empty() calls at 0.34 µs each left a SAC learner's spin, 60% of the
    # profile and half the script's time alone, at zero)
    # A spin calls its wait again and again from one place; a thread's start() and join(), or a sleep now
    # and then, wait once each (a clean A2C script's join() of its rollout thread, 1 s beside two busy
    # processes, was named a busy wait from 10 calls at 3 sites)
    return _calls_charged(ev, "busy_wait", keys, "sleep / poll / lock-wait calls", depth=1, min_calls=10, min_share=0.1,
                          site=lambda e: e.calls >= 10, direct=p.keys("wait", "threading.py"), net=False)


LOG_CALLS = (("debug", "info", "warning", "error", "critical", "log", "exception"), "logging/__init__.py")
FILE_WRITES = ("posix.fsync", "posix.fdatasync", "posix.replace", "posix.rename", "'writerow' of '_csv.",
               "'writerows' of '_csv.")
"""Builtins that write a log of your own: a CSV row, a file forced to disk, an atomic rename."""
WRITERS = ("tensorboard/writer.py", "tensorboardX/writer.py", "wandb/")


def logging_rule(ev: Evidence) -> Finding | None:
    """print / logging / TensorBoard writes every step, with the reads that feed them (docs/bottlenecks.md §9)."""
    p, steps = ev.p, ev.steps
    if p is None or steps is None:
        return None
    keys = p.keys(builtin="builtins.print") + [k for k in p.keys(path=LOG_CALLS[1]) if k[2] in LOG_CALLS[0]]
    keys += [k for k in p.raw if any(w in k[0].replace(os.sep, "/") for w in WRITERS) and k[2].startswith(("add_", "log"))]
    keys += [k for k in p.keys(builtin="of '_io.") if "'write'" in k[2] or "'flush'" in k[2]]
    keys += [k for k in p.keys(path="tqdm/") if k[2] in PROGRESS_CALLS]
    # a log of your own: rows written to a file and forced to disk, made directly by your code (a
    # checkpoint's writes are torch.save's or pickle's, below them)
    keys += [k for b in FILE_WRITES for k in p.keys(builtin=b)] + p.keys("dump", "json/__init__.py")
    logs = p.edges(keys)
    n_logs, _ = _total(logs)
    # Logging every step needs steps: a handful of writes (a file of weights written once, a print at the
    # end) in a script whose loop runs in its workers is not it, whatever the few "steps" counted.
    if n_logs < MIN_LOGS or n_logs / steps[0] < 0.5:
        return None
    # The reads of device values that go with the logs: .item()/.tolist() and tensor formatting in the
    # same functions, at most a few per log call.
    loggers = {e.caller for e in logs}
    reads = [e for e in p.edges(_tensor_methods(p, ("item", "tolist", "__format__", "__repr__"))
                                + p.keys("__format__", "torch/_tensor.py") + p.keys("__repr__", "torch/_tensor.py"))
             if e.caller in loggers]
    n_reads, read_s = _total(reads)
    if n_reads > 4 * n_logs:
        read_s *= 4 * n_logs / n_reads
        n_reads = 4 * n_logs
    seconds = _total(logs)[1] + read_s
    top = _top(logs)
    where = p.where(top.caller, top.callee)
    block = _log_block(p, logs)
    measured = (f"the log calls' and their reads' measured {seconds_short(seconds)} (cProfile, at their call sites)")
    evidence = (f"{n_logs:,} print/logging/writer/file-write calls{_per_step(n_logs, steps)} and {n_reads:,} reads of "
                f"tensor values for them took {_share(p, seconds)}; the costliest call site is {where}")
    if block is not None and block[0] > seconds:
        seconds, what = block
        measured = f"{what}: {seconds_short(seconds)}"
        evidence += f"; with the values computed only to be logged, {_share(p, seconds)}"
    return finding("logging", evidence, seconds * (1 - 1 / 100),
                   f"{measured} × (1 − 1/100): one log every 100 steps", where=where)


MIN_LOGS = 10
"""The fewest log calls that can be logging every step."""

PROGRESS_CALLS = ("set_postfix", "set_postfix_str", "set_description", "set_description_str", "write")
"""tqdm's calls that redraw a progress bar with new values (``update`` draws at most every ``mininterval``)."""


def _log_block(p: ScriptProfile, logs: list[Edge]) -> tuple[float, str] | None:
    """The time of the statements that serve only the log calls in your loops (the log calls, the
    values computed for them, the ``if`` that gates them: :meth:`Sources.log_only`), from the line
    sampler's share of the function's cProfile time; a helper that only logs, its whole time. The
    costliest function's, with what it was read from; None without enough samples."""
    mine = {k[2] for k in p.raw if p.is_user(k) and not k[2].startswith("<")}
    best: tuple[float, str] | None = None
    for fn in {e.caller for e in logs}:
        lines, whole = p.sources.log_only(fn, {p.line(fn, e.callee) for e in logs if e.caller == fn}, mine - {fn[2]})
        name = fn[2] if not fn[2].startswith("<") else p.sources.enclosing_function(fn[0], fn[1]) or fn[2]
        if whole and fn[2] != "<module>":
            found = (p.cumtime(fn), f"{short_file(fn[0])}:{fn[1]} ({name}) only logs: its measured time (cProfile)")
        else:
            samples = p.line_wall.get((fn[0], fn[2])) or {}  # a share of cProfile's (wall) time
            n = sum(samples.values())
            looped = [line for line in lines if p.sources.in_loop(fn, line)]
            if n < MIN_SAMPLES or not looped:
                continue
            share = sum(samples.get(line, 0) for line in looped) / n
            span = f"{looped[0]}-{looped[-1]}" if len(looped) > 1 else f"{looped[0]}"
            found = (share * p.cumtime(fn), f"the lines that serve only the logs ({short_file(fn[0])}:{span}, {name}) "
                     f"measured as {share:.0%} of {name}'s {seconds_short(p.cumtime(fn))} (the line sampler's share of "
                     "cProfile's time)")
        if best is None or found[0] > best[0]:
            best = found
    return best


_DRAWS = (("sample", "random.py"), ("choices", "random.py"), ("shuffle", "random.py"))
_DRAW_BUILTINS = ("'choice' of", "'randint' of", "'integers' of", "'permutation' of")
_BUILDS = ("torch.tensor", "torch.stack", "torch.cat", "numpy.array", "numpy.asarray", "numpy.core.multiarray.array",
           "numpy.stack", "numpy.concatenate", "torch.as_tensor", "torch.from_numpy")


def replay_sampling(ev: Evidence) -> Finding | None:
    """Replay sampled in Python: a draw, then the batch built element by element (docs/bottlenecks.md §2)."""
    p = ev.p
    if p is None:
        return None
    draws = [k for name, path in _DRAWS for k in p.keys(name, path)]
    draws += [k for b in _DRAW_BUILTINS for k in p.keys(builtin=b)]
    building = [k for b in _BUILDS for k in p.keys(builtin=b)] + p.keys("stack", "numpy/")
    best = None
    for e in p.edges(draws):
        fn = e.caller
        if fn == p.loop_holder():
            continue
        inner = [k for k, _, _ in p.callees.get(fn, []) if k[2] in ("<listcomp>", "<genexpr>") or p.is_user(k)]
        looped = any(d >= 1 for d, _, _ in p.sources.loops(fn)) or bool(inner)
        builds = p.calls_any(fn, building) or any(p.calls_any(c, building) for c in inner)
        if not (looped and builds):
            continue
        if best is None or p.cumtime(fn) > p.cumtime(best[0]):
            best = (fn, e.callee)
    if best is None:
        return _built_per_item(p, building) or _loader_per_batch(p) or _loader_per_item(ev)
    fn, draw = best
    cum = p.cumtime(fn)
    return finding(
        "replay_sampling",
        f"{fn[2]} ({p.where(fn, draw)}) draws the batch in Python and builds it element by element (a comprehension or "
        f"loop, then an array per field), {p.calls(fn):,} calls, {_share(p, cum)}",
        cum * 0.9,
        f"the sampler's measured {seconds_short(cum)} (cProfile) × 0.9: one index draw and one gather per field keep "
        f"about a tenth", where=p.loop_where(fn))


_STACKS = ("torch.stack", "torch.cat", "numpy.stack", "numpy.concatenate", "numpy.array", "numpy.asarray",
           "numpy.core.multiarray.array", "numpy.vstack")


def _built_per_item(p: ScriptProfile, building: list[Key]) -> Finding | None:
    """A batch built one stored element at a time: a comprehension (or loop) of one of your functions
    makes an array or tensor per element (``torch.tensor(arr[i]) for i in idx``), many per call, and the
    function stacks them. The index draw need not show: numpy's ``Generator.integers`` is a Cython
    method cProfile does not record, or the indices come in as an argument."""
    stacks = [k for b in _STACKS for k in p.keys(builtin=b)] + p.keys("stack", "numpy/")
    holder = p.loop_holder()
    best = None
    for fn in [k for k in p.raw if p.is_user(k) and k != holder and not k[2].startswith("<")]:
        calls = p.calls(fn)
        if calls < 2 or not p.calls_any(fn, stacks):
            continue
        inner = [k for k, _, _ in p.callees.get(fn, []) if k[2] in ("<listcomp>", "<genexpr>") and p.is_user(k)]
        sites = [(c, sum(nc for k, nc, _ in p.callees.get(c, []) if k in building)) for c in inner]
        if p.sources.loops(fn):  # a for loop of the function's own, building per element
            sites.append((fn, sum(nc for k, nc, _ in p.callees.get(fn, []) if k in building)))
        site, built = max(sites, key=lambda t: t[1], default=(None, 0))
        if site is None or built / calls < 16:
            continue
        if best is None or p.cumtime(fn) > p.cumtime(best[0]):
            best = (fn, site, built)
    if best is None:
        return None
    fn, site, built = best
    cum = p.cumtime(fn)
    where = (f"{short_file(fn[0])}:{site[1]} ({fn[2]})" if site != fn
             else p.where(fn, [callee_name(k) for k in building if p.calls_any(fn, [k])]))
    return finding(
        "replay_sampling",
        f"{fn[2]} ({where}) builds the batch element by element: {built:,} arrays or tensors made one per stored "
        f"element in {p.calls(fn):,} calls ({built / p.calls(fn):,.0f} per batch), then stacked; {_share(p, cum)}",
        cum * 0.9,
        f"the sampler's measured {seconds_short(cum)} (cProfile) × 0.9: one index draw and one gather per field keep "
        f"about a tenth", where=where)


_LOADER = "torch/utils/data/dataloader.py"


def _loader_per_batch(p: ScriptProfile) -> Finding | None:
    """A torch DataLoader iterator made for each batch taken from it (``next(iter(DataLoader(replay,
    shuffle=True)))`` per update): each batch pays the iterator's set-up and the sampler's draw over
    the whole dataset, and is read item by item (``__getitem__``) and stacked. An epoch loop over one
    iterator takes many batches from it and is not this."""
    iters, nexts = p.keys("__iter__", _LOADER), p.keys("__next__", _LOADER)
    made, taken = sum(p.calls(k) for k in iters), sum(p.calls(k) for k in nexts)
    if made < 16 or taken > 2 * made:
        return None
    made_at = p.keys("__init__", _LOADER)
    sites = _by_caller(p.edges([*made_at, *iters, *nexts], depth=2))
    if not sites:
        return None
    fn, edges = max(sites.items(), key=lambda item: _total(item[1])[1])
    seconds = _total(edges)[1]
    where = p.where(fn, next((e.callee for e in edges if e.callee in made_at), edges[0].callee))  # the DataLoader(...) line
    return finding(
        "replay_sampling",
        f"{where} makes a DataLoader iterator for every batch it takes ({made:,} iterators, {taken:,} batches): each "
        f"batch pays the iterator's set-up and a draw over the whole buffer, then is read item by item and stacked; "
        f"{_share(p, seconds)}",
        seconds * 0.9,
        f"the DataLoader calls' measured {seconds_short(seconds)} (cProfile, at {where}) × 0.9: one index draw and one "
        f"gather per field keep about a tenth", where=where if fn == p.loop_holder() else p.loop_where(fn))


_FETCH = "torch/utils/data/_utils/fetch.py"


def _loader_per_item(ev: Evidence) -> Finding | None:
    """A DataLoader that fetches each batch item by item through your Dataset's ``__getitem__`` (the
    fetcher's loop over the batch's indices, one Python call and one small sample per item, then
    ``default_collate`` stacking them again), where that fetch holds :data:`HOT_SHARE` of the script:
    a Dataset that takes the batch's indices at once (``__getitems__``, or a BatchSampler with
    ``batch_size=None``) gathers each field once. A library's Dataset read per item (TensorDataset) over
    an epoch is the common case, and no finding."""
    p = ev.p
    if p is None:
        return None
    fetches = p.keys("fetch", _FETCH)
    fetchers = set(p.keys(path=_FETCH))
    getters = [k for k in p.keys("__getitem__") + p.keys("__getitems__") if p.is_user(k)
               and any(c in fetchers for c in p.raw[k][4])]
    batches = sum(p.calls(k) for k in fetches)
    if not getters or not batches:
        return None
    getter = max(getters, key=p.cumtime)
    items = p.calls(getter)
    seconds = sum(p.cumtime(k) for k in fetches)  # the per-item reads and the collation that re-stacks them
    if items / batches < 16 or not ev.clears(seconds, HOT_SHARE * p.total):
        return None
    line = p.hottest_line(getter)
    kids = sorted(p.callees.get(getter, []), key=lambda t: -t[2])
    where = (f"{short_file(getter[0])}:{line} ({getter[2]})" if line else
             p.where(getter, kids[0][0]) if kids else p.where(getter))
    made = [e for e in p.edges(p.keys("__init__", _LOADER), depth=1) if e.caller != p.loop_holder()]
    site = f" made in {short_file(made[0].caller[0])} ({made[0].caller[2]})" if made else ""
    return finding(
        "replay_sampling",
        f"the DataLoader{site} reads each batch item by item: {items:,} calls of your Dataset's __getitem__ for "
        f"{batches:,} batches ({items / batches:,.0f} per batch), each result collated again; the fetches took "
        f"{_share(p, seconds)}",
        seconds * 0.9,
        f"the DataLoader fetches' measured {seconds_short(seconds)} (cProfile) × 0.9: one index draw per batch and "
        f"one gather per field keep about a tenth", where=where,
        fix="let the Dataset take a batch of indices (a BatchSampler as the DataLoader's sampler, batch_size=None)")


def _per_item(p: ScriptProfile, e: Edge, steps: tuple[int, str] | None) -> bool:
    """Calls made in a loop over items: many per call of the caller, and many per step."""
    return e.calls / max(1, p.calls(e.caller)) >= 16 and (steps is None or e.calls / steps[0] >= 16)


_TRANSFERS = ("to", "cpu", "cuda", "numpy", "pin_memory")


def device_transfer(ev: Evidence) -> Finding | None:
    """Host<->device (or array<->tensor) copies every step (the checklist: transfers and syncs)."""
    p = ev.p
    if p is None:
        return None
    keys = _tensor_methods(p, _TRANSFERS) + p.keys(builtin="torch.tensor") + p.keys(builtin="torch.as_tensor")
    keys += [k for k in p.raw if k[0] == "~" and "'Tensor'" in k[2] and "new" in k[2]]
    # A per-item loop of host copies is host_copy's; what is left is copies per step.
    host_copies = set(_tensor_methods(p, HOST_COPIES))
    return _calls_charged(ev, "device_transfer", keys, "tensor conversions and device copies",
                          min_share=0.1, site=lambda e: not (e.callee in host_copies and _per_item(p, e, ev.steps)))


def gc_pauses(ev: Evidence) -> Finding | None:
    """Garbage-collector pauses (docs/bottlenecks.md §13), at the allocation that triggered most of them."""
    gc, p = ev.gc, ev.p
    if not gc or float(gc.get("share_of_loop") or 0.0) < MIN_SHARE:
        return None
    n = gc.get("collections") or {}
    seconds = float(gc.get("total_s") or 0.0)
    where = _gc_site(gc, p)
    return finding(
        "gc_pauses",
        f"{gc.get('total_collections', 0):,} collections (gen0 {n.get('gen0', 0):,}, gen1 {n.get('gen1', 0):,}, gen2 "
        f"{n.get('gen2', 0):,}) took {seconds_short(seconds)}, {percent_short(float(gc['share_of_loop']))} of the script, "
        f"longest pause {float(gc.get('max_pause_ms') or 0):.1f} ms (gc.callbacks)"
        + (f"; the allocations that triggered most of that time are at {where}" if where else ""),
        seconds, f"the collector's measured {seconds_short(seconds)}: the fix runs no full collections in the loop",
        where=where)


def _gc_site(gc: Mapping[str, Any], p: ScriptProfile | None) -> str | None:
    """The line of your code whose allocations triggered the most collector time."""
    if p is None:
        return None
    by_line: dict[tuple[str, int, str], float] = defaultdict(float)
    for trigger in gc.get("triggers") or []:
        for file, line, function in trigger["frames"]:
            if p.own(file):
                by_line[(file, line, function)] += float(trigger["total_s"])
                break
    if not by_line:
        return None
    file, line, function = max(by_line, key=lambda k: by_line[k])
    return f"{short_file(file)}:{line} ({function})"


OVERSUBSCRIBED_SHARE = 0.2
"""The share of the script's time its own threads must have outnumbered the CPUs for (ThreadCensus) to
be a ``threads`` finding: a pool that ran wide for a moment (a start-up product) is not one."""


def threads(ev: Evidence) -> Finding | None:
    """More compute threads than free CPUs (docs/bottlenecks.md §14): the script's own pools and
    workers outnumbering the CPUs (measured), else torch's threads beyond the CPUs or the load."""
    return _pools_oversubscribed(ev) or _torch_threads(ev)


def _pools_oversubscribed(ev: Evidence) -> Finding | None:
    """The script's threads -- its BLAS and OpenMP pools, in its process and in the processes it
    started -- kept more threads busy than there are CPUs for :data:`OVERSUBSCRIBED_SHARE` of its
    time (rlperf.instruments.evidence.ThreadCensus): the pools wider than one thread are named."""
    info = (ev.record.get("profile") or {}).get("threads") or {}
    census = info.get("census") or {}
    watched = float(census.get("watched_s") or 0.0)  # the script's run, as the census saw it
    cpus = float(census.get("cpus") or info.get("cpus") or 0)
    over_s = float(census.get("oversubscribed_s") or 0.0)
    if not census or cpus <= 0 or watched <= 0 or over_s < OVERSUBSCRIBED_SHARE * watched:
        return None
    wide = sorted((pool for pool in info.get("pools") or [] if int(pool.get("threads") or 1) > 1),
                  key=lambda pool: -int(pool["threads"]))
    torch = info.get("torch") or {}
    workers = int(census.get("worker_processes") or 0)
    if not wide and int(torch.get("intra_op") or 1) <= 1 and not workers:
        return None  # threads of the script's own making (a thread pool of Python threads): not a pool to cap
    named = [f"{pool['package']}'s {pool['library']}" + (f" {pool['version']}" if pool.get("version") else "")
             + f" ({pool['api']}, {pool['threads']} threads)" for pool in wide]
    if int(torch.get("intra_op") or 1) > 1:
        named.append(f"torch's intra-op threads ({torch['intra_op']})")
    processes = 1 + workers
    # the wide pools share the CPUs (working at once, or spinning after their calls while another works)
    each = max(1, math.floor(cpus / (processes * max(1, len(wide)))))
    where_workers = (f"; {workers} worker processes the script started, up to {census['most_threads_per_worker']} "
                     f"threads each" if workers else "")
    wait = (ev.record.get("profile") or {}).get("cpu_wait") or {}
    waited = (f"; the script's thread waited {seconds_short(float(wait['wait_s']))} for a CPU in all"
              if wait.get("wait_s") else "")
    evidence = (f"the script's threads kept up to {float(census['max_threads_busy']):.1f} busy on {cpus:g} usable CPUs, "
                f"more than the CPUs for {seconds_short(over_s)} of its {seconds_short(watched)} (census of its threads every "
                f"{census.get('interval_s', 0.5):g} s); pools: {', '.join(named) or 'one thread each'}{where_workers}"
                f"{waited}")
    packages = list(dict.fromkeys(pool["package"] for pool in wide)) or ["torch"]
    fix = (f"{each} thread(s) per process: threadpoolctl.threadpool_limits({each})"
           + (f" and torch.set_num_threads({each})" if torch else "") + f" at the start, or OMP_NUM_THREADS={each} "
           f"OPENBLAS_NUM_THREADS={each} MKL_NUM_THREADS={each} set before the first import of {' or '.join(packages)} "
           "(worker processes inherit the variables)")
    bench = ev.hooks.get("threads_bench")
    p = ev.p
    saving = None
    if p is not None and bench:
        compute = _compute_keys(p)
        saving = _bench_saving(_total(p.edges(compute))[1], bench)
    estimate = ("the busiest module's forward and backward with fewer threads, micro-benchmarked after the script"
                if saving is not None else "not measured: the pools' time is spent in C, out of cProfile's sight; "
                "profile --verify runs the script again with them capped")
    setters = p.edges(p.keys(builtin="set_num_threads")) if p is not None else []
    where = _setter_where(p, setters[0].caller, int(torch.get("intra_op") or 0)) if p is not None and setters \
        else _first_import(ev.record, packages)
    return finding("threads", evidence, saving, estimate, where=where, fix=fix)


def _first_import(record: Mapping[str, Any], packages: list[str]) -> str | None:
    """``train.py:3 (<module>)``: the script's first import of a package that loaded a pool (before
    which the environment variables go), else its first import."""
    argv = (record.get("script") or {}).get("argv") or []
    try:
        tree = ast.parse(open(argv[0], encoding="utf-8").read()) if argv else None
    except (OSError, SyntaxError, ValueError):
        return None
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))] if tree else []
    roots = {node: [a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import)
             else [(node.module or "").split(".")[0]] for node in imports}
    first = min((n for n in imports if set(roots[n]) & set(packages)), key=lambda n: n.lineno, default=None) or min(
        imports, key=lambda n: n.lineno, default=None)
    return f"{short_file(os.path.abspath(argv[0]))}:{first.lineno} (<module>)" if first is not None else None


def _compute_keys(p: ScriptProfile) -> list[Key]:
    """The networks' forward and backward passes and the optimizers' steps."""
    compute = p.keys("_wrapped_call_impl", "torch/nn/modules/module.py") + p.keys("backward", "torch/_tensor.py")
    return compute + [k for k in p.keys("step", "torch/optim/") if "lr_scheduler" not in k[0]]


def _torch_threads(ev: Evidence) -> Finding | None:
    """torch's threads beyond the usable CPUs, or more than one while the load average fills them."""
    p = ev.p
    system = ev.record.get("system") or {}
    n = int(system.get("torch_threads") or 0)
    load = (ev.record.get("profile") or {}).get("load") or {}
    cpus = float(load.get("cpus") or effective_cpus())
    busy = float(load.get("loadavg_1m") or 0.0)
    if p is None or n <= 1 or not (n > cpus or busy > cpus + 0.5):
        return None
    _, seconds = _total(p.edges(_compute_keys(p)))
    setters = p.edges(p.keys(builtin="set_num_threads"))
    # Compute in the profiled thread, or a thread count your code set beyond the CPUs (its work may run
    # in threads cProfile does not see: a thread pool's).
    if seconds < 0.2 * p.total and not (setters and n > cpus):
        return None
    fewer = max(1, math.floor(cpus)) if n > cpus else 1
    why = (f"{n} torch threads on {cpus:g} usable CPUs" if n > cpus else
           f"{n} torch threads while the load average was {busy:.1f} on {cpus:g} CPUs")
    bench = ev.hooks.get("threads_bench")
    saving = _bench_saving(seconds, bench)
    estimate = (f"forward, backward and optimizer time {seconds_short(seconds)} × {_factor(bench)}: the busiest "
                f"module's forward and backward with {bench['fewer']} against "
                f"{bench['threads']} threads, micro-benchmarked after the script{_noise(saving)}"
                if saving is not None and bench else
                "not measured: depends on the other processes; profile --verify runs the script again with "
                f"{fewer} thread(s)")
    where = _setter_where(p, setters[0].caller, n) if setters else _busiest_site(ev)
    return finding(
        "threads", f"{why}" + (f", set at {where}" if setters else "") + f"; forward and backward passes and optimizer "
        f"steps in the profiled thread took {_share(p, seconds)}", saving, estimate,
        where=where, fix=f"torch.set_num_threads({fewer}) (and threadpoolctl.threadpool_limits({fewer}) for the BLAS "
        "and OpenMP pools numpy and scipy load)")


def _setter_where(p: ScriptProfile, caller: Key, n: int) -> str:
    """The ``set_num_threads(n)`` call in ``caller`` that set the count the script ran with (``if fast:
    set_num_threads(1) else: set_num_threads(16)`` -> the second), else its first call."""
    node = p.sources.function(caller)
    for call in ast.walk(node) if node is not None else ():
        if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant) \
                and call.args[0].value == n and "set_num_threads" == (
                    call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)):
            return f"{short_file(caller[0])}:{call.lineno} ({caller[2]})"
    return p.where(caller, ["set_num_threads"])


def _busiest_site(ev: Evidence) -> str | None:
    sites = ev.hooks.get("forwards") or []
    return _site_where(max(sites, key=lambda s: s["seconds"])) if sites else None


def env_backend(ev: Evidence) -> Finding | None:
    """Single envs stepped one by one in Python (docs/bottlenecks.md §5)."""
    p = ev.p
    if p is None:
        return None
    vector = [k for k in p.keys("step") if "gymnasium/vector/" in k[0].replace(os.sep, "/") or _vector_class_method(k)]
    # a step of one env: not a vector env's, not torch's (an optimizer), not a wrapper of a vector env
    single = [k for k in p.keys("step") if k not in vector and "torch/" not in k[0].replace(os.sep, "/")
              and not _reaches(p, k, set(vector), depth=3)]
    sync = p.keys("step", "gymnasium/vector/sync_vector_env.py")
    best = None
    candidates = [(k, p.calls(k), p.cumtime(k)) for k in sync]
    candidates += [(e.caller, p.calls(e.caller), p.cumtime(e.caller)) for e in p.edges(single)]
    timed = (ev.record.get("totals") or {}).get("vector_steps")
    for fn, calls, cum in candidates:
        inner = sum(nc for k, nc, _ in p.callees.get(fn, []) if k in single)
        stepping = sum(ct for k, _, ct in p.callees.get(fn, []) if k in single)  # the single envs' steps' own time
        # Several single-env steps per iteration of the loop: per call of a vector env, or of a helper
        # called every iteration, or (the loop itself, called once) per step the phase timer counted.
        per_iteration = inner / calls if "sync_vector_env" in fn[0] or calls >= 2 else (inner / timed if timed else 0)
        # SyncVectorEnv.step is all stepping one by one (its loop, the wrappers, the stacking of the
        # results); a helper of yours around single envs may do other work too: their steps' time only
        spent = cum if "sync_vector_env" in fn[0] else min(cum, stepping)
        if not calls or per_iteration < 4 or spent < 0.3 * p.total:
            continue
        if "sync_vector_env" not in fn[0] and p.sources.steps_loop_items(fn) is False:
            continue  # a loop over time stepping one env (an evaluation episode), not one over envs
        if best is None or spent > best[2]:
            best = (fn, per_iteration, spent)
    if best is None:
        return None
    fn, per_call, cum = best
    if "sync_vector_env" in fn[0]:
        sites = p.edges([fn], depth=2)
        where = p.where(_top(sites).caller, _top(sites).callee) if sites else None
        what = "gymnasium's SyncVectorEnv"
    else:
        where = p.where(fn, "step")
        what = where
    each = ("per call" if "sync_vector_env" in fn[0] else f"per call of {fn[2]}" if p.calls(fn) >= 2
            else "per step (timer.step_done() calls)")
    # Frames the envs draw inside their steps (a reset that renders, reached by autoreset) are the rendering
    # rule's: a batched step draws as many
    below = p.subtree(fn, 8)
    drawn = min(sum(e.seconds for e in p.edges(_drawing(p)) if e.caller in below), cum)
    apart = f", {seconds_short(drawn)} of it drawing frames (rendering, named apart)" if drawn >= 0.05 * cum else ""
    kept = cum - drawn if apart else cum
    return finding(
        "env_backend",
        f"{what} steps {per_call:.0f} single envs {each}, {p.calls(fn):,} calls; their steps took {_share(p, cum)}{apart}",
        kept * (1 - 1 / per_call),
        f"the single envs' steps' measured {seconds_short(kept)}{' less the drawing' if apart else ''} × "
        f"(1 − 1/{per_call:.0f}): one batched step costing about what one env's step costs", where=where)


@functools.cache
def _vector_class_method(key: Key) -> bool:
    """Whether ``key`` (a function's file, first line, name) is a method of a class whose bases name a
    vector env (``class CartPoleVectorEnv(VectorEnv)``, gymnasium's own batched envs, or yours): its
    step is one batched step, not one env's. Read from the file's source, once a file."""
    classes = _vector_classes(key[0])
    return any(first <= key[1] <= last for first, last in classes)


@functools.cache
def _vector_classes(file: str) -> tuple[tuple[int, int], ...]:
    """The line spans of the classes in ``file`` that derive from a ``...VectorEnv`` by name."""
    try:
        with open(file, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return ()
    def name(base: ast.expr) -> str:
        while isinstance(base, ast.Subscript):  # VectorEnv[ObsType, ActType, ArrayType]
            base = base.value
        return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")

    return tuple((node.lineno, node.end_lineno or node.lineno) for node in ast.walk(tree)
                 if isinstance(node, ast.ClassDef) and any(name(b).endswith("VectorEnv") for b in node.bases))


def _reaches(p: ScriptProfile, key: Key, targets: set[Key], depth: int) -> bool:
    """Whether ``key`` calls one of ``targets`` within ``depth`` calls (a wrapper of a vector env's step)."""
    frontier, seen = [key], {key}
    for _ in range(depth):
        nxt = [k for f in frontier for k, _, _ in p.callees.get(f, []) if k not in seen]
        if any(k in targets for k in nxt):
            return True
        seen.update(nxt)
        frontier = nxt
    return False


# -- Python loops over elements: preprocessing, reward shaping, or a hot spot --------------------

_WORDS = {
    "preprocessing": ("obs", "observation", "frame", "pixel", "image", "img", "gray", "grey", "resize", "downsample",
                      "preprocess", "normalize", "normalise", "crop", "one_hot", "onehot", "encode", "action"),
    "reward_shaping": ("reward", "shaping", "shaped", "shaper", "bonus", "potential", "penalty"),
    # a replay buffer's own Python loops: a prioritized buffer's sum tree walked node by node
    "replay_sampling": ("replay", "buffer", "memory", "priorit", "tree", "prefixsum", "transition"),
}
_ENV_METHODS = ("step", "reset", "__init__", "render")


def _env_function(name: str) -> bool:
    """An env's own method, or a function of an env written as functions (``env_step``,
    ``env_observe``, ``reset_env``): the env's cost, not the agent's."""
    lowered = name.lower()
    return name in _ENV_METHODS or lowered.startswith("env_") or lowered.endswith("_env")


def _classify(text: str, name: str) -> str | None:
    """preprocessing, reward shaping or a replay buffer's work by the words of the code (the function's
    name counts thrice): the kind with twice the words of the next."""
    lowered = text.lower()
    scores = {kind: sum(lowered.count(w) for w in words) + 3 * sum(w in name.lower() for w in words)
              for kind, words in _WORDS.items()}
    kind, runner_up = sorted(scores, key=lambda k: -scores[k])[:2]
    return kind if scores[kind] > 0 and scores[kind] >= 2 * scores[runner_up] else None


def python_loops(ev: Evidence, found: list[Finding]) -> list[Finding]:
    """Your functions (or the loop's own body) whose time is a Python loop over elements: classified
    by what the code handles as preprocessing or reward shaping (the checklist), else left to
    :func:`hot_spot`."""
    p = ev.p
    if p is None:
        return []
    holder = p.loop_holder()
    named = {f.where.rsplit(" ", 1)[-1] + f.where.split(":", 1)[0] for f in found if f.where}
    loops_found: list[Finding] = []
    heavy = {k for k in p.raw if k[2] in ("backward", "_wrapped_call_impl") or "torch/optim/" in k[0]}
    # A loop that steps the env is the step loop (a rollout), not a loop over elements.
    stepping = {k for k in p.raw if "step" in k[2].lower() and not any(
        w in k[2].lower() for w in ("train", "update", "optim", "learn", "grad")) and "torch/" not in k[0]}
    for fn in [k for k in p.raw if p.is_user(k)]:
        if (fn[2].startswith("<") and fn[2] != "<module>") or f"({fn[2]})" + short_file(fn[0]) in named:
            continue  # a comprehension (counted in its function), or a function another rule named
        if fn != holder and p.calls_any(fn, stepping):
            continue
        if p.compiled(fn):
            continue  # its loops run compiled (numba), not as Python
        loops = p.sources.loops(fn)
        if not loops:
            continue
        own = _own_python_time(p, fn, heavy)
        if fn == holder:
            # Loops over elements inside the step loop, itself often inside an episode loop: the body of
            # an episode loop over steps is the script's own work, not a loop over elements.
            loops = [lp for lp in loops if lp[0] >= 3]
            if not loops:
                continue
        # The loop's own body, an env method: Python time a clean loop has too, unless it dominates.
        if not ev.clears(own, (0.3 if fn == holder else 0.4 if _env_function(fn[2]) else 0.25) * p.total):
            continue
        share = p.loop_share(fn) if fn != holder else None
        if share is not None and share < 0.5:
            continue  # the samples put its time outside its loops
        depth, line, text = loops[0]
        kind = _loop_kind(ev, fn, text if fn == holder else None)
        if kind is None:
            continue
        inner = f"{short_file(fn[0])}:{line} ({fn[2]})"
        where = inner if fn == holder else p.loop_where(fn)
        if any(f.where == where for f in [*found, *loops_found]):
            continue  # the call another rule named (a render() drawing pixel by pixel is rendering)
        loops_found.append(finding(
            kind,
            f"{inner}: a Python loop (nested {depth} deep) over elements, {percent_short(own / p.total)} of the script in "
            f"the function's own Python time ({seconds_short(own)}, cProfile)",
            own * 0.9,
            f"the loop's measured Python time {seconds_short(own)} × 0.9: one array operation over the batch keeps "
            f"about a tenth", where=where))
    return loops_found


def _own_python_time(p: ScriptProfile, fn: Key, heavy: set[Key]) -> float:
    """``fn``'s own Python time: its bytecode, its comprehensions' and the builtins both call, not the
    networks, updates or your other functions they call; less what cProfile added for those calls."""
    comprehensions = [k for k, _, _ in p.callees.get(fn, []) if k[2].startswith("<") and p.is_user(k)]
    # NumPy's functions called per element (np.clip, np.sqrt on scalars) are the loop's too; torch's
    # are the network's or the update's work.
    own = p.tottime(fn) + sum(p.tottime(k) for k in comprehensions) + sum(
        ct for f in (fn, *comprehensions) for k, _, ct in p.callees.get(f, [])
        if (k[0] == "~" or "numpy/" in k[0].replace(os.sep, "/")) and k not in heavy)
    return max(0.0, own - p.call_cost * sum(nc for f in (fn, *comprehensions) for _, nc, _ in p.callees.get(f, [])))


def _loop_kind(ev: Evidence, fn: Key, holder_text: str | None) -> str | None:
    """What a loop over elements handles, from its code (``holder_text``: the step loop's own body) or
    its function's: preprocessing, reward shaping, or None (left to :func:`hot_spot`)."""
    p = ev.p
    assert p is not None
    # A method is named by its class too (SumTree.set walks a tree, whatever its method is called).
    owner = p.sources.class_of(fn) if holder_text is None else None
    kind = _classify(holder_text if holder_text is not None else p.sources.text(fn), f"{owner}.{fn[2]}" if owner else fn[2])
    if kind == "reward_shaping" and holder_text is None and _fed_by_a_forward(ev, fn):
        # a loop over a network's outputs with the rewards (a TD target, a return): the update's
        # own computation written per element, not a reward shaped from the env's state
        return None
    return kind


def _fed_by_a_forward(ev: Evidence, fn: Key) -> bool:
    """Whether the loop's call of ``fn`` passes it a network's output: a forward (the hooks' call
    sites) runs on the call's own line (``f(r, target(o2))``) or assigns a name the call passes."""
    p = ev.p
    if p is None:
        return False
    holder, line, child = p.loop_call(fn)
    if holder == fn:
        return False
    base = os.path.basename(holder[0])
    forward_lines = {int(s["line"]) for s in ev.hooks.get("forwards") or []
                     if os.path.basename(str(s.get("file"))) == base and s.get("function") == holder[2]}
    if line in forward_lines:
        return True
    node = p.sources.function(holder)
    if node is None or not forward_lines:
        return False
    passed = {n.id for c in ast.walk(node) if isinstance(c, ast.Call) and c.lineno == line
              and child[2] == (c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None))
              for a in [*c.args, *(k.value for k in c.keywords)] for n in ast.walk(a) if isinstance(n, ast.Name)}
    return any(isinstance(n, ast.Assign) and n.lineno in forward_lines
               and {t.id for t in n.targets if isinstance(t, ast.Name)} & passed for n in ast.walk(node))


_WAITING = ("multiprocessing/", "/queue.py", "/threading.py", "concurrent/", "/selectors.py", "/subprocess.py")


_RLPERF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def hot_spot(ev: Evidence, found: list[Finding]) -> Finding | None:
    """When no rule fired: the place (your function, or a library call from it) holding the most of
    the script beyond the network's own work, if it holds :data:`HOT_SHARE`."""
    p = ev.p
    if p is None or found:
        return None
    expected = set(p.keys("_wrapped_call_impl", "torch/nn/modules/module.py") + p.keys("backward", "torch/_tensor.py"))
    expected |= {k for k in p.keys("step", "torch/optim/")}
    best, best_fn = _hot_function(ev, p, expected)
    holder = p.loop_holder()
    for e in p.edges([k for k in p.raw if not p.is_user(k) and k not in expected and k[2] != "<module>"]):
        # The env's own step and the networks' passes are the loop's expected work, and a blocking wait
        # for another process or thread is time it spends elsewhere (busy_wait names polling): not hot spots.
        # rlperf's own calls in the script (PhaseTimer.step_done(), a phase) are the instrument's, not the loop's.
        if (_env_function(e.callee[2]) or _env_function(e.caller[2]) or e.callee[2].startswith("<")
                or "importlib" in e.callee[0]  # an import inside the loop: its time is left out of the loop's
                or e.callee[0].startswith(_RLPERF_DIR)
                or (e.caller[2].startswith("<") and e.caller[2] != "<module>") or e.caller == best_fn
                or any(w in k[0].replace(os.sep, "/") for k in p.subtree(e.callee, 3) for w in _WAITING)
                or p.subtree(e.callee) & expected or _feeds_the_loop(p, e.caller, holder)):
            continue
        if ev.clears(e.seconds, LIBRARY_HOT_SHARE * p.total) and (best is None or e.seconds > best[1]):
            best = (p.offending(e.caller, e.callee), e.seconds,
                    f"the library call {callee_name(e.callee)}() (from {p.where(e.caller, e.callee)}), made")
    if best is None:
        return None
    where, seconds, what = best
    return finding(
        "hot_spot",
        f"{what} at {where} holds {_share(p, seconds)}, and no rule of the checklist explains it",
        seconds, f"at most its measured {seconds_short(seconds)} (cProfile, at the call site): what a fix that removes "
        f"or vectorizes the work could save", where=where)


def _feeds_the_loop(p: ScriptProfile, fn: Key, holder: Key | None, call: tuple[Key, int, Key] | None = None) -> bool:
    """Whether ``fn`` (yours, called from the loop, not the loop's holder) returns what the loop computes
    its next step from (``state = state * (1 + f(state))``): its library calls are the loop's own work,
    however much they hold, not a hot spot (the loop that drops or only collects the result is one).
    ``call``: ``p.loop_call(fn)``, where the caller has it."""
    if not p.is_user(fn) or fn == holder:
        return False
    at, line, child = call or p.loop_call(fn)
    return at != fn and p.sources.returns_value(child) and not p.sources.result_dropped(at, line, child[2])


def _hot_function(ev: Evidence, p: ScriptProfile, expected: set[Key]) -> tuple[tuple[str, float, str] | None, Key | None]:
    """Your function (not the loop's holder, the env's or one holding the networks' work) that is hot:
    (where, seconds, what) and the function, or (None, None)."""
    holder = p.loop_holder()
    best: tuple[str, float, str] | None = None
    best_fn: Key | None = None  # a library call from the hot function is part of it
    for fn in [k for k in p.raw if p.is_user(k) and k != holder and not k[2].startswith("<")]:
        if _env_function(fn[2]) or p.subtree(fn) & expected or p.imported_only(fn):
            continue
        sites = [e for e in p.edges([fn]) if e.caller != fn]
        cum = _total(sites)[1] if sites else p.cumtime(fn)
        # Hot: the function's own Python time in a loop of its own holds the share (array arithmetic
        # written with operators is own time too, but a vectorized function has no loop; one running the
        # whole episode through numpy holds everything, and nothing), where the samples say most of its
        # time is in the loop's body (a loop over the few colliding pairs of a vectorized step is not) ...
        share = p.loop_share(fn)
        looped = bool(p.sources.loops(fn)) and (share is None or share >= 0.5) and not p.compiled(fn)
        # ... or one library call it makes holds nearly all of it (a per-step metric over a big tensor) ...
        kids = sorted(p.callees.get(fn, []), key=lambda t: -t[2])
        holder_of_call, line, child = p.loop_call(fn)
        concentrated = (bool(kids) and not p.is_user(kids[0][0]) and ev.clears(kids[0][2], 0.8 * p.cumtime(fn))
                        and not _feeds_the_loop(p, fn, holder, (holder_of_call, line, child)))
        # ... or it is work done every step whose result the loop drops or only collects (a metric
        # recomputed each step for a plot).
        side = (ev.steps is not None and p.calls(child) >= 0.5 * ev.steps[0] and holder_of_call != fn
                and p.sources.returns_value(child) and p.sources.result_dropped(holder_of_call, line, child[2]))
        # ... or it only checks (asserts, returns nothing, writes nothing it was given) and is called
        # again and again: a debugging check left in the loop, whatever it calls.
        checks = p.calls(fn) >= 2 and p.sources.only_checks(fn)
        hot = (ev.clears(p.python_time(fn), HOT_SHARE * p.total) and looped) or (
            (concentrated or side or checks) and ev.clears(cum, HOT_SHARE * p.total))
        if hot and (best is None or cum > best[1]):
            hottest = p.hottest_line(fn)
            inside = (p.where(fn, kids[0][0]) if kids and kids[0][2] > 0.5 * cum else
                      f"{short_file(fn[0])}:{hottest} ({fn[2]})" if hottest else p.where(fn))
            kept = (", whose result the loop drops or only collects," if side and not looped and not concentrated else
                    ", which only checks (it asserts, returns nothing and changes nothing it is given)," if checks
                    and not looped and not concentrated else "")
            best = (p.loop_where(fn), cum, f"your function {fn[2]} (most of it at {inside}){kept} called")
            best_fn = fn
    return best, best_fn


_EXPECTED_LIBRARY = (("torch/nn/modules/module.py", ("_call_impl", "_wrapped_call_impl", "__call__")),
                     ("torch/_tensor.py", ("backward",)), ("torch/autograd/", ()), ("torch/optim/", ()))
"""Library calls that are a loop's expected work: a module's forward, a backward, an optimizer's step."""


_ARRAY_LIBRARIES = ("/numpy/", "/scipy/", "/jax/", "/torch/")


def _expected_library(file: str, function: str) -> bool:
    path = file.replace(os.sep, "/")
    return (file.startswith(_RLPERF_DIR) or any(w in path for w in _WAITING)
            or any(part in path and (not names or function in names) for part, names in _EXPECTED_LIBRARY))


def _array_work(file: str) -> bool:
    """A function of an array library that computes (not torch.load's or np.load's file reading): a
    worker's own work, which a worker whose job is arithmetic spends most of its CPU in."""
    path = file.replace(os.sep, "/")
    return any(lib in path for lib in _ARRAY_LIBRARIES) and not any(
        io in path for io in ("serialization", "/lib/npyio", "/lib/_npyio", "/lib/format", "/hub"))


WORKER_SHARE = 0.1
"""The share of the script's own time the workers' CPU (over the CPUs they shared) must hold to be looked into."""


def worker_hot_spot(ev: Evidence) -> Finding | None:
    """Work in the processes the script forked or started (its workers, actors, a vector env's or a Pool's) that
    holds most of their CPU and that no loop of theirs needs: a library call made from a line of yours
    (not a module's forward, a backward, an optimizer step, an env step or a wait), an object built
    again and again (a class's ``__init__``), or a function's own Python loops. Read from CPU-time
    samples of the workers (rlperf.instruments.evidence.WorkerSampler); saving: at most that CPU over
    the CPUs the workers shared (what the script waits for, when it waits for its workers)."""
    workers, p = ev.hooks.get("workers") or {}, ev.p
    cpu = float(workers.get("cpu_s") or 0.0)
    if p is None or cpu <= 0:
        return None
    n = int(workers.get("processes") or 1)
    load = (ev.record.get("profile") or {}).get("load") or {}
    spread = max(1.0, min(float(n), float(load.get("cpus") or effective_cpus())))
    # Workers whose whole CPU is a small part of the script hold no bottleneck of it (a Pool's
    # initializer is most of the CPU of workers given a few short tasks)
    if cpu / spread < WORKER_SHARE * ev.own_total():
        return None
    found = [c for c in (_worker_library_call(p, workers, cpu), _worker_function(p, workers, cpu)) if c is not None]
    if not found:
        return None
    seconds, where, what = max(found)
    return finding(
        "hot_spot",
        f"in the {n} worker process(es) the script started, {what} held {seconds_short(seconds)} of their "
        f"{seconds_short(cpu)} of CPU ({percent_short(seconds / cpu)}, CPU-time samples of each worker), and no rule "
        "of the checklist explains it",
        seconds / spread, f"at most its {seconds_short(seconds)} of the workers' CPU over the {spread:g} CPUs they "
        "shared: what the script waits for when it waits for its workers, if a fix removes the work", where=where)


def _worker_library_call(p: ScriptProfile, workers: Mapping[str, Any], cpu: float) -> tuple[float, str, str] | None:
    """The library call from a line of yours holding :data:`LIBRARY_HOT_SHARE` of the workers' CPU
    that is not their expected work (a network's passes, a wait, an array library's arithmetic):
    (seconds, where, what)."""
    best: tuple[float, str, str] | None = None
    for cfile, cline, cfn, file, first, fn, seconds in workers.get("edges") or []:
        if (seconds < LIBRARY_HOT_SHARE * cpu or p.is_user((file, first, fn)) or _env_function(fn)
                or _expected_library(file, fn) or _array_work(file)) or (best is not None and seconds <= best[0]):
            continue
        where = f"{short_file(cfile)}:{cline} ({cfn})"
        best = (seconds, where, f"the library call {fn}() from {where}")
    return best


def _worker_function(p: ScriptProfile, workers: Mapping[str, Any], cpu: float) -> tuple[float, str, str] | None:
    """Your function in the workers holding :data:`HOT_SHARE` of their CPU as an object built again and
    again (named where it is built) or as its own Python loop: (seconds, where, what)."""
    edges = workers.get("edges") or []
    called: dict[tuple[str, int], float] = {}  # (file, line) -> the library calls that line makes
    for cfile, cline, _, efile, efirst, efn, s in edges:
        if not p.is_user((efile, efirst, efn)):
            called[(cfile, cline)] = called.get((cfile, cline), 0.0) + s
    best: tuple[float, str, str] | None = None
    for file, first, fn, seconds in workers.get("functions") or []:
        key = (file, first, fn)
        if seconds < HOT_SHARE * cpu or not p.is_user(key) or fn.startswith("<") or (best and seconds <= best[0]):
            continue
        if fn == "__init__":  # the same object built for every task or step: where it is built
            sites = sorted((e for e in edges if tuple(e[3:6]) == key), key=lambda e: -e[6])
            if sites:
                where = f"{short_file(sites[0][0])}:{sites[0][1]} ({sites[0][2]})"
                best = (seconds, where, f"building {p.sources.class_of(key) or 'an object'}() at {where}")
            continue
        if _env_function(fn):
            continue
        # Its own Python time inside loops of its own: the lines' time less the library calls they make
        # (a statement handing arrays to numpy or torch is that call's C work, not the loop's own)
        # (a loop's header line, its next item each turn, is that loop's own work, not the loop around it)
        looped: dict[int, float] = {}
        for lfile, lfirst, lfn, line, s in workers.get("lines") or []:
            loop = p.sources.owning_loop(file, line) if (lfile, lfirst, lfn) == key else None
            if loop is not None and loop > first and not p.sources.array_call(file, line):
                looped[loop] = looped.get(loop, 0.0) + max(0.0, s - called.get((file, line), 0.0))
        own = sum(looped.values())
        if own >= HOT_SHARE * cpu and own >= 0.5 * seconds:
            where = f"{short_file(file)}:{max(looped, key=lambda k: looped[k])} ({fn})"
            best = (seconds, where, f"your function {fn}, its Python loop at {where},")
    return best


SCRIPT_RULES: tuple[ScriptRule, ...] = (
    host_copy,
    update_ratio,
    target_copy,
    logging_rule,
    replay_sampling,
    autograd_forward,
    small_batch,
    device_transfer,
    env_reset,
    rendering,
    checkpointing,
    busy_wait,
    gc_pauses,
    threads,
    env_backend,
    worker_hot_spot,
)


def alone_factor(record: Mapping[str, Any], calls: CallStats | None, hooks: Mapping[str, Any] | None) -> float:
    """The share of the profiled time the script takes alone: 1 − cProfile's own cost (its recorded
    calls × its cost per call, measured in the script's process) over the script's wall time."""
    cost = ((hooks or {}).get("profiler_cost") or {}).get("per_call_s")
    wall = float((record.get("script") or {}).get("wall_s") or 0.0)
    if calls is None or cost is None or wall <= 0:
        return 1.0
    return 1.0 - min(0.7, calls.total_calls * float(cost) / wall)


def advise_script(record: Mapping[str, Any], calls: CallStats | None, gc: Mapping[str, Any] | None,
                  steps: tuple[int, str] | None, hooks: Mapping[str, Any] | None = None) -> list[Finding]:
    """Every script rule that fires: estimated savings first, biggest first, then the others. A saving
    below :data:`MIN_SHARE` of the script's own time (:meth:`Evidence.own_total`) drops the finding;
    ``hot_spot`` comes only when nothing else fired. Savings are in seconds of the script alone: each
    call site's profiled seconds less cProfile's cost for the calls recorded beneath it, as the
    estimate states."""
    cost = float(((hooks or {}).get("profiler_cost") or {}).get("per_call_s") or 0.0)
    profile = ScriptProfile(calls, call_cost=cost) if calls is not None else None
    if profile is not None:
        profile.add_line_samples((hooks or {}).get("line_samples"))
    ev = Evidence(record, profile, gc, steps, hooks or {})
    findings = [f for rule in SCRIPT_RULES if (f := rule(ev)) is not None]
    findings += python_loops(ev, findings)
    if profile is not None:
        floor = MIN_SHARE * ev.own_total()
        # Threads set beyond the CPUs are named even when the micro-benchmark finds the cost small (on a
        # busier machine it is not); forwards that recorded unused graphs are a bottleneck only when running
        # them without grad saves something (CleanRL's dqn.py: under 2%, inside its noise).
        findings = [_clamped(f, profile.total) for f in findings
                    if f.est_saving_s is None or ev.clears(f.est_saving_s, floor) or f.id == "threads"]
    spot = hot_spot(ev, findings)
    findings += [_clamped(spot, profile.total)] if spot and profile is not None else []
    if cost:
        findings = [replace(f, estimate=f"{f.estimate}; cProfile's own cost ({cost * 1e6:.2g} µs per recorded call) "
                            f"left out") if f.est_saving_s is not None else f for f in findings]
    measured = sorted((f for f in findings if f.est_saving_s is not None), key=lambda f: f.est_saving_s or 0.0,
                      reverse=True)
    ranked = measured + [f for f in findings if f.est_saving_s is None]
    command = (record.get("script") or {}).get("command")
    return [_script_fix(f, rank, command) for rank, f in enumerate(ranked, 1)]


def _script_fix(f: Finding, rank: int, command: list[str] | None) -> Finding:
    """A finding as a script's: its fix is a change at its line of the script, not a knob of rlperf's
    loop (``--set`` and ``rlperf compare`` do not run the script); the check is ``rlperf profile
    --verify`` where rlperf can apply the fix from outside (rlperf.instruments.fixes), else none."""
    from rlperf.instruments.fixes import VERIFIABLE

    verify = (shlex.join(["rlperf", "profile", "--verify", str(rank), "--", *command])
              if command and f.id in VERIFIABLE else None)
    return replace(f, knob=None, command=verify)


def _clamped(f: Finding, total: float) -> Finding:
    """A saving is never more than the time it is charged against (each rule clamps to its call
    sites' time; this is the last guard: the script's time)."""
    if f.est_saving_s is not None and f.est_saving_s > total:
        return replace(f, est_saving_s=total)
    return f
