"""Checkpoints and resume: what a run saves, when, and what a resume may change.

``checkpoint.pt`` holds everything a resume needs (model, target, optimizer, replay contents and
cursor, env state, every generator, counters, ε, the loss accumulator, phase statistics and the
run's history), and a SHA-256 digest of all of it (:func:`state_digest`: every tensor's bytes,
dtype and shape, every other value) under ``digest``. :class:`CheckpointWriter` writes it
atomically and decides when the next periodic one is due; both run modes use it.

:func:`resume_config` and :func:`load_checkpoint` check, before anything is built or written, that
a resume continues the same computation: the digest matches (a damaged file is refused, however
well it still unpickles), the counters and fields have their types and ranges, only
:data:`RESUMABLE_KEYS` may differ, the device type must match, and ``metrics.csv`` is this run's.
:func:`reached_stop` tells a finished run apart: one whose record was never written (killed between
its final checkpoint and ``run.json``) gets the record from its checkpoint instead of training.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import math
import random
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from pydantic import ValidationError

from rlperf.config import Config, config_from, config_to_dict, flat_keys, load_config
from rlperf.errors import RlperfError
from rlperf.atomic import save_torch_atomic, write_bytes_atomic
from rlperf.run.files import CHECKPOINT_NAME, CONFIG_NAME, METRICS_NAME, RECORD_NAME, SCHEMA, read_metrics_header, read_record
from rlperf.env.registration import ENV_ID as SNAKE_ID
from rlperf.run.record import METRICS_FIELDS, RunHistory, cumulative

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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MESSAGE_MAX = 4000
"""The longest loader message shown (torch's caution about a refused pickle is about 900 characters)."""


def load_checkpoint(run_dir: Path, cfg: Config, device: torch.device) -> dict[str, Any]:
    """Read ``run_dir``'s checkpoint and check that it is whole and that ``cfg`` on ``device`` can
    continue it (whether its stop condition lies ahead is :func:`reached_stop`'s question)."""
    path = run_dir / CHECKPOINT_NAME
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        # torch's whole message, on one line: for a file it refuses (a pickled object, possibly code)
        # it says what loading it anyway would risk, and that must not be cut (it bolds one clause
        # with terminal escapes; those are dropped).
        text = " ".join(_ANSI.sub("", str(exc)).split())[:MESSAGE_MAX] or type(exc).__name__
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
    if state.get("mode") == "async":
        raise RlperfError(f"{path} is an async run's checkpoint (weights only)", hint="start a new async run")
    missing = [k for k in ("config", "agent", "buffer", "env", "progress", "timer", "rng", "run") if k not in state]
    if missing:
        raise RlperfError(
            f"checkpoint {path} lacks {', '.join(missing)}", hint="it was written by an older rlperf; start a new run"
        )
    check_digest(state, path)
    try:
        saved_cfg = Config.model_validate(state["config"])
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise RlperfError(
            f"checkpoint {path} holds a config this rlperf cannot read ({'.'.join(map(str, first['loc']))}: {first['msg']})",
            hint="resume it with the rlperf version that wrote it",
        ) from None
    check_fields(state, saved_cfg, path)
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
    read_metrics_header(run_dir / METRICS_NAME, METRICS_FIELDS)  # a foreign or damaged curve: refused now
    check_curve(run_dir, state)
    return state


def check_curve(run_dir: Path, state: dict[str, Any]) -> None:
    """Refuse a resume whose ``metrics.csv`` lacks rows the run wrote before its checkpoint (the file
    was cut short or edited): appending to it would leave a gap in the learning curve, silently.
    The checkpoint's history notes every log row's env step (thinned, the latest always kept)."""
    noted = [cumulative(row)["env_steps"] for row in state["run"].get("intervals") or []]
    if not noted:
        return
    path = run_dir / METRICS_NAME
    rows = _curve_env_steps(path, state["progress"]["vector_steps"])
    if rows is None:
        return
    have = set(rows)
    lost = [steps for steps in noted if steps not in have]
    if lost:
        last = f"ends at env step {max(have)}" if have else "has no rows"
        raise RlperfError(
            f"--resume {run_dir}: {path.name} {last}, but the run logged a row at env step {lost[0]}"
            + (f" and {len(lost) - 1} more that are not there" if len(lost) > 1 else " that is not there")
            + "; the resumed learning curve would have a gap",
            hint=f"restore {path.name} from a copy, or start a new run")


def _curve_env_steps(path: Path, vector_steps: int) -> list[int] | None:
    """The env steps of the whole rows of ``metrics.csv`` up to ``vector_steps`` (none if it is missing;
    None if its columns do not say)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise RlperfError(f"cannot read {path}: {e.strerror or e}") from None
    lines = text.splitlines(keepends=True)
    rows = csv.reader(line for line in lines if line.endswith("\n"))
    header = next(rows, None)
    if header is None:  # empty, or its header cut short: no row survived
        return []
    if "env_steps" not in header or "vector_steps" not in header:
        return None
    env_col, step_col = header.index("env_steps"), header.index("vector_steps")
    steps = []
    for row in rows:
        with contextlib.suppress(ValueError, IndexError):
            if int(row[step_col]) <= vector_steps:
                steps.append(int(row[env_col]))
    return steps


def finish_row(history: RunHistory, progress: Progress, log_every: int) -> bool:
    """Whether the run's last log row is the one a completed run writes at its last step when that
    step is not a log boundary. A resume that extends the run drops that row (with its interval): the
    run goes on, and its curve is then the one an uninterrupted run writes."""
    last = history.intervals[-1] if history.intervals else None
    return last is not None and last["env_steps"] == progress.env_steps and progress.vector_steps % log_every != 0


def reached_stop(progress: dict[str, Any], cfg: Config) -> str | None:
    """``"train.steps=N (M done)"`` when ``progress`` has reached ``cfg``'s stop condition, else None."""
    t = cfg.train
    if t.episodes > 0 and progress["episodes"] >= t.episodes:
        return f"train.episodes={t.episodes} ({progress['episodes']} done)"
    if t.steps > 0 and progress["env_steps"] >= t.steps:
        return f"train.steps={t.steps} ({progress['env_steps']} done)"
    return None


def unrecorded_finish(run_dir: Path, state: dict[str, Any]) -> bool:
    """Whether the checkpoint is a finished run's (its own config's stop condition reached) whose
    ``run.json`` is missing or older: the process was killed between the two final writes."""
    saved_cfg = Config.model_validate(state["config"])
    if reached_stop(state["progress"], saved_cfg) is None:
        return False
    if not (run_dir / RECORD_NAME).exists():
        return True
    record = read_record(run_dir)
    described = (record.get("checkpoint") or {}).get("env_steps")
    return not (record.get("status") == "completed" and described == state["progress"]["env_steps"])


# -- integrity ----------------------------------------------------------------------------------


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 over everything in a checkpoint but its ``digest``: keys, every tensor's dtype, shape
    and bytes, every other value. Damage that still unpickles (a flipped bit inside a tensor)
    changes it."""
    h = hashlib.sha256()
    _digest_into(h, {k: v for k, v in state.items() if k != "digest"})
    return h.hexdigest()


def _digest_into(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _digest_into(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__[0]}{len(value)}".encode())
        for item in value:
            _digest_into(h, item)
    else:  # None, bool, int, float, str, bytes
        h.update(f"{type(value).__name__}:{value!r};".encode())


def with_digest(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its ``digest`` (what :func:`check_digest` checks on load)."""
    return {**state, "digest": {"algorithm": "sha256", "value": state_digest(state)}}


def check_digest(state: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose contents do not match the digest it was written with."""
    digest = state.get("digest")
    if not isinstance(digest, dict) or digest.get("algorithm") != "sha256" or not isinstance(digest.get("value"), str):
        raise RlperfError(f"checkpoint {path} has no digest to check it against",
                          hint="it was written by an older rlperf or edited by hand; start a new run")
    if state_digest(state) != digest["value"]:
        raise RlperfError(f"checkpoint {path} is damaged: its contents do not match the digest it was written with",
                          hint="restore it from a copy, or start a new run")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _count(x: Any) -> bool:
    return _is_int(x) and x >= 0


def _seconds(x: Any) -> bool:
    return _is_number(x) and 0 <= x < math.inf


def _device(x: Any) -> bool:
    if not isinstance(x, str):
        return False
    try:
        torch.device(x)
    except (RuntimeError, ValueError):
        return False
    return True


_WARM_KEYS = ("env_steps", "updates", "episodes")
_FIELDS: tuple[tuple[str, Any, str], ...] = (
    # (section.key, check, what it must be)
    *((f"progress.{k}", _count, "an integer >= 0")
      for k in ("vector_steps", "env_steps", "updates", "episodes", "best_score", "episode_steps", "loss_count")),
    ("progress.epsilon", lambda x: _is_number(x) and 0 <= x <= 1, "a number in [0, 1]"),
    ("progress.owed_updates", _seconds, "a number >= 0"),
    ("progress.last_loss", _is_number, "a number"),
    ("progress.status", lambda x: isinstance(x, str), "a string"),
    *((f"progress.{k}", lambda x: isinstance(x, list) and all(_is_number(v) for v in x), "a list of numbers")
      for k in ("scores", "returns")),
    ("progress.loss_sum", lambda x: x is None or isinstance(x, torch.Tensor), "a tensor or None"),
    ("agent.updates", _count, "an integer >= 0"),
    ("run.started_at", lambda x: isinstance(x, str), "a string"),
    ("run.device", _device, "a device such as cpu or cuda:0"),
    ("run.command", lambda x: isinstance(x, list) and all(isinstance(a, str) for a in x), "a list of strings"),
    ("run.wall_s", _seconds, "a number of seconds >= 0"),
    ("run.resumed", lambda x: isinstance(x, list) and all(isinstance(v, dict) for v in x), "a list of tables"),
    ("run.at_warmup_end", lambda x: isinstance(x, dict) and all(_count(x.get(k)) for k in _WARM_KEYS),
     "a table of env_steps, updates and episodes >= 0"),
    ("timer.steps", _count, "an integer >= 0"),
    ("timer.wall_s", _seconds, "a number of seconds >= 0"),
    ("timer.phases", lambda x: isinstance(x, dict), "a table"),
)
_MISSING = object()


def check_fields(state: dict[str, Any], cfg: Config, path: Path) -> None:
    """The counters and fields a resume reads, with their types and ranges: one line for the first
    that is wrong (a checkpoint edited by hand, or written by a different program)."""
    from rlperf.dqn import Progress

    def bad(field: str, value: Any, want: str) -> RlperfError:
        shown = "missing" if value is _MISSING else f"= {value!r}" if len(repr(value)) <= 40 else f"= {repr(value)[:37]}..."
        return RlperfError(f"checkpoint {path} has {field} {shown}, expected {want}",
                           hint="the checkpoint was changed after rlperf wrote it; start a new run")

    for section in ("progress", "run", "timer", "agent", "buffer", "rng"):
        if not isinstance(state[section], dict):
            raise bad(section, state[section], "a table")
    for field, check, want in _FIELDS:
        section, key = field.split(".")
        value = state[section].get(key, _MISSING)
        if value is _MISSING or not check(value):
            raise bad(field, value, want)
    for section, known in (("progress", set(Progress.__dataclass_fields__)), ("run", set(RunHistory.__dataclass_fields__))):
        unknown = sorted(set(state[section]) - known)
        if unknown:
            raise bad(f"{section}.{unknown[0]}", state[section][unknown[0]], "no such key")
    p = state["progress"]
    if p["env_steps"] != p["vector_steps"] * cfg.env.num_envs:
        raise bad("progress.env_steps", p["env_steps"],
                  f"vector_steps x env.num_envs = {p['vector_steps']} x {cfg.env.num_envs}")
    if state["agent"]["updates"] != p["updates"]:
        raise bad("agent.updates", state["agent"]["updates"], f"progress.updates ({p['updates']})")


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


def tidy_for_resume(run_dir: Path, vector_steps: int, finished_row: bool = False) -> None:
    """Drop what a killed process left after its checkpoint: temp files and later metrics rows;
    with ``finished_row`` (:func:`finish_row`) the completed run's last row too, at ``vector_steps``.

    The header was checked by :func:`load_checkpoint`; rows that do not parse (torn, or bytes that
    are not UTF-8) are dropped with the rows after the checkpoint.
    """
    last_kept = vector_steps - 1 if finished_row else vector_steps
    for tmp in run_dir.glob(".*.tmp"):  # from atomic writes cut short; the run is locked, so none is live
        with contextlib.suppress(OSError):
            tmp.unlink()
    path = run_dir / METRICS_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.splitlines(keepends=True)
    if not lines:
        return
    try:
        header = next(csv.reader([lines[0].decode("utf-8")]))
    except (UnicodeDecodeError, StopIteration):
        return  # read_metrics_header refuses it with one line
    if "vector_steps" not in header:
        return
    column = header.index("vector_steps")

    def keep(line: bytes) -> bool:
        if not line.endswith(b"\n"):
            return False  # a torn last row
        try:
            return int(next(csv.reader([line.decode("utf-8")]))[column]) <= last_kept
        except (ValueError, IndexError, StopIteration, UnicodeDecodeError):
            return False

    kept = [lines[0]] + [line for line in lines[1:] if keep(line)]
    if len(kept) != len(lines):
        write_bytes_atomic(path, b"".join(kept))


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
        save_torch_atomic(self.path, with_digest(state))
        self.written_at = time.perf_counter()
        self.cost_s = self.written_at - t0
        self.env_steps, self.vector_steps = progress.env_steps, progress.vector_steps

    def describe(self) -> dict[str, Any] | None:
        if self.env_steps is None:
            return None
        return {"file": CHECKPOINT_NAME, "env_steps": self.env_steps, "vector_steps": self.vector_steps}
