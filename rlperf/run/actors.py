"""The actor side of the async actor/learner mode: the process protocol and the actor loop.

Everything the processes share lives in one shared-memory segment (:mod:`rlperf.run.shm`), laid out
by :func:`layout_for`: a control block (stop flag, weight seqlock, learner update count), one stats
slot per actor (a per-worker status flag, as PufferLib's workers have, plus counters and phase
timings), per-actor finished-episode rings, the weights, and the replay. An actor
(:func:`actor_main`, started with the spawn method, CPU, one torch thread) steps its own batched
Snake with a local copy of the policy, writes transitions into the replay, and keeps its weights
up to date the way ``async.publish`` says (:class:`PolicySync`). The learner is
:mod:`rlperf.run.learner`.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlperf import threads
from rlperf.config import Config
from rlperf.dqn import Agent, QNetwork, epsilon_at
from rlperf.env.vector import VectorSnake
from rlperf.run.shm import Layout, RingWriter, Segment, SeqLock, replay_fields

ACTOR_PHASES = ("sync", "select", "step", "push")
# Per-actor stats slot (float64; counters stay exact up to 2**53).
SLOT = {name: i for i, name in enumerate((
    "state", "pid", "vector_steps", "env_steps", "episodes", "lock_wait_s", "lock_acquires", "measured_steps",
    *(f"{p}_{k}" for p in ACTOR_PHASES for k in ("s", "p50", "p95")), "stale_sum", "stale_max", "behind_sum",
    "behind_max", "syncs", "torn_reads", "check_s", "diff_before", "diff_after", "peak_rss_mb",
))}
STARTING, RUNNING, DONE, STOPPED, FAILED = range(5)  # slot "state"
CTRL_STOP, CTRL_SEQ, CTRL_UPDATES, CTRL_PUBLISHED_AT = range(4)  # control block (int64)
EPISODE_RING = 8192  # finished episodes kept per actor between two learner reads
ERROR_BYTES = 512
_SAMPLES_KEPT = 4096  # per phase, for the p50/p95 an actor reports


@dataclass(frozen=True)
class Plan:
    """Everything an actor process needs (picklable; the lock and the wake-up semaphore travel at spawn)."""

    cfg: Config
    kernel: str  # the env's step kernel, as the learner resolved it for the actors' CPU (rlperf.env.plan)
    segment: str
    layout: Layout
    obs_shape: tuple[int, ...]
    n_actions: int
    ring_capacity: int
    param_shapes: tuple[tuple[int, ...], ...]
    learner_pid: int
    lock: Any = None
    wake: Any = None


def layout_for(cfg: Config, obs_shape: tuple[int, ...], n_params: int) -> tuple[Layout, int, int]:
    """The segment layout, the number of rings and slots per ring."""
    k, a = cfg.async_.actors, cfg.async_
    rings, capacity = (1, cfg.buffer.capacity) if a.buffer == "locked" else (k, cfg.buffer.capacity // k)
    fields = {
        "ctrl": ((4,), "int64"),
        "slots": ((k, len(SLOT)), "float64"),
        "holding": ((k,), "int64"),
        "errors": ((k, ERROR_BYTES), "uint8"),
        "episodes": ((k, EPISODE_RING, 3), "float64"),
        "weights": ((n_params,), "float32"),
        **replay_fields(rings, capacity, obs_shape),
    }
    return Layout(fields), rings, capacity


# ------------------------------------------------------------------------------------------------
# Actor process


def actor_main(plan: Plan, index: int, incarnation: int) -> None:
    """Entry point of actor ``index`` (its ``incarnation``-th start): step, act, write, repeat."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the learner, which stops us in order
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    threads.apply(threads.Policy(1, "an actor steps its boards on one thread"))
    segment = Segment(plan.segment, plan.layout, create=False)
    slot = segment.arrays["slots"][index]
    code = 0
    try:
        code = _act(plan, index, incarnation, segment.arrays, terminated)
    except BaseException as exc:  # report it where the learner looks, then die with a non-zero code
        slot[SLOT["state"]] = FAILED
        text = f"{type(exc).__name__}: {exc}".encode()[: ERROR_BYTES - 1]
        segment.arrays["errors"][index, : len(text)] = np.frombuffer(text, dtype=np.uint8)
        traceback.print_exc()
        code = 1
    finally:
        segment.close()
    sys.exit(code)


