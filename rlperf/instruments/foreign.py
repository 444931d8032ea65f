"""The advisor on your own code: the bottleneck checklist as rules over a script's cProfile.

``rlperf profile -- python train.py`` knows nothing of the script's config, so these rules read
only what the profile shows: which of *your* functions (files under the script's folder or the
working directory) call what, how often, and for how long, with the loop's steps counted by
``timer.step_done()`` (:class:`rlperf.PhaseTimer`) or, without it, by the env's ``step`` calls.
Each rule is the generic form of one item of the checklist docs/bottlenecks.md catalogues:

- a per-item loop doing host copies (``.item()``, ``.cpu()``, ``.numpy()``, ``.tolist()``) -- §1
- many optimizer steps per env step -- §3
- ``load_state_dict`` on (nearly) every update: a hard target copy -- §7
- ``print`` / ``logging`` / file writes every step -- §9
- replay sampled in Python (``random.sample``, comprehensions building tensors) -- §2
- forward passes with autograd on outside the update -- §8
- garbage-collector pauses -- §13
- more compute threads than free CPUs -- §14
- single envs stepped one by one in Python (``SyncVectorEnv``, a loop over envs) -- §5

Precision before recall: a rule fires only when the pattern is unambiguous and costs a real share
of the script's time, so a clean loop gets no finding. Each finding points at your function and
line, says the fix in plain words, and gives the ``rlperf compare`` line that measures the same fix
on rlperf's own loop (the knob that demonstrates it).
"""

from __future__ import annotations

import math
import os
import shlex
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from rlperf.instruments.advisor import Finding, effective_cpus
from rlperf.instruments.profilers import CallStats, short_path
from rlperf.report.units import percent_short, seconds_short

Key = tuple[str, int, str]
DEMO = ("rlperf", "compare", "fast", "--steps", "25600", "--repeats", "3")


def demo(slow_form: str) -> str:
    """The rlperf compare line that measures a fix on rlperf's own loop: fast.toml against its slow form."""
    return shlex.join([*DEMO[:3], "--vs", slow_form, *DEMO[3:]])


class ScriptProfile:
    """A script's cProfile table, read as a call graph: who calls what, how often, for how long."""

    def __init__(self, calls: CallStats) -> None:
        self.raw: Mapping[Key, tuple] = calls.entries
        self.own = calls.own
        # The script's time without imports (of its own modules, and of packages imported inside
        # functions): the shares below are of the work the script does.
        total = calls.total_s or sum(v[2] for v in self.raw.values())
        importing = sum(v[3] for k, v in self.raw.items() if k[2] == "_find_and_load" and "importlib" in k[0])
        self.total = max(total - importing, 1e-9)
        self.callees: dict[Key, list[tuple[Key, int, float]]] = defaultdict(list)
        for key, (_cc, _nc, _tt, _ct, callers) in self.raw.items():
            for caller, (_ccc, nc, _ttt, ct) in callers.items():
                self.callees[caller].append((key, nc, ct))

    def calls(self, key: Key) -> int:
        return int(self.raw[key][1]) if key in self.raw else 0

    def cumtime(self, key: Key) -> float:
        return float(self.raw[key][3]) if key in self.raw else 0.0

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

    def user_callers(self, keys: list[Key]) -> dict[Key, tuple[int, float]]:
        """Your functions that call any of ``keys``: their call counts and the time those calls took."""
        out: dict[Key, list[float]] = defaultdict(lambda: [0, 0.0])
        for key in keys:
            for caller, (_cc, nc, _tt, ct) in self.raw[key][4].items():
                if self.is_user(caller):
                    out[caller][0] += nc
                    out[caller][1] += ct
        return {k: (int(v[0]), float(v[1])) for k, v in out.items()}

    def calls_any(self, caller: Key, keys: list[Key]) -> bool:
        wanted = set(keys)
        return any(k in wanted for k, _, _ in self.callees.get(caller, []))

    def user_ancestors(self, key: Key, depth: int = 3) -> set[Key]:
        """Your functions up to ``depth`` calls above ``key`` (through yours only)."""
        seen: set[Key] = set()
        frontier = [key]
        for _ in range(depth):
            nxt = []
            for k in frontier:
                for caller in self.raw.get(k, (0, 0, 0, 0, {}))[4]:
                    if self.is_user(caller) and caller not in seen:
                        seen.add(caller)
                        nxt.append(caller)
            frontier = nxt
        return seen


def where(key: Key) -> str:
    """``train.py:42 (push_all)``."""
    return f"{short_path(key[0])}:{key[1]} ({key[2]})"


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
    return (most, "calls of your step method") if most else None


