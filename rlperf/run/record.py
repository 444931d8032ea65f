"""The run record (``run.json``) and the learning-curve row: one builder for sync and async runs.

A record is the unit of evidence ``compare``, ``sweep`` and the advisor read back. Both run modes
hand :func:`build_record` the same things -- the config, the run's history, its counters, its
measured window (after warm-up) and its phase statistics -- so their records have one layout and
one meaning; the async mode adds its own ``async`` section.

Memory is measured per run: the CUDA peak is reset when a run starts, and so is the peak resident
set size where Linux allows it (``/proc/self/clear_refs``), so a run in a sweep or a comparison
reports its own peak, not the process's so far. Where the reset is not possible the record says
``rss_scope: "process"`` and ``compare`` shows the figure without a ratio.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import resource
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlperf import threads
from rlperf.config import Config, config_to_dict
from rlperf.score import record_section
from rlperf.system import machine
from rlperf.run.files import CHECKPOINT_NAME, CONFIG_NAME, METRICS_NAME, RECORD_NAME, SCHEMA, MetricsCSV
from rlperf.timers import PHASES

if TYPE_CHECKING:
    from rlperf.dqn import Progress
    from rlperf.env.plan import EnvPlan

PHASE_COLUMNS = tuple(f"{name}_{what}" for name in PHASES for what in ("s", "share"))
"""``metrics.csv``'s per-phase columns: each phase's seconds in the log interval and its share of the
interval's phase time (in an async run, of the learner's time, waiting for data included)."""

METRICS_FIELDS = (
    "vector_steps", "env_steps", "episodes", "updates", "wall_s", "mean_score_100", "mean_return_100",
    "best_score", "epsilon", "loss", "env_steps_per_s", "mean_episode_length", *PHASE_COLUMNS,
)
"""The columns of ``metrics.csv``, one row per log interval. ``mean_episode_length`` is the mean
length of the episodes that finished in that interval (empty when none did). The phase columns come
last: a run written before they existed keeps its own header when it is resumed (the rows appended
then leave them out, see :class:`rlperf.run.files.MetricsCSV`), and its record still gets them."""

MAX_INTERVALS = 128
"""Log intervals a record keeps (``intervals``); longer runs keep evenly spaced rows,
each then covering several intervals exactly."""

_START: dict[str, Any] = {"env_steps": 0, "episodes_read": 0, "episode_steps": 0, "wall_s": 0.0, "updates": 0,
                          "phase_s": {}}


def now() -> str:
    """The current UTC time as an ISO 8601 string (seconds)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def finite(x: float) -> float | None:
    """``x``, or None for NaN and infinities (JSON has neither)."""
    return x if x == x and abs(x) != float("inf") else None


def cumulative(row: Mapping[str, Any] | Sequence[float]) -> dict[str, Any]:
    """A history row as a dict. Checkpoints written before the phase series kept
    ``[env_steps, episodes read, their env steps, wall_s]`` lists: those rows have no updates,
    score or phase times (the interval that ends at the first new row has none either)."""
    if isinstance(row, Mapping):
        return dict(row)
    return {"env_steps": row[0], "episodes_read": row[1], "episode_steps": row[2], "wall_s": row[3]}


@dataclass
class RunHistory:
    """What a run carries across resumes (saved in the checkpoint under ``run``)."""

    started_at: str
    command: list[str]
    device: str
    wall_s: float = 0.0  # wall seconds of the segments before this one
    resumed: list[dict[str, Any]] = field(default_factory=list)
    at_warmup_end: dict[str, int] = field(default_factory=lambda: {"env_steps": 0, "updates": 0, "episodes": 0})
    # Cumulative figures at log rows (env_steps, episodes_read, episode_steps, wall_s, updates,
    # phase_s: seconds per phase) and the mean score there, thinned to at most 2 x MAX_INTERVALS:
    # differences between any two rows are exact interval figures.
    intervals: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.intervals = [cumulative(row) for row in self.intervals]

    def add_interval(self, p: Progress, wall_s: float, phase_s: Mapping[str, float] | None = None) -> None:
        """Note a log row (where the run's curves of score, episode length, cost per env step and
        phase times are read); ``phase_s``: each phase's seconds since the run started."""
        self.intervals.append({"env_steps": p.env_steps, "episodes_read": p.lengths_read,
                               "episode_steps": p.episode_steps, "wall_s": round(wall_s, 6), "updates": p.updates,
                               "mean_score_100": finite(p.mean_score), "phase_s": dict(phase_s or {})})
        if len(self.intervals) > 2 * MAX_INTERVALS:
            self.intervals = self.intervals[-1::-2][::-1]  # every other row, the latest kept