def _actor_parts(plan: Plan, index: int, incarnation: int, arrays: dict[str, np.ndarray],
                 terminated: list[int]) -> tuple[VectorSnake, torch.Tensor, Agent, PolicySync, RingWriter]:
    """The actor's env (reset), first observation, agent, policy sync and replay writer, seeded for
    this actor's ``incarnation``-th start (a restarted actor does not replay its predecessor's episodes)."""
    cfg, t, e = plan.cfg, plan.cfg.train, plan.cfg.env
    seed = cfg.run.seed + 1000 * (index + 1) + 7919 * incarnation
    torch.manual_seed(seed)
    cpu = torch.device("cpu")
    env = VectorSnake(plan.cfg.async_.envs_per_actor, size=e.size, obs=e.obs, flood_fill=e.flood_fill,
                      initial_length=e.initial_length, hunger=e.hunger or None, device=cpu, kernel=plan.kernel, copy=False)
    obs, _ = env.reset(seed=seed)
    # The learner's knobs for the update (compile, AMP) do not apply to acting on the CPU.
    agent = Agent(cfg.model_copy(update={"train": t.model_copy(update={"compile": "off", "amp": "off"})}), plan.obs_shape, cpu,
                  plan.n_actions)
    agent.generator.manual_seed(seed)
    policy = PolicySync(plan, arrays, agent.q)
    writer = RingWriter(arrays, index, plan.ring_capacity, lock=plan.lock, holding=arrays["holding"][index:index + 1],
                        give_up=lambda: _stopping(plan, arrays["ctrl"], terminated))
    return env, obs, agent, policy, writer


def _act(plan: Plan, index: int, incarnation: int, arrays: dict[str, np.ndarray], terminated: list[int]) -> int:
    cfg, t = plan.cfg, plan.cfg.train
    ctrl, slots, slot = arrays["ctrl"], arrays["slots"], arrays["slots"][index]
    slot[SLOT["pid"]] = os.getpid()
    arrays["errors"][index] = 0
    env, obs, agent, policy, writer = _actor_parts(plan, index, incarnation, arrays, terminated)
    clock = _ActorClock(slot, t.warmup_steps)
    episodes = arrays["episodes"][index]
    n = cfg.async_.envs_per_actor
    slot[SLOT["state"]] = RUNNING
    policy.sync()  # the learner published version 1 before starting us
    while True:
        if _stopping(plan, ctrl, terminated):
            slot[SLOT["state"]] = STOPPED
            break
        env_steps, n_episodes = slots[:, SLOT["env_steps"]].sum(), slots[:, SLOT["episodes"]].sum()
        if (t.steps and env_steps >= t.steps) or (t.episodes and n_episodes >= t.episodes):
            slot[SLOT["state"]] = DONE
            break
        clock.start()
        policy.sync()
        clock.lap("sync")
        actions = agent.act(obs, epsilon_at(cfg, int(env_steps)))
        policy.note_use(slot, ctrl)
        clock.lap("select")
        next_obs, rewards, terminations, _, infos = env.step(actions)
        clock.lap("step")
        waited = writer.write(obs.numpy(), actions.numpy(), rewards.numpy(), infos["final_obs"].numpy(), terminations.numpy())
        if waited is None:  # stopped while waiting for the lock
            continue
        if plan.wake is not None:
            wake(plan.wake)
        obs = next_obs
        finished = infos["_final_info"].nonzero().squeeze(1)
        if finished.numel():
            count = int(slot[SLOT["episodes"]])
            rows = (count + np.arange(finished.numel())) % EPISODE_RING
            ep = infos["final_info"]
            episodes[rows] = torch.stack([ep["score"][finished].double(), ep["steps"][finished].double(),
                                          ep["return"][finished].double()], 1).numpy()
            slot[SLOT["episodes"]] = count + finished.numel()  # after the rows: the learner reads up to here
        clock.lap("push")
        slot[SLOT["vector_steps"]] += 1
        slot[SLOT["env_steps"]] += n
        if plan.lock is not None:
            slot[SLOT["lock_wait_s"]] += waited
            slot[SLOT["lock_acquires"]] += 1
        clock.step_done()
    clock.flush()
    return 143 if terminated and not ctrl[CTRL_STOP] else 0