def _optimizer_steps(p: ScriptProfile) -> int:
    keys = [k for k in p.keys("step", "torch/optim/") if "lr_scheduler" not in k[0]]
    return max((p.calls(k) for k in keys), default=0)


# -- the rules ----------------------------------------------------------------------------------

ScriptRule = Callable[[Mapping[str, Any], "ScriptProfile | None", "Mapping[str, Any] | None", "tuple[int, str] | None"],
                      "Finding | None"]

HOST_COPIES = ("'item' of", "'cpu' of", "'numpy' of", "'tolist' of")


def host_copy_loop(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
                   steps: tuple[int, str] | None) -> Finding | None:
    """One of your functions loops over items, copying each to the host (docs/bottlenecks.md §1)."""
    if p is None:
        return None
    copies = [k for k in p.raw if k[0] == "~" and "Tensor" in k[2] and any(m in k[2] for m in HOST_COPIES)]
    per_caller: dict[Key, dict[str, int]] = defaultdict(dict)
    for key in copies:
        for caller, (n, _) in p.user_callers([key]).items():
            per_caller[caller][key[2].split("'")[1]] = n
    best = None
    for caller, methods in per_caller.items():
        n, calls = sum(methods.values()), p.calls(caller)
        # A loop over items: many copies per call of the function, and (when the steps are known) per
        # step too -- the loop function itself makes one copy per step in a single call.
        per_step_ok = n / steps[0] >= 16 if steps else calls >= 2
        if not calls or n / calls < 16 or not per_step_ok or p.cumtime(caller) < 0.03 * p.total:
            continue
        if best is None or p.cumtime(caller) > p.cumtime(best[0]):
            best = (caller, methods, n / calls)
    if best is None:
        return None
    caller, methods, per_call = best
    cum = p.cumtime(caller)
    counted = ", ".join(f".{m}() {n:,}" for m, n in sorted(methods.items(), key=lambda kv: -kv[1]))
    per_step = f", {sum(methods.values()) / steps[0]:,.0f} per step ({steps[1]})" if steps else ""
    return Finding(
        title="A per-item loop copies tensors to the host one by one",
        evidence=f"{where(caller)} called {counted} times in {p.calls(caller):,} calls: {per_call:,.0f} host copies "
        f"per call{per_step}; the function took {seconds_short(cum)} ({percent_short(cum / p.total)} of the script)",
        fix="move the whole batch at once (one .cpu()/.numpy() of the batch tensor, or keep it on the device) and "
        "write it with one vectorized assignment instead of a Python loop over items",
        knob="buffer.push=batch", command=demo("buffer.push=loop"),
        expected_gain="2–5× on that part of the loop (each .item() is also a device sync on a GPU)",
        est_saving_s=cum * (1 - 1 / per_call),
        estimate=f"at most the function's {seconds_short(cum)} × (1 − 1/{per_call:,.0f}): one batched copy instead of "
        f"{per_call:,.0f}",
        reference="docs/bottlenecks.md §1", where=where(caller),
    )


def update_ratio(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
                 steps: tuple[int, str] | None) -> Finding | None:
    """Many optimizer steps per env step (docs/bottlenecks.md §3)."""
    if p is None or steps is None:
        return None
    updates = _optimizer_steps(p)
    ratio = updates / steps[0]
    backward = p.keys("backward", "torch/_tensor.py")
    callers = p.user_callers(backward)
    if ratio <= 4 or not callers:
        return None
    update_fn = max(callers, key=lambda k: callers[k][0])
    cum = p.cumtime(update_fn)
    if cum < 0.2 * p.total:
        return None
    return Finding(
        title="Many gradient updates per env step",
        evidence=f"{updates:,} optimizer steps over {steps[0]:,} env steps ({steps[1]}): {ratio:.1f} per env step; "
        f"{where(update_fn)} took {seconds_short(cum)} ({percent_short(cum / p.total)} of the script)",
        fix=f"make 1–4 gradient updates per env step instead of {ratio:.0f} (or update every few steps)",
        knob="train.train_ratio=4", command=demo("train.train_ratio=64"),
        expected_gain="2–4× overall; fewer updates can change learning, so watch the score too",
        est_saving_s=cum * (1 - 4 / ratio),
        estimate=f"{where(update_fn)}'s {seconds_short(cum)} × (1 − 4/{ratio:.1f}): its measured cost per update, 4 "
        f"updates per env step",
        reference="docs/bottlenecks.md §3", where=where(update_fn),
    )


