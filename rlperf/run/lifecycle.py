"""One training run from a validated config to a run directory with its record.

``train_run`` is what ``rlperf train`` (and ``profile``, ``sweep``, ``compare``) call: it checks
the knobs and the memory the run will need, builds the env, buffer and agent, runs
:func:`rlperf.dqn.run_loop`, and writes ``run.json``, ``metrics.csv``, ``config.toml`` and
``checkpoint.pt`` atomically (DESIGN §4, §7). The lifecycle:

- **Signals.** SIGINT and SIGTERM stop the loop at the next vector-step boundary; the checkpoint
  and the record are written with ``status: interrupted`` and the exit code is 130 / 143. The
  handlers stay installed through the final write, so a second Ctrl-C cannot tear it. A signal
  that arrives before the run directory exists ends the command with nothing written.
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
  checkpoint: model, target network, optimizer, replay contents and cursor, env state, every
  generator (env, agent, replay, global torch/CUDA/numpy/Python), counters, ε, loss accumulator,
  phase statistics and learning history. ``metrics.csv`` is appended (rows written after the
  checkpoint, by a run that was killed, are dropped first), ``config.toml``, ``checkpoint.pt``
  and ``run.json`` are replaced, and the record lists each resume under ``resumed``. Only the
  keys in :data:`RESUMABLE_KEYS` may differ from the checkpoint's config (they do not change what
  the run computes); on the CPU a resumed run reproduces the uninterrupted run exactly.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from rlperf.env.backends import make_env
from rlperf.buffer import ReplayBuffer, available_memory
from rlperf.config import Config, config_from, config_to_dict, flat_keys, load_config, to_toml
from rlperf.report.dashboard import Dashboard
from rlperf.device import resolve_device, synchronize
from rlperf.dqn import Agent, Progress, check_knobs, run_loop, stop_reached
from rlperf.errors import RlperfError
from rlperf.run.files import (
    RECORD_NAME,
    SCHEMA,
    MetricsCSV,
    make_run_dir,
    peak_cuda_mb,
    peak_rss_mb,
    read_record,
    save_torch_atomic,
    system_info,
    write_json_atomic,
    write_text_atomic,
)
from rlperf.env.vector import observation_shape
from rlperf.timers import PHASES, PhaseTimer

METRICS_FIELDS = (
    "vector_steps", "env_steps", "episodes", "updates", "wall_s", "mean_score_100", "mean_return_100",
    "best_score", "epsilon", "loss", "env_steps_per_s",
)
EXIT_CODES = {"completed": 0, "interrupted": 130, "diverged": 1, "failed": 1}


def exit_code(status: str, signum: int | None = None) -> int:
    """The process exit code for a run that ended with ``status`` (143 for an interruption by SIGTERM)."""
    if status == "interrupted" and signum == signal.SIGTERM:
        return 143
    return EXIT_CODES.get(status, 1)
CHECKPOINT_NAME = "checkpoint.pt"
CONFIG_NAME = "config.toml"
METRICS_NAME = "metrics.csv"

CHECKPOINT_MIN_INTERVAL_S = 60.0
"""Least wall time between two periodic checkpoints."""
CHECKPOINT_MAX_OVERHEAD = 0.02
"""Periodic checkpoints are spaced so that writing them takes at most this share of the run."""

RESUMABLE_KEYS = frozenset({
    "train.episodes", "train.steps",  # extend (or shorten) the stop condition
    "train.log_every", "train.checkpoint", "train.tensorboard",  # what is written, not what is computed
    "train.gc", "run.threads", "run.timing",  # how fast it runs and how it is timed
    "run.device",  # "auto" vs "cpu" naming the same device; the device type itself is checked
})
"""Config keys that may differ between a run and its resume. Every other key shapes what the run
computes (or the shape of its state), so changing it on resume is refused."""

# Share of the free memory kept for everything the estimate does not count.
_MEMORY_HEADROOM = 0.10


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


@dataclass
class RunHistory:
    """What a run carries across resumes (saved in the checkpoint under ``run``)."""

    started_at: str
    command: list[str]
    device: str
    wall_s: float = 0.0  # wall seconds of the segments before this one
    resumed: list[dict[str, Any]] = field(default_factory=list)
    at_warmup_end: dict[str, int] = field(default_factory=lambda: {"env_steps": 0, "updates": 0, "episodes": 0})


class RunInterrupted(RlperfError):
    """A signal arrived before the run directory existed: the command ends, nothing written."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name} before the run started; nothing was written")
        self.exit_code = 128 + signum


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
            # Later signals are ignored: the final checkpoint and record are written in full.

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
    if cfg.train.tensorboard:
        _require_tensorboard()
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(cfg.run.threads)
    return device