def wake(signal_: Any) -> None:
    """Wake a learner blocked in ``async.wait=event``. Never blocks: a bounded semaphore, not an
    ``mp.Event``, whose ``set`` takes a lock that a killed learner may still hold."""
    try:
        signal_.release()
    except ValueError:  # already signalled
        pass


def _stopping(plan: Plan, ctrl: np.ndarray, terminated: list[int]) -> bool:
    # getppid() changes when the learner dies (we are re-parented): never outlive it.
    return bool(ctrl[CTRL_STOP]) or bool(terminated) or os.getppid() != plan.learner_pid


class _ActorClock:
    """Phase times of one actor, written into its stats slot (totals every step, p50/p95 every 0.5 s)."""

    def __init__(self, slot: np.ndarray, warmup_steps: int) -> None:
        self.slot, self.warmup_steps, self.steps = slot, warmup_steps, 0
        self.samples = {p: np.zeros(_SAMPLES_KEPT) for p in ACTOR_PHASES}
        self.index = {p: SLOT[f"{p}_s"] for p in ACTOR_PHASES}
        self.t = 0.0
        self.flushed = time.monotonic()

    def start(self) -> None:
        self.t = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        if self.steps >= self.warmup_steps:
            self.slot[self.index[phase]] += now - self.t
            self.samples[phase][(self.steps - self.warmup_steps) % _SAMPLES_KEPT] = now - self.t
        self.t = now

    def step_done(self) -> None:
        self.steps += 1
        if self.steps > self.warmup_steps:
            self.slot[SLOT["measured_steps"]] += 1
        if time.monotonic() - self.flushed > 0.5:
            self.flush()

    def flush(self) -> None:
        kept = min(max(self.steps - self.warmup_steps, 0), _SAMPLES_KEPT)
        for phase, values in self.samples.items():
            if kept:
                p50, p95 = np.percentile(values[:kept], (50, 95))
                self.slot[SLOT[f"{phase}_p50"]], self.slot[SLOT[f"{phase}_p95"]] = p50, p95
        self.slot[SLOT["peak_rss_mb"]] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.flushed = time.monotonic()


def shared_views(plan: Plan, flat: np.ndarray) -> list[torch.Tensor]:
    views, offset = [], 0
    for shape in plan.param_shapes:
        size = int(np.prod(shape))
        views.append(torch.from_numpy(flat[offset:offset + size]).view(shape))
        offset += size
    return views


def shared_qnetwork(obs_shape: tuple[int, ...], n_actions: int, hidden: list[int], views: list[torch.Tensor]) -> QNetwork:
    """The ``state_dict`` publish form's shared model: a Q-network whose tensors are the shared-memory weights."""
    model = QNetwork(obs_shape, n_actions, hidden)
    for p, view in zip(model.parameters(), views, strict=True):
        p.data = view
    return model


