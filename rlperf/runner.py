"""One training run from a validated config to a run directory with its record.

``train_run`` is what ``rlperf train`` (and ``profile``, ``sweep``, ``compare``) call: it checks
the knobs, builds the env, buffer and agent, runs :func:`rlperf.dqn.run_loop`, and writes
``run.json``, ``metrics.csv``, ``config.toml`` and ``checkpoint.pt`` atomically. SIGINT and
SIGTERM stop the loop at the next vector-step boundary and the run is saved as ``interrupted``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlperf.backends import make_env
from rlperf.buffer import ReplayBuffer
from rlperf.config import Config, config_to_dict, to_toml
from rlperf.dashboard import Dashboard
from rlperf.device import resolve_device, synchronize
from rlperf.dqn import Agent, Progress, check_knobs, run_loop
from rlperf.errors import RlperfError
from rlperf.records import SCHEMA, MetricsCSV, make_run_dir, peak_cuda_mb, peak_rss_mb, save_torch_atomic, system_info, write_json_atomic, write_text_atomic
from rlperf.snake import observation_shape
from rlperf.timers import PHASES, PhaseTimer

METRICS_FIELDS = (
    "vector_steps", "env_steps", "episodes", "updates", "wall_s", "mean_score_100", "mean_return_100",
    "best_score", "epsilon", "loss", "env_steps_per_s",
)
EXIT_CODES = {"completed": 0, "interrupted": 130, "diverged": 1, "failed": 1}


@dataclass
class RunResult:
    """What a run leaves behind: its directory, its record and the process exit code."""

    run_dir: Path
    record: dict[str, Any]
    exit_code: int


@dataclass
class RunHooks:
    """Optional instruments around the loop (used by ``rlperf profile``)."""

    around_loop: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    on_step: Callable[[], None] | None = None
    annotate_phases: bool = False
    extra_record: dict[str, Any] = field(default_factory=dict)


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks at each vector-step boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        def handler(signum: int, frame: Any) -> None:
            if self.signum is None:
                self.signum = signum
            # A second signal during the final write is ignored: the write finishes cleanly.

        if threading_main():
            previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)
        else:  # signal handlers can only be installed from the main thread (e.g. Ray workers)
            yield


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def prepare(cfg: Config) -> torch.device:
    """Resolve the device, apply thread settings and refuse knobs that cannot apply."""
    device = resolve_device(cfg.run.device)
    check_knobs(cfg, device)
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(cfg.run.threads)
    return device


def train_run(
    cfg: Config,
    out: str | Path = "runs",
    name: str | None = None,
    command: list[str] | None = None,
    quiet: bool = False,
    dashboard: bool = True,
    kind: str = "train",
    hooks: RunHooks | None = None,
) -> RunResult:
    """Train with ``cfg`` and write a new run directory under ``out``. Raises RlperfError on bad input."""
    hooks = hooks or RunHooks()
    if cfg.run.mode == "async":
        from rlperf.actor_learner import async_run

        return async_run(cfg, out=out, name=name, command=command, quiet=quiet, dashboard=dashboard, kind=kind)
    device = prepare(cfg)
    seed_everything(cfg.run.seed)
    e = cfg.env
    obs_shape = observation_shape(e.size, e.obs, e.flood_fill)
    env = make_env(e.backend, e.num_envs, device, size=e.size, obs=e.obs, flood_fill=e.flood_fill,
                   initial_length=e.initial_length, hunger=e.hunger or None)
    try:
        buffer = ReplayBuffer(cfg.buffer.capacity, obs_shape, device, storage=cfg.buffer.storage, seed=cfg.run.seed)
        agent = Agent(cfg, obs_shape, device)
        run_dir = make_run_dir(out, name, prefix=kind)  # only once everything was accepted
        return _run(cfg, env, buffer, agent, device, run_dir, command, quiet, dashboard, kind, hooks)
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()


def _run(cfg: Config, env: Any, buffer: ReplayBuffer, agent: Agent, device: torch.device, run_dir: Path,
         command: list[str] | None, quiet: bool, show: bool, kind: str, hooks: RunHooks) -> RunResult:
    t = cfg.train
    write_text_atomic(run_dir / "config.toml", to_toml(cfg))
    metrics = MetricsCSV(run_dir / "metrics.csv", METRICS_FIELDS)
    tb = _tensorboard(run_dir) if t.tensorboard else None
    timer = PhaseTimer(device, mode=cfg.run.timing, warmup_steps=t.warmup_steps, annotate=hooks.annotate_phases)
    progress = Progress()
    stop = StopSignal()
    started = time.perf_counter()
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    at_warmup_end: dict[str, int] = {"env_steps": 0, "updates": 0, "episodes": 0}
    total, unit = (t.episodes, "episodes") if t.episodes > 0 else (t.steps, "env steps")
    board = Dashboard(total, unit, enabled=show and not quiet)

    def on_step() -> None:
        if timer.steps == timer.warmup_steps:
            at_warmup_end.update(env_steps=progress.env_steps, updates=progress.updates, episodes=progress.episodes)
        if hooks.on_step is not None:
            hooks.on_step()

    def on_log(p: Progress) -> None:
        wall = time.perf_counter() - started
        rate = p.env_steps / wall if wall > 0 else 0.0
        row = dict(vector_steps=p.vector_steps, env_steps=p.env_steps, episodes=p.episodes, updates=p.updates,
                   wall_s=round(wall, 4), mean_score_100=p.mean_score, mean_return_100=p.mean_return,
                   best_score=p.best_score, epsilon=p.epsilon, loss=p.last_loss, env_steps_per_s=rate)
        metrics.write(row)
        if tb is not None:
            for key in ("mean_score_100", "mean_return_100", "epsilon", "loss", "env_steps_per_s"):
                tb.add_scalar(f"rlperf/{key}", row[key], p.env_steps)
        if board.enabled:
            done = p.episodes if unit == "episodes" else p.env_steps
            shares = {name: s.share for name, s in timer.stats().items()} if board.live_mode or wall > 5 else None
            board.update(done, {"episodes": p.episodes, "env_steps_per_s": rate, "updates_per_s": p.updates / wall if wall else 0.0,
                                "mean_score": p.mean_score, "epsilon": p.epsilon, "loss": p.last_loss}, shares)

    obs, _ = env.reset(seed=cfg.run.seed)
    status = "completed"
    error: str | None = None
    try:
        with stop.installed(), board, hooks.around_loop():
            obs = run_loop(cfg, env, agent, buffer, timer, progress, obs, on_log, should_stop=stop, on_step=on_step)
        synchronize(device)
        if progress.status == "diverged":
            status = "diverged"
        elif stop():
            status = "interrupted"
    except torch.OutOfMemoryError as exc:
        status, error = "failed", f"out of memory: {str(exc).splitlines()[0]}"
    wall = time.perf_counter() - started
    metrics.close()
    if tb is not None:
        tb.close()

    record = build_record(cfg, device, run_dir, command, kind, status, progress, timer, buffer, wall, started_at, at_warmup_end)
    if error:
        record["error"] = error
    record.update(hooks.extra_record)
    # A diverged run keeps its last good checkpoint: the diverged weights are not saved over it.
    if t.checkpoint and status != "diverged":
        save_torch_atomic(run_dir / "checkpoint.pt", checkpoint_state(cfg, env, agent, buffer, timer, progress, obs))
        record["files"]["checkpoint"] = "checkpoint.pt"
    write_json_atomic(run_dir / "run.json", record)
    code = EXIT_CODES[status]
    if status == "interrupted" and stop.signum == signal.SIGTERM:
        code = 143
    return RunResult(run_dir, record, code)


def _tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RlperfError("--tensorboard needs the tensorboard package", hint="pip install 'rlperf[tb]'") from None
    return SummaryWriter(log_dir=str(run_dir / "tb"))


def checkpoint_state(cfg: Config, env: Any, agent: Agent, buffer: ReplayBuffer, timer: PhaseTimer, progress: Progress, obs: torch.Tensor) -> dict[str, Any]:
    """Everything a resume needs: model, target, optimizer, replay, env, RNGs, counters, timings."""
    env_state = env.state_dict() if cfg.env.backend == "tensor" else None
    if env_state is not None:
        env_state["obs"] = obs.detach().cpu().clone()
    return {
        "schema": SCHEMA,
        "config": config_to_dict(cfg),
        "agent": agent.state_dict(),
        "buffer": buffer.state_dict(),
        "env": env_state,
        "progress": progress.state_dict(),
        "timer": timer.state_dict(),
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
    }


def build_record(cfg: Config, device: torch.device, run_dir: Path, command: list[str] | None, kind: str, status: str,
                 p: Progress, timer: PhaseTimer, buffer: ReplayBuffer, wall: float, started_at: str,
                 at_warmup_end: dict[str, int]) -> dict[str, Any]:
    """The run record (DESIGN §4): evidence that ``compare`` and ``sweep`` read back."""
    timing = timer.to_dict()
    measured_wall = timing["wall_s"] if timing["wall_s"] > 0 else wall
    measured = {k: getattr(p, k) - at_warmup_end[k] for k in at_warmup_end} if timer.measured_steps else \
        {"env_steps": p.env_steps, "updates": p.updates, "episodes": p.episodes}
    env_rate = measured["env_steps"] / measured_wall if measured_wall > 0 else 0.0
    episode_rate = measured["episodes"] / measured_wall if measured_wall > 0 else 0.0
    phases = {name: timing["phases"][name] for name in PHASES if name in timing["phases"]}
    return {
        "schema": SCHEMA,
        "kind": kind,
        "name": run_dir.name,
        "run_dir": str(run_dir),
        "status": status,
        "command": command or sys.argv,
        "started_at": started_at,
        "config": config_to_dict(cfg),
        "system": system_info(device),
        "timing": {"mode": timing["mode"], "warmup_steps": timing["warmup_steps"], "warmup_s": timing["warmup_s"],
                   "measured_steps": timing["measured_steps"], "measured_wall_s": measured_wall},
        "totals": {"episodes": p.episodes, "env_steps": p.env_steps, "vector_steps": p.vector_steps,
                   "updates": p.updates, "wall_s": wall, "warmup_s": timing["warmup_s"]},
        "throughput": {
            "env_steps_per_s": env_rate,
            "updates_per_s": measured["updates"] / measured_wall if measured_wall > 0 else 0.0,
            "episodes_per_s": episode_rate,
            "s_per_1000_episodes": 1000.0 / episode_rate if episode_rate > 0 else None,
            "replay_ratio": p.updates * cfg.buffer.batch_size * cfg.train.grad_accum / max(p.env_steps, 1),
        },
        "phases": phases,
        "learning": {
            "mean_score_last_100": _finite(p.mean_score),
            "mean_return_last_100": _finite(p.mean_return),
            "best_score": p.best_score,
            "mean_episode_length": p.episode_steps / p.episodes if p.episodes else None,
            "final_epsilon": p.epsilon,
            "last_loss": _finite(p.last_loss),
        },
        "memory": {"peak_rss_mb": peak_rss_mb(), "peak_cuda_mb": peak_cuda_mb(device),
                   "replay_mb": ReplayBuffer.estimate_nbytes(buffer.capacity, buffer.obs_shape) / 2**20},
        "files": {"record": "run.json", "metrics": "metrics.csv", "config": "config.toml"},
    }


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None
