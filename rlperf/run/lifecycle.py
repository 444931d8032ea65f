"""One training run from a validated config to a run directory with its record.

:func:`train_run` is what ``rlperf train`` (and ``profile``, ``sweep``, ``compare``) call: it checks
the knobs and the memory the run will need, builds the env, buffer and agent, runs
:func:`rlperf.dqn.run_loop` (or, with ``run.mode=async``, the actor/learner mode of
:mod:`rlperf.run.learner`), and writes ``run.json``, ``metrics.csv``, ``config.toml`` and
``checkpoint.pt`` atomically. The lifecycle:

- **Signals.** SIGINT and SIGTERM stop the loop at the next vector-step boundary, or between two
  gradient updates of a step (a large ``train_ratio`` makes a step long); the checkpoint
  and the record are written with ``status: interrupted`` and the exit code is 130 / 143. The
  handlers stay installed through the final write, so a second Ctrl-C cannot tear it. A signal
  that arrives before the run directory exists ends the command with nothing written. A caller
  that runs several runs (sweep, compare) passes its own :class:`StopSignal`, so one signal stops
  the run in progress and the caller's loop.
- **Disk errors.** A write the filesystem refuses (full, quota, read-only, no inodes) raises
  :class:`rlperf.errors.DiskError` (one line: the path, the bytes, what was free; exit code 2).
  Before the first step it removes the new run directory (nothing is left); during the run it
  ends the run as ``failed`` with that reason in ``run.json`` and keeps the last good checkpoint.
  The record can be written on a disk the run filled: the run holds :data:`RESERVE_BYTES` back
  from its start (:class:`SpaceReserve`) and gives them up right before the record.
- **Checkpoints.** ``checkpoint.pt`` is written at the first log boundary, then at log boundaries
  at most every ``max(60 s, 50 x the last write's duration)`` (so writing costs at most 2% of the
  run), and at the end of a completed or interrupted run. There is no config key for this on
  purpose: the interval bounds both the work lost to a crash and the cost of writing. The write
  is timed as part of the ``log`` phase.
- **Divergence.** A NaN/inf mean loss (read at each log boundary) ends the run as ``diverged``;
  the diverged weights are not saved, so the last periodic checkpoint (its weights checked finite
  when it was written) stays. A CUDA or host out-of-memory during the run ends it as ``failed``
  with the record, a hint, and that same last checkpoint.
- **Resume.** ``train_run(cfg, resume=RUN_DIR)`` continues a run in its own directory from its
  checkpoint (:mod:`rlperf.run.checkpoint`). ``metrics.csv`` is appended (rows written after the
  checkpoint, by a run that was killed, are dropped first), ``config.toml``, ``checkpoint.pt``
  and ``run.json`` are replaced, and the record lists each resume under ``resumed``. On the CPU a
  resumed run reproduces the uninterrupted run exactly: a run stopped inside a step's updates pays
  the rest first (if that step wrote a log row, the row holds the losses up to the stop, and the
  next row the rest), and a completed run extended with ``--steps``/``--episodes`` drops the row its last
  step wrote off a log boundary, its interval going on. A ``metrics.csv`` that lost rows written before
  the checkpoint is refused. A run killed between its final checkpoint
  and its record is finished: its resume writes the missing record from the checkpoint (marked
  ``recovered``) without training.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlperf.atomic import write_json_atomic
from rlperf.buffer import ReplayBuffer
from rlperf.config import Config
from rlperf.device import is_out_of_memory, synchronize
from rlperf.dqn import Agent, Progress, run_loop, steps_before_learning, stop_reached
from rlperf.fused_update import resolve_update
from rlperf.env.backends import build_env, env_spec
from rlperf.env.plan import EnvPlan, plan_env
from rlperf.errors import DiskError, RlperfError
from rlperf.run.checkpoint import (
    check_run_dir, checkpoint_state, finish_row, load_checkpoint, reached_stop, restore, resume_config,
    tidy_for_resume, unrecorded_finish,
)
from rlperf.run.common import RunResult, prepare, seed_everything, thread_settings_restored
from rlperf.run.core import RunCore, forms_line
from rlperf.run.files import (
    CHECKPOINT_NAME, RECORD_NAME, RESERVE_BYTES, check_run_name, lock_run_dir, make_run_dir, read_record,
)
from rlperf.run.memory import check_run_memory, oom_message, refusing_oom
from rlperf.run.record import METRICS_FIELDS, RunHistory, Window, build_record, now
from rlperf.run.signals import RunInterrupted, StopSignal, exit_code
from rlperf.timers import PHASES, PhaseTimer

__all__ = ["METRICS_FIELDS", "RESERVE_BYTES", "RunHooks", "RunInterrupted", "RunResult", "StopSignal", "exit_code",
           "resume_config", "train_run"]


@dataclass
class RunHooks:
    """Optional instruments around the loop (used by ``rlperf profile``).

    ``measure_after_fill``: the timer's warm-up starts only once the replay holds
    ``train.learning_starts`` transitions (the fill is excluded too), and the stop condition counts
    episodes or env steps from the end of that warm-up, in a measured window of at least
    ``min_measured_steps`` vector steps: what ``rlperf profile --episodes N`` measures.
    """

    around_loop: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    on_step: Callable[[], None] | None = None
    annotate_phases: bool = False
    measure_after_fill: bool = False
    min_measured_steps: int = 0


def train_run(
    cfg: Config,
    out: str | Path = "runs",
    name: str | None = None,
    command: list[str] | None = None,
    quiet: bool = False,
    dashboard: bool = True,
    kind: str = "train",
    hooks: RunHooks | None = None,
    resume: str | Path | None = None,
    stop: StopSignal | None = None,
) -> RunResult:
    """Train with ``cfg`` and write a new run directory under ``out``, or continue ``resume``.

    With ``resume`` (a run directory) the run continues in that directory and ``out``/``name``
    are not used; build ``cfg`` with :func:`resume_config`. ``stop``: the caller's stop signal (a
    sweep's, a comparison's, the command line's); by default the run installs its own. Raises
    RlperfError on bad input, in which case nothing was written, and DiskError when the
    filesystem refuses a write (see the module docstring for what is left).
    """
    stop = stop if stop is not None else StopSignal()
    stop.arm()
    check_run_name(name)
    if cfg.run.mode == "async":
        if resume is not None:
            raise RlperfError("--resume works for run.mode=sync runs only", hint="start a new async run")
        from rlperf.run.learner import async_run  # the actor/learner machinery: only async runs import it

        return async_run(cfg, out, name, command, dashboard and not quiet, kind, stop)
    with thread_settings_restored(), stop.installed(), contextlib.ExitStack() as held:
        return _build_and_run(cfg, out, name, command, quiet, dashboard, kind, hooks or RunHooks(), resume, stop, held)


def _build_and_run(cfg: Config, out: str | Path, name: str | None, command: list[str] | None, quiet: bool,
                   show: bool, kind: str, hooks: RunHooks, resume: str | Path | None, stop: StopSignal,
                   held: contextlib.ExitStack) -> RunResult:
    """Check, build and run; ``held`` closes the run directory's lock and the env when the run ends."""
    device, env_plan = prepare(cfg)
    e = cfg.env
    obs_shape, n_actions = env_spec(cfg)
    saved: dict[str, Any] | None = None
    run_dir: Path | None = None
    if resume is not None:
        run_dir = check_run_dir(resume)
        held.callback(os.close, lock_run_dir(run_dir))
        saved = load_checkpoint(run_dir, cfg, device)
        reached = reached_stop(saved["progress"], cfg)
        if reached is not None:
            if unrecorded_finish(run_dir, saved):
                stop.raise_if_set("the record was written")
                return record_from_checkpoint(run_dir, saved, device, kind, list(command or sys.argv))
            raise RlperfError(f"run {run_dir} already reached {reached}",
                              hint="pass a larger --steps or --episodes to continue it")
    stop.raise_if_set()
    check_run_memory(cfg, obs_shape, device)
    seed_everything(cfg.run.seed)
    with refusing_oom("the env", f"env.num_envs={e.num_envs}", "lower env.num_envs"):
        env = build_env(cfg, env_plan)
    held.callback(env.close)
    buffer = ReplayBuffer(cfg.buffer.capacity, obs_shape, device, storage=cfg.buffer.storage, push=cfg.buffer.push,
                          seed=cfg.run.seed, check_memory=False)  # checked above, with the rest of the run
    with refusing_oom("the Q-network", f"agent.hidden={list(cfg.agent.hidden)}", "use narrower agent.hidden"):
        agent = Agent(cfg, obs_shape, device, n_actions)
    # The warm-up window starts at the first gradient update: its one-off costs (compilation, CUDA-graph
    # capture, the optimizer's state) never enter a rate; the fill steps before it are timed apart too.
    fill = steps_before_learning(cfg)
    timer = PhaseTimer(device, mode=cfg.run.timing, warmup_steps=fill + cfg.train.warmup_steps,
                       annotate=hooks.annotate_phases)
    progress = Progress(score_targets=tuple(cfg.train.score_targets))
    finished_row = False
    if saved is not None:
        assert run_dir is not None
        history = restore(saved, run_dir, env, agent, buffer, timer, progress)
        finished_row = finish_row(history, progress, saved["config"]["train"]["log_every"])
        if finished_row:  # the run goes on past its last step: its interval is not over
            history.intervals.pop()
        history.resumed.append({"from_env_steps": progress.env_steps, "from_vector_steps": progress.vector_steps,
                                "at": now(), "command": list(command or sys.argv)})
    else:
        history = RunHistory(started_at=now(), command=list(command or sys.argv), device=str(device))
    stop.raise_if_set()
    new = run_dir is None
    if run_dir is None:
        run_dir = make_run_dir(out, name, prefix=kind)  # only once everything was accepted
        held.callback(os.close, lock_run_dir(run_dir))
    core = RunCore.open(cfg=cfg, device=device, run_dir=run_dir, kind=kind, history=history, stop=stop, new_dir=new,
                        show=show and not quiet, resumed=progress if saved is not None else None, finished_row=finished_row,
                        heading=forms_line(env_plan, agent.update_form))
    run = SyncRun(core=core, env=env, env_plan=env_plan, buffer=buffer, agent=agent, timer=timer, progress=progress,
                  hooks=hooks, fill_steps=fill)
    return run.run(resumed=saved is not None)


