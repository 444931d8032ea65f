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
a lower replay ratio in the record). With ``run.threads = 0`` the learner takes the cores the
actors leave free. ε decays over env steps as in sync mode: actors that out-run a CPU learner reach
``eps_end`` early, so give exploration more steps (``agent.eps_decay_steps``).

Robustness: the learner checks its actors every 0.1 s (a dead one ends the run as ``failed``
naming the actor and its exit code, or is restarted with ``async.restart_actors``; a live one that
has taken no step for ``async.stall_timeout_s`` -- stopped, hung -- is killed and handled the same
way), every wait has a timeout, children ignore SIGINT and stop on the shared flag, actors exit
when the learner disappears, and the segment is unlinked on every ending. When the whole process
group is killed, the run's :class:`~rlperf.run.janitor.Janitor` (a process in its own session)
unlinks the segment and the semaphores and kills what is left of the actors; a segment that still
survives (no janitor could start) is named after the learner's pid and removed at the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import math
import multiprocessing as mp
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlperf.buffer import Batch
from rlperf.config import Config, config_to_dict, to_toml
from rlperf.device import MemoryRefused
from rlperf.dqn import Agent, Progress, QNetwork, epsilon_at
from rlperf.env.registration import ENV_ID as SNAKE_ID
from rlperf.env.vector import observation_shape
from rlperf.errors import ConfigError, DiskError
from rlperf.report.dashboard import Dashboard
from rlperf.run.actors import (
    ACTOR_PHASES, CTRL_PUBLISHED_AT, CTRL_SEQ, CTRL_STOP, CTRL_UPDATES, DONE, EPISODE_RING, RUNNING, SLOT, STARTING, STOPPED,
    Plan, actor_main, layout_for, shared_qnetwork, shared_views,
)
from rlperf.run.checkpoint import CheckpointWriter
from rlperf.run.files import (
    CHECKPOINT_NAME, CONFIG_NAME, RECORD_NAME, SCHEMA, SpaceReserve, discard_run_dir,
    forget_run_dir, make_run_dir, write_json_atomic, write_text_atomic,
)
from rlperf.run.janitor import Janitor
from rlperf.run.common import RunResult, prepare, seed_everything, thread_settings_restored
from rlperf.run.record import MetricsLog, RunHistory, Window, build_record, metrics_row, now, reset_peak_memory
from rlperf.run.shm import ReplayLockTimeout, ReplayReader, Segment, SeqLock, cleanup_stale, new_run_id, \
    segment_name, shm_free_bytes
from rlperf.run.signals import StopSignal, exit_code
from rlperf.timers import PhaseTimer

CHECK_EVERY_S = 0.1  # liveness checks: a dead actor is seen within this (+ one update)
START_TIMEOUT_S = 120.0  # an actor that has not taken its first step by then (spawn, imports) is stalled
STOP_GRACE_S = 5.0
MAX_RESTARTS = 10  # per actor; a crash loop ends the run instead of spinning


def learner_threads(cfg: Config) -> int:
    """``run.threads``, or else the cores the actors leave free (at least 1): a learner whose intra-op
    threads compete with busy actors for the same cores spends its updates spinning (docs/bottlenecks.md §14)."""
    if cfg.run.threads > 0:
        return cfg.run.threads
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cores - cfg.async_.actors))


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


# ------------------------------------------------------------------------------------------------
# Learner (the main process)


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


class ActorFailure(RuntimeError):
    """An actor died and is not (or no longer) restarted."""

    def __init__(self, message: str, detail: dict[str, Any]) -> None:
        super().__init__(message)
        self.detail = detail


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


