"""The advisor: what to change, ranked by the time it could save on *this* run.

Each rule is a small function of (record, config, cProfile stats, GC stats) that returns a
:class:`Finding` or None. A rule fires only on evidence measured in the run -- a phase share, a
cProfile entry, a GC count -- together with the config that explains it, and its finding says
which evidence it used, the fix in plain words and as a knob (a slow form to its fast form), the
gain practitioners reported for that change with the section of docs/bottlenecks.md that explains
it, and the ``rlperf compare`` line that measures it.

Savings are measured, not assumed. The run measures how much time the slow form took (a phase, or
a function's cProfile time scaled to the measured window); the same process then micro-benchmarks
the slow and the fast form of that piece of work (:mod:`rlperf.instruments.microbench`, kept in the
record as ``profile.microbench``), and the saving is ``measured × (1 − fast / slow)``. Where a knob
changes how often work runs rather than how it runs (train_ratio, log_every), the saving is the
measured cost per call times the calls the fix removes. Each finding's ``estimate`` says which.
A finding whose saving could not be measured has ``est_saving_s`` None and is listed after the
others; ``rlperf profile --verify K`` runs the compare lines and records the measured gain beside
each estimate.

Every bottleneck is defined once, in :mod:`rlperf.instruments.catalogue` (its id, title, fix, knob
and section); a rule here adds what this run measured, and the advisor of your own scripts
(:mod:`rlperf.instruments.foreign`) builds its findings from the same entries.

Adding a rule: write ``rule(record, cfg, calls, gc) -> Finding | None`` returning
``catalogue.finding(ID, ...)`` and append it to :data:`RULES`; if it needs a micro-benchmark, add a
``Bench`` to ``microbench.BENCHES``.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rlperf.config import Config
from rlperf.instruments.catalogue import Finding, finding
from rlperf.instruments.profilers import CallStats
from rlperf.report.units import percent_short, seconds_short
from rlperf.system import effective_cpus

MIN_SAVING_SHARE = 0.0025
"""A finding must be worth at least this share of the measured phase time (its saving is measured,
so a small one is still real: the per-board push loop is under 1% of the naive loop on a CPU)."""


MIN_GC_S = 0.005
"""The garbage collector's time in the loop below which it is no finding, whatever its share."""


@dataclass(frozen=True)
class VerifyBase:
    """The run a finding's compare line repeats: the config as the user named it, and the run options."""

    config: str = "default"
    args: tuple[str, ...] = ()

    def command(self, knob: str) -> str:
        return shlex.join(["rlperf", "compare", self.config, "--vs", knob, *self.args])

    def for_window(self, env_steps: int, repeats: int = 3) -> VerifyBase:
        """The same run options, measuring what a profile measured: its ``env_steps`` in all (a train
        run leaves the same fill and warm-up out of its rates), ``repeats`` a side."""
        args, rest = [], list(self.args)
        while rest:
            arg = rest.pop(0)
            if arg in ("--episodes", "--steps", "--repeats") and rest:
                rest.pop(0)
            elif arg.startswith(("--episodes=", "--steps=", "--repeats=")):
                continue
            else:
                args.append(arg)
        args += ["--steps", str(env_steps), "--repeats", str(repeats)]
        return VerifyBase(self.config, tuple(args))


Rule = Callable[[Mapping[str, Any], Config, "CallStats | None", "Mapping[str, Any] | None"], "Finding | None"]


# -- facts read from a record ------------------------------------------------------------------


def _phase(record: Mapping[str, Any], name: str) -> dict[str, float]:
    p = (record.get("phases") or {}).get(name) or {}
    return {"total_s": float(p.get("total_s") or 0.0), "share": float(p.get("share") or 0.0),
            "calls": int(p.get("calls") or 0), "mean_ms": float(p.get("mean_ms") or 0.0),
            "p50_ms": float(p.get("p50_ms") or 0.0), "p95_ms": float(p.get("p95_ms") or 0.0)}


def measured_total(record: Mapping[str, Any]) -> float:
    """Seconds of phase time after warm-up (what the phase table adds up)."""
    return sum(float(p.get("total_s") or 0.0) for p in (record.get("phases") or {}).values())