def record_from_checkpoint(run_dir: Path, state: dict[str, Any], device: torch.device, kind: str,
                           command: list[str]) -> RunResult:
    """The record of a finished run that was killed before writing it, built from its final checkpoint
    (counters, phase statistics, learning, history); nothing is trained. Memory peaks were not
    measured by this process: they are null, with ``rss_scope: "not measured"``."""
    cfg = Config.model_validate(state["config"])
    obs_shape, _ = env_spec(cfg)
    timer = PhaseTimer(device, mode=cfg.run.timing, warmup_steps=cfg.train.warmup_steps)
    timer.load_state_dict(state["timer"])
    progress = Progress(score_targets=tuple(cfg.train.score_targets))
    progress.load_state_dict(state["progress"])
    history = RunHistory(**state["run"])
    with contextlib.suppress(RlperfError, OSError):
        kind = read_record(run_dir).get("kind") or kind
    tidy_for_resume(run_dir, progress.vector_steps)
    p = progress
    checkpoint = {"file": CHECKPOINT_NAME, "env_steps": p.env_steps, "vector_steps": p.vector_steps}
    record = sync_record(cfg, device, run_dir, kind, history, p, timer, "completed", history.wall_s, "not measured",
                         None, checkpoint, obs_shape, plan_env(cfg, device), resolve_update(cfg, device))
    record["memory"].update(peak_rss_mb=None, peak_cuda_mb=None)
    record["recovered"] = {"at": now(), "from": CHECKPOINT_NAME, "command": command,
                           "why": "the run was stopped after its final checkpoint, before its record was written"}
    write_json_atomic(run_dir / RECORD_NAME, record)
    return RunResult(run_dir, record, 0)