@dataclass(frozen=True)
class Window:
    """The measured part of a run (after warm-up): its wall seconds and what was done in them."""

    wall_s: float
    env_steps: int
    updates: int
    episodes: int

    def rate(self, count: int | float) -> float:
        return count / self.wall_s if self.wall_s > 0 else 0.0


def metrics_row(p: Progress, wall_s: float, measured: Window | None, history: RunHistory | None = None,
                phase_s: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One ``metrics.csv`` row, noted in ``history``'s intervals. The rate is over the measured window
    (warm-up excluded, as in the record); before the warm-up ends it is over the whole run so far.
    ``phase_s``: each phase's seconds since the run started (:meth:`rlperf.timers.PhaseTimer.totals`);
    the row gets the interval's part of them (with ``history``, which holds the previous row)."""
    rate = measured.rate(measured.env_steps) if measured is not None else (p.env_steps / wall_s if wall_s > 0 else 0.0)
    length = None
    phases: dict[str, Any] = {}
    if history is not None:
        last = history.intervals[-1] if history.intervals else _START
        episodes = p.lengths_read - last["episodes_read"]
        length = (p.episode_steps - last["episode_steps"]) / episodes if episodes > 0 else None
        history.add_interval(p, wall_s, phase_s)
        spent = phase_deltas(last, history.intervals[-1])
        if spent is not None:
            total = sum(spent.values())
            for name in PHASES:
                if name in spent:
                    phases[f"{name}_s"] = round(spent[name], 6)
                    phases[f"{name}_share"] = round(spent[name] / total, 4) if total > 0 else 0.0
    return dict(vector_steps=p.vector_steps, env_steps=p.env_steps, episodes=p.episodes, updates=p.updates,
                wall_s=round(wall_s, 4), mean_score_100=p.mean_score, mean_return_100=p.mean_return,
                best_score=p.best_score, epsilon=p.epsilon, loss=p.last_loss, env_steps_per_s=rate,
                mean_episode_length=length, **phases)


def phase_deltas(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float] | None:
    """Each phase's seconds between two cumulative history rows; None where either row has no phase
    times (a row from an older checkpoint, or a run timed with ``run.timing=off``)."""
    a, b = before.get("phase_s"), after.get("phase_s")
    if not b or (a is None) or (not a and before is not _START):
        return None
    return {name: max(0.0, seconds - a.get(name, 0.0)) for name, seconds in b.items()}


def interval_rows(intervals: Sequence[Mapping[str, Any] | Sequence[float]],
                  limit: int = MAX_INTERVALS) -> list[dict[str, Any]]:
    """The record's ``intervals``: per log interval (or evenly merged ones past ``limit``),
    where it ended (env steps, wall seconds, updates, the mean score of the last 100 episodes), the
    episodes that finished in it, their mean length, the interval's seconds per 1000 env steps and
    each phase's seconds in it (``phase_s``; left out where the history has no phase times)."""
    rows = [cumulative(row) for row in intervals]
    if len(rows) > limit:
        step = len(rows) / limit
        rows = [rows[min(len(rows) - 1, round((i + 1) * step) - 1)] for i in range(limit)]
    out = []
    previous: Mapping[str, Any] = _START
    for row in rows:
        steps, episodes = row["env_steps"] - previous["env_steps"], row["episodes_read"] - previous["episodes_read"]
        seconds = row["wall_s"] - previous["wall_s"]
        entry: dict[str, Any] = {
            "env_steps": int(row["env_steps"]), "wall_s": row["wall_s"], "episodes": int(episodes),
            "mean_episode_length": (row["episode_steps"] - previous["episode_steps"]) / episodes if episodes > 0 else None,
            "s_per_1000_env_steps": 1000 * seconds / steps if steps > 0 else None}
        if "updates" in row:
            entry["updates"] = int(row["updates"])
            entry["mean_score_100"] = row.get("mean_score_100")
        spent = phase_deltas(previous, row)
        if spent is not None:
            entry["phase_s"] = {name: round(s, 6) for name, s in spent.items()}
        out.append(entry)
        previous = row
    return out


class MetricsLog:
    """Where a run's log rows go: ``metrics.csv`` (:class:`~rlperf.run.files.MetricsCSV`: same
    ``write``/``rollback``/``close``) and, with ``train.tensorboard``, TensorBoard scalars under
    ``RUN_DIR/tb`` (:class:`rlperf.run.tensorboard.TensorBoardLog`)."""

    def __init__(self, run_dir: Path, tensorboard: bool = False) -> None:
        self.csv = MetricsCSV(run_dir / METRICS_NAME, METRICS_FIELDS)
        self.tb: Any = None
        if tensorboard:
            from rlperf.run.tensorboard import TensorBoardLog

            self.tb = TensorBoardLog(run_dir / "tb")

    def write(self, row: Mapping[str, Any], episodes: Sequence[Any] = ()) -> None:
        """One row; ``episodes``: the episodes read in its interval (:meth:`rlperf.dqn.Progress.take_episodes`)."""
        self.csv.write(row)
        if self.tb is not None:
            self.tb.write(row, episodes)

    def rollback(self) -> None:
        self.csv.rollback()

    def close(self) -> None:
        self.csv.close()
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def build_record(
    *,
    cfg: Config,
    device: torch.device,
    run_dir: Path,
    history: RunHistory,
    kind: str,
    status: str,
    progress: Progress,
    timing: Mapping[str, Any],
    window: Window,
    wall_s: float,
    phases: Mapping[str, Any],
    episode_length: float | None,
    rss_scope: str,
    score_resolution: str,
    env: EnvPlan,
    update: tuple[str, str],
    memory: Mapping[str, Any] | None = None,
    checkpoint: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The run record. ``timing`` carries the timer's mode, warm-up steps and seconds (of which
    ``fill_steps`` only filled the replay, when the warm-up waited for it) and measured steps;
    ``window`` the measured wall time and work; ``rss_scope`` what :func:`reset_peak_memory`
    returned at the start; ``score_resolution`` how often the time to score was checked; ``env``
    the env as the run resolved it (:func:`rlperf.env.plan.plan_env`); ``memory`` extra memory figures."""
    p = progress
    files = {"record": RECORD_NAME, "metrics": METRICS_NAME, "config": CONFIG_NAME}
    if checkpoint is not None:
        files["checkpoint"] = CHECKPOINT_NAME
    record: dict[str, Any] = {
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
        "threads": threads.record_section(),  # every pool's count, why, and what other processes took
        "env": env.record(),
        "update": {"form": update[0], "reason": update[1]},  # the Agent's decision (resolve_update), as it ran
        "timing": _timing_section(timing, window),
        "totals": _totals_section(p, wall_s, timing),
        "throughput": _throughput_section(cfg, p, window),
        "phases": dict(phases),
        "intervals": interval_rows(history.intervals),
        "learning": _learning_section(p, episode_length),
        "time_to_score": record_section(cfg.train.score_targets, p.time_to_score, score_resolution),
        "memory": {"peak_rss_mb": peak_rss_mb(), "rss_scope": rss_scope, "peak_cuda_mb": peak_cuda_mb(device),
                   **(memory or {})},
        "checkpoint": dict(checkpoint) if checkpoint is not None else None,
        "files": files,
    }
    if error:
        record["error"] = error
    return record


def _totals_section(p: Progress, wall_s: float, timing: Mapping[str, Any]) -> dict[str, Any]:
    """The record's ``totals``: the run's counters, its wall time and its warm-up."""
    return {"episodes": p.episodes, "env_steps": p.env_steps, "vector_steps": p.vector_steps,
            "updates": p.updates, "wall_s": wall_s, "warmup_s": timing["warmup_s"]}


def _timing_section(timing: Mapping[str, Any], window: Window) -> dict[str, Any]:
    """The record's ``timing``: how the timer ran and what the measured window holds."""
    return {"mode": timing["mode"], "warmup_steps": timing["warmup_steps"], "warmup_s": timing["warmup_s"],
            "fill_steps": timing.get("fill_steps", 0), "measured_steps": timing["measured_steps"],
            "measured_wall_s": window.wall_s, "measured_env_steps": window.env_steps,
            "measured_episodes": window.episodes, "measured_updates": window.updates,
            "vector_step": timing.get("vector_step"),
            **({"asked_window_steps": timing["asked_window_steps"]} if "asked_window_steps" in timing else {})}


def _throughput_section(cfg: Config, p: Progress, window: Window) -> dict[str, Any]:
    """The record's ``throughput``: rates over the measured window, and the replay ratio over the run."""
    episode_rate = window.rate(window.episodes)
    step_rate = window.rate(window.env_steps)
    return {
        "env_steps_per_s": step_rate,
        "updates_per_s": window.rate(window.updates),
        "episodes_per_s": episode_rate,
        "s_per_1000_env_steps": 1000.0 / step_rate if step_rate > 0 else None,
        "s_per_1000_episodes": 1000.0 / episode_rate if episode_rate > 0 else None,
        "replay_ratio": p.updates * cfg.buffer.batch_size * cfg.train.grad_accum / max(p.env_steps, 1),
    }


def _learning_section(p: Progress, episode_length: float | None) -> dict[str, Any]:
    """The record's ``learning``: the last-100 means, the best score, the final ε and loss."""
    return {
        "mean_score_last_100": finite(p.mean_score),
        "mean_return_last_100": finite(p.mean_return),
        "best_score": p.best_score,
        "mean_episode_length": episode_length,
        "final_epsilon": p.epsilon,
        "last_loss": finite(p.last_loss),
    }


def system_info(device: torch.device | str) -> dict[str, Any]:
    """What a timing depends on: versions, device, CPU, threads, git revision, host."""
    device = torch.device(device)
    cpu = machine()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu["cpu_model"]
    return {
        "rlperf": _rlperf_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": device_name,
        **cpu,
        "torch_threads": torch.get_num_threads(),
        "git_revision": git_revision(),
        "hostname": socket.gethostname(),
    }


def _rlperf_version() -> str:
    import rlperf

    return rlperf.__version__


def git_revision(cwd: str | Path | None = None) -> str | None:
    """The commit checked out in ``cwd`` (default: the working directory), or None."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or os.getcwd(), capture_output=True, text=True,
                                timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


# -- memory peaks, per run ----------------------------------------------------------------------

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def reset_peak_memory(device: torch.device) -> str:
    """Start this run's memory peaks from now; returns the RSS scope, ``"run"`` or ``"process"``.

    The CUDA allocator's peak is reset on ``device``. Linux resets the resident-set high-water
    mark (``VmHWM``) when 5 is written to ``/proc/self/clear_refs``; elsewhere the RSS peak stays
    the process's peak so far.
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return "process"
    return "run" if _vm_hwm_mb() is not None else "process"


def _vm_hwm_mb() -> float | None:
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident memory in MiB since the last :func:`reset_peak_memory` (or process start)."""
    hwm = _vm_hwm_mb()
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # macOS reports bytes, Linux kB


def peak_cuda_mb(device: torch.device | str) -> float | None:
    """Peak memory allocated by tensors on a CUDA ``device`` since the last reset, in MiB; None elsewhere."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / (1024 * 1024)
