"""Gymnasium registration of ``rlperf/Snake-v0`` (single board and native vector entry points)."""

from __future__ import annotations

import gymnasium

ENV_ID = "rlperf/Snake-v0"


def register_envs() -> None:
    if ENV_ID in gymnasium.registry:
        return
    gymnasium.register(
        id=ENV_ID,
        entry_point="rlperf.single_snake:SnakeEnv",
        vector_entry_point="rlperf.snake:VectorSnake",
    )