@dataclass(kw_only=True)
class SyncRun:
    """The in-process loop, from its first step to its record: the loop's callbacks (metrics rows, the
    dashboard, periodic checkpoints, the warm-up boundary) and the ending; ``core`` holds the rest."""

    core: RunCore
    env: Any
    env_plan: EnvPlan
    buffer: ReplayBuffer
    agent: Agent
    timer: PhaseTimer
    progress: Progress
    hooks: RunHooks
    started: float = field(default_factory=time.perf_counter)
    fill_steps: int = 0  # vector steps of the timer's warm-up that only filled the replay
    asked_at: int | None = field(default=None, init=False)  # measured steps at which the asked window was complete

    def done(self, p: Progress) -> bool:
        """The stop condition: the config's, or (``hooks.measure_after_fill``) counted after the warm-up."""
        cfg = self.core.cfg
        if not self.hooks.measure_after_fill:
            return stop_reached(cfg, p)
        # From the counters, not the timer: in the step's own log phase they already include it.
        measured = p.vector_steps - self.timer.warmup_steps
        if measured <= 0:
            return False
        if self.asked_at is None and stop_reached(cfg, p, since=self.core.history.at_warmup_end):
            self.asked_at = measured
        return self.asked_at is not None and measured >= self.hooks.min_measured_steps

    # -- the loop's callbacks --------------------------------------------------------------------

    def wall_s(self) -> float:
        """Wall seconds of the whole run so far, over every resumed segment."""
        return self.core.history.wall_s + (time.perf_counter() - self.started)

    def window(self) -> Window | None:
        """The measured part so far (None while still in warm-up)."""
        if not self.timer.measured_steps:
            return None
        warm, p = self.core.history.at_warmup_end, self.progress
        return Window(self.timer.measured_wall_now(), p.env_steps - warm["env_steps"], p.updates - warm["updates"],
                      p.episodes - warm["episodes"])

    def state(self) -> dict[str, Any]:
        core = self.core
        snapshot = checkpoint_state(core.cfg, self.env, self.agent, self.buffer, self.timer, self.progress, core.history)
        snapshot["run"]["wall_s"] = self.wall_s()
        return snapshot

    def on_step(self) -> None:
        core, p = self.core, self.progress
        t = core.cfg.train
        if self.timer.steps == self.timer.warmup_steps:
            core.history.at_warmup_end.update(env_steps=p.env_steps, updates=p.updates, episodes=p.episodes)
        if self.hooks.on_step is not None:
            self.hooks.on_step()
        if (t.checkpoint and p.vector_steps % t.log_every == 0 and p.status == "running"
                and not core.stop() and not self.done(p) and core.checkpoints.due()):
            with self.timer.phase("log"):
                if weights_finite(self.agent):
                    core.checkpoints.write(self.state(), p)
                else:  # a finite mean loss can still leave the last update's weights at inf/NaN
                    p.status = "diverged"

    def on_log(self, p: Progress) -> None:
        wall, board = self.wall_s(), self.core.board
        self.core.log(p, wall, self.window(), self.timer.totals(), self.timer.shares if board.live_mode or wall > 5 else None)

    # -- the run ---------------------------------------------------------------------------------

    def run(self, resumed: bool) -> RunResult:
        core, p = self.core, self.progress
        status, error, failure = "completed", None, None
        try:
            # Inside the handler: a reset can run out of memory too (a large N on a GPU).
            obs = self.env.observations if resumed else self.env.reset(seed=core.cfg.run.seed)[0]
            with core.board, self.hooks.around_loop():
                run_loop(core.cfg, self.env, self.agent, self.buffer, self.timer, p, obs, self.on_log,
                         should_stop=core.stop, on_step=self.on_step, done=self.done, run_wall=self.wall_s)
            synchronize(core.device)
            if p.status == "diverged":
                status, error = "diverged", self._divergence_message()
            elif core.stop() and not self.done(p):  # a signal on the last step: the run is complete
                status = "interrupted"
        except DiskError as exc:  # metrics.csv or a periodic checkpoint: the disk is full
            status, error, core.disk = "failed", str(exc), exc
        except Exception as exc:
            if is_out_of_memory(exc):
                status, error = "failed", oom_message(exc, core.device, core.checkpoints.env_steps)
            else:  # a bug: keep the record of what was measured, then let it surface
                status, error, failure = "failed", f"{type(exc).__name__}: {exc}", exc
        wall = self.wall_s()
        core.close_files()
        status, error = core.final_checkpoint(status, error, self.state, p)
        record = self.record(status, wall, error)
        core.write_record(record, p.env_steps)
        if failure is not None:
            raise failure
        return core.result(record)

    def record(self, status: str, wall: float, error: str | None) -> dict[str, Any]:
        core = self.core
        timing: dict[str, Any] = {"fill_steps": self.fill_steps}
        if self.hooks.measure_after_fill:
            timing["asked_window_steps"] = self.asked_at
        return sync_record(core.cfg, core.device, core.run_dir, core.kind, core.history, self.progress, self.timer,
                           status, wall, core.rss_scope, error, core.checkpoints.describe(), self.buffer.obs_shape,
                           self.env_plan, self.agent.update_form, capacity=self.buffer.capacity, timing_extra=timing)

    def _divergence_message(self) -> str:
        p, cfg, kept = self.progress, self.core.cfg, self.core.checkpoints.env_steps
        what = f"mean loss became {p.last_loss}" if not math.isfinite(p.last_loss) else "Q-network weights became non-finite"
        kept_line = (f"checkpoint.pt is the last good one, from env step {kept}" if kept is not None
                     else "no checkpoint was written before it")
        hint = f"try an agent.lr below {cfg.agent.lr:g}" + (", and agent.grad_clip > 0" if cfg.agent.grad_clip == 0 else "")
        return f"{what} by env step {p.env_steps}; {kept_line} ({hint})"