def target_copy_every_update(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
                             steps: tuple[int, str] | None) -> Finding | None:
    """``load_state_dict`` on (nearly) every update: a hard target copy (docs/bottlenecks.md §7)."""
    if p is None:
        return None
    callers = p.user_callers(p.keys("load_state_dict", "torch/nn/modules/module.py"))
    updates = _optimizer_steps(p)
    if not callers or updates < 10:
        return None
    copies = sum(n for n, _ in callers.values())
    seconds = sum(t for _, t in callers.values())
    if copies < 0.5 * updates or seconds < 0.01 * p.total:
        return None
    top = max(callers, key=lambda k: callers[k][0])
    return Finding(
        title="The target network is copied on every update",
        evidence=f"{where(top)} called load_state_dict {copies:,} times for {updates:,} optimizer steps; the copies took "
        f"{seconds_short(seconds)} ({percent_short(seconds / p.total)} of the script)",
        fix="copy the target network every N updates (e.g. 1,000), or update it in place with a soft update: "
        "torch._foreach_lerp_(target_params, params, tau) under torch.no_grad()",
        knob="agent.target_update=soft", command=demo("agent.target_update=hard"),
        expected_gain="removes a state-dict copy per update (no figure reported)",
        est_saving_s=seconds * (1 - 1 / 100),
        estimate=f"the copies' {seconds_short(seconds)} × (1 − 1/100): one copy every 100 updates",
        reference="docs/bottlenecks.md §7", where=where(top),
    )


def log_every_step(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
                   steps: tuple[int, str] | None) -> Finding | None:
    """``print``, ``logging`` or file writes every step (docs/bottlenecks.md §9)."""
    if p is None or steps is None:
        return None
    printing = p.keys(builtin="builtins.print")
    logging_calls = [k for k in p.keys(path="logging/__init__.py") if k[2] in ("debug", "info", "warning", "log")]
    writes = [k for k in p.keys(builtin="of '_io.") if ("'write'" in k[2] or "'flush'" in k[2])]
    callers = p.user_callers(printing + logging_calls + writes)
    n = sum(c for c, _ in callers.values())
    seconds = sum(t for _, t in callers.values())
    if not callers or n / steps[0] < 0.5 or seconds < 0.02 * p.total:
        return None
    top = max(callers, key=lambda k: callers[k][1])
    return Finding(
        title="Printing or logging every step",
        evidence=f"{n:,} print/logging/write calls from your code over {steps[0]:,} steps ({steps[1]}): "
        f"{n / steps[0]:.1f} per step, {seconds_short(seconds)} ({percent_short(seconds / p.total)} of the script); most "
        f"from {where(top)}",
        fix="log every 100 steps (accumulate on the device in between, read once per log: each .item() waits for "
        "the GPU)",
        knob="train.log_every=100", command=demo("train.log_every=1"),
        expected_gain="small on a CPU (under 5%); on a GPU every read of a device value is a sync",
        est_saving_s=seconds * (1 - 1 / 100),
        estimate=f"the calls' {seconds_short(seconds)} × (1 − 1/100): one log every 100 steps",
        reference="docs/bottlenecks.md §9", where=where(top),
    )


def python_sampling(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
                    steps: tuple[int, str] | None) -> Finding | None:
    """Replay sampled in Python: ``random.sample`` and comprehensions building tensors (docs/bottlenecks.md §2)."""
    if p is None:
        return None
    drawing = p.keys("sample", "random.py") + p.keys("choices", "random.py") + p.keys(builtin="'choice' of")
    building = (p.keys(builtin="torch.tensor") + p.keys(builtin="torch.stack") + p.keys(builtin="numpy.array")
                + p.keys(builtin="numpy.core.multiarray.array") + p.keys("stack", "numpy/"))
    comprehensions = [k for k in p.raw if k[2] in ("<listcomp>", "<genexpr>") and p.is_user(k)]
    best = None
    for fn in p.user_callers(drawing):
        inner = [c for c in comprehensions if fn in p.raw[c][4]]
        builds = p.calls_any(fn, building) or any(p.calls_any(c, building) for c in inner)
        if not (inner and builds) or p.cumtime(fn) < 0.05 * p.total:
            continue
        if best is None or p.cumtime(fn) > p.cumtime(best):
            best = fn
    if best is None:
        return None
    cum = p.cumtime(best)
    return Finding(
        title="Replay sampling runs in Python",
        evidence=f"{where(best)} draws with random.sample/choices and builds its batch in a comprehension, "
        f"{p.calls(best):,} calls, {seconds_short(cum)} ({percent_short(cum / p.total)} of the script)",
        fix="keep the replay in preallocated arrays or tensors (one per field) and sample with one index draw "
        "(torch.randint) and one gather per field",
        knob="buffer.storage=tensor", command=demo("buffer.storage=list"),
        expected_gain="removes the per-sample Python loop and copies (no figure reported)",
        est_saving_s=None,
        estimate=f"not measured: at most the function's {seconds_short(cum)}; the compare line measures the same fix "
        f"on rlperf's own replay",
        reference="docs/bottlenecks.md §2", where=where(best),
    )