class Learner:
    """The main process: owns the run directory, the record, the signals, the segment and the actors."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def run(
        self, out: str | Path, name: str | None, command: list[str] | None, quiet: bool, show: bool, kind: str,
        stop: StopSignal | None = None,
    ) -> RunResult:
        cfg = self.cfg = usable_async_config(self.cfg)
        self.obs_shape = observation_shape(cfg.env.size, cfg.env.obs, cfg.env.flood_fill)
        check_async(cfg)
        self.stop = stop if stop is not None else StopSignal()
        self.stop.arm()
        with thread_settings_restored(), self.stop.installed():
            self.device = prepare(cfg)
            seed_everything(cfg.run.seed)
            self.param_shapes = tuple(tuple(p.shape) for p in QNetwork(self.obs_shape, 3, list(cfg.agent.hidden)).parameters())
            n_weights = sum(int(np.prod(s)) for s in self.param_shapes)
            self.layout, self.rings, self.ring_capacity = layout_for(cfg, self.obs_shape, n_weights)
            free = shm_free_bytes()
            if free is not None and self.layout.nbytes > 0.9 * free:
                raise MemoryRefused(
                    f"async replay needs {self.layout.nbytes / 2**20:.1f} MiB of shared memory, /dev/shm has "
                    f"{free / 2**20:.1f} MiB free",
                    hint="lower buffer.capacity, or enlarge /dev/shm (docker: --shm-size)",
                )
            self.agent = Agent(cfg, self.obs_shape, self.device)
            self.learner_threads = learner_threads(cfg)
            torch.set_num_threads(self.learner_threads)
            self.stale_removed = cleanup_stale()
            self.stop.raise_if_set()
            self.run_dir = make_run_dir(out, name, prefix=kind)
            self.kind = kind
            self.history = RunHistory(started_at=now(), command=list(command or sys.argv), device=str(self.device))
            self.janitor = Janitor()
            name_ = segment_name(new_run_id(), "run")
            self.janitor.shm(name_)  # told first: a kill from here on still removes it
            self.segment = Segment(name_, self.layout, create=True)
            self.procs: list[Any] = []
            safety_net = register_cleanup(self.procs, self.segment)
            try:
                return self._run(show and not quiet)
            finally:
                self._stop_actors()
                self.segment.unlink()
                self.segment.close()
                atexit.unregister(safety_net)
                self._release_semaphores()
                self.janitor.dismiss()

    def _release_semaphores(self) -> None:
        """Drop every reference to the replay lock and the wake-up semaphore, so that
        ``multiprocessing`` unlinks their names now (its finalizer), not at the interpreter's exit."""
        self.procs.clear()
        for name in ("plan", "lock", "wake", "reader"):
            self.__dict__.pop(name, None)
        gc.collect()

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self, show: bool) -> RunResult:
        cfg, a, t = self.cfg, self.cfg.async_, self.cfg.train
        arrays = self.segment.arrays
        self.ctrl, self.slots = arrays["ctrl"], arrays["slots"]
        self.rss_scope = reset_peak_memory(self.device)
        self._open_files()
        self.checkpoints = CheckpointWriter(self.run_dir / CHECKPOINT_NAME, None)
        ctx = spawn_context()
        lock = ctx.Lock() if a.buffer == "locked" else None
        self.wake = ctx.BoundedSemaphore(1) if a.wait == "event" else None
        for semaphore in filter(None, (lock, self.wake)):
            self.janitor.semaphore(semaphore._semlock.name)
        self.plan = Plan(
            cfg,
            self.segment.name,
            self.layout,
            self.obs_shape,
            self.ring_capacity,
            self.param_shapes,
            os.getpid(),
            lock,
            self.wake,
        )
        self.lock, self.ctx = lock, ctx
        self.reader = ReplayReader(
            arrays,
            self.rings,
            self.ring_capacity,
            a.envs_per_actor,
            cfg.buffer.batch_size,
            lock=lock,
            check=self._check_actors,
            seed=cfg.run.seed,
            out=staging_arrays(arrays, cfg.buffer.batch_size, self.device),
        )
        sampler = _Sampler(self.reader, self.device)
        self.seq = SeqLock(self.ctrl[CTRL_SEQ : CTRL_SEQ + 1])
        self.shared = shared_views(self.plan, arrays["weights"])
        if a.publish == "state_dict":
            self.shared_model = shared_qnetwork(self.obs_shape, list(cfg.agent.hidden), self.shared)
        self.timer = PhaseTimer(self.device, mode=cfg.run.timing, warmup_steps=t.warmup_steps)
        self.progress = Progress(score_targets=tuple(cfg.train.score_targets))
        self.pids: list[list[int]] = [[] for _ in range(a.actors)]
        self.restarts = [0] * a.actors
        self.restart_events: list[dict[str, Any]] = []
        self.exit_codes: list[int | None] = [None] * a.actors
        self.failure: dict[str, Any] | None = None
        self.disk: DiskError | None = None
        self.progress_seen: list[tuple[float, float]] = [(0.0, time.monotonic())] * a.actors  # (vector steps, since)
        self.stalled: list[float | None] = [None] * a.actors
        self.stepping = [False] * a.actors  # has stepped since it (re)started
        self.publishes, self.publish_s, self.wait_s, self.waits, self.busy_s = 0, 0.0, 0.0, 0, 0.0
        self.episodes_read = [0] * a.actors
        self.episodes_lost = 0
        self.episodes_seen = 0  # episodes whose score and length the learner read
        self.t_start = time.perf_counter()
        # (time, env steps, updates, episodes) when every actor was past its warm-up steps.
        self.window_start: tuple[float, int, int, int] | None = None
        self.t_first_update: float | None = None
        self.t_first_data: float | None = None
        self.t_all_running: float | None = None
        self.loss_sum, self.loss_count = torch.zeros((), device=self.device), 0
        total, unit = (t.episodes, "episodes") if t.episodes > 0 else (t.steps, "env steps")
        self.board = Dashboard(total, unit, enabled=show)

        self._publish()  # version 1: every actor starts from the learner's initial weights
        for i in range(a.actors):
            self.procs.append(None)
            self._start(i)
        n = a.envs_per_actor
        starts = max(t.learning_starts, cfg.buffer.batch_size + (a.actors * n if a.buffer == "lockfree" else 0))
        status, error = "completed", None
        next_tick = 0.0
        next_log = t.log_every * a.actors
        try:
            with self.board:
                while True:
                    if self.stop():
                        status = "interrupted"
                        break
                    now = time.perf_counter()
                    if now >= next_tick:
                        next_tick = now + CHECK_EVERY_S
                        self._check_actors()
                        if self._all_done():
                            break
                        self._note_window(now)
                        if self.slots[:, SLOT["vector_steps"]].sum() >= next_log:
                            next_log += t.log_every * a.actors
                            if not self._log():
                                status, error = "diverged", f"mean loss became {self.progress.last_loss}"
                                break
                    published = self.reader.published()
                    owed = (
                        int(t.train_ratio * ((published - starts) / n + 1)) - self.agent.updates
                        if published >= starts and t.train_ratio > 0
                        else 0
                    )
                    if owed > 0 and sampler.ready():
                        t0 = time.perf_counter()
                        with self.timer.phase("train"):
                            self.loss_sum += self.agent.update(sampler)
                        self.busy_s += time.perf_counter() - t0  # host time, for the utilisation
                        self.loss_count += 1
                        self._after_update()
                    else:
                        self._wait(published)
        except ActorFailure as exc:
            status, error, self.failure = "failed", str(exc), exc.detail
        except DiskError as exc:  # metrics.csv: the disk is full
            status, error, self.disk = "failed", str(exc), exc
        except ReplayLockTimeout as exc:
            status, error = "failed", f"{exc}: an actor may be stuck or have died inside it"
        except Exception as exc:  # a bug or an OOM: keep the record of what was measured, then surface it
            self._finish("failed", f"{type(exc).__name__}: {exc}")
            raise
        return self._finish(status, error)

    def _open_files(self) -> None:
        """The space held back for the record, config.toml and metrics.csv's header; a disk error here,
        before any actor started, leaves nothing of the run."""
        self.reserve: SpaceReserve | None = None
        try:
            self.reserve = SpaceReserve(self.run_dir)
            write_text_atomic(self.run_dir / CONFIG_NAME, to_toml(self.cfg))
            self.metrics = MetricsLog(self.run_dir, tensorboard=self.cfg.train.tensorboard)
        except DiskError:
            if self.reserve is not None:
                self.reserve.release()
            discard_run_dir(self.run_dir)
            raise

    def _after_update(self) -> None:
        a = self.cfg.async_
        updates = self.agent.updates
        if self.t_first_update is None:
            self.t_first_update = time.perf_counter()
        self.ctrl[CTRL_UPDATES] = updates
        if updates % a.publish_every == 0:
            self._publish()
        self.timer.step_done()

    def _wait(self, published: int) -> None:
        """No batch to train on: the ``async.wait`` knob."""
        t0 = time.perf_counter()
        if published == 0:
            self.t_first_data = None
        elif self.t_first_data is None:
            self.t_first_data = t0
        if self.wake is None:
            time.sleep(0.001)  # the slow form: poll
        else:
            self.wake.acquire(block=False)  # drop a stale wake-up, then look again before blocking
            if self.reader.published() == published:
                self.wake.acquire(timeout=CHECK_EVERY_S)
        if self.t_first_data is not None:  # before the first transition it is start-up, reported apart
            self.wait_s += time.perf_counter() - t0
            self.waits += 1

    def _publish(self) -> None:
        """Weights to the actors, as ``async.publish`` says, under the seqlock."""
        t0 = time.perf_counter()
        self.seq.begin()
        publish_weights(self.cfg.async_.publish, self.agent.q, self.shared, getattr(self, "shared_model", None),
                        torch.from_numpy(self.segment.arrays["weights"]))
        self.ctrl[CTRL_PUBLISHED_AT] = self.agent.updates
        self.seq.end()
        self.publishes += 1
        self.publish_s += time.perf_counter() - t0

    # -- actors -----------------------------------------------------------------------------------

    def _start(self, index: int) -> None:
        slot = self.slots[index]
        slot[SLOT["state"]] = STARTING
        proc = start_actor(self.ctx, self.plan, index, self.restarts[index])
        self.procs[index] = proc
        self.pids[index].append(proc.pid)
        self.janitor.process(proc.pid)
        self.progress_seen[index] = (float(slot[SLOT["vector_steps"]]), time.monotonic())
        self.stepping[index] = False
        self.stalled[index] = None

    def _check_stalls(self) -> None:
        """An actor alive but taking no step for ``async.stall_timeout_s`` (stopped, hung) is killed
        here; :meth:`_check_actors` then handles it like one that died."""
        limit = self.cfg.async_.stall_timeout_s
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if proc is None or proc.exitcode is not None:
                continue
            state = int(self.slots[i, SLOT["state"]])
            steps = float(self.slots[i, SLOT["vector_steps"]])
            seen, since = self.progress_seen[i]
            if steps != seen or state in (DONE, STOPPED):
                self.progress_seen[i] = (steps, now)
                self.stepping[i] = self.stepping[i] or (steps != seen and state == RUNNING)
                continue
            # Until its first step an actor is starting (spawn, imports, the first forward pass).
            allowed = limit if self.stepping[i] else max(START_TIMEOUT_S, 10 * limit)
            if now - since > allowed:
                self.stalled[i] = now - since
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)  # the only signal a stopped process cannot hold back
                proc.join(1.0)

    def _check_actors(self) -> None:
        """Liveness: a dead actor is restarted or ends the run (called every CHECK_EVERY_S and in lock waits)."""
        self._check_stalls()
        for i, proc in enumerate(self.procs):
            if proc is None or proc.exitcode is None:
                continue
            state = int(self.slots[i, SLOT["state"]])
            if proc.exitcode == 0 and (state == DONE or (state == STOPPED and self.ctrl[CTRL_STOP])):
                continue
            detected = time.monotonic()
            error = bytes(self.segment.arrays["errors"][i]).split(b"\0", 1)[0].decode(errors="replace")
            stalled = self.stalled[i]
            if stalled is not None:
                limit = self.cfg.async_.stall_timeout_s
                message = (f"actor {i} (pid {proc.pid}) took no step for {stalled:.1f} s (async.stall_timeout_s={limit:g}): "
                           f"stalled, killed")
            else:
                message = describe_exit(i, proc.pid, proc.exitcode, error)
            detail = {
                "actor": i,
                "pid": proc.pid,
                "exit_code": proc.exitcode,
                "error": error or None,
                "stalled_s": stalled,
                "detected_monotonic": detected,
                "env_steps": int(self.slots[:, SLOT["env_steps"]].sum()),
            }
            proc.join(0)
            if not self.cfg.async_.restart_actors or self.restarts[i] >= MAX_RESTARTS or self.stop():
                if self.cfg.async_.restart_actors and self.restarts[i] >= MAX_RESTARTS:
                    message += f" (after {MAX_RESTARTS} restarts)"
                self.exit_codes[i] = proc.exitcode
                self.procs[i] = None
                raise ActorFailure(message, detail)
            if self.lock is not None and self.segment.arrays["holding"][i]:
                # It died inside the replay lock: release it for the others. Its slots were never published.
                self.segment.arrays["holding"][i] = 0
                self.lock.release()
                detail["released_lock"] = True
            self.restarts[i] += 1
            self.restart_events.append({**detail, "message": message})
            self._start(i)

    def _all_done(self) -> bool:
        return all(int(s) == DONE for s in self.slots[:, SLOT["state"]])

    def _note_window(self, now: float) -> None:
        """Rates are measured from the moment every actor is past its warm-up steps (spawn excluded)."""
        if self.t_all_running is None and all(int(s) != STARTING for s in self.slots[:, SLOT["state"]]):
            self.t_all_running = now
        if self.window_start is None and (self.slots[:, SLOT["measured_steps"]] > 0).all():
            s = self.slots
            self.window_start = (
                now,
                int(s[:, SLOT["env_steps"]].sum()),
                self.agent.updates,
                int(s[:, SLOT["episodes"]].sum()),
            )

    def _stop_actors(self) -> None:
        """In order: the shared stop flag, a grace period, then SIGTERM, then SIGKILL."""
        self.ctrl[CTRL_STOP] = 1
        deadline = time.monotonic() + STOP_GRACE_S
        live = [p for p in self.procs if p is not None]
        for proc in live:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in live:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for i, proc in enumerate(self.procs):
            if proc is not None:
                self.exit_codes[i] = proc.exitcode

    # -- logging and the record ---------------------------------------------------------------------

    def _log(self) -> bool:
        """Read finished episodes and the mean loss; a row for metrics.csv and the dashboard. False: diverged."""
        self.timer.flush()  # CUDA events mode: resolve the interval's pairs off the update path
        with self.timer.phase("log"):
            p, s = self.progress, self.slots
            episodes = self.segment.arrays["episodes"]
            p.env_steps = int(s[:, SLOT["env_steps"]].sum())
            p.vector_steps = int(s[:, SLOT["vector_steps"]].sum())
            p.updates = self.agent.updates
            for i in range(len(self.episodes_read)):
                count = int(s[i, SLOT["episodes"]])
                new = count - self.episodes_read[i]
                if new > 0:
                    kept = min(new, EPISODE_RING)
                    self.episodes_lost += new - kept
                    rows = episodes[i, np.arange(count - kept, count) % EPISODE_RING]
                    p.add_episodes(rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2],
                                   clock=self._score_clock)
                    self.episodes_seen += kept
                    self.episodes_read[i] = count
            p.episodes = int(s[:, SLOT["episodes"]].sum())
            p.epsilon = epsilon_at(self.cfg, p.env_steps)
            finite = True
            if self.loss_count:
                p.last_loss = float(self.loss_sum) / self.loss_count
                self.loss_sum.zero_()
                self.loss_count = 0
                finite = math.isfinite(p.last_loss)
            now_s = time.perf_counter()
            window = self._window(now_s) if self.window_start is not None else None
            # The learner's phases, and its waiting for data: what its interval was spent on.
            row = metrics_row(p, now_s - self.t_start, window, self.history, {**self.timer.totals(), "wait": self.wait_s})
            self.metrics.write(row)
            if self.board.enabled:
                done = p.episodes if self.board.unit == "episodes" else p.env_steps
                self.board.update(
                    done,
                    {
                        "episodes": p.episodes,
                        "env_steps_per_s": row["env_steps_per_s"],
                        "updates_per_s": window.rate(window.updates) if window else 0.0,
                        "mean_score": p.mean_score,
                        "epsilon": p.epsilon,
                        "loss": p.last_loss,
                    },
                    extra=lambda: _metrics_line(self._async_metrics(time.perf_counter())),
                )
        return finite

    def _score_clock(self) -> dict[str, float | int]:
        """The clock and counters of this log read, for a score target reached in it: measured from
        when every actor was past its warm-up (0 before), as the rates are."""
        now_s, p = time.perf_counter(), self.progress
        measured = now_s - self.window_start[0] if self.window_start is not None else 0.0
        return {"wall_s": measured, "run_wall_s": now_s - self.t_start, "env_steps": p.env_steps, "updates": p.updates}

    def _window(self, t_end: float) -> Window:
        """The measured part up to ``t_end``: from when every actor was past its warm-up (spawn and
        warm-up excluded, as a sync run excludes its warm-up steps)."""
        t0, env0, upd0, ep0 = self.window_start or (self.t_all_running or self.t_start, 0, 0, 0)
        s = self.slots
        return Window(
            max(t_end - t0, 1e-9),
            int(s[:, SLOT["env_steps"]].sum()) - env0,
            self.agent.updates - upd0,
            int(s[:, SLOT["episodes"]].sum()) - ep0,
        )

    def _async_metrics(self, t_end: float) -> dict[str, Any]:
        """The async metrics: experience rate, updates/s, waiting, lock wait, drops, staleness, utilisation."""
        a, s = self.cfg.async_, self.slots

        def col(name: str) -> np.ndarray:
            return s[:, SLOT[name]]

        env_steps, updates = int(col("env_steps").sum()), self.agent.updates
        t0, env0, upd0, _ = self.window_start or (self.t_all_running or self.t_start, 0, 0, 0)
        span = max(t_end - t0, 1e-9)
        active = max(t_end - self.t_first_update, 1e-9) if self.t_first_update is not None else None
        steps = max(col("vector_steps").sum(), 1)
        tracker, rs = self.reader.tracker, self.reader.stats
        actor_acquires = col("lock_acquires").sum()
        return {
            "experience_rate": (env_steps - env0) / span,
            "learner_updates_per_s": updates / active if active else 0.0,
            "wait_for_data_s": self.wait_s,
            "wait_for_data_share": self.wait_s / max(t_end - (self.t_first_data or t_end), 1e-9),
            "waits": self.waits,
            "lock_wait_s": {"learner": rs.lock_wait_s, "actors": float(col("lock_wait_s").sum())},
            "lock_wait_ms_per_acquire": {
                "learner": 1e3 * rs.lock_wait_s / rs.lock_acquires if rs.lock_acquires else 0.0,
                "actors": 1e3 * float(col("lock_wait_s").sum()) / actor_acquires if actor_acquires else 0.0,
            },
            "overwritten": tracker.overwritten,
            "overwritten_unsampled": tracker.unsampled,
            "overwritten_unsampled_share": tracker.unsampled / tracker.overwritten if tracker.overwritten else 0.0,
            "redrawn_slots": rs.redrawn,
            "staleness_versions": {"mean": float(col("stale_sum").sum() / steps), "max": float(col("stale_max").max())},
            "staleness_updates": {"mean": float(col("behind_sum").sum() / steps), "max": float(col("behind_max").max())},
            "learner_utilisation": self.busy_s / active if active else 0.0,
            "publishes": self.publishes,
            "publish_s": self.publish_s,
            "weight_syncs": int(col("syncs").sum()),
            "torn_weight_reads": int(col("torn_reads").sum()),
            "weight_check_s": float(col("check_s").sum()),
            "weight_check_diff": (
                {"before": float(col("diff_before").mean()), "after": float(col("diff_after").mean())}
                if a.weight_check == "on"
                else None
            ),
            "updates_per_s_window": (updates - upd0) / span,
        }

    def _phases(self) -> dict[str, dict[str, Any]]:
        """Actors' select/step/push (+ sync), summed over actors; the learner's train/log (+ wait).

        ``share`` is of all phase time of all processes (so the shares add up to 1, as in a sync run);
        ``role_share`` is of the actors' or the learner's own total. Actors' p50/p95 are call-weighted
        means of each actor's percentiles (over its last 4096 steps)."""
        s = self.slots
        calls = s[:, SLOT["measured_steps"]]
        actor: dict[str, dict[str, Any]] = {}
        for p in ACTOR_PHASES:
            total, n = float(s[:, SLOT[f"{p}_s"]].sum()), int(calls.sum())
            w = calls / calls.sum() if calls.sum() else np.zeros_like(calls)
            actor[p] = {
                "total_s": total,
                "calls": n,
                "mean_ms": 1e3 * total / n if n else 0.0,
                "p50_ms": 1e3 * float((w * s[:, SLOT[f"{p}_p50"]]).sum()),
                "p95_ms": 1e3 * float((w * s[:, SLOT[f"{p}_p95"]]).sum()),
                "role": "actors",
            }
        stats = self.timer.stats()
        learner: dict[str, dict[str, Any]] = {
            name: {**stats[name].as_dict(), "role": "learner"} for name in ("train", "log") if name in stats}
        learner["wait"] = {
            "total_s": self.wait_s,
            "calls": self.waits,
            "mean_ms": 1e3 * self.wait_s / self.waits if self.waits else 0.0,
            "p50_ms": None,
            "p95_ms": None,
            "role": "learner",
        }
        grand = sum(v["total_s"] for group in (actor, learner) for v in group.values())
        for group in (actor, learner):
            role_total = sum(v["total_s"] for v in group.values())
            for v in group.values():
                v["share"] = v["total_s"] / grand if grand > 0 else 0.0
                v["role_share"] = v["total_s"] / role_total if role_total > 0 else 0.0
        order = ("select", "step", "push", "train", "log", "sync", "wait")
        merged = {**actor, **learner}
        return {name: merged[name] for name in order}

    def _finish(self, status: str, error: str | None) -> RunResult:
        t_end = time.perf_counter()
        self._stop_actors()
        try:
            self._log_quietly()
        except DiskError as exc:
            status, error, self.disk = "failed", error or str(exc), self.disk or exc
        self.metrics.close()
        cfg, a, p = self.cfg, self.cfg.async_, self.progress
        m = self._async_metrics(t_end)
        window = self._window(t_end)
        timing = self.timer.to_dict()
        timing["vector_step"] = None  # the learner's loop steps are not env vector steps
        warmup_s = (self.window_start or (self.t_all_running or self.t_start,))[0] - self.t_start
        if cfg.train.checkpoint and status in ("completed", "interrupted"):
            try:
                self.checkpoints.write(
                    {
                        "schema": SCHEMA,
                        "mode": "async",
                        "config": config_to_dict(cfg),
                        "agent": self.agent.state_dict(),
                        "progress": p.state_dict(),
                    },
                    p,
                )
            except DiskError as exc:
                status, error, self.disk = "failed", str(exc), exc
        s = self.slots
        replay_bytes = self.rings * self.ring_capacity * (2 * 4 * int(np.prod(self.obs_shape)) + 8 + 4 + 4)
        record = build_record(
            cfg=cfg,
            device=self.device,
            run_dir=self.run_dir,
            history=self.history,
            kind=self.kind,
            status=status,
            progress=p,
            timing={**timing, "warmup_s": warmup_s},
            window=window,
            wall_s=t_end - self.t_start,
            phases=self._phases(),
            episode_length=p.episode_steps / self.episodes_seen if self.episodes_seen else None,
            rss_scope=self.rss_scope,
            score_resolution=f"every learner log read (train.log_every = {cfg.train.log_every} vector steps per actor, "
                             f"checked every {CHECK_EVERY_S:g} s)",
            memory={
                "replay_mb": replay_bytes / 2**20,
                "shared_mb": self.layout.nbytes / 2**20,
                "actors_peak_rss_mb": float(s[:, SLOT["peak_rss_mb"]].sum()),
            },
            checkpoint=self.checkpoints.describe(),
            error=error,
        )
        record["async"] = {
            "actors": a.actors,
            "envs_per_actor": a.envs_per_actor,
            "boards": a.actors * a.envs_per_actor,
            "learner_threads": self.learner_threads,
            "buffer": a.buffer,
            "wait": a.wait,
            "weight_check": a.weight_check,
            "publish": a.publish,
            "publish_every": a.publish_every,
            "restart_actors": a.restart_actors,
            **{k: v for k, v in m.items() if k != "updates_per_s_window"},
            "startup_s": (self.t_all_running - self.t_start) if self.t_all_running else None,
            "restarts": sum(self.restarts),
            "restart_events": self.restart_events,
            "failure": self.failure,
            "episodes_not_read": self.episodes_lost,
            "stale_segments_removed": self.stale_removed,
            "replay": {
                "rings": self.rings,
                "ring_capacity": self.ring_capacity,
                "segment": self.segment.name,
                "storage": "host shared memory, copied to the learner's device per sample",
            },
            "per_actor": [
                {
                    "index": i,
                    "pids": self.pids[i],
                    "exit_code": self.exit_codes[i],
                    "restarts": self.restarts[i],
                    "env_steps": int(s[i, SLOT["env_steps"]]),
                    "episodes": int(s[i, SLOT["episodes"]]),
                    "lock_wait_s": float(s[i, SLOT["lock_wait_s"]]),
                }
                for i in range(a.actors)
            ],
        }
        self._write_record(record)
        if self.board.enabled:
            self.board.console.print(async_table(record["async"]))
        return RunResult(self.run_dir, record, exit_code(status, self.stop.signum))

    def _write_record(self, record: dict[str, Any]) -> None:
        """``run.json``, with the space held back for it; a disk error (the run's or the record's own)
        is raised after it as one line (the sync run's :meth:`rlperf.run.lifecycle.SyncRun._write_record`)."""
        from rlperf.run.lifecycle import _with_detail

        if self.reserve is not None:
            self.reserve.release()
        steps = self.progress.env_steps
        try:
            write_json_atomic(self.run_dir / RECORD_NAME, record)
        except DiskError as exc:
            if self.checkpoints.env_steps is None:
                discard_run_dir(self.run_dir)
                left = f"the run stopped at env step {steps} and nothing of it was kept"
            else:
                left = (f"the run stopped at env step {steps}; its record could not be written, its weights are in "
                        f"{CHECKPOINT_NAME}")
            raise _with_detail(self.disk or exc, left) from None
        forget_run_dir(self.run_dir)
        if self.disk is not None:
            raise _with_detail(self.disk, f"the run stopped at env step {steps}: run.json says failed",
                               record=record, run_dir=self.run_dir) from None

    def _log_quietly(self) -> None:
        enabled, self.board.enabled = self.board.enabled, False
        try:
            self._log()
        finally:
            self.board.enabled = enabled