def sync_record(cfg: Config, device: torch.device, run_dir: Path, kind: str, history: RunHistory, p: Progress,
                timer: PhaseTimer, status: str, wall: float, rss_scope: str, error: str | None,
                checkpoint: dict[str, Any] | None, obs_shape: tuple[int, ...], env_plan: EnvPlan,
                update: tuple[str, str], capacity: int | None = None,
                timing_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A sync run's record from its parts (a run that just ended, or a finished run's checkpoint);
    ``timing_extra`` joins the timer's figures (the profile's fill and asked window)."""
    timing = {**timer.to_dict(), **(timing_extra or {})}
    # Rates over the measured window; a run that was all warm-up is measured whole.
    warm = history.at_warmup_end if timer.measured_steps else {"env_steps": 0, "updates": 0, "episodes": 0}
    window = Window(timing["wall_s"] if timing["wall_s"] > 0 else wall, p.env_steps - warm["env_steps"],
                    p.updates - warm["updates"], p.episodes - warm["episodes"])
    replay = ReplayBuffer.estimate_nbytes(capacity or cfg.buffer.capacity, obs_shape)
    return build_record(
        cfg=cfg, device=device, run_dir=run_dir, history=history, kind=kind, status=status,
        progress=p, timing=timing, window=window, wall_s=wall,
        phases={name: timing["phases"][name] for name in PHASES if name in timing["phases"]},
        episode_length=p.episode_steps / p.episodes if p.episodes else None, rss_scope=rss_scope,
        score_resolution=score_resolution(cfg, device),
        env=env_plan, update=update, memory={"replay_mb": replay / 2**20}, checkpoint=checkpoint, error=error)


def score_resolution(cfg: Config, device: torch.device) -> str:
    """How often a sync run checks its time to score: where :func:`rlperf.dqn.run_loop` reads
    finished episodes (every step on the CPU, every log interval elsewhere)."""
    if device.type == "cpu":
        return f"every vector step ({cfg.env.num_envs} env steps)"
    return f"every log interval (train.log_every = {cfg.train.log_every} vector steps)"


def weights_finite(agent: Agent) -> bool:
    """Whether every Q-network weight is finite (one host read)."""
    return bool(torch.stack([torch.isfinite(p).all() for p in agent.q.parameters()]).all())
