"""Async actor/learner mode (``run.mode = "async"``): K actor processes and one learner, with the
four slow forms a multiprocess RL system typically has as knobs (docs/bottlenecks.md §15–§18).

K actor processes (spawn start method, CPU, one torch thread each) step their own batched Snake
(``async.envs_per_actor`` boards) with a local copy of the policy and write transitions into a
shared-memory replay. The main process is the learner: it samples, trains the same DQN
(:class:`rlperf.dqn.Agent`) and publishes weights with a version counter. Everything the processes
share lives in one segment (:mod:`rlperf.run.shm`): a control block (stop flag, weight seqlock, learner
update count), one stats slot per actor (PufferLib's per-worker status flag, plus counters and
phase timings), per-actor finished-episode rings, the weights, and the replay.

Each slow form is a knob with its fixed form next to it:

- ``async.buffer``: ``locked`` (one ring, one lock over the whole add and the whole sample) vs
  ``lockfree`` (per-actor single-writer rings; slots first, then the write index).
- ``async.wait``: ``sleep`` (the learner polls with 1 ms sleeps) vs ``event`` (it blocks, with a
  timeout, on a wake-up the writers signal), whenever it has no batch to train on: before ``train.learning_starts``
  and whenever it is ``train.train_ratio`` updates per actor vector step ahead of the actors.
- ``async.weight_check``: ``on`` clones and compares the weights around every sync.
- ``async.publish``: ``state_dict`` (CPU state dict loaded into a shared model every
  ``publish_every`` updates; actors clone the whole shared state dict on every step) vs
  ``shared`` (the same shared tensors, written in place under a seqlock; actors copy only when the
  version moved).

What differs from a sync run: ``train.train_ratio`` counts updates per *actor* vector step
(``async.envs_per_actor`` transitions), so one actor with ``envs_per_actor = env.num_envs`` has a
sync run's replay ratio; ``env.num_envs`` is not used (each actor steps ``envs_per_actor`` boards);
the learner trains only when it is behind that ratio and otherwise waits, and it stops when the
actors have reached the stop condition (a learner slower than the actors shows as fewer updates and
a lower replay ratio in the record). With ``run.threads = 0`` the learner gets the count
:func:`rlperf.threads.choose` picks (on CUDA, the cores the actors leave free). ε decays over env
steps as in sync mode: actors that out-run a CPU learner reach
``eps_end`` early, so give exploration more steps (``agent.eps_decay_steps``).

This module is the learner loop (:class:`Learner`); the actors' supervision is
:mod:`rlperf.run.supervisor`, the record's ``async`` section :mod:`rlperf.run.async_record`, and
what every run has (run directory, files, checkpoints, dashboard, record) :class:`rlperf.run.core.RunCore`.

Robustness: the learner checks its actors every 0.1 s (:class:`~rlperf.run.supervisor.Supervisor`:
a dead one ends the run as ``failed`` naming the actor and its exit code, or is restarted with
``async.restart_actors``; a live one that has taken no step for ``async.stall_timeout_s`` --
stopped, hung -- is killed and handled the same way), every wait has a timeout, children ignore
SIGINT and stop on the shared flag, actors exit when the learner disappears, and the segment is
unlinked on every ending. When the whole process group is killed, the run's
:class:`~rlperf.run.janitor.Janitor` (a process in its own session) unlinks the segment and the
semaphores and kills what is left of the actors; a segment that still survives (no janitor could
start) is named after the learner's pid and removed at the next start.
"""

from __future__ import annotations

import atexit
import gc
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlperf.buffer import Batch, ReplayBuffer
from rlperf.config import Config, config_to_dict
from rlperf.device import MemoryRefused
from rlperf.dqn import Agent, Progress, QNetwork, epsilon_at
from rlperf.env.backends import env_spec
from rlperf.env.plan import EnvPlan
from rlperf.env.registration import ENV_ID as SNAKE_ID
from rlperf.errors import ConfigError, DiskError
from rlperf.run.actors import (
    CTRL_PUBLISHED_AT, CTRL_SEQ, CTRL_UPDATES, EPISODE_RING, SLOT, Plan, layout_for, shared_qnetwork, shared_views,
)
from rlperf.run.async_record import LearnerStats, async_metrics, async_phases, async_section, async_table, metrics_line
from rlperf.run.common import RunResult, prepare, seed_everything, thread_settings_restored
from rlperf.run.core import RunCore, forms_line
from rlperf.run.files import SCHEMA, make_run_dir
from rlperf.run.janitor import Janitor
from rlperf.run.record import RunHistory, build_record, now
from rlperf.run.shm import (
    Layout, ReplayLockTimeout, ReplayReader, Segment, SeqLock, cleanup_stale, new_run_id, segment_name, shm_free_bytes,
)
from rlperf.run.signals import StopSignal
from rlperf.run.supervisor import CHECK_EVERY_S, ActorFailure, Supervisor, register_cleanup, spawn_context
from rlperf.timers import PhaseTimer