def _metrics_line(m: dict[str, Any]) -> str:
    return (
        f"async: exp/s {m['experience_rate']:,.0f}  learner upd/s {m['learner_updates_per_s']:,.1f}  "
        f"wait {m['wait_for_data_share'] * 100:.0f}%  lock wait {sum(m['lock_wait_s'].values()):.2f}s  "
        f"dropped {m['overwritten_unsampled']:,}  stale {m['staleness_updates']['mean']:.1f} upd  "
        f"util {m['learner_utilisation'] * 100:.0f}%"
    )


def async_table(m: dict[str, Any]) -> Any:
    """The async metrics table, from a record's ``async`` section."""
    from rich.table import Table

    table = Table(title=f"async: {m['actors']} actor(s) x {m['envs_per_actor']} boards", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("experience rate", f"{m['experience_rate']:,.0f} transitions/s"),
        ("learner updates/s", f"{m['learner_updates_per_s']:,.1f}"),
        ("learner utilisation", f"{m['learner_utilisation'] * 100:.0f}%"),
        ("waiting for data", f"{m['wait_for_data_s']:.2f} s ({m['wait_for_data_share'] * 100:.0f}%)"),
        ("lock wait (learner / actors)", f"{m['lock_wait_s']['learner']:.3f} s / {m['lock_wait_s']['actors']:.3f} s"),
        ("overwritten unsampled", f"{m['overwritten_unsampled']:,} of {m['overwritten']:,}"),
        (
            "staleness (versions / updates)",
            f"{m['staleness_versions']['mean']:.2f} / {m['staleness_updates']['mean']:.1f}"
            f" (max {m['staleness_updates']['max']:.0f})",
        ),
        ("weight syncs / publishes", f"{m['weight_syncs']:,} / {m['publishes']:,}"),
        ("actor restarts", f"{m['restarts']}"),
    ]
    for label, value in rows:
        table.add_row(label, value)
    return table


# -- process plumbing -----------------------------------------------------------------------------


def spawn_context() -> Any:
    return mp.get_context("spawn")


def start_actor(ctx: Any, plan: Plan, index: int, incarnation: int) -> Any:
    """Start one actor with SIGINT blocked meanwhile: the child inherits the mask, so a Ctrl-C that
    arrives while it boots cannot reach it, and the learner gets its own copy once unblocked."""
    proc = ctx.Process(target=actor_main, args=(plan, index, incarnation), name=f"rlperf-actor-{index}", daemon=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return proc


def describe_exit(index: int, pid: int, code: int | None, error: str) -> str:
    """``actor 1 (pid 4242) was killed by SIGKILL (exit code -9)``, with the actor's own error if any."""
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            how = f"was killed by signal {-code} (exit code {code})"
    else:
        how = f"exited with code {code}"
    return f"actor {index} (pid {pid}) {how}" + (f": {error}" if error else "")


def register_cleanup(procs: list[Any], segment: Segment) -> Any:
    """atexit safety net (an exception path that skipped the finally): kill live actors, unlink the segment."""

    def cleanup() -> None:
        for proc in procs:
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join(1)
        segment.unlink()

    atexit.register(cleanup)
    return cleanup