def autograd_forward(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
                     steps: tuple[int, str] | None) -> Finding | None:
    """Forward passes with autograd on outside the update (docs/bottlenecks.md §8)."""
    if p is None or steps is None:
        return None
    forward = p.keys("_wrapped_call_impl", "torch/nn/modules/module.py") or p.keys("_call_impl", "torch/nn/modules/")
    backward = p.keys("backward", "torch/_tensor.py")
    no_grad = p.keys("__enter__", "torch/autograd/grad_mode.py") + p.keys("__enter__", "torch/utils/_contextlib.py")
    decorated = p.keys("decorate_context", "torch/utils/_contextlib.py")
    best = None
    for fn, (_calls, t) in p.user_callers(forward).items():
        if p.calls_any(fn, backward) or p.calls(fn) < 0.5 * steps[0] or t < 0.03 * p.total:
            continue
        scope = {fn, *p.user_ancestors(fn)}
        if any(p.calls_any(k, no_grad) for k in scope) or any(k in decorated for k in p.raw[fn][4]):
            continue  # under no_grad/inference_mode somewhere above (or cannot tell): say nothing
        if any(p.calls_any(k, backward) for k in p.user_ancestors(fn, depth=1)):
            continue  # called from the update itself
        if best is None or t > best[1]:
            best = (fn, t)
    if best is None:
        return None
    fn, seconds = best
    return Finding(
        title="Forward passes record autograd graphs nobody uses",
        evidence=f"{where(fn)} runs the network {p.calls(fn):,} times ({steps[1]}: {steps[0]:,}) outside the update, with "
        f"no torch.no_grad()/inference_mode() around it; those forwards took {seconds_short(seconds)} "
        f"({percent_short(seconds / p.total)} of the script)",
        fix="select actions under torch.inference_mode() (decorate the function, or wrap the call)",
        knob="agent.inference=no_grad", command=demo("agent.inference=grad"),
        expected_gain="select runs without building a graph (no figure reported)",
        est_saving_s=None,
        estimate=f"not measured: part of the forwards' {seconds_short(seconds)}; the compare line measures the same fix "
        f"on rlperf's own network",
        reference="docs/bottlenecks.md §8", where=where(fn),
    )


def gc_pauses(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
              steps: tuple[int, str] | None) -> Finding | None:
    """Garbage-collector pauses (docs/bottlenecks.md §13)."""
    if not gc or float(gc.get("share_of_loop") or 0.0) < 0.05:
        return None
    n = gc.get("collections") or {}
    seconds = float(gc.get("total_s") or 0.0)
    return Finding(
        title="Garbage-collector pauses",
        evidence=f"{gc.get('total_collections', 0):,} collections (gen0 {n.get('gen0', 0):,}, gen1 {n.get('gen1', 0):,}, "
        f"gen2 {n.get('gen2', 0):,}) took {seconds_short(seconds)}, {percent_short(float(gc['share_of_loop']))} of the "
        f"script, longest pause {float(gc.get('max_pause_ms') or 0):.1f} ms (gc.callbacks)",
        fix="call gc.freeze() once setup is done (or gc.disable() around the loop), and avoid creating reference "
        "cycles per step",
        knob="train.gc=freeze", command=demo("train.gc=on"),
        expected_gain="removes the periodic pauses (no figure reported)",
        est_saving_s=seconds, estimate=f"the collector's measured {seconds_short(seconds)}",
        reference="docs/bottlenecks.md §13",
    )