LOCKFREE_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})
"""Where the lock-free ring's "slots first, then the write index" publication is sound without
fences: x86's total store order (stores become visible in program order, loads are not reordered
with loads). Weaker orderings (ARM, POWER) would need release/acquire barriers numpy cannot emit."""


def usable_async_config(cfg: Config) -> Config:
    """``cfg``, with ``async.buffer=lockfree`` replaced by ``locked`` (and a line on stderr) on a
    machine whose memory ordering the lock-free ring was not written for."""
    machine = platform.machine().lower()
    if cfg.async_.buffer != "lockfree" or machine in LOCKFREE_MACHINES:
        return cfg
    print(f"rlperf: async.buffer=lockfree relies on x86-64 memory ordering and this machine is {machine}: "
          f"using async.buffer=locked", file=sys.stderr)
    return cfg.model_copy(update={"async_": cfg.async_.model_copy(update={"buffer": "locked"})})


def check_async(cfg: Config) -> None:
    """Refuse, with one line each, settings the async mode cannot honour."""
    a, b = cfg.async_, cfg.buffer
    if cfg.env.id != SNAKE_ID:
        raise ConfigError(f"run.mode=async trains on rlperf/Snake-v0 only, not env.id={cfg.env.id}",
                          hint="use --set run.mode=sync for other envs")
    if cfg.env.backend != "tensor":
        raise ConfigError(
            f"env.backend={cfg.env.backend} does not apply with run.mode=async: each actor steps the batched env",
            hint="use env.backend=tensor with run.mode=async",
        )
    if b.storage == "list" or b.push == "loop":
        key = "buffer.storage=list" if b.storage == "list" else "buffer.push=loop"
        raise ConfigError(
            f"{key} does not apply with run.mode=async: the replay is shared memory (async.buffer)",
            hint="use buffer.storage=tensor and buffer.push=batch, and async.buffer=locked|lockfree",
        )
    per_ring = b.capacity if a.buffer == "locked" else b.capacity // a.actors
    if per_ring < 2 * a.envs_per_actor or (a.buffer == "lockfree" and a.actors * (per_ring - a.envs_per_actor) < b.batch_size):
        raise ConfigError(
            f"buffer.capacity={b.capacity} is too small for {a.actors} actor(s) x {a.envs_per_actor} boards "
            f"({'one ring' if a.buffer == 'locked' else 'one ring per actor'} of {per_ring} slots)",
            hint=f"raise buffer.capacity to at least {a.actors * (2 * a.envs_per_actor + b.batch_size)}",
        )


def publish_weights(mode: str, q: torch.nn.Module, shared: list[torch.Tensor], shared_model: Any = None,
                    flat: torch.Tensor | None = None) -> None:
    """The learner's side of ``async.publish`` (the caller holds the seqlock). ``flat`` is the one
    shared tensor the ``shared`` views are slices of: from a GPU, the weights go in one copy."""
    if mode == "shared":
        with torch.no_grad():
            params: list[torch.Tensor] = list(q.parameters())
            if flat is not None and params[0].device.type == "cuda":
                flat.copy_(torch.cat([p.reshape(-1) for p in params]))  # one device-to-host copy, not one per tensor
            else:
                torch._foreach_copy_(shared, params)
    else:  # the slow form: the whole state dict to the CPU, loaded into the shared model
        state_dict_cpu = {k: v.cpu() for k, v in q.state_dict().items()}
        shared_model.load_state_dict(state_dict_cpu)


STAGED = ("obs", "action", "reward", "next_obs", "done")


def staging_arrays(arrays: dict[str, np.ndarray], batch: int, device: torch.device) -> dict[str, np.ndarray] | None:
    """Where a sample is gathered on the host: page-locked memory when the learner is on a GPU, so the
    copy to the device is one asynchronous transfer per field (None: the reader allocates plain arrays)."""
    if device.type != "cuda":
        return None
    return {name: torch.empty((batch, *arrays[name].shape[1:]), dtype=torch.from_numpy(arrays[name][:0]).dtype,
                              pin_memory=True).numpy() for name in STAGED}


