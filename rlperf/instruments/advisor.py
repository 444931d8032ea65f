"""The advisor: what to change, ranked by the time it could save on *this* run.

Each rule is a small function of (record, config, cProfile stats, GC stats) that returns a
:class:`Finding` or None. A rule fires only on evidence measured in the run -- a phase share, a
cProfile entry, a GC count -- together with the config that explains it, and its finding says
which evidence it used, which knob to turn (a slow form to its fast form), the gain practitioners
reported for that change with the section of docs/bottlenecks.md that explains it, and the
``rlperf compare`` line that measures it. Savings are estimates in seconds of the run's measured (post-warm-up) phase time,
each with its basis stated in the evidence; the compare line is the proof.

Phase times come from the profiled run, so they include the instruments' overhead, which is
largest in pure-Python phases (a per-board push loop, a Python BFS): the ranking leans towards
those, and the compare line measures them without instruments.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from rlperf.config import Config
from rlperf.instruments.profilers import CallStats
from rlperf.report.units import percent_short, seconds_short

MIN_SAVING_SHARE = 0.005
"""A finding must be worth at least this share of the measured phase time."""


@dataclass(frozen=True)
class Finding:
    """One piece of advice: measured fact -> knob -> the reported gain -> how to verify."""

    title: str
    evidence: str
    knob: str  # "buffer.push=batch": what to pass to --set / --vs
    command: str  # the exact `rlperf compare ...` line that measures the change
    expected_gain: str  # the gain reported for this change, e.g. "2–5× on the push phase"
    est_saving_s: float  # seconds of this run's measured phase time the change could save
    reference: str  # where the bottleneck is explained: "docs/bottlenecks.md §1"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class VerifyBase:
    """The run a finding's compare line repeats: the config as the user named it, and the run options."""

    config: str = "default"
    args: tuple[str, ...] = ()

    def command(self, knob: str) -> str:
        return shlex.join(["rlperf", "compare", self.config, "--vs", knob, *self.args])


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
        f"{push['mean_ms'] / n * 1e3:.0f} µs "
        f"per board) with buffer.push=loop"
    )
    if calls is not None:
        pushes = calls.count("write_one", "rlperf/buffer.py")
        items = calls.count("'item' of", builtin=True)
        evidence += (
            f"; cProfile: the storage's write_one called {pushes:,} times ({_per_step(pushes, record)}), "
            f"Tensor.item {items:,} times" + (" (each a device sync)" if _cuda(record) else "")
        )
    evidence += "; estimate: a batch push removes ~90% of the phase (one vectorized write per field)"
    return Finding(
        "Replay push loops over boards",
        evidence,
        "buffer.push=batch",
        "",
        "2–5× on the push phase (2–3× overall)",
        0.9 * push["total_s"],
        "docs/bottlenecks.md §1",
    )


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
        f"at train.train_ratio={ratio:g} "
        f"({ratio:g} updates per vector step, replay ratio {replay:.1f})"
    )
    if calls is not None:
        updates = calls.count("update", "rlperf/dqn.py")
        evidence += f"; cProfile: Agent.update called {updates:,} times ({_per_step(updates, record)})"
    evidence += f"; estimate: train_ratio 4 does 4/{ratio:g} of the updates"
    title = "Training frequency dominates the loop" if train["share"] >= 0.5 else "Many gradient updates per vector step"
    return Finding(
        title,
        evidence,
        "train.train_ratio=4",
        "",
        "2–4× overall (10–15× going from 64 to 4 updates per vector step); fewer updates can change "
        "learning, so read the mean score in the compare too",
        train["total_s"] * (1 - 4 / ratio),
        "docs/bottlenecks.md §3",
    )


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
        if env_step <= 0 or bfs_calls == 0:
            return None
        fraction = min(1.0, bfs_cum / env_step)
        steps = int((record.get("totals") or {}).get("vector_steps") or 0)
        per_board = f", {bfs_calls / (steps * cfg.env.num_envs):.1f} per board" if steps else ""
        evidence += (
            f"; cProfile: bfs_count called {bfs_calls:,} times ({_per_step(bfs_calls, record)}{per_board}), "
            f"{percent_short(fraction)} of the env step's time; estimate: the batched fill removes ~95% of that"
        )
        saving = 0.95 * fraction * step["total_s"]
    else:
        evidence += "; estimate (no cProfile to split the step): the BFS is ~80% of the step"
        saving = 0.8 * step["total_s"]
    knob = "env.flood_fill=tensor"
    return Finding(
        "Flood fill runs a Python BFS per board",
        evidence,
        knob,
        "",
        "2–3× for models with flood-fill features",
        saving,
        "docs/bottlenecks.md §4",
    )


