"""The bottleneck catalogue: every bottleneck the advisor knows, defined once.

Two sources of evidence produce findings from these definitions: rlperf's own run
(:mod:`rlperf.instruments.advisor`: its config, phases and micro-benchmarks) and a script of yours
(:mod:`rlperf.instruments.foreign`: cProfile, the GC monitor, grad-mode evidence and your phase
timer). A finding's title, fix, expected gain and reference come from here, so the same bottleneck
reads the same wherever it was found; the rule adds only what it measured (the evidence, the saving
and how it was estimated, the line it points at).

Ids are stable snake_case strings (``rlperf profile --json`` lists them, ``rlperf explain ID``
takes them). A bottleneck with a knob in rlperf's own loop names it in its fast form (``knob``) and
its slow form (``slow``): the ``rlperf compare`` line that measures the same fix on rlperf's loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

DOC = "docs/bottlenecks.md"


@dataclass(frozen=True)
class Bottleneck:
    """One item of the checklist: what it is, what it costs, the fix, and where it is explained."""

    id: str
    title: str
    cost: str  # what it costs, in a sentence
    fix: str  # the change, in the user's words
    expected_gain: str  # what practitioners report for the fix
    section: int | None  # the "## §N" of docs/bottlenecks.md that explains it; None: the checklist only
    knob: str | None = None  # rlperf's knob in its fast form ("buffer.push=batch"), when rlperf's loop has one
    slow: str | None = None  # the same knob in its slow form ("buffer.push=loop")


@dataclass(frozen=True)
class Finding:
    """One piece of advice: measured fact -> the fix -> the reported gain -> the estimate -> how to verify."""

    id: str  # the catalogue's id ("host_copy")
    title: str
    evidence: str  # what this run measured that shows the bottleneck
    fix: str  # the change, in the user's words
    knob: str | None  # "buffer.push=batch": the rlperf knob that demonstrates it (--set / --vs), if one does
    command: str | None  # the exact `rlperf compare ...` line that measures the change
    expected_gain: str  # the gain reported for this change, e.g. "2–5× on the push phase"
    est_saving_s: float | None  # seconds of this run's measured time the change could save; None: not measured
    estimate: str  # how est_saving_s was measured
    reference: str  # where the bottleneck is explained: "docs/bottlenecks.md §1 (rlperf explain 1)"
    where: str | None = None  # the offending line, for foreign code: "train.py:42 (push_all)"
    verified: Mapping[str, Any] | None = None  # the measured gain, from profile --verify

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_ALL = (
    Bottleneck(
        "replay_sampling", "Replay sampling or storage runs in Python",
        "each sample builds its batch from Python objects (a list of tuples, a comprehension, a copy per field, a new "
        "DataLoader iterator read item by item)",
        "keep the replay in preallocated arrays or tensors (one per field) on the model's device, and sample with "
        "one index draw (torch.randint) and one gather per field",
        "removes the per-sample Python loop and copies (no figure reported)", 2,
        "buffer.storage=tensor", "buffer.storage=list"),
    Bottleneck(
        "host_copy", "Per-item host copies in the loop",
        "a Python loop over items copies each one to the host (.item(), .cpu(), .numpy(), .tolist()), one call "
        "and, on a GPU, one device sync per item",
        "copy the whole batch at once (one .cpu()/.numpy() of the batch tensor, or keep it on the device) and write "
        "it with one vectorized assignment instead of a Python loop over items",
        "2–5× on that part of the loop (2–3× overall in rlperf's loop)", 1, "buffer.push=batch", "buffer.push=loop"),
    Bottleneck(
        "update_ratio", "Too many gradient updates per env step",
        "every env step pays for many forward and backward passes",
        "make 1–4 gradient updates per env step (or one every few steps)",
        "2–4× overall (10–15× going from 64 to 4 updates per step); fewer updates can change learning, so watch "
        "the score too", 3, "train.train_ratio=4", "train.train_ratio=64"),
    Bottleneck(
        "flood_fill", "Flood fill runs a Python BFS per board",
        "the reachable-space features cost one Python BFS per board per step",
        "compute the reachable-space features for all boards at once on the device (batched dilation), or drop them",
        "2–3× for models with flood-fill features", 4, "env.flood_fill=tensor", "env.flood_fill=bfs"),
    Bottleneck(
        "env_backend", "Envs are stepped one by one in Python",
        "a Python loop over single envs (gymnasium's SyncVectorEnv, or your own) pays the call overhead per env",
        "step every env in one batched call (a vectorized env: gymnasium.make_vec(id, num_envs=N, "
        "vectorization_mode='vector_entry_point')), or step them in parallel processes (AsyncVectorEnv)",
        "a batched env steps every env in one call (no figure reported; rlperf's own target is ≥ 100× "
        "SyncVectorEnv at 256 boards)", 5, "env.backend=tensor", "env.backend=gym-sync"),
    Bottleneck(
        "env_kernel", "Env step is operator dispatch",
        "one tensor operator per rule: a fixed cost per call, whatever the number of boards",
        "step every board with one compiled per-board kernel instead of ~150 tensor operators per vector step",
        "one fused step per environment, as PufferLib and EnvPool do (rlperf's own target: ≥ 10 M env steps/s at "
        "256 boards on a 2-core CPU)", 6, "env.kernel=fused", "env.kernel=ops"),
    Bottleneck(
        "target_copy", "Target-network copies on every update",
        "a whole state dict copied (deepcopy / load_state_dict) far more often than the target needs",
        "copy the target network every N updates (e.g. 1,000), or update it in place with a soft update: "
        "torch._foreach_lerp_(target_params, params, tau) under torch.no_grad()",
        "removes a state-dict copy per update; hard copies show as spikes in time per update (no figure reported)",
        7, "agent.target_update=soft", "agent.target_update=hard"),
    Bottleneck(
        "autograd_forward", "Forward passes record autograd graphs nobody uses",
        "forwards outside the update run with grad enabled: each records a graph that no backward reads",
        "run those forwards under torch.inference_mode() (or torch.no_grad()): decorate the function, or wrap the call",
        "the forward runs without building a graph (no figure reported)", 8,
        "agent.inference=no_grad", "agent.inference=grad"),
    Bottleneck(
        "logging", "Logging every step",
        "print / logging / TensorBoard writes every step, and the .item() reads of device values that feed them "
        "(on a GPU each read waits for the device)",
        "log every 100 steps: accumulate on the device in between and read the values once per log",
        "small on a CPU when only printing (under 5%); on a GPU every read of a device value is a sync", 9,
        "train.log_every=100", "train.log_every=1"),
    Bottleneck(
        "amp", "Updates run in full precision on the GPU",
        "float32 forward and backward passes where the GPU's tensor cores run bfloat16 far faster",
        "run the update's forward and backward under torch.autocast (bfloat16)",
        "30–40% faster forward and 25–30% faster backward passes (use train.amp=fp16 where bf16 is not supported)",
        10, "train.amp=bf16", "train.amp=off"),
    Bottleneck(
        "compile", "Network not compiled",
        "every forward pays Python and kernel-launch overhead per operator",
        "compile the network (torch.compile, mode reduce-overhead)",
        "10–15% faster forward passes", 11, "train.compile=reduce-overhead", "train.compile=off"),
    Bottleneck(
        "torch_update", "Gradient update is operator dispatch",
        "the eager update of a small network is ~120 operators (sample, forwards, loss, backward, clip, Adam, "
        "target), each paying a fixed dispatch cost: a floor per update that does not shrink with the batch",
        "run the whole update (sample, forwards, loss, backward, clip, Adam, target) as one compiled call; on a GPU, "
        "capture it in a CUDA graph (train.update=graph)",
        "4–5× on a 2×64 update at batch 128 on a 2-core CPU (BENCHMARKS.md); less on wide networks, whose matrix "
        "products dominate", 20, "train.update=fused", "train.update=torch"),
    Bottleneck(
        "small_batch_gpu", "Batches too small for the GPU",
        "a kernel-launch-bound update costs about the same at 4× the batch",
        "sample batches 4× larger and update a quarter as often (the same replay ratio)",
        "batch 256 → 512 raised GPU utilisation from ~60% to ~85%", 12),
    Bottleneck(
        "small_batch", "Forward passes one sample at a time",
        "the network runs once per env or per sample instead of once on the stacked batch: the per-call overhead "
        "is paid N times",
        "stack the observations and run one forward on the batch (obs of shape [N, ...]), then split the result",
        "one call instead of N (no figure reported)", 12),
    Bottleneck(
        "device_transfer", "Host–device copies every step",
        "tensors built from host arrays or moved between devices (.to(), .cpu(), .numpy(), torch.tensor(ndarray)) "
        "every step; on a GPU each is a copy and often a sync",
        "keep the data where it is used: build tensors once (torch.as_tensor / torch.from_numpy share memory), "
        "keep the loop's state on one device, move whole batches, not pieces",
        "removes a copy per step (no figure reported)", None),
    Bottleneck(
        "env_reset", "Env resets cost a large share of the loop",
        "the env is re-created or fully reset far more often, or at far more cost, than an episode end needs",
        "create the env once and reset only the envs whose episode ended (an auto-resetting vector env); keep "
        "expensive set-up out of reset",
        "no figure reported", None),
    Bottleneck(
        "rendering", "Rendering in the training loop",
        "env.render() or frame drawing every step: pixels nobody looks at while training",
        "render only when recording an evaluation episode (every N episodes, or in a separate eval run), not in "
        "the training loop",
        "removes the drawing from every step (no figure reported)", None),
    Bottleneck(
        "reward_shaping", "Reward shaping in a Python loop",
        "a shaped reward computed per env or per element in Python",
        "compute the shaped reward for all envs at once with array operations (numpy / torch) on the batch",
        "one array operation instead of a Python loop (no figure reported)", None),
    Bottleneck(
        "preprocessing", "Observation or action preprocessing in a Python loop",
        "observations (or actions) converted per pixel or per element in Python",
        "preprocess the whole batch with array operations (numpy / torch: slicing, casting, resizing) instead of "
        "Python loops over elements",
        "one array operation instead of a loop over elements: often 100× on that part (no figure reported)", None),
    Bottleneck(
        "gc_pauses", "Garbage-collector pauses",
        "periodic collections walk every tracked object, more often the more objects the loop creates",
        "gc.freeze() what exists before the loop (or gc.disable() in it, collecting between runs), and avoid "
        "creating many small objects and reference cycles per step",
        "removes the periodic pauses (no figure reported)", 13, "train.gc=freeze", "train.gc=on"),
    Bottleneck(
        "checkpointing", "Checkpointing too often",
        "torch.save / pickle of the model (and optimizer) far more often than a checkpoint is needed: "
        "serialization and a file write each time",
        "checkpoint every N minutes or every N thousand steps (and at the end), not every step or episode",
        "removes the serialization from the loop (no figure reported)", None),
    Bottleneck(
        "busy_wait", "Busy-waiting or lock waits in the loop",
        "the loop polls (sleep in a loop, spinning on a flag or a queue) or waits on a lock instead of being woken",
        "block on an event, a condition or a queue's get() with a timeout instead of polling; hold locks only "
        "around the shared write",
        "the waiting thread wakes as soon as there is work (no figure reported)", 16),
    Bottleneck(
        "threads", "More compute threads than free CPUs",
        "threads that lose their CPU stall the others at every parallel op",
        "cap every pool (torch's, numba's, the BLAS/OpenMP pools: threadpoolctl's threadpool_limits) at the CPUs the "
        "process really has, divided among its processes; for small networks, one thread",
        "measured per run: the update timed with the run's threads and with one, interleaved; beside busy processes "
        "on 2 CPUs an update on two threads took about 30× its quiet time", 14, "run.threads=1", "run.threads=2"),
    Bottleneck(
        "episode_growth", "Time per episode grows through the run",
        "either the agent survives longer (episodes get longer) or each env step gets slower",
        "measure in env steps (--steps N), not episodes; if each env step got slower, find what grows with the run",
        "not a speed-up: it tells a slowdown from an agent that survives longer", 19),
    Bottleneck(
        "hot_spot", "A hot spot no rule knows",
        "one function holds a large share of the loop, and none of the checklist's patterns explains it",
        "look at that line first: profile it on its own (py-spy at line level, or line_profiler), and check whether "
        "it runs more often than it must, or could run on the whole batch at once",
        "depends on what the hot spot is: the share is the most a fix can save", None),
)

CATALOGUE: dict[str, Bottleneck] = {b.id: b for b in _ALL}


def section_for(finding_id: str) -> int | None:
    """The § of docs/bottlenecks.md that explains ``finding_id``, or None (an unknown id, or one with no section)."""
    b = CATALOGUE.get(finding_id)
    return b.section if b is not None else None


def reference(finding_id: str) -> str:
    """``docs/bottlenecks.md §N (rlperf explain N)``; an item with no section of its own names its id."""
    section = section_for(finding_id)
    if section is None:
        return f"{DOC} (rlperf explain {finding_id})"
    return f"{DOC} §{section} (rlperf explain {section})"


def describe(finding_id: str) -> str:
    """The catalogue's entry as text: title, what it costs, the fix (for ``rlperf explain`` of an id with no section)."""
    b = CATALOGUE[finding_id]
    return f"{b.title}\n\nWhat it costs: {b.cost}.\n\nThe fix: {b.fix}.\n\nExpected gain: {b.expected_gain}."


def finding(finding_id: str, evidence: str, est_saving_s: float | None, estimate: str, *, where: str | None = None,
            knob: str | None = None, command: str | None = None, fix: str | None = None) -> Finding:
    """A finding of bottleneck ``finding_id``: the catalogue's title, fix, gain and reference with the
    rule's evidence and estimate. ``knob`` overrides the catalogue's (a count measured in this run,
    ``run.threads=2``); ``fix`` adds to the catalogue's fix what this run's figures make concrete."""
    b = CATALOGUE[finding_id]
    return Finding(
        id=b.id, title=b.title, evidence=evidence, fix=b.fix if fix is None else f"{b.fix}; here: {fix}",
        knob=knob if knob is not None else b.knob, command=command, expected_gain=b.expected_gain,
        est_saving_s=est_saving_s, estimate=estimate, reference=reference(finding_id), where=where)
