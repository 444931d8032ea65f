"""Time to score: when a run's mean score over its last 100 episodes first reached a target.

"How long until the agent is good" is the practitioner's question (docs/bottlenecks.md §19). A run
tracks the targets of ``train.score_targets``: for each, the wall time, env steps, updates and
episodes at which the mean score of the last :data:`WINDOW` finished episodes first reached it.
Only full windows count (the first 100 episodes are needed), so one lucky early episode is not a
crossing.

The check runs where the loop reads finished episodes anyway, so it adds no host sync: every
vector step in a sync run on the CPU, every log interval on a GPU (``train.log_every``) and in the
async learner. Within one read the crossing is found at the exact episode; its counters and clock
are those of the read. The clock is the run's measured wall time, as for the rates: the timer's
warm-up (``timing.warmup_s``: the vector steps that fill the replay to ``train.learning_starts``,
then the first ``train.warmup_steps`` from the first gradient update on) is excluded.
``run_wall_s`` counts from the run's start instead, everything included, as ``metrics.csv``'s
``wall_s`` does (what ``scripts/bench_peers.py`` compares with other libraries).

One implementation serves sync runs, async runs and the peer benchmark: :func:`first_reached`
finds the crossing, :class:`rlperf.dqn.Progress` keeps what was reached, :func:`record_section`
writes it into the record and :func:`time_to` reads it back for ``compare`` and ``sweep``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

WINDOW = 100
"""Episodes in the moving window whose mean score is compared with a target."""

NOT_REACHED = "not reached"


def target_key(target: float) -> str:
    """How a target is named in records and objectives: ``20.0`` → ``"20"``, ``0.5`` → ``"0.5"``."""
    return format(float(target), "g")


def first_reached(recent: Sequence[float], new: Sequence[float] | np.ndarray, target: float,
                  window: int = WINDOW) -> int | None:
    """The index in ``new`` of the first episode after which the mean of the last ``window`` scores
    reaches ``target``, or None. ``recent``: the scores read before ``new`` (oldest first; the last
    ``window - 1`` are enough). Windows must be full."""
    return first_reached_each(recent, new, [target], window)[0]


def first_reached_each(recent: Sequence[float], new: Sequence[float] | np.ndarray, targets: Sequence[float],
                       window: int = WINDOW) -> list[int | None]:
    """:func:`first_reached` for several targets, the window sums computed once."""
    new = np.asarray(new, dtype=np.float64)
    have = len(recent)
    if not len(new) or have + len(new) < window:
        return [None] * len(targets)
    keep = min(have, window - 1)
    before = np.fromiter(itertools.islice(recent, have - keep, have), dtype=np.float64, count=keep)
    scores = np.concatenate([before, new])
    sums = np.concatenate([[0.0], np.cumsum(scores)])
    ends = np.arange(max(keep, window - 1), len(scores))  # the last episode of each full window
    totals = sums[ends + 1] - sums[ends + 1 - window]
    best = totals.max()
    out: list[int | None] = []
    for target in targets:
        # Compared as sums: exact for integer scores, where a mean would round.
        need = target * window - 1e-9
        if best < need:
            out.append(None)
            continue
        out.append(int(ends[np.argmax(totals >= need)] - keep))
    return out


def record_section(targets: Iterable[float], reached: Mapping[str, Mapping[str, Any]], resolution: str) -> dict[str, Any]:
    """The record's ``time_to_score``: per target, where it was first reached, or ``reached: false``."""
    rows = []
    for target in targets:
        hit = reached.get(target_key(target))
        rows.append({"score": float(target), "reached": hit is not None,
                     **{k: (hit or {}).get(k) for k in ("wall_s", "run_wall_s", "env_steps", "updates", "episodes")}})
    return {
        "window_episodes": WINDOW,
        "clock": "wall_s: the run's measured seconds (warm-up excluded: timing.warmup_s; the replay fill is "
                 "included); run_wall_s: seconds from the run's start",
        "resolution": resolution,
        "targets": rows,
    }


def time_to(record: Mapping[str, Any], target: float, field: str = "wall_s") -> tuple[bool, float | None] | None:
    """``(reached, value)`` for ``target`` in a record (``value`` None when not reached); None when
    the record does not track that target (an older record, or another ``train.score_targets``)."""
    section = record.get("time_to_score")
    if not isinstance(section, Mapping):
        return None
    for row in section.get("targets") or []:
        if isinstance(row, Mapping) and target_key(row.get("score", float("nan"))) == target_key(target):
            value = row.get(field)
            return bool(row.get("reached")), float(value) if row.get("reached") and value is not None else None
    return None


def tracked_targets(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """Every target the records track, ascending."""
    seen: dict[str, float] = {}
    for record in records:
        section = record.get("time_to_score")
        for row in (section.get("targets") or []) if isinstance(section, Mapping) else []:
            if isinstance(row, Mapping) and isinstance(row.get("score"), (int, float)):
                seen.setdefault(target_key(row["score"]), float(row["score"]))
    return sorted(seen.values())