class _Sampler:
    """What :meth:`rlperf.dqn.Agent.update` samples from: the shared replay, staged on the learner's device.

    :meth:`ready` draws the next batch into the reader's staging arrays; :meth:`sample` hands it
    over (the batch size is the reader's, fixed when the run starts). On the CPU the staging arrays
    are the batch. On a GPU they are pinned, copied without blocking into fixed device tensors, and
    the next :meth:`ready` waits for that copy before the reader overwrites them.
    """

    def __init__(self, reader: ReplayReader, device: torch.device) -> None:
        self.reader, self.device = reader, device
        self._host = Batch(*(torch.from_numpy(reader.out[k]) for k in STAGED))
        self._device = Batch(*(torch.empty_like(x, device=device) for x in self._host)) if device.type == "cuda" else None
        self._copied: Any = None  # the CUDA event after the last copy

    def ready(self) -> bool:
        """Draw the next batch now; False when the replay cannot give one yet."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        return self.reader.sample() is not None

    def sample(self, batch_size: int) -> Batch:
        if batch_size != self.reader.batch:
            raise ValueError(f"the shared replay stages batches of {self.reader.batch}, not {batch_size}")
        if self._device is None:
            return self._host
        for dst, src in zip(self._device, self._host, strict=True):
            dst.copy_(src, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return self._device


@dataclass(frozen=True)
class Sizing:
    """The shapes an async run's segment is laid out for: the observation, the Q-network's tensors and
    the replay's rings (one ring for ``async.buffer=locked``, one per actor for ``lockfree``)."""

    obs_shape: tuple[int, ...]
    n_actions: int
    param_shapes: tuple[tuple[int, ...], ...]
    layout: Layout
    rings: int
    ring_capacity: int

    @classmethod
    def of(cls, cfg: Config) -> Sizing:
        """The sizing of ``cfg``'s run, refused when its segment does not fit in /dev/shm."""
        obs_shape, n_actions = env_spec(cfg)
        param_shapes = tuple(tuple(p.shape) for p in QNetwork(obs_shape, n_actions, list(cfg.agent.hidden)).parameters())
        layout, rings, ring_capacity = layout_for(cfg, obs_shape, sum(int(np.prod(s)) for s in param_shapes))
        free = shm_free_bytes()
        if free is not None and layout.nbytes > 0.9 * free:
            raise MemoryRefused(
                f"async replay needs {layout.nbytes / 2**20:.1f} MiB of shared memory, /dev/shm has "
                f"{free / 2**20:.1f} MiB free",
                hint="lower buffer.capacity, or enlarge /dev/shm (docker: --shm-size)",
            )
        return cls(obs_shape, n_actions, param_shapes, layout, rings, ring_capacity)


def async_run(cfg: Config, out: str | Path, name: str | None, command: list[str] | None, show: bool, kind: str,
              stop: StopSignal) -> RunResult:
    """An async run from a validated config to its run directory (what :func:`rlperf.run.lifecycle.train_run`
    calls for ``run.mode=async``)."""
    cfg = usable_async_config(cfg)
    check_async(cfg)
    with thread_settings_restored(), stop.installed():
        device, env_plan = prepare(cfg)
        seed_everything(cfg.run.seed)
        sizing = Sizing.of(cfg)
        agent = Agent(cfg, sizing.obs_shape, device, sizing.n_actions)
        threads = torch.get_num_threads()  # what prepare's thread policy gave the learner
        stale_removed = cleanup_stale()
        stop.raise_if_set()
        run_dir = make_run_dir(out, name, prefix=kind)
        history = RunHistory(started_at=now(), command=list(command or sys.argv), device=str(device))
        core = RunCore.open(cfg=cfg, device=device, run_dir=run_dir, kind=kind, history=history, stop=stop,
                            new_dir=True, show=show, resumable=False, heading=forms_line(env_plan, agent.update_form))
        janitor = Janitor()
        segment_id = segment_name(new_run_id(), "run")
        janitor.shm(segment_id)  # told first: a kill from here on still removes it
        segment = Segment(segment_id, sizing.layout, create=True)
        try:
            learner = Learner(core, env_plan, agent, sizing, segment, janitor, threads, stale_removed)
            safety_net = register_cleanup(learner.supervisor.procs, segment)
            try:
                return learner.run()
            finally:
                learner.supervisor.shutdown()
                atexit.unregister(safety_net)
                learner.release()
        finally:
            segment.unlink()
            segment.close()
            janitor.dismiss()