def host_storage(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Replay in a Python list or host arrays, copied on every sample (docs/bottlenecks.md §2)."""
    storage = cfg.buffer.storage
    if storage == "tensor" or calls is None:
        return None
    train = _phase(record, "train")
    update = calls.cumtime("update", "rlperf/dqn.py")
    sample_calls, _, sample = calls.get("sample", "rlperf/buffer.py")
    if update <= 0 or sample_calls == 0:
        return None
    fraction = min(1.0, sample / update)
    saving = 0.8 * fraction * train["total_s"]
    evidence = (
        f"buffer.storage={storage}: ReplayBuffer.sample called {sample_calls:,} times, "
        f"{percent_short(fraction)} of the update's time (cProfile)"
    )
    if storage == "list" and cfg.buffer.push == "batch":
        push = _phase(record, "push")
        saving += 0.8 * push["total_s"]
        evidence += f"; push (a Python loop over rows into the list) is {percent_short(push['share'])}"
    evidence += "; estimate: sampling on the device removes ~80% of it"
    return Finding(
        f"Replay storage is a {'Python list' if storage == 'list' else 'host numpy array'}, copied every sample",
        evidence,
        "buffer.storage=tensor",
        "",
        "preallocated storage indexed in place removes the per-sample copies and allocations (no figure reported)",
        saving,
        "docs/bottlenecks.md §2",
    )


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
        f"p50 {train['p50_ms']:.3g} ms; estimate: ~80% of the copy time, before the soft update's own per-update lerp"
    )
    return Finding(
        "Hard target-network copies",
        evidence,
        "agent.target_update=soft",
        "",
        "hard copies show as spikes in time per update; a soft update with τ spreads the cost (no figure reported)",
        0.8 * seconds,
        "docs/bottlenecks.md §7",
    )


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
    if calls is not None:
        logs = calls.count("on_log", "rlperf/run/lifecycle.py")
        evidence += (
            f"; cProfile: on_log ran {logs:,} times ({_per_step(logs, record)}), each writing and flushing a metrics.csv row"
        )
    if _cuda(record):
        evidence += "; each log reads the loss on the host, which waits for the device (a sync every step)"
    evidence += f"; estimate: log_every=100 keeps {every}/100 of it"
    return Finding(
        "Logging and host sync every step",
        evidence,
        "train.log_every=100",
        "",
        "small on a CPU (under 5%, below 1.1×); on a GPU every read is a sync",
        log["total_s"] * (1 - every / 100),
        "docs/bottlenecks.md §9",
    )


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
        f"agent.inference=grad: every forward records an autograd graph nobody uses; "
        f"estimate: inference mode saves ~30% of a small network's forward"
    )
    return Finding(
        "Action selection runs with autograd on",
        evidence,
        "agent.inference=no_grad",
        "",
        "select runs without building a graph (no figure reported)",
        0.3 * select["total_s"],
        "docs/bottlenecks.md §8",
    )


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
    evidence += "; estimate: the batched env steps every board in a few tensor ops, ~90% less"
    return Finding(
        f"Boards are stepped one by one ({backend})",
        evidence,
        "env.backend=tensor",
        "",
        "a batched env steps every board in one call (no figure reported; rlperf's own target is "
        "≥ 100× SyncVectorEnv at 256 boards)",
        0.9 * step["total_s"],
        "docs/bottlenecks.md §5",
    )


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
    # Side by side on a 2-core CPU (BENCHMARKS.md): fused is >30x ops up to a few thousand boards, where
    # ops is dispatch; still ~3x at 65,536, where ops is memory traffic.
    dispatch = n <= 4096
    evidence += f"; estimate: the fused kernel removes ~{'95' if dispatch else '70'}% of the step"
    title = "Env step is operator dispatch" if dispatch else "Env step is one tensor operator per rule"
    return Finding(f"{title} (env.kernel=ops)", evidence, "env.kernel=fused", "",
                   "docs/bottlenecks.md §6: one compiled per-board step instead of ~150 tensor operators per vector "
                   "step (CPU, numba)", (0.95 if dispatch else 0.7) * step["total_s"], "docs/bottlenecks.md §6")


def gc_pauses(record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None) -> Finding | None:
    """Garbage-collector pauses in the loop (docs/bottlenecks.md §13)."""
    if cfg.train.gc != "on" or not gc:
        return None
    share = float(gc.get("share_of_loop") or 0.0)
    seconds = float(gc.get("total_s") or 0.0)
    if share < MIN_SAVING_SHARE:
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
    evidence += "; estimate: ~90% of the collector's time"
    return Finding(
        "Garbage-collector pauses",
        evidence,
        knob,
        "",
        "removes the periodic pauses (no figure reported)",
        0.9 * seconds * _to_measured(record),
        "docs/bottlenecks.md §13",
    )


def amp_off(record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None) -> Finding | None:
    """Full-precision updates on a GPU (docs/bottlenecks.md §10)."""
    if not _cuda(record) or cfg.train.amp != "off":
        return None
    train = _phase(record, "train")
    if train["share"] < 0.3:
        return None
    device = (record.get("system") or {}).get("device_name", "the GPU")
    evidence = (
        f"train is {percent_short(train['share'])} of phase time ({seconds_short(train['total_s'])}) on {device} "
        f"with train.amp=off; "
        f"estimate: ~25% of the update"
    )
    return Finding(
        "Updates run in full precision on the GPU",
        evidence,
        "train.amp=bf16",
        "",
        "30–40% faster forward and 25–30% faster backward passes (use train.amp=fp16 where bf16 is not supported)",
        0.25 * train["total_s"],
        "docs/bottlenecks.md §10",
    )


def compile_off(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """The network not compiled, on a GPU (docs/bottlenecks.md §11)."""
    if not _cuda(record) or cfg.train.compile != "off":
        return None
    select, train = _phase(record, "select"), _phase(record, "train")
    share = select["share"] + train["share"]
    if share < 0.3:
        return None
    evidence = (
        f"select + train are {percent_short(share)} of phase time on the GPU with train.compile=off; estimate: ~10% of both"
    )
    return Finding(
        "Network not compiled",
        evidence,
        "train.compile=reduce-overhead",
        "",
        "10–15% faster forward passes",
        0.1 * (select["total_s"] + train["total_s"]),
        "docs/bottlenecks.md §11",
    )


def small_batch_gpu(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """Small batches on a GPU, where launch overhead dominates an update (docs/bottlenecks.md §12)."""
    if not _cuda(record) or cfg.buffer.batch_size > 256:
        return None
    train = _phase(record, "train")
    t = record.get("throughput") or {}
    timing = record.get("timing") or {}
    updates = float(t.get("updates_per_s") or 0.0) * float(timing.get("measured_wall_s") or 0.0)
    if train["share"] < 0.3 or updates < 1:
        return None
    per_update_ms = 1e3 * train["total_s"] / updates
    if per_update_ms > 2.0:
        return None  # not launch-bound
    batch = cfg.buffer.batch_size
    evidence = (
        f"train is {percent_short(train['share'])} of phase time at {per_update_ms:.2f} ms per update with "
        f"buffer.batch_size={batch}: a kernel-launch-bound update costs about the same at 4× the batch; "
        f"estimate: 4× batch at ¼ train_ratio (same replay ratio) halves train, if the compare shows "
        f"updates/s nearly flat"
    )
    return Finding(
        "Batches too small for the GPU",
        evidence,
        f"buffer.batch_size={4 * batch}",
        "",
        "batch 256 → 512 raised GPU utilisation from ~60% to ~85%",
        0.5 * train["total_s"],
        "docs/bottlenecks.md §12",
    )


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


def thread_oversubscription(
    record: Mapping[str, Any], cfg: Config, calls: CallStats | None, gc: Mapping[str, Any] | None
) -> Finding | None:
    """More compute threads than CPUs, from this run's own processes or the machine's load (docs/bottlenecks.md §14)."""
    system = record.get("system") or {}
    threads = int(system.get("torch_threads") or 0)
    load = (record.get("profile") or {}).get("load") or {}
    cpus = float(load.get("cpus") or effective_cpus())
    processes = 1 + (cfg.async_.actors if cfg.run.mode == "async" else 0)
    if cfg.env.backend == "gym-async":
        processes += cfg.env.num_envs  # each worker process imports torch with its own pool
    wanted = threads * processes
    busy = float(load.get("loadavg_1m") or 0.0)
    if threads == 0 or (wanted <= cpus and not (threads > 1 and busy > cpus + 0.5)):
        return None
    select, train = _phase(record, "select"), _phase(record, "train")
    per_process = max(1, math.floor(cpus / processes))
    if wanted > cpus:
        evidence = f"{processes} process(es) × {threads} torch threads = {wanted} on {cpus:g} usable CPUs"
    else:
        evidence = (
            f"{threads} torch threads while the machine's load average was {busy:.1f} on {cpus:g} CPUs: "
            f"threads that lose their CPU stall the others at every parallel op"
        )
        per_process = 1
    evidence += (
        f" (run.threads={cfg.run.threads}); select + train are {percent_short(select['share'] + train['share'])} of "
        f"phase time; estimate: ~20% of them is lost to contention"
    )
    return Finding(
        "More compute threads than CPUs",
        evidence,
        f"run.threads={per_process}",
        "",
        "less contention and steadier timings (no figure reported)",
        0.2 * (select["total_s"] + train["total_s"]),
        "docs/bottlenecks.md §14",
    )


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
    gc_pauses,
    amp_off,
    compile_off,
    small_batch_gpu,
    thread_oversubscription,
)


def advise(
    record: Mapping[str, Any],
    calls: CallStats | None = None,
    gc: Mapping[str, Any] | None = None,
    verify: VerifyBase | None = None,
    cfg: Config | None = None,
    rules: Sequence[Rule] = RULES,
) -> list[Finding]:
    """Every rule that fires on this run's evidence, biggest estimated saving first."""
    if _measured_steps(record) == 0 or measured_total(record) <= 0:
        return []
    cfg = cfg if cfg is not None else Config.model_validate(record["config"])
    verify = verify or VerifyBase()
    floor = MIN_SAVING_SHARE * measured_total(record)
    findings = []
    for rule in rules:
        finding = rule(record, cfg, calls, gc)
        if finding is not None and finding.est_saving_s >= floor:
            findings.append(replace(finding, command=verify.command(finding.knob)))
    return sorted(findings, key=lambda f: f.est_saving_s, reverse=True)


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