class PolicySync:
    """An actor's copy of the weights, kept up to date the way ``async.publish`` says."""

    def __init__(self, plan: Plan, arrays: dict[str, np.ndarray], local: torch.nn.Module) -> None:
        a = plan.cfg.async_
        self.mode, self.check = a.publish, a.weight_check == "on"
        self.seq, self.ctrl, self.slot = SeqLock(arrays["ctrl"][CTRL_SEQ:CTRL_SEQ + 1]), arrays["ctrl"], None
        self.local = local
        self.local_params: list[torch.Tensor] = list(local.parameters())
        self.shared = shared_views(plan, arrays["weights"])
        if self.mode == "state_dict":
            self.shared_model = shared_qnetwork(plan.obs_shape, plan.n_actions, list(plan.cfg.agent.hidden), self.shared)
        # The largest layer: the one the weight check compares.
        self.big = max(range(len(self.shared)), key=lambda i: self.shared[i].numel())
        self.version, self.updates_at = -1, 0
        self.counts = {"syncs": 0, "torn_reads": 0, "check_s": 0.0}

    def sync(self) -> None:
        """``shared``: copy when the version moved. ``state_dict``: clone and load every time."""
        if self.mode == "shared":
            counter = self.seq.read()
            if counter // 2 == self.version:
                return
        before = self._compare() if self.check else None
        if not (self._copy_in_place() if self.mode == "shared" else self._load_state_dict()):
            return
        self.counts["syncs"] += 1
        if before is not None:
            self.counts["diff_before"], self.counts["diff_after"] = before, self._compare()

    def _copy_in_place(self) -> bool:
        for _ in range(10_000):
            counter = self.seq.read()
            if counter % 2 == 0:
                with torch.no_grad():
                    torch._foreach_copy_(self.local_params, self.shared)
                updates_at = int(self.ctrl[CTRL_PUBLISHED_AT])
                if self.seq.read() == counter:
                    self.version, self.updates_at = counter // 2, updates_at
                    return True
            self.counts["torn_reads"] += 1
            time.sleep(0)
        return False  # the learner is stuck mid-write (or gone); keep acting, the stop checks decide

    def _load_state_dict(self) -> bool:
        counter = self.seq.read()
        if counter % 2:
            self.counts["torn_reads"] += 1
            return False
        cloned = {
            k: v.clone() for k, v in self.shared_model.state_dict().items()
        }  # a full state-dict clone per sync (docs/bottlenecks.md §18)
        updates_at = int(self.ctrl[CTRL_PUBLISHED_AT])
        if self.seq.read() != counter:  # the learner wrote meanwhile: keep the old weights this step
            self.counts["torn_reads"] += 1
            return False
        self.local.load_state_dict(cloned)
        self.version, self.updates_at = counter // 2, updates_at
        return True

    def _compare(self) -> float:
        t0 = time.perf_counter()
        local = self.local_params[self.big].data.clone().cpu()
        shared = self.shared[self.big].clone().cpu()
        diff = torch.abs(local - shared).mean().item()
        self.counts["check_s"] += time.perf_counter() - t0
        return diff

    def note_use(self, slot: np.ndarray, ctrl: np.ndarray) -> None:
        """Staleness at use: versions (and learner updates) behind the newest published weights."""
        stale = self.seq.version - self.version
        behind = int(ctrl[CTRL_UPDATES]) - self.updates_at
        slot[SLOT["stale_sum"]] += stale
        slot[SLOT["behind_sum"]] += behind
        if stale > slot[SLOT["stale_max"]]:
            slot[SLOT["stale_max"]] = stale
        if behind > slot[SLOT["behind_max"]]:
            slot[SLOT["behind_max"]] = behind
        c = self.counts
        slot[SLOT["syncs"]], slot[SLOT["torn_reads"]], slot[SLOT["check_s"]] = c["syncs"], c["torn_reads"], c["check_s"]
        if "diff_after" in c:
            slot[SLOT["diff_before"]], slot[SLOT["diff_after"]] = c["diff_before"], c["diff_after"]
