"""The async run's figures: its metrics, its phase table and the record's ``async`` section.

Read from the actors' stats slots (:data:`rlperf.run.actors.SLOT`), the shared replay's reader and
the learner's own counters (:class:`LearnerStats`); :mod:`rlperf.run.learner` calls these at each log
read (the dashboard's async line) and once at the end (the record).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlperf.config import Config
from rlperf.run.actors import ACTOR_PHASES, SLOT
from rlperf.run.record import Window
from rlperf.run.shm import ReplayReader
from rlperf.timers import PhaseTimer


@dataclass
class LearnerStats:
    """The learner's clock and counters: when the run and its measured window started, its waits,
    its busy time and its weight publications."""

    t_start: float
    window_start: tuple[float, int, int, int] | None = None  # (time, env steps, updates, episodes) once every actor is warm
    t_first_update: float | None = None
    t_first_data: float | None = None  # the first transition in the replay (waits before it are start-up)
    t_all_running: float | None = None  # every actor past its start
    publishes: int = 0
    publish_s: float = 0.0
    wait_s: float = 0.0
    waits: int = 0
    busy_s: float = 0.0  # host time in updates, for the utilisation

    def origin(self) -> tuple[float, int, int, int]:
        """Where the measured window starts: every actor warm, else every actor running, else the start."""
        return self.window_start or (self.t_all_running or self.t_start, 0, 0, 0)

    def window(self, slots: np.ndarray, updates: int, t_end: float) -> Window:
        """The measured part up to ``t_end`` (spawn and warm-up excluded, as a sync run excludes its warm-up steps)."""
        t0, env0, upd0, ep0 = self.origin()
        return Window(max(t_end - t0, 1e-9), int(slots[:, SLOT["env_steps"]].sum()) - env0, updates - upd0,
                      int(slots[:, SLOT["episodes"]].sum()) - ep0)


def async_metrics(cfg: Config, slots: np.ndarray, reader: ReplayReader, stats: LearnerStats, updates: int,
                  t_end: float) -> dict[str, Any]:
    """The async metrics: experience rate, updates/s, waiting, lock wait, drops, staleness, utilisation."""

    def col(name: str) -> np.ndarray:
        return slots[:, SLOT[name]]

    env_steps = int(col("env_steps").sum())
    t0, env0, upd0, _ = stats.origin()
    span = max(t_end - t0, 1e-9)
    active = max(t_end - stats.t_first_update, 1e-9) if stats.t_first_update is not None else None
    steps = max(col("vector_steps").sum(), 1)
    tracker, rs = reader.tracker, reader.stats
    actor_acquires = col("lock_acquires").sum()
    return {
        "experience_rate": (env_steps - env0) / span,
        "learner_updates_per_s": updates / active if active else 0.0,
        "wait_for_data_s": stats.wait_s,
        "wait_for_data_share": stats.wait_s / max(t_end - (stats.t_first_data or t_end), 1e-9),
        "waits": stats.waits,
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
        "learner_utilisation": stats.busy_s / active if active else 0.0,
        "publishes": stats.publishes,
        "publish_s": stats.publish_s,
        "weight_syncs": int(col("syncs").sum()),
        "torn_weight_reads": int(col("torn_reads").sum()),
        "weight_check_s": float(col("check_s").sum()),
        "weight_check_diff": (
            {"before": float(col("diff_before").mean()), "after": float(col("diff_after").mean())}
            if cfg.async_.weight_check == "on"
            else None
        ),
        "updates_per_s_window": (updates - upd0) / span,
    }


def async_phases(slots: np.ndarray, timer: PhaseTimer, stats: LearnerStats) -> dict[str, dict[str, Any]]:
    """Actors' select/step/push (+ sync), summed over actors; the learner's train/log (+ wait).

    ``share`` is of all phase time of all processes (so the shares add up to 1, as in a sync run);
    ``role_share`` is of the actors' or the learner's own total. Actors' p50/p95 are call-weighted
    means of each actor's percentiles (over its last 4096 steps)."""
    s = slots
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
    timed = timer.stats()
    learner: dict[str, dict[str, Any]] = {
        name: {**timed[name].as_dict(), "role": "learner"} for name in ("train", "log") if name in timed}
    learner["wait"] = {
        "total_s": stats.wait_s,
        "calls": stats.waits,
        "mean_ms": 1e3 * stats.wait_s / stats.waits if stats.waits else 0.0,
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


def async_section(cfg: Config, metrics: dict[str, Any], learner_threads: int, stats: LearnerStats,
                  run: dict[str, Any]) -> dict[str, Any]:
    """The record's ``async`` section: the knobs, the metrics, and ``run`` -- what the learner and its
    supervisor know of the actors (restarts, failure, per-actor figures, the replay's layout)."""
    a = cfg.async_
    return {
        "actors": a.actors,
        "envs_per_actor": a.envs_per_actor,
        "boards": a.actors * a.envs_per_actor,
        "learner_threads": learner_threads,
        "buffer": a.buffer,
        "wait": a.wait,
        "weight_check": a.weight_check,
        "publish": a.publish,
        "publish_every": a.publish_every,
        "restart_actors": a.restart_actors,
        **{k: v for k, v in metrics.items() if k != "updates_per_s_window"},
        "startup_s": (stats.t_all_running - stats.t_start) if stats.t_all_running else None,
        **run,
    }


def metrics_line(m: dict[str, Any]) -> str:
    """The dashboard's async line."""
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