def _measured_steps(record: Mapping[str, Any]) -> int:
    return int((record.get("timing") or {}).get("measured_steps") or 0)


def _to_measured(record: Mapping[str, Any]) -> float:
    """Scale from whole-loop seconds (cProfile, GC) to the measured window (phases exclude warm-up)."""
    total = measured_total(record)
    warm = float((record.get("timing") or {}).get("warmup_s") or 0.0)
    return total / (total + warm) if total + warm > 0 else 0.0


def _per_step(count: int, record: Mapping[str, Any]) -> str:
    steps = int((record.get("totals") or {}).get("vector_steps") or 0)
    return f"{count / steps:,.0f} per vector step" if steps else ""


def _cuda(record: Mapping[str, Any]) -> bool:
    return str((record.get("system") or {}).get("device", "")).startswith("cuda")


def _graph_update(record: Mapping[str, Any]) -> bool:
    """The update ran as one CUDA graph (``train.update=graph``): a knob that needs the eager update
    (AMP, torch.compile) would give that up, and its micro-benchmark times the eager form."""
    return (record.get("update") or {}).get("form") == "graph"


# -- measured savings ---------------------------------------------------------------------------


def _bench(record: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """A micro-benchmark of this run (``profile.microbench``), when it ran and succeeded."""
    bench = ((record.get("profile") or {}).get("microbench") or {}).get(name)
    return bench if bench and "error" not in bench and bench.get("fast_s") else None


def call_time(seconds: float) -> str:
    """A per-call time: ``7.1 ms``, ``31 µs``."""
    if seconds >= 0.1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def replaced(measured_s: float, what: str, record: Mapping[str, Any], name: str) -> tuple[float | None, str]:
    """``measured × (1 − fast / slow)`` from micro-benchmark ``name``, and how it was measured."""
    bench = _bench(record, name)
    if bench is None or not bench.get("slow_s"):
        missing = ((record.get("profile") or {}).get("microbench") or {}).get(name) or {}
        why = f" ({missing['error']})" if "error" in missing else ""
        return None, f"not measured: no micro-benchmark of the two forms in this record{why}"
    keep = bench["fast_s"] / bench["slow_s"]
    text = (f"{what} {seconds_short(measured_s)} × (1 − {call_time(bench['fast_s'])} / {call_time(bench['slow_s'])} per "
            f"{bench['what']}: {bench['fast']} against {bench['slow']}, micro-benchmarked here, median of "
            f"{bench['repeats']} interleaved repeats)")
    return measured_s * (1 - keep), text


# -- the rules ---------------------------------------------------------------------------------


def push_loop(record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None) -> Finding | None:
    """The per-board replay push with host copies and .item() (docs/bottlenecks.md §1)."""
    if cfg.buffer.push != "loop":
        return None
    push = _phase(record, "push")
    if push["total_s"] <= 0:
        return None
    n = cfg.env.num_envs
    evidence = (
        f"push is {percent_short(push['share'])} of phase time ({seconds_short(push['total_s'])}, "
        f"{push['mean_ms'] / n * 1e3:.0f} µs per board) with buffer.push=loop"
    )
    if calls is not None:
        pushes = calls.count("write_one", "rlperf/buffer.py")
        items = calls.count("'item' of", builtin=True)
        evidence += (
            f"; cProfile: the storage's write_one called {pushes:,} times ({_per_step(pushes, record)}), "
            f"Tensor.item {items:,} times" + (" (each a device sync)" if _cuda(record) else "")
        )
    saving, estimate = replaced(push["total_s"], "push phase", record, "push")
    return finding("host_copy", evidence, saving, estimate)


def train_ratio(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """More gradient updates per vector step than the 1–4 that usually pay (docs/bottlenecks.md §3)."""
    ratio = cfg.train.train_ratio
    train = _phase(record, "train")
    if ratio <= 4 or train["total_s"] <= 0:
        return None
    replay = float((record.get("throughput") or {}).get("replay_ratio") or 0.0)
    evidence = (
        f"train is {percent_short(train['share'])} of phase time ({seconds_short(train['total_s'])}) "
        f"at train.train_ratio={ratio:g} ({ratio:g} updates per vector step, replay ratio {replay:.1f})"
    )
    if calls is not None:
        updates = calls.count("update", "rlperf/dqn.py")
        evidence += f"; cProfile: Agent.update called {updates:,} times ({_per_step(updates, record)})"
    updates = int((record.get("timing") or {}).get("measured_updates") or 0)
    per_update = f"{call_time(train['total_s'] / updates)} per update measured in this run, " if updates else ""
    return finding("update_ratio", evidence, train["total_s"] * (1 - 4 / ratio),
                   f"train phase {seconds_short(train['total_s'])} × (1 − 4/{ratio:g}): {per_update}4/{ratio:g} of the "
                   f"updates", fix=f"4 updates per vector step instead of {ratio:g}")


def bfs_flood_fill(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """The per-board Python BFS for the flood-fill features (docs/bottlenecks.md §4)."""
    if cfg.env.flood_fill != "bfs":
        return None
    step = _phase(record, "step")
    if step["total_s"] <= 0:
        return None
    evidence = (
        f"step is {percent_short(step['share'])} of phase time ({seconds_short(step['total_s'])}) with env.flood_fill=bfs"
    )
    if calls is not None:
        env_file = "rlperf/env/vector.py" if cfg.env.backend == "tensor" else "rlperf/env/backends.py"
        env_step = calls.cumtime("step", env_file)
        bfs_calls, _, bfs_cum = calls.get("bfs_count", "rlperf/env/floodfill.py")
        bfs_cum = max(bfs_cum, calls.cumtime("reachable_bfs", "rlperf/env/floodfill.py"))
        if bfs_calls:
            steps = int((record.get("totals") or {}).get("vector_steps") or 0)
            per_board = f", {bfs_calls / (steps * cfg.env.num_envs):.1f} per board" if steps else ""
            evidence += f"; cProfile: bfs_count called {bfs_calls:,} times ({_per_step(bfs_calls, record)}{per_board})"
            if env_step > 0:
                evidence += f", {percent_short(min(1.0, bfs_cum / env_step))} of the env step's time"
    saving, estimate = replaced(step["total_s"], "step phase", record, "flood_fill")
    return finding("flood_fill", evidence, saving, estimate)


def host_storage(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Replay in a Python list or host arrays, copied on every sample (docs/bottlenecks.md §2)."""
    storage = cfg.buffer.storage
    if storage == "tensor" or calls is None:
        return None
    update = calls.cumtime("update", "rlperf/dqn.py")
    sample_calls, _, sample = calls.get("sample", "rlperf/buffer.py")
    if update <= 0 or sample_calls == 0:
        return None
    sample_s = sample * _to_measured(record)
    evidence = (
        f"buffer.storage={storage}: ReplayBuffer.sample called {sample_calls:,} times, "
        f"{percent_short(min(1.0, sample / update))} of the update's time (cProfile)"
    )
    saving, estimate = replaced(sample_s, "sampling", record, "storage_sample")
    if storage == "list" and cfg.buffer.push == "batch" and saving is not None:
        push = _phase(record, "push")
        push_saving, push_estimate = replaced(push["total_s"], "push phase", record, "storage_push")
        if push_saving is not None:
            saving += push_saving
            estimate += f", plus {push_estimate}"
            evidence += f"; push (a Python loop over rows into the list) is {percent_short(push['share'])}"
    return finding("replay_sampling", evidence, saving, estimate)


def hard_target(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Hard target copies: a whole state dict every target_every updates (docs/bottlenecks.md §7)."""
    a = cfg.agent
    if a.target_update != "hard" or calls is None:
        return None
    n_calls, _, cum = calls.get("_hard_update", "rlperf/dqn.py")
    copies = calls.count("load_state_dict", "torch/nn/modules/module.py")
    if n_calls == 0 or copies == 0:
        return None
    seconds = cum * _to_measured(record)
    train = _phase(record, "train")
    evidence = (
        f"agent.target_update=hard: {copies:,} full state-dict copies (every {a.target_every} updates) took "
        f"{seconds_short(cum)} (cProfile), {1e3 * cum / copies:.2f} ms each; train p95 {train['p95_ms']:.3g} ms vs "
        f"p50 {train['p50_ms']:.3g} ms"
    )
    bench = _bench(record, "target")
    if bench is None:
        saving, estimate = replaced(seconds, "target copies", record, "target")
    else:
        # The soft form lerps on every update, the hard one copies every target_every: compare totals.
        slow, fast = copies * bench["slow_s"], n_calls * bench["fast_s"]
        saving = seconds * (1 - fast / slow)
        estimate = (f"target copies {seconds_short(seconds)} × (1 − {n_calls:,} lerps × {call_time(bench['fast_s'])} / "
                    f"({copies:,} copies × {call_time(bench['slow_s'])})), both micro-benchmarked here, median of "
                    f"{bench['repeats']} interleaved repeats")
    return finding("target_copy", evidence, saving, estimate)


def log_every_step(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Logging, and reading device values on the host, every vector step (docs/bottlenecks.md §9)."""
    every = cfg.train.log_every
    if every > 10:
        return None
    log = _phase(record, "log")
    if log["total_s"] <= 0:
        return None
    evidence = (
        f"log is {percent_short(log['share'])} of phase time ({seconds_short(log['total_s'])}) with train.log_every={every}"
    )
    measured, what = log["total_s"], "log phase"
    if calls is not None:
        logs, _, on_log = calls.get("on_log", "rlperf/run/lifecycle.py")
        evidence += (
            f"; cProfile: on_log ran {logs:,} times ({_per_step(logs, record)}), each writing and flushing a metrics.csv row"
        )
        if logs:
            measured, what = on_log * _to_measured(record), f"on_log ({call_time(on_log / logs)} per call)"
    if _cuda(record):
        evidence += "; each log reads the loss on the host, which waits for the device (a sync every step)"
    return finding("logging", evidence, measured * (1 - every / 100),
                   f"{what} {seconds_short(measured)} × (1 − {every}/100): the measured cost per log, {every}/100 as "
                   f"many logs")


def autograd_select(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Action selection with autograd on: a graph recorded and thrown away every step (docs/bottlenecks.md §8)."""
    if cfg.agent.inference != "grad":
        return None
    select = _phase(record, "select")
    if select["total_s"] <= 0:
        return None
    evidence = (
        f"select is {percent_short(select['share'])} of phase time ({select['mean_ms']:.3g} ms per step) with "
        f"agent.inference=grad: every forward records an autograd graph nobody uses"
    )
    saving, estimate = replaced(select["total_s"], "select phase", record, "inference")
    return finding("autograd_forward", evidence, saving, estimate)


def gym_backend(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Gymnasium's vector wrappers over single boards instead of the batched env (docs/bottlenecks.md §5)."""
    backend = cfg.env.backend
    if backend == "tensor":
        return None
    step = _phase(record, "step")
    if step["total_s"] <= 0:
        return None
    evidence = (
        f"step is {percent_short(step['share'])} of phase time ({seconds_short(step['total_s'])}) with env.backend={backend}"
    )
    if calls is not None and backend == "gym-sync":
        boards = calls.count("step", "rlperf/env/single.py")
        evidence += f"; cProfile: SnakeEnv.step called {boards:,} times ({_per_step(boards, record)}, one per board)"
    bench = _bench(record, "backend")
    if bench is not None and not bench.get("slow_s") and step["calls"]:
        # gym-async's workers are not rebuilt for a benchmark: the run's own step is the slow figure.
        saving = step["total_s"] - step["calls"] * bench["fast_s"]
        estimate = (f"step phase {seconds_short(step['total_s'])} − {step['calls']:,} steps × "
                    f"{call_time(bench['fast_s'])} per {bench['what']} with env.backend=tensor (micro-benchmarked here)")
    else:
        saving, estimate = replaced(step["total_s"], "step phase", record, "backend")
    return finding("env_backend", evidence, saving, estimate)


def ops_kernel(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """docs/bottlenecks.md §6: the env step as one tensor operator per rule (env.kernel=ops) on the CPU."""
    e = cfg.env
    ran = (record.get("env") or {}).get("kernel", e.kernel if e.backend == "tensor" else None)
    # The fused kernel runs on the CPU and computes its own flood fill (flood_fill=bfs has its own rule).
    if ran != "ops" or e.backend != "tensor" or e.flood_fill == "bfs" or _cuda(record):
        return None
    step = _phase(record, "step")
    if step["total_s"] <= 0 or step["share"] < 0.05:
        return None
    n = e.num_envs
    evidence = (f"step is {percent_short(step['share'])} of phase time ({step['mean_ms']:.3g} ms per vector step, "
                f"{1e3 * step['mean_ms'] / n:.2f} µs per board) with env.kernel=ops")
    steps = int((record.get("totals") or {}).get("vector_steps") or 0)
    if calls is not None and steps:
        ops = calls.builtin_calls_from("rlperf/env/vector.py", "rlperf/env/floodfill.py") / steps
        if ops:
            evidence += (f"; cProfile: {ops:,.0f} torch calls per vector step from the env, "
                         f"{1e3 * step['mean_ms'] / ops:.1f} µs "
                         f"each: a fixed cost per call, whatever the number of boards")
    saving, estimate = replaced(step["total_s"], "step phase", record, "kernel")
    if n > 4096:  # up to here the ops kernel is operator dispatch; beyond, memory traffic as well
        evidence += f"; at {n:,} boards memory traffic adds to the dispatch"
    return finding("env_kernel", evidence, saving, estimate)


def torch_update(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """docs/bottlenecks.md §20: the eager torch update on the CPU, where the fused one can run."""
    import torch

    from rlperf.fused_update import why_not_fused

    ran = (record.get("update") or {}).get("form", cfg.train.update)
    if ran != "torch" or _cuda(record) or why_not_fused(cfg, torch.device("cpu")) is not None:
        return None
    train = _phase(record, "train")
    if train["total_s"] <= 0 or train["share"] < 0.05:
        return None
    updates = int((record.get("timing") or {}).get("measured_updates") or 0)
    per_update = f", {call_time(train['total_s'] / updates)} per update" if updates else ""
    evidence = (f"train is {percent_short(train['share'])} of phase time{per_update} with train.update=torch "
                f"(batch {cfg.buffer.batch_size}, network {'×'.join(map(str, cfg.agent.hidden))})")
    saving, estimate = replaced(train["total_s"], "train phase", record, "update")
    return finding("torch_update", evidence, saving, estimate)


def gc_pauses(record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None) -> Finding | None:
    """Garbage-collector pauses in the loop (docs/bottlenecks.md §13)."""
    if cfg.train.gc != "on" or not gc:
        return None
    share = float(gc.get("share_of_loop") or 0.0)
    seconds = float(gc.get("total_s") or 0.0)
    # A young collection costs a fraction of a millisecond: a short window's one or two are not pauses.
    if share < MIN_SAVING_SHARE or seconds < MIN_GC_S:
        return None
    n = gc.get("collections") or {}
    # Objects created inside the loop (a list buffer's tuples) are not covered by a freeze at its start.
    knob = "train.gc=off" if cfg.buffer.storage == "list" else "train.gc=freeze"
    evidence = (
        f"train.gc=on: {gc.get('total_collections', 0):,} collections (gen0 {n.get('gen0', 0):,}, gen1 "
        f"{n.get('gen1', 0):,}, gen2 {n.get('gen2', 0):,}) took {seconds_short(seconds)}, {percent_short(share)} of the loop, "
        f"longest pause {float(gc.get('max_pause_ms') or 0):.1f} ms (gc.callbacks)"
    )
    if cfg.buffer.storage == "list":
        evidence += "; the list buffer's tuples are created in the loop, so freezing at its start would not cover them"
    measured = seconds * _to_measured(record)
    return finding("gc_pauses", evidence, measured,
                   f"the collector's measured time, {seconds_short(measured)} in the measured window: the fix runs no "
                   f"full collections in the loop", knob=knob)


def amp_off(record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None) -> Finding | None:
    """Full-precision updates on a GPU (docs/bottlenecks.md §10)."""
    if not _cuda(record) or cfg.train.amp != "off" or _graph_update(record):
        return None
    train = _phase(record, "train")
    if train["share"] < 0.3:
        return None
    device = (record.get("system") or {}).get("device_name", "the GPU")
    evidence = (
        f"train is {percent_short(train['share'])} of phase time ({seconds_short(train['total_s'])}) on {device} "
        f"with train.amp=off"
    )
    saving, estimate = replaced(train["total_s"], "train phase", record, "amp")
    return finding("amp", evidence, saving, estimate)


def compile_off(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """The network not compiled, on a GPU (docs/bottlenecks.md §11)."""
    if not _cuda(record) or cfg.train.compile != "off" or _graph_update(record):
        return None
    select, train = _phase(record, "select"), _phase(record, "train")
    share = select["share"] + train["share"]
    if share < 0.3:
        return None
    evidence = f"select + train are {percent_short(share)} of phase time on the GPU with train.compile=off"
    return finding("compile", evidence, None, "not measured: compiling takes longer than a micro-benchmark can afford; "
                   "the compare line (or --verify) measures it")


def small_batch_gpu(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Small batches on a GPU, where launch overhead dominates an update (docs/bottlenecks.md §12)."""
    if not _cuda(record) or cfg.buffer.batch_size > 256:
        return None
    train = _phase(record, "train")
    updates = int((record.get("timing") or {}).get("measured_updates") or 0)
    if train["share"] < 0.3 or updates < 1:
        return None
    per_update_ms = 1e3 * train["total_s"] / updates
    if per_update_ms > 2.0:
        return None  # not launch-bound
    batch = cfg.buffer.batch_size
    evidence = (
        f"train is {percent_short(train['share'])} of phase time at {per_update_ms:.2f} ms per update with "
        f"buffer.batch_size={batch}: a kernel-launch-bound update costs about the same at 4× the batch"
    )
    bench = _bench(record, "batch")
    if bench is None:
        saving, estimate = replaced(train["total_s"], "train phase", record, "batch")
    else:  # 4× the batch at ¼ the updates keeps the replay ratio
        saving = train["total_s"] * (1 - bench["fast_s"] / (4 * bench["slow_s"]))
        estimate = (f"train phase {seconds_short(train['total_s'])} × (1 − {call_time(bench['fast_s'])} / (4 × "
                    f"{call_time(bench['slow_s'])})): an update at 4× the batch against four at this batch, micro-benchmarked "
                    f"here")
    return finding("small_batch_gpu", evidence, saving, estimate, knob=f"buffer.batch_size={4 * batch}",
                   fix=f"batches of {4 * batch}")


def run_threads(record: Mapping[str, Any]) -> int:
    """The thread count the run's pools had (the thread policy's, else torch's); 0 unknown."""
    count = (record.get("threads") or {}).get("count")
    return int(count or (record.get("system") or {}).get("torch_threads") or 0)


def cpu_wait_share(record: Mapping[str, Any]) -> float | None:
    """The share of the measured steps the loop's thread spent ready to run, waiting for a CPU other
    processes held (Linux's run-queue wait); else of the whole run; None where it was not measured."""
    share = ((record.get("timing") or {}).get("vector_step") or {}).get("cpu_wait_share")
    if share is None:
        share = ((record.get("threads") or {}).get("contention") or {}).get("wait_share")
    return float(share) if share is not None else None


def thread_excess(cfg: Config, record: Mapping[str, Any]) -> tuple[int, int] | None:
    """(the run's threads, the count to try) when the run's own processes ran more compute threads
    than there are CPUs (docs/bottlenecks.md §14); else None."""
    threads = run_threads(record)
    load = (record.get("profile") or {}).get("load") or {}
    cpus = float(load.get("cpus") or effective_cpus())
    processes = _processes(cfg)
    if threads and threads * processes > cpus:
        return threads, max(1, math.floor(cpus / processes))
    return None


def _processes(cfg: Config) -> int:
    """The run's processes that each hold their own pools."""
    processes = 1 + (cfg.async_.actors if cfg.run.mode == "async" else 0)
    if cfg.env.backend == "gym-async":
        processes += cfg.env.num_envs  # each worker process imports torch with its own pool
    return processes


WAITING = 0.5
"""A loop whose measured steps spent this share or more waiting for a CPU is told so first: every
other figure of the run is inflated by the wait."""

CONTENDED = 2.0
"""A run whose updates took this many times longer than the same update timed right after it, with
the same threads, had its threads starved by other processes while it ran."""


def _fewer_threads_saving(bench: Mapping[str, Any] | None, pools_s: float, train_s: float, updates: int,
                          record: Mapping[str, Any]) -> tuple[float, str] | None:
    """What one thread per pool saves, from the ``threads`` micro-benchmark: the run's select + train
    (``pools_s``) scaled by the update's 1-thread / run's-threads time; or, where the run's own
    updates took far longer than the benchmark's with the same threads (starved while it ran), the
    train phase less the same updates at the 1-thread time. The larger; None when neither saves."""
    if bench is None or not bench.get("slow_s"):
        return None
    options = []
    if bench["fast_s"] < bench["slow_s"]:
        options.append(replaced(pools_s, "select + train", record, "threads"))
    if updates and train_s / updates > CONTENDED * bench["slow_s"]:
        options.append((train_s - updates * bench["fast_s"],
                        f"train phase {seconds_short(train_s)} − {updates:,} updates × {call_time(bench['fast_s'])} (an "
                        f"update with 1 thread, micro-benchmarked here; the run's own took "
                        f"{call_time(train_s / updates)}: its threads were starved while it ran)"))
    best = max(((s, text) for s, text in options if s is not None and s > 0), default=None, key=lambda o: o[0])
    return (float(best[0]), best[1]) if best is not None else None


def thread_oversubscription(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Compute threads that wait for CPUs other processes hold: the loop's measured run-queue wait,
    and what the same update costs with the run's threads and with one, timed interleaved after the
    run (docs/bottlenecks.md §14)."""
    threads = run_threads(record)
    wait = cpu_wait_share(record)
    bench = _bench(record, "threads") if threads > 1 else None
    excess = thread_excess(cfg, record)
    waiting = wait is not None and wait >= WAITING
    if not waiting and bench is None and excess is None:
        return None
    load = ((record.get("threads") or {}).get("contention") or (record.get("profile") or {}).get("load") or {})
    loadavg = float(load.get("loadavg_1m_end") or load.get("loadavg_1m") or 0.0)
    cpus = float(load.get("cpus") or effective_cpus())
    parts = []
    if waiting:
        parts.append(f"the loop waited for a CPU {percent_short(wait or 0.0)} of its measured time (Linux run-queue "
                     f"wait; load average {loadavg:.1f} on {cpus:g} CPUs): other processes held the CPUs, and every "
                     f"figure of this run is inflated by that wait")
    if excess is not None:
        processes = _processes(cfg)
        parts.append(f"{processes} process(es) × {threads} threads = {threads * processes} on {cpus:g} usable CPUs")
    select, train = _phase(record, "select"), _phase(record, "train")
    updates = int((record.get("timing") or {}).get("measured_updates") or 0)
    saving: float | None = None
    if threads > 1:
        estimate = "not measured: no micro-benchmark of the update with one thread in this record"
        knob, fix = "run.threads=1", "1 thread"
    else:
        estimate = "not measured: the run had one thread, so there is no fewer to time; the wait is other processes'"
        # No knob: the catalogue's (run.threads=1) is what ran.
        knob, fix = "", "run where the CPUs are free, or stop the work beside it: the loop already runs one thread"
    measured = _fewer_threads_saving(bench, select["total_s"] + train["total_s"], train["total_s"], updates, record)
    if bench is not None and measured is not None:
        saving, estimate = measured
        parts.append(f"an update took {call_time(bench['slow_s'])} with the run's {threads} threads and "
                     f"{call_time(bench['fast_s'])} with 1, timed interleaved after the run"
                     + (f", and {call_time(train['total_s'] / updates)} in the run itself" if updates else "")
                     + (f" (load average {loadavg:.1f} on {cpus:g} CPUs)" if not waiting else ""))
        knob, fix = "run.threads=1", "1 thread"
    elif excess is not None:
        knob, fix = f"run.threads={excess[1]}", f"{excess[1]} thread(s)"
    elif not waiting:
        return None
    evidence = "; ".join(parts) + f" (run.threads={cfg.run.threads}, {threads} thread(s) per pool)"
    return finding("threads", evidence, saving, estimate, knob=knob, fix=fix)


def episode_growth(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Time per episode grows through the run: longer episodes, or dearer env steps (docs/bottlenecks.md §19)."""
    from rlperf.report.stats import GROWTH_NOTED, episode_split, training_start
    from rlperf.report.tables import growth_text

    split = episode_split(record.get("intervals") or [], start_env_steps=training_start(record))
    if split is None or split["growth"]["s_per_episode"] < GROWTH_NOTED:
        return None
    slower = split["growth"]["s_per_env_step"] >= 1.2
    return finding(
        "episode_growth",
        ("each env step got slower through the run: " if slower else "episodes get longer, not the loop slower: ")
        + growth_text(split), None, "no saving: this explains the time per episode, it does not change it",
        fix=("find what grows with the run: the phase whose share rises, memory that does not flatten once the replay "
             "is full; or other processes took the CPUs as the run went on (the load average at its end was "
             f"{float(((record.get('profile') or {}).get('load') or {}).get('loadavg_1m') or 0):.1f})" if slower else
             "the agent survives longer, so measure in env steps (--steps N)"))


RULES: tuple[Rule, ...] = (
    push_loop,
    train_ratio,
    bfs_flood_fill,
    host_storage,
    hard_target,
    log_every_step,
    autograd_select,
    gym_backend,
    ops_kernel,
    torch_update,
    gc_pauses,
    amp_off,
    compile_off,
    small_batch_gpu,
    thread_oversubscription,
    episode_growth,
)


def advise(
    record: Mapping[str, Any],
    calls: CallStats | None = None,
    gc: Mapping[str, Any] | None = None,
    verify: VerifyBase | None = None,
    cfg: Config | None = None,
    rules: Sequence[Rule] = RULES,
) -> list[Finding]:
    """Every rule that fires on this run's evidence: measured savings first, biggest first, then the
    findings whose saving was not measured, in rule order. A measured saving below
    :data:`MIN_SAVING_SHARE` of the measured phase time drops the finding."""
    if _measured_steps(record) == 0 or measured_total(record) <= 0:
        return []
    cfg = cfg if cfg is not None else Config.model_validate(record["config"])
    verify = verify or VerifyBase()
    total = measured_total(record)
    floor = MIN_SAVING_SHARE * total
    findings = []
    for rule in rules:
        finding = rule(record, cfg, calls, gc)
        if finding is None or (finding.est_saving_s is not None and finding.est_saving_s < floor):
            continue
        if finding.est_saving_s is not None and finding.est_saving_s > total:
            # The one clamp: a saving is a share of the measured time, never more than all of it.
            finding = replace(finding, est_saving_s=total)
        if finding.knob:
            finding = replace(finding, command=verify.command(finding.knob))
        findings.append(finding)
    measured = sorted((f for f in findings if f.est_saving_s is not None), key=lambda f: f.est_saving_s or 0.0, reverse=True)
    ranked = measured + [f for f in findings if f.est_saving_s is None]
    if (cpu_wait_share(record) or 0.0) >= WAITING:  # a loop mostly waiting for a CPU hears that first
        ranked.sort(key=lambda f: f.id != "threads")
    return ranked


def no_finding_reason(record: Mapping[str, Any]) -> str:
    """Why a run has no findings (said instead of an empty list)."""
    if _measured_steps(record) == 0:
        steps = int((record.get("totals") or {}).get("vector_steps") or 0)
        return (
            f"no finding: all {steps} vector steps were warm-up, so there is no measured loop to judge; "
            f"run longer (e.g. --steps 50000)"
        )
    return (
        f"no finding: no rule's evidence reached {percent_short(MIN_SAVING_SHARE)} of the measured phase time "
        f"({seconds_short(measured_total(record))}) on this run"
    )
