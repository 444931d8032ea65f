"""TensorBoard scalars of a run (``--tensorboard``, under ``RUN_DIR/tb``), written at log time.

rlperf's own tags (``rlperf/...``: the learning curve, throughput, the per-phase series) sit beside
the tags a Stable-Baselines3 or CleanRL user already looks for, so their dashboards and scripts
read an rlperf run unchanged: ``rollout/ep_rew_mean`` and ``rollout/ep_len_mean`` (means over the
last 100 episodes, as SB3), ``train/loss``, ``time/fps``, and CleanRL's ``charts/episodic_return``
and ``charts/episodic_length`` with one point per finished episode at the env step it ended. The
episodes reach here as the loop read them, once per log interval (:meth:`rlperf.dqn.Progress.take_episodes`),
so the hot loop never writes to TensorBoard nor builds an array for it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlperf.timers import PHASES

OWN = ("mean_score_100", "mean_return_100", "epsilon", "loss", "env_steps_per_s")
"""The row's columns written as ``rlperf/<column>``."""

FAMILIAR = {"rollout/ep_rew_mean": "mean_return_100", "rollout/exploration_rate": "epsilon",
            "train/loss": "loss", "time/fps": "env_steps_per_s"}
"""SB3's tag -> the row's column."""


def episode_rows(taken: Sequence[tuple[np.ndarray | int, np.ndarray, np.ndarray]]) -> np.ndarray:
    """:meth:`rlperf.dqn.Progress.take_episodes`'s reads as one array of (end env step, return, length) rows."""
    rows = [np.stack(np.broadcast_arrays(ends, returns, lengths), axis=1).astype(np.float64)
            for ends, returns, lengths in taken]
    return np.concatenate(rows) if rows else np.zeros((0, 3))


class TensorBoardLog:
    """A ``SummaryWriter`` fed one metrics row (and that interval's finished episodes) at a time."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer: Any = SummaryWriter(log_dir=str(log_dir))
        self.lengths: deque[float] = deque(maxlen=100)

    def write(self, row: Mapping[str, Any], taken: Sequence[Any] = ()) -> None:
        """``row``: a metrics.csv row; ``taken``: the interval's episodes (:func:`episode_rows`)."""
        add, step = self.writer.add_scalar, row["env_steps"]
        episodes = episode_rows(taken)
        for key in OWN:
            add(f"rlperf/{key}", row[key], step)
        for name in PHASES:
            if f"{name}_s" in row:
                add(f"rlperf/phase_s/{name}", row[f"{name}_s"], step)
                add(f"rlperf/phase_share/{name}", row[f"{name}_share"], step)
        for tag, key in FAMILIAR.items():
            if row.get(key) is not None and math.isfinite(row[key]):  # as SB3: no point before the first episode
                add(tag, row[key], step)
        if len(episodes):
            for end, ret, length in episodes.tolist():
                add("charts/episodic_return", ret, int(end))
                add("charts/episodic_length", length, int(end))
            self.lengths.extend(episodes[:, 2].tolist())
        if self.lengths:
            add("rollout/ep_len_mean", sum(self.lengths) / len(self.lengths), step)

    def close(self) -> None:
        self.writer.close()