def threads(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
            steps: tuple[int, str] | None) -> Finding | None:
    """More compute threads than free CPUs (docs/bottlenecks.md §14)."""
    system = record.get("system") or {}
    n = int(system.get("torch_threads") or 0)
    load = (record.get("profile") or {}).get("load") or {}
    cpus = float(load.get("cpus") or effective_cpus())
    busy = float(load.get("loadavg_1m") or 0.0)
    if p is None or n <= 1 or not (n > cpus or busy > cpus + 0.5):
        return None
    compute = p.keys("_wrapped_call_impl", "torch/nn/modules/module.py") + p.keys("backward", "torch/_tensor.py")
    seconds = sum(t for _, t in p.user_callers(compute).values())
    if seconds < 0.2 * p.total:
        return None
    fewer = max(1, math.floor(cpus)) if n > cpus else 1
    why = (f"{n} torch threads on {cpus:g} usable CPUs" if n > cpus else
           f"{n} torch threads while the load average was {busy:.1f} on {cpus:g} CPUs")
    return Finding(
        title="More compute threads than free CPUs",
        evidence=f"{why}; forward and backward passes took {seconds_short(seconds)} ({percent_short(seconds / p.total)} "
        f"of the script): threads that lose their CPU stall the others at every parallel op",
        fix=f"torch.set_num_threads({fewer}) (and OMP_NUM_THREADS={fewer}) at the start of the script",
        knob=f"run.threads={fewer}", command=demo("run.threads=0"),
        expected_gain="less contention and steadier timings (no figure reported)",
        est_saving_s=None, estimate="not measured: depends on the other processes; the compare line measures it on "
        "rlperf's loop",
        reference="docs/bottlenecks.md §14",
    )


def envs_one_by_one(record: Mapping[str, Any], p: ScriptProfile | None, gc: Mapping[str, Any] | None,
                    steps: tuple[int, str] | None) -> Finding | None:
    """Single envs stepped one by one in Python (docs/bottlenecks.md §5)."""
    if p is None:
        return None
    single = [k for k in p.keys("step") if "gymnasium/vector/" not in k[0].replace(os.sep, "/") and "torch/" not in
              k[0].replace(os.sep, "/")]
    best = None
    sync = p.keys("step", "gymnasium/vector/sync_vector_env.py")
    candidates = [(k, p.calls(k), p.cumtime(k)) for k in sync]
    candidates += [(caller, p.calls(caller), p.cumtime(caller)) for caller in p.user_callers(single)]
    timed = (record.get("totals") or {}).get("vector_steps")
    for fn, calls, cum in candidates:
        inner = sum(nc for k, nc, _ in p.callees.get(fn, []) if k in single)
        # Several single-env steps per iteration of the loop: per call of a vector env, or of a helper
        # called every iteration, or (the loop itself, called once) per step the phase timer counted.
        per_iteration = inner / calls if "sync_vector_env" in fn[0] or calls >= 2 else (inner / timed if timed else 0)
        if not calls or per_iteration < 4 or cum < 0.2 * p.total:
            continue
        if best is None or cum > best[2]:
            best = (fn, per_iteration, cum)
    if best is None:
        return None
    fn, per_call, cum = best
    what = "gymnasium's SyncVectorEnv" if "sync_vector_env" in fn[0] else where(fn)
    return Finding(
        title="Envs are stepped one by one in Python",
        evidence=f"{what} steps {per_call:.0f} single envs per iteration, {p.calls(fn):,} calls, {seconds_short(cum)} "
        f"({percent_short(cum / p.total)} of the script)",
        fix="step all envs in one batched call: the env's vector entry point (gymnasium.make_vec(id, num_envs=N, "
        "vectorization_mode='vector_entry_point')), or AsyncVectorEnv to step them in parallel processes",
        knob="env.backend=tensor", command=demo("env.backend=gym-sync"),
        expected_gain="a batched env steps every env in one call (no figure reported; rlperf's own target is ≥ 100× "
        "SyncVectorEnv at 256 boards)",
        est_saving_s=None,
        estimate=f"not measured: at most the loop's {seconds_short(cum)}; the compare line measures the same fix on "
        f"rlperf's own env",
        reference="docs/bottlenecks.md §5", where=None if "sync_vector_env" in fn[0] else where(fn),
    )


SCRIPT_RULES: tuple[ScriptRule, ...] = (
    host_copy_loop,
    update_ratio,
    target_copy_every_update,
    log_every_step,
    python_sampling,
    autograd_forward,
    gc_pauses,
    threads,
    envs_one_by_one,
)


def advise_script(record: Mapping[str, Any], calls: CallStats | None, gc: Mapping[str, Any] | None,
                  steps: tuple[int, str] | None) -> list[Finding]:
    """Every script rule that fires: estimated savings first, biggest first, then the others."""
    profile = ScriptProfile(calls) if calls is not None else None
    findings = [f for rule in SCRIPT_RULES if (f := rule(record, profile, gc, steps)) is not None]
    measured = sorted((f for f in findings if f.est_saving_s is not None), key=lambda f: f.est_saving_s or 0.0,
                      reverse=True)
    return measured + [f for f in findings if f.est_saving_s is None]