def _restore_threads(torch_threads: int, omp: str | None, mkl: str | None) -> None:
    torch.set_num_threads(torch_threads)
    for key, value in (("OMP_NUM_THREADS", omp), ("MKL_NUM_THREADS", mkl)):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
) -> RunResult:
    """Train with ``cfg`` and write a new run directory under ``out``, or continue ``resume``.

    With ``resume`` (a run directory) the run continues in that directory and ``out``/``name``
    are not used; build ``cfg`` with :func:`resume_config`. Raises RlperfError on bad input, in
    which case nothing was written.
    """
    hooks = hooks or RunHooks()
    if cfg.run.mode == "async":
        if resume is not None:
            raise RlperfError("--resume works for run.mode=sync runs only", hint="start a new async run")
        from rlperf.run.learner import async_run

        return async_run(cfg, out=out, name=name, command=command, quiet=quiet, dashboard=dashboard, kind=kind)
    stop = StopSignal()
    lock: list[int] = []
    threads = (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"))
    try:
        with stop.installed():
            return _train(cfg, out, name, command, quiet, dashboard, kind, hooks, resume, stop, lock)
    finally:
        for fd in lock:
            os.close(fd)  # releases the run directory's lock
        _restore_threads(*threads)  # run.threads is this run's setting, not the process's from now on


def _train(cfg: Config, out: str | Path, name: str | None, command: list[str] | None, quiet: bool, show: bool,
           kind: str, hooks: RunHooks, resume: str | Path | None, stop: StopSignal, lock: list[int]) -> RunResult:
    device = prepare(cfg)
    e = cfg.env
    obs_shape = observation_shape(e.size, e.obs, e.flood_fill)
    saved: dict[str, Any] | None = None
    if resume is not None:
        run_dir = check_run_dir(resume)
        lock.append(_lock_run_dir(run_dir))
        saved = load_checkpoint(run_dir, cfg, device)
    check_memory(cfg, obs_shape, device)
    seed_everything(cfg.run.seed)
    with _refusing_oom("the env", f"env.num_envs={e.num_envs}", "lower env.num_envs"):
        env = make_env(e.backend, e.num_envs, device, size=e.size, obs=e.obs, flood_fill=e.flood_fill,
                       initial_length=e.initial_length, hunger=e.hunger or None, kernel=e.kernel)
    try:
        buffer = ReplayBuffer(cfg.buffer.capacity, obs_shape, device, storage=cfg.buffer.storage, seed=cfg.run.seed)
        with _refusing_oom("the Q-network", f"agent.hidden={list(cfg.agent.hidden)}", "use narrower agent.hidden"):
            agent = Agent(cfg, obs_shape, device)
        timer = PhaseTimer(device, mode=cfg.run.timing, warmup_steps=cfg.train.warmup_steps, annotate=hooks.annotate_phases)
        progress = Progress()
        if saved is not None:
            history = _restore(saved, run_dir, env, agent, buffer, timer, progress)
            history.resumed.append({
                "from_env_steps": progress.env_steps, "from_vector_steps": progress.vector_steps,
                "at": _now(), "command": list(command or sys.argv),
            })
        else:
            history = RunHistory(started_at=_now(), command=list(command or sys.argv), device=str(device))
        if stop.signum is not None:
            raise RunInterrupted(stop.signum)
        if saved is None:
            run_dir = make_run_dir(out, name, prefix=kind)  # only once everything was accepted
            lock.append(_lock_run_dir(run_dir))
        else:
            _tidy_for_resume(run_dir, progress.vector_steps)
        return _run(cfg, env, buffer, agent, device, run_dir, kind, quiet, show, hooks, stop, timer, progress,
                    history, resumed=saved is not None)
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()


def _run(cfg: Config, env: Any, buffer: ReplayBuffer, agent: Agent, device: torch.device, run_dir: Path, kind: str,
         quiet: bool, show: bool, hooks: RunHooks, stop: StopSignal, timer: PhaseTimer, progress: Progress,
         history: RunHistory, resumed: bool) -> RunResult:
    t = cfg.train
    write_text_atomic(run_dir / CONFIG_NAME, to_toml(cfg))
    metrics = MetricsCSV(run_dir / METRICS_NAME, METRICS_FIELDS)
    tb = _tensorboard(run_dir) if t.tensorboard else None
    started = time.perf_counter()
    checkpoints = _Checkpoints(run_dir / CHECKPOINT_NAME, progress if resumed else None)
    total, unit = (t.episodes, "episodes") if t.episodes > 0 else (t.steps, "env steps")
    board = Dashboard(total, unit, enabled=show and not quiet)

    def state() -> dict[str, Any]:
        snapshot = checkpoint_state(cfg, env, agent, buffer, timer, progress, history)
        snapshot["run"]["wall_s"] = history.wall_s + (time.perf_counter() - started)
        return snapshot

    def on_step() -> None:
        if timer.steps == timer.warmup_steps:
            history.at_warmup_end.update(env_steps=progress.env_steps, updates=progress.updates, episodes=progress.episodes)
        if hooks.on_step is not None:
            hooks.on_step()
        if (t.checkpoint and progress.vector_steps % t.log_every == 0 and progress.status == "running"
                and not stop() and not stop_reached(cfg, progress) and checkpoints.due()):
            with timer.phase("log"):
                if weights_finite(agent):
                    checkpoints.write(state(), progress)
                else:  # a finite mean loss can still leave the last update's weights at inf/NaN
                    progress.status = "diverged"

    def on_log(p: Progress) -> None:
        wall = history.wall_s + (time.perf_counter() - started)
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
            shares = timer.shares if board.live_mode or wall > 5 else None
            board.update(done, {"episodes": p.episodes, "env_steps_per_s": rate, "updates_per_s": p.updates / wall if wall else 0.0,
                                "mean_score": p.mean_score, "epsilon": p.epsilon, "loss": p.last_loss}, shares)

    obs = env.observations if resumed else env.reset(seed=cfg.run.seed)[0]
    status = "completed"
    error: str | None = None
    failure: BaseException | None = None
    try:
        with board, hooks.around_loop():
            run_loop(cfg, env, agent, buffer, timer, progress, obs, on_log, should_stop=stop, on_step=on_step)
        synchronize(device)
        if progress.status == "diverged":
            status, error = "diverged", _divergence_message(cfg, progress, checkpoints)
        elif stop() and not stop_reached(cfg, progress):  # a signal on the last step: the run is complete
            status = "interrupted"
    except (torch.OutOfMemoryError, MemoryError) as exc:
        status, error = "failed", _oom_message(exc, device, checkpoints)
    except Exception as exc:  # a bug: keep the record of what was measured, then let it surface
        status, error, failure = "failed", f"{type(exc).__name__}: {exc}", exc
    wall = history.wall_s + (time.perf_counter() - started)
    metrics.close()
    if tb is not None:
        tb.close()

    # Only a run that stopped at a clean step boundary is checkpointed at the end: a diverged run's
    # weights are not saved over the last good checkpoint, and a failed step may be half done.
    if t.checkpoint and status in ("completed", "interrupted"):
        checkpoints.write(state(), progress)
    record = build_record(cfg, device, run_dir, history, kind, status, progress, timer, buffer, wall, checkpoints)
    record["env"] = env.kernel_info  # which env.kernel ran, and why
    if error:
        record["error"] = error
    record.update(hooks.extra_record)
    write_json_atomic(run_dir / RECORD_NAME, record)
    if failure is not None:
        raise failure
    code = EXIT_CODES[status]
    if status == "interrupted" and stop.signum == signal.SIGTERM:
        code = 143
    return RunResult(run_dir, record, code)


class _Checkpoints:
    """Writes ``checkpoint.pt`` and decides when the next periodic one is due."""

    def __init__(self, path: Path, resumed_at: Progress | None) -> None:
        self.path = path
        self.cost_s = 0.0
        # A resumed run already has a checkpoint (the one it resumed from); a new run writes its
        # first at its first log boundary, so that a run that diverges early still keeps one.
        self.written_at: float | None = time.perf_counter() if resumed_at is not None else None
        self.env_steps: int | None = resumed_at.env_steps if resumed_at is not None else None
        self.vector_steps: int | None = resumed_at.vector_steps if resumed_at is not None else None

    def due(self) -> bool:
        if self.written_at is None:
            return True
        interval = max(CHECKPOINT_MIN_INTERVAL_S, self.cost_s / CHECKPOINT_MAX_OVERHEAD)
        return time.perf_counter() - self.written_at >= interval

    def write(self, state: dict[str, Any], progress: Progress) -> None:
        t0 = time.perf_counter()
        save_torch_atomic(self.path, state)
        self.written_at = time.perf_counter()
        self.cost_s = self.written_at - t0
        self.env_steps, self.vector_steps = progress.env_steps, progress.vector_steps

    def describe(self) -> dict[str, Any] | None:
        if self.env_steps is None:
            return None
        return {"file": CHECKPOINT_NAME, "env_steps": self.env_steps, "vector_steps": self.vector_steps}


def weights_finite(agent: Agent) -> bool:
    """Whether every Q-network weight is finite (one host read)."""
    return bool(torch.stack([torch.isfinite(p).all() for p in agent.q.parameters()]).all())


def _divergence_message(cfg: Config, p: Progress, checkpoints: _Checkpoints) -> str:
    what = f"mean loss became {p.last_loss}" if not math.isfinite(p.last_loss) else "Q-network weights became non-finite"
    kept = (f"checkpoint.pt is the last good one, from env step {checkpoints.env_steps}"
            if checkpoints.env_steps is not None else "no checkpoint was written before it")
    hint = f"try an agent.lr below {cfg.agent.lr:g}" + (", and agent.grad_clip > 0" if cfg.agent.grad_clip == 0 else "")
    return f"{what} by env step {p.env_steps}; {kept} ({hint})"


def _oom_message(exc: BaseException, device: torch.device, checkpoints: _Checkpoints) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    where = f"CUDA memory on {device}" if isinstance(exc, torch.OutOfMemoryError) and device.type == "cuda" else "memory"
    kept = f"; checkpoint.pt is from env step {checkpoints.env_steps}" if checkpoints.env_steps is not None else ""
    return (f"out of {where} during the run: {first}{kept} (lower buffer.batch_size or env.num_envs, "
            f"or keep the replay on the host with buffer.storage=numpy)")


def _tensorboard(run_dir: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(run_dir / "tb"))


def _require_tensorboard() -> None:
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise RlperfError("--tensorboard needs the tensorboard package", hint="pip install 'rlperf[tb]'") from None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# -- memory --------------------------------------------------------------------------------------


def estimate_memory(cfg: Config, obs_shape: tuple[int, ...]) -> dict[str, tuple[int, str]]:
    """Bytes the run's large allocations take, by part, with the key that sizes each.

    Rough but on the safe side: the env's state and step temporaries, the networks with their
    gradients and Adam moments, one update's batch and activations, the replay buffer.
    """
    e, a, b = cfg.env, cfg.agent, cfg.buffer
    obs_numel = int(np.prod(obs_shape))
    cells = e.size * e.size
    per_board = (cells + 1) + 8 * cells + 12 * 8 + 3 * 4 * obs_numel  # occupancy, body ring, scalars, obs
    if e.flood_fill == "tensor":
        per_board += 3 * 8 * cells
    widths = list(a.hidden)
    if len(obs_shape) == 3:
        widths = [32 * cells, 64 * cells, 64 * cells, *widths]
    params, width = 0, (obs_numel if len(obs_shape) == 1 else 64 * cells)
    if len(obs_shape) == 3:
        params += obs_shape[0] * 32 * 9 + 32 * 64 * 9
    for size in list(a.hidden) + [3]:
        params += width * size + size
        width = size
    activations = 4 * sum(widths)
    return {
        "replay": (ReplayBuffer.estimate_nbytes(b.capacity, obs_shape, storage=b.storage), f"buffer.capacity={b.capacity}"),
        "model": (5 * 4 * params, f"agent.hidden={list(a.hidden)}"),  # q, grads, Adam m and v, target
        "env": (2 * e.num_envs * (per_board + activations), f"env.num_envs={e.num_envs}"),
        "batch": (b.batch_size * (2 * 4 * obs_numel + 6 * activations), f"buffer.batch_size={b.batch_size}"),
    }


_MEMORY_HINTS = {
    "replay": "lower buffer.capacity", "model": "use narrower agent.hidden",
    "env": "lower env.num_envs", "batch": "lower buffer.batch_size",
}


def check_memory(cfg: Config, obs_shape: tuple[int, ...], device: torch.device) -> None:
    """Refuse, before allocating anything, a run whose parts do not fit in the free memory."""
    from rlperf.buffer import _format_bytes as fmt

    parts = estimate_memory(cfg, obs_shape)
    on_host = cfg.buffer.storage != "tensor"
    places: dict[torch.device, list[str]] = {}
    for part in parts:
        where = torch.device("cpu") if part == "replay" and on_host else device
        places.setdefault(where, []).append(part)
    for where, names in places.items():
        needed = sum(parts[n][0] for n in names)
        free = available_memory(where)
        if needed <= free * (1 - _MEMORY_HEADROOM):
            continue
        names.sort(key=lambda n: -parts[n][0])
        detail = ", ".join(f"{n} {fmt(parts[n][0])} ({parts[n][1]})" for n in names)
        place = "host memory" if where.type == "cpu" else f"memory on {where}"
        hint = _MEMORY_HINTS[names[0]]
        if names[0] == "replay":
            rest = needed - parts["replay"][0]
            per_slot = ReplayBuffer.estimate_nbytes(1, obs_shape, storage=cfg.buffer.storage)
            hint += f" to at most {max(0, int(free * (1 - _MEMORY_HEADROOM) - rest) // per_slot)}"
        raise RlperfError(f"this run needs about {fmt(needed)} of {place} but only {fmt(free)} is free: {detail}", hint=hint)


@contextlib.contextmanager
def _refusing_oom(what: str, key: str, hint: str) -> Iterator[None]:
    """An allocation the estimate let through but the allocator refused: one line, not a traceback."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        text = str(exc).lower()
        if not (isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in text or "out of memory" in text):
            raise
        raise RlperfError(f"out of memory allocating {what} ({key}): {str(exc).strip().splitlines()[0]}", hint=hint) from None


# -- run directories and resume ------------------------------------------------------------------

_RUN_DIR_HINT = "pass a directory written by rlperf train, e.g. runs/train-20250101-120000"


def check_run_dir(path: str | Path) -> Path:
    """``path`` as a run directory that can be resumed; raises RlperfError saying what is missing."""
    run_dir = Path(path)
    if not run_dir.exists():
        raise RlperfError(f"--resume {path}: no such directory", hint=_RUN_DIR_HINT)
    if not run_dir.is_dir():
        raise RlperfError(f"--resume {path}: not a directory", hint=_RUN_DIR_HINT)
    has_config, has_checkpoint = (run_dir / CONFIG_NAME).is_file(), (run_dir / CHECKPOINT_NAME).is_file()
    if not has_config and not has_checkpoint:
        raise RlperfError(f"--resume {path}: not a run directory (no {CONFIG_NAME} or {CHECKPOINT_NAME})", hint=_RUN_DIR_HINT)
    if not has_checkpoint:
        raise RlperfError(f"--resume {path}: the run has no {CHECKPOINT_NAME} to resume from",
                          hint="it ran with train.checkpoint=false or stopped before its first checkpoint")
    if not has_config:
        raise RlperfError(f"--resume {path}: the run has no {CONFIG_NAME}", hint=_RUN_DIR_HINT)
    if (run_dir / RECORD_NAME).exists():
        read_record(run_dir)  # refuses an unreadable record or one with a newer schema
    return run_dir


def resume_config(run_dir: str | Path, overrides: list[str] | None = None, **flags: Any) -> Config:
    """The config to resume ``run_dir`` with: its ``config.toml`` plus the changes a resume allows.

    ``overrides`` and ``flags`` are those of :func:`rlperf.config.config_from`; a key outside
    :data:`RESUMABLE_KEYS` that they change is refused with one line naming it.
    """
    path = check_run_dir(run_dir) / CONFIG_NAME
    saved = load_config(path)
    cfg = config_from(path, overrides or [], **flags)
    changed = _changed_keys(flat_keys(saved), flat_keys(cfg))
    if changed:
        key, old, new = changed[0]
        raise RlperfError(f"--resume {run_dir}: {key} cannot change when resuming ({_show(old)} -> {_show(new)})",
                          hint=f"a resume may change only {', '.join(sorted(RESUMABLE_KEYS))}; start a new run to change {key}")
    return cfg


def _changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if k not in RESUMABLE_KEYS and old.get(k) != new.get(k)]


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def load_checkpoint(run_dir: Path, cfg: Config, device: torch.device) -> dict[str, Any]:
    """Read ``run_dir``'s checkpoint and check that ``cfg`` on ``device`` can continue it."""
    path = run_dir / CHECKPOINT_NAME
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise RlperfError(f"cannot read checkpoint {path}: {text}", hint="the file is damaged or was not written by rlperf") from None
    schema = state.get("schema") if isinstance(state, dict) else None
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise RlperfError(f"{path} is not an rlperf checkpoint (no schema version)", hint=_RUN_DIR_HINT)
    if schema > SCHEMA:
        raise RlperfError(f"checkpoint {path} has schema {schema}, this rlperf reads <= {SCHEMA}", hint="upgrade rlperf to resume it")
    missing = [k for k in ("config", "agent", "buffer", "env", "progress", "timer", "rng", "run") if k not in state]
    if missing:
        raise RlperfError(f"checkpoint {path} lacks {', '.join(missing)}", hint="it was written by an older rlperf; start a new run")
    try:
        saved_cfg = Config.model_validate(state["config"])
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise RlperfError(f"checkpoint {path} holds a config this rlperf cannot read ({'.'.join(map(str, first['loc']))}: {first['msg']})",
                          hint="resume it with the rlperf version that wrote it") from None
    changed = _changed_keys(flat_keys(saved_cfg), flat_keys(cfg))
    if changed:
        key, old, new = changed[0]
        raise RlperfError(f"checkpoint {path} was written with {key}={_show(old)}, this config has {_show(new)}",
                          hint=f"the config is incompatible with the checkpoint; resume with {run_dir / CONFIG_NAME} unchanged")
    if state["env"] is None:
        raise RlperfError(f"run {run_dir} used env.backend={cfg.env.backend}, whose env state cannot be saved",
                          hint="only env.backend=tensor runs can be resumed")
    saved_device = torch.device(state["run"]["device"])
    if saved_device.type != device.type:
        raise RlperfError(f"checkpoint {path} was written on {saved_device}, this run would use {device}",
                          hint=f"pass --device {saved_device.type}")
    p = state["progress"]
    t = cfg.train
    if (t.episodes > 0 and p["episodes"] >= t.episodes) or (t.steps > 0 and p["env_steps"] >= t.steps):
        reached = f"train.episodes={t.episodes} ({p['episodes']} done)" if t.episodes > 0 else f"train.steps={t.steps} ({p['env_steps']} done)"
        raise RlperfError(f"run {run_dir} already reached {reached}", hint="pass a larger --steps or --episodes to continue it")
    return state


def _restore(state: dict[str, Any], run_dir: Path, env: Any, agent: Agent, buffer: ReplayBuffer, timer: PhaseTimer,
             progress: Progress) -> RunHistory:
    """Load a checkpoint into freshly built parts; the global RNGs last, right before the loop."""
    try:
        agent.load_state_dict(state["agent"])
        buffer.load_state_dict(state["buffer"])
        env.load_state_dict(state["env"])
        progress.load_state_dict(state["progress"])
        timer.load_state_dict(state["timer"])
        history = RunHistory(**state["run"])
        set_rng_state(state["rng"])
    except RlperfError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        text = " ".join(str(exc).split())[:200]
        raise RlperfError(f"checkpoint {run_dir / CHECKPOINT_NAME} does not fit this config: {text}",
                          hint=f"resume with {run_dir / CONFIG_NAME} unchanged") from None
    return history


def _tidy_for_resume(run_dir: Path, vector_steps: int) -> None:
    """Drop what a killed process left after its checkpoint: temp files and later metrics rows."""
    for tmp in run_dir.glob(".*.tmp"):  # from atomic writes cut short; the run is locked, so none is live
        with contextlib.suppress(OSError):
            tmp.unlink()
    path = run_dir / METRICS_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    lines = text.splitlines(keepends=True)
    if not lines:
        return
    header = next(csv.reader([lines[0]]))
    if "vector_steps" not in header:
        return  # MetricsCSV refuses a foreign file with one line
    column = header.index("vector_steps")

    def keep(line: str) -> bool:
        if not line.endswith("\n"):
            return False  # a torn last row
        try:
            return int(next(csv.reader([line]))[column]) <= vector_steps
        except (ValueError, IndexError, StopIteration):
            return False

    kept = [lines[0]] + [line for line in lines[1:] if keep(line)]
    if len(kept) != len(lines):
        write_text_atomic(path, "".join(kept))


def _lock_run_dir(run_dir: Path) -> int:
    """Hold an exclusive lock on the run directory (released when the process ends, however it ends)."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RlperfError(f"run {run_dir} is in use by another rlperf process", hint="wait for it to end or stop it first") from None
    return fd


# -- checkpoint and record -----------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every global generator, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.copy()), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        # Only where CUDA is in use: asking for its generators would start a CUDA context in a CPU run.
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy(), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        saved = state["cuda"]
        torch.cuda.set_rng_state_all(saved[: torch.cuda.device_count()])


def checkpoint_state(cfg: Config, env: Any, agent: Agent, buffer: ReplayBuffer, timer: PhaseTimer, progress: Progress,
                     history: RunHistory) -> dict[str, Any]:
    """Everything a resume needs: model, target, optimizer, replay, env, RNGs, counters, timings."""
    return {
        "schema": SCHEMA,
        "config": config_to_dict(cfg),
        "agent": agent.state_dict(),
        "buffer": buffer.state_dict(),
        "env": env.state_dict() if cfg.env.backend == "tensor" else None,  # state_dict holds the current obs
        "progress": progress.state_dict(),
        "timer": timer.state_dict(),
        "rng": rng_state(),
        "run": asdict(history),
    }


def build_record(cfg: Config, device: torch.device, run_dir: Path, history: RunHistory, kind: str, status: str,
                 p: Progress, timer: PhaseTimer, buffer: ReplayBuffer, wall: float,
                 checkpoints: _Checkpoints | None = None) -> dict[str, Any]:
    """The run record (DESIGN §4): evidence that ``compare`` and ``sweep`` read back."""
    timing = timer.to_dict()
    measured_wall = timing["wall_s"] if timing["wall_s"] > 0 else wall
    at_warmup_end = history.at_warmup_end
    measured = {k: getattr(p, k) - at_warmup_end[k] for k in at_warmup_end} if timer.measured_steps else \
        {"env_steps": p.env_steps, "updates": p.updates, "episodes": p.episodes}
    env_rate = measured["env_steps"] / measured_wall if measured_wall > 0 else 0.0
    episode_rate = measured["episodes"] / measured_wall if measured_wall > 0 else 0.0
    phases = {name: timing["phases"][name] for name in PHASES if name in timing["phases"]}
    files = {"record": RECORD_NAME, "metrics": METRICS_NAME, "config": CONFIG_NAME}
    checkpoint = checkpoints.describe() if checkpoints is not None else None
    if checkpoint is not None:
        files["checkpoint"] = CHECKPOINT_NAME
    return {
        "schema": SCHEMA,
        "kind": kind,
        "name": run_dir.name,
        "run_dir": str(run_dir),
        "status": status,
        "command": history.command,
        "started_at": history.started_at,
        "resumed": history.resumed,
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
        "checkpoint": checkpoint,
        "files": files,
    }


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None
