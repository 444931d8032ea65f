"""Checkpoints and resume: what a run saves, when, and what a resume may change.

``checkpoint.pt`` holds everything a resume needs (model, target, optimizer, replay contents and
cursor, env state, every generator, counters, ε, the loss accumulator, phase statistics and the
run's history). :class:`CheckpointWriter` writes it atomically and decides when the next periodic
one is due; both run modes use it. :func:`resume_config` and :func:`load_checkpoint` check, before
anything is built, that a resume continues the same computation: only :data:`RESUMABLE_KEYS` may
differ, the device type must match, and the stop condition must lie ahead.
"""

from __future__ import annotations

import contextlib
import csv
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from pydantic import ValidationError

from rlperf.config import Config, config_from, config_to_dict, flat_keys, load_config
from rlperf.errors import RlperfError
from rlperf.run.files import (
    CHECKPOINT_NAME, CONFIG_NAME, METRICS_NAME, RECORD_NAME, SCHEMA, read_record, save_torch_atomic, write_text_atomic,
)
from rlperf.env.gym_env import SNAKE_ID
from rlperf.run.record import RunHistory

if TYPE_CHECKING:
    from rlperf.buffer import ReplayBuffer
    from rlperf.dqn import Agent, Progress
    from rlperf.timers import PhaseTimer

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
        raise RlperfError(
            f"--resume {run_dir}: {key} cannot change when resuming ({_show(old)} -> {_show(new)})",
            hint=f"a resume may change only {', '.join(sorted(RESUMABLE_KEYS))}; start a new run to change {key}",
        )
    return cfg


def _changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [
        (k, old.get(k), new.get(k))
        for k in sorted(set(old) | set(new))
        if k not in RESUMABLE_KEYS and old.get(k) != new.get(k)
    ]


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def load_checkpoint(run_dir: Path, cfg: Config, device: torch.device) -> dict[str, Any]:
    """Read ``run_dir``'s checkpoint and check that ``cfg`` on ``device`` can continue it."""
    path = run_dir / CHECKPOINT_NAME
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise RlperfError(
            f"cannot read checkpoint {path}: {text}", hint="the file is damaged or was not written by rlperf"
        ) from None
    schema = state.get("schema") if isinstance(state, dict) else None
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise RlperfError(f"{path} is not an rlperf checkpoint (no schema version)", hint=_RUN_DIR_HINT)
    if schema > SCHEMA:
        raise RlperfError(
            f"checkpoint {path} has schema {schema}, this rlperf reads <= {SCHEMA}", hint="upgrade rlperf to resume it"
        )
    missing = [k for k in ("config", "agent", "buffer", "env", "progress", "timer", "rng", "run") if k not in state]
    if missing:
        raise RlperfError(
            f"checkpoint {path} lacks {', '.join(missing)}", hint="it was written by an older rlperf; start a new run"
        )
    try:
        saved_cfg = Config.model_validate(state["config"])
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise RlperfError(
            f"checkpoint {path} holds a config this rlperf cannot read ({'.'.join(map(str, first['loc']))}: {first['msg']})",
            hint="resume it with the rlperf version that wrote it",
        ) from None
    changed = _changed_keys(flat_keys(saved_cfg), flat_keys(cfg))
    if changed:
        key, old, new = changed[0]
        raise RlperfError(
            f"checkpoint {path} was written with {key}={_show(old)}, this config has {_show(new)}",
            hint=f"the config is incompatible with the checkpoint; resume with {run_dir / CONFIG_NAME} unchanged",
        )
    if state["env"] is None:
        raise RlperfError(
            f"run {run_dir} used env.id={cfg.env.id} env.backend={cfg.env.backend}, whose env state cannot be saved",
            hint="only rlperf/Snake-v0 runs with env.backend=tensor can be resumed",
        )
    saved_device = torch.device(state["run"]["device"])
    if saved_device.type != device.type:
        raise RlperfError(
            f"checkpoint {path} was written on {saved_device}, this run would use {device}",
            hint=f"pass --device {saved_device.type}",
        )
    p = state["progress"]
    t = cfg.train
    if (t.episodes > 0 and p["episodes"] >= t.episodes) or (t.steps > 0 and p["env_steps"] >= t.steps):
        reached = (
            f"train.episodes={t.episodes} ({p['episodes']} done)"
            if t.episodes > 0
            else f"train.steps={t.steps} ({p['env_steps']} done)"
        )
        raise RlperfError(
            f"run {run_dir} already reached {reached}", hint="pass a larger --steps or --episodes to continue it"
        )
    return state


def restore(
    state: dict[str, Any], run_dir: Path, env: Any, agent: Agent, buffer: ReplayBuffer, timer: PhaseTimer, progress: Progress
) -> RunHistory:
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
        raise RlperfError(
            f"checkpoint {run_dir / CHECKPOINT_NAME} does not fit this config: {text}",
            hint=f"resume with {run_dir / CONFIG_NAME} unchanged",
        ) from None
    return history


def tidy_for_resume(run_dir: Path, vector_steps: int) -> None:
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


def rng_state() -> dict[str, Any]:
    """Every global generator, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    return {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
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


def checkpoint_state(
    cfg: Config, env: Any, agent: Agent, buffer: ReplayBuffer, timer: PhaseTimer, progress: Progress, history: RunHistory
) -> dict[str, Any]:
    """Everything a resume needs: model, target, optimizer, replay, env, RNGs, counters, timings."""
    return {
        "schema": SCHEMA,
        "config": config_to_dict(cfg),
        "agent": agent.state_dict(),
        "buffer": buffer.state_dict(),
        # state_dict holds the current obs; only the batched Snake can save its state
        "env": env.state_dict() if cfg.env.backend == "tensor" and cfg.env.id == SNAKE_ID else None,
        "progress": progress.state_dict(),
        "timer": timer.state_dict(),
        "rng": rng_state(),
        "run": asdict(history),
    }


class CheckpointWriter:
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