class Learner:
    """The learner loop (the main process): train when behind ``train.train_ratio``, else wait; read the
    actors' episodes at each log; publish weights. Its :class:`~rlperf.run.supervisor.Supervisor` keeps
    the actors, its :class:`~rlperf.run.core.RunCore` the run directory and the record."""

    def __init__(self, core: RunCore, env_plan: EnvPlan, agent: Agent, sizing: Sizing, segment: Segment,
                 janitor: Janitor, threads: int, stale_removed: list[str]) -> None:
        cfg, a = core.cfg, core.cfg.async_
        self.core, self.env_plan, self.agent, self.sizing, self.segment = core, env_plan, agent, sizing, segment
        self.threads, self.stale_removed = threads, stale_removed
        arrays = segment.arrays
        self.ctrl, self.slots = arrays["ctrl"], arrays["slots"]
        ctx = spawn_context()
        self.lock = ctx.Lock() if a.buffer == "locked" else None
        self.wake = ctx.BoundedSemaphore(1) if a.wait == "event" else None
        for semaphore in filter(None, (self.lock, self.wake)):
            janitor.semaphore(semaphore._semlock.name)
        self.plan = Plan(cfg, env_plan.kernel or "ops", segment.name, sizing.layout, sizing.obs_shape, sizing.n_actions,
                         sizing.ring_capacity, sizing.param_shapes, os.getpid(), self.lock, self.wake)
        self.supervisor = Supervisor(cfg, ctx, self.plan, segment, janitor, self.lock, core.stop)
        self.reader = ReplayReader(arrays, sizing.rings, sizing.ring_capacity, a.envs_per_actor, cfg.buffer.batch_size,
                                   lock=self.lock, check=self.supervisor.check, seed=cfg.run.seed,
                                   out=staging_arrays(arrays, cfg.buffer.batch_size, core.device))
        self.sampler = _Sampler(self.reader, core.device)
        self.seq = SeqLock(self.ctrl[CTRL_SEQ : CTRL_SEQ + 1])
        self.shared = shared_views(self.plan, arrays["weights"])
        self.shared_model = (shared_qnetwork(sizing.obs_shape, sizing.n_actions, list(cfg.agent.hidden), self.shared)
                             if a.publish == "state_dict" else None)
        self.timer = PhaseTimer(core.device, mode=cfg.run.timing, warmup_steps=cfg.train.warmup_steps)
        self.progress = Progress(score_targets=tuple(cfg.train.score_targets))
        self.stats = LearnerStats(t_start=time.perf_counter())
        self.failure: dict[str, Any] | None = None
        self.episodes_read = [0] * a.actors
        self.episodes_lost = 0
        self.episodes_seen = 0  # episodes whose score and length the learner read
        self.loss_sum, self.loss_count = torch.zeros((), device=core.device), 0

    def release(self) -> None:
        """Drop every reference to the replay lock and the wake-up semaphore, so that
        ``multiprocessing`` unlinks their names now (its finalizer), not at the interpreter's exit."""
        self.supervisor.procs.clear()
        for name in ("plan", "lock", "wake", "reader", "sampler", "supervisor"):
            self.__dict__.pop(name, None)
        gc.collect()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> RunResult:
        self._publish()  # version 1: every actor starts from the learner's initial weights
        self.supervisor.start_all()
        status, error = "completed", None
        try:
            with self.core.board:
                status, error = self._loop()
        except ActorFailure as exc:
            status, error, self.failure = "failed", str(exc), exc.detail
        except DiskError as exc:  # metrics.csv: the disk is full
            status, error, self.core.disk = "failed", str(exc), exc
        except ReplayLockTimeout as exc:
            status, error = "failed", f"{exc}: an actor may be stuck or have died inside it"
        except Exception as exc:  # a bug or an OOM: keep the record of what was measured, then surface it
            self._finish("failed", f"{type(exc).__name__}: {exc}")
            raise
        return self._finish(status, error)

    def _loop(self) -> tuple[str, str | None]:
        """Train while behind the actors, else wait; check the actors and log on their clocks. The
        run's (status, error) when it ends: the actors done, a signal, or divergence."""
        cfg, a, t = self.core.cfg, self.core.cfg.async_, self.core.cfg.train
        n = a.envs_per_actor
        starts = max(t.learning_starts, cfg.buffer.batch_size + (a.actors * n if a.buffer == "lockfree" else 0))
        next_tick, next_log = 0.0, t.log_every * a.actors
        while not self.core.stop():
            now_s = time.perf_counter()
            if now_s >= next_tick:
                next_tick = now_s + CHECK_EVERY_S
                self.supervisor.check()
                if self.supervisor.all_done():
                    return "completed", None
                self._note_window(now_s)
                if self.slots[:, SLOT["vector_steps"]].sum() >= next_log:
                    next_log += t.log_every * a.actors
                    if not self._log():
                        return "diverged", f"mean loss became {self.progress.last_loss}"
            published = self.reader.published()
            owed = (int(t.train_ratio * ((published - starts) / n + 1)) - self.agent.updates
                    if published >= starts and t.train_ratio > 0 else 0)
            if owed > 0 and self.sampler.ready():
                t0 = time.perf_counter()
                with self.timer.phase("train"):
                    self.loss_sum += self.agent.update(self.sampler)
                self.stats.busy_s += time.perf_counter() - t0  # host time, for the utilisation
                self.loss_count += 1
                self._after_update()
            else:
                self._wait(published)
        return "interrupted", None

    def _after_update(self) -> None:
        updates = self.agent.updates
        if self.stats.t_first_update is None:
            self.stats.t_first_update = time.perf_counter()
        self.ctrl[CTRL_UPDATES] = updates
        if updates % self.core.cfg.async_.publish_every == 0:
            self._publish()
        self.timer.step_done()

    def _wait(self, published: int) -> None:
        """No batch to train on: the ``async.wait`` knob."""
        t0, stats = time.perf_counter(), self.stats
        if published == 0:
            stats.t_first_data = None
        elif stats.t_first_data is None:
            stats.t_first_data = t0
        if self.wake is None:
            time.sleep(0.001)  # the slow form: poll
        else:
            self.wake.acquire(block=False)  # drop a stale wake-up, then look again before blocking
            if self.reader.published() == published:
                self.wake.acquire(timeout=CHECK_EVERY_S)
        if stats.t_first_data is not None:  # before the first transition it is start-up, reported apart
            stats.wait_s += time.perf_counter() - t0
            stats.waits += 1

    def _publish(self) -> None:
        """Weights to the actors, as ``async.publish`` says, under the seqlock."""
        t0 = time.perf_counter()
        self.seq.begin()
        publish_weights(self.core.cfg.async_.publish, self.agent.q, self.shared, self.shared_model,
                        torch.from_numpy(self.segment.arrays["weights"]))
        self.ctrl[CTRL_PUBLISHED_AT] = self.agent.updates
        self.seq.end()
        self.stats.publishes += 1
        self.stats.publish_s += time.perf_counter() - t0

    def _note_window(self, now_s: float) -> None:
        """Rates are measured from the moment every actor is past its warm-up steps (spawn excluded)."""
        stats, s = self.stats, self.slots
        if stats.t_all_running is None and self.supervisor.all_started():
            stats.t_all_running = now_s
        if stats.window_start is None and (s[:, SLOT["measured_steps"]] > 0).all():
            stats.window_start = (now_s, int(s[:, SLOT["env_steps"]].sum()), self.agent.updates,
                                  int(s[:, SLOT["episodes"]].sum()))

    # -- logging and the record ---------------------------------------------------------------------

    def _log(self) -> bool:
        """Read finished episodes and the mean loss; a row for metrics.csv and the dashboard. False: diverged."""
        self.timer.flush()  # CUDA events mode: resolve the interval's pairs off the update path
        with self.timer.phase("log"):
            p, s = self.progress, self.slots
            p.env_steps = int(s[:, SLOT["env_steps"]].sum())
            p.vector_steps = int(s[:, SLOT["vector_steps"]].sum())
            p.updates = self.agent.updates
            self._read_episodes()
            p.episodes = int(s[:, SLOT["episodes"]].sum())
            p.epsilon = epsilon_at(self.core.cfg, p.env_steps)
            finite = True
            if self.loss_count:
                p.last_loss = float(self.loss_sum) / self.loss_count
                self.loss_sum.zero_()
                self.loss_count = 0
                finite = math.isfinite(p.last_loss)
            now_s = time.perf_counter()
            window = self.stats.window(s, self.agent.updates, now_s) if self.stats.window_start is not None else None
            # The learner's phases, and its waiting for data: what its interval was spent on.
            self.core.log(p, now_s - self.stats.t_start, window, {**self.timer.totals(), "wait": self.stats.wait_s},
                          extra=lambda: metrics_line(self._metrics()))
        return finite

    def _read_episodes(self) -> None:
        """The episodes each actor finished since the last read (its ring keeps the last EPISODE_RING)."""
        episodes = self.segment.arrays["episodes"]
        for i in range(len(self.episodes_read)):
            count = int(self.slots[i, SLOT["episodes"]])
            new = count - self.episodes_read[i]
            if new > 0:
                kept = min(new, EPISODE_RING)
                self.episodes_lost += new - kept
                rows = episodes[i, np.arange(count - kept, count) % EPISODE_RING]
                self.progress.add_episodes(rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2],
                                           clock=self._score_clock)
                self.episodes_seen += kept
                self.episodes_read[i] = count

    def _score_clock(self) -> dict[str, float | int]:
        """The clock and counters of this log read, for a score target reached in it: measured from
        when every actor was past its warm-up (0 before), as the rates are."""
        now_s, p, stats = time.perf_counter(), self.progress, self.stats
        measured = now_s - stats.window_start[0] if stats.window_start is not None else 0.0
        return {"wall_s": measured, "run_wall_s": now_s - stats.t_start, "env_steps": p.env_steps, "updates": p.updates}

    def _metrics(self, t_end: float | None = None) -> dict[str, Any]:
        return async_metrics(self.core.cfg, self.slots, self.reader, self.stats, self.agent.updates,
                             time.perf_counter() if t_end is None else t_end)

    def _log_quietly(self) -> None:
        """The last row, for metrics.csv; on the dashboard only when it showed no row yet (a run
        whose actors finished before the learner's first log still shows its figures once)."""
        board = self.core.board
        enabled, board.enabled = board.enabled, board.enabled and not board.drawn
        try:
            self._log()
        finally:
            board.enabled = enabled

    def _finish(self, status: str, error: str | None) -> RunResult:
        core, p, t_end = self.core, self.progress, time.perf_counter()
        self.supervisor.shutdown()
        try:
            self._log_quietly()
        except DiskError as exc:
            status, error, core.disk = "failed", error or str(exc), core.disk or exc
        core.close_files()
        status, error = core.final_checkpoint(status, error, self._checkpoint_state, p)
        record = self._record(status, error, t_end)
        core.write_record(record, p.env_steps)
        if core.board.enabled:
            core.board.console.print(async_table(record["async"]))
        return core.result(record)

    def _checkpoint_state(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "mode": "async", "config": config_to_dict(self.core.cfg),
                "agent": self.agent.state_dict(), "progress": self.progress.state_dict()}

    def _record(self, status: str, error: str | None, t_end: float) -> dict[str, Any]:
        core, cfg, p, stats, sizing = self.core, self.core.cfg, self.progress, self.stats, self.sizing
        timing = self.timer.to_dict()
        timing["vector_step"] = None  # the learner's loop steps are not env vector steps
        replay = ReplayBuffer.estimate_nbytes(sizing.rings * sizing.ring_capacity, sizing.obs_shape)
        record = build_record(
            cfg=cfg, device=core.device, run_dir=core.run_dir, history=core.history, kind=core.kind, status=status,
            progress=p, timing={**timing, "warmup_s": stats.origin()[0] - stats.t_start},
            window=stats.window(self.slots, self.agent.updates, t_end), wall_s=t_end - stats.t_start,
            phases=async_phases(self.slots, self.timer, stats),
            episode_length=p.episode_steps / self.episodes_seen if self.episodes_seen else None,
            rss_scope=core.rss_scope,
            score_resolution=f"every learner log read (train.log_every = {cfg.train.log_every} vector steps per actor, "
                             f"checked every {CHECK_EVERY_S:g} s)",
            memory={"replay_mb": replay / 2**20, "shared_mb": sizing.layout.nbytes / 2**20,
                    "actors_peak_rss_mb": float(self.slots[:, SLOT["peak_rss_mb"]].sum())},
            env=self.env_plan, update=self.agent.update_form, checkpoint=core.checkpoints.describe(), error=error)
        supervisor = self.supervisor
        record["async"] = async_section(cfg, self._metrics(t_end), self.threads, stats, {
            "restarts": sum(supervisor.restarts),
            "restart_events": supervisor.restart_events,
            "failure": self.failure,
            "episodes_not_read": self.episodes_lost,
            "stale_segments_removed": self.stale_removed,
            "replay": {"rings": sizing.rings, "ring_capacity": sizing.ring_capacity, "segment": self.segment.name,
                       "storage": "host shared memory, copied to the learner's device per sample"},
            "per_actor": supervisor.per_actor(),
        })
        return record
