"""Gymnasium registration of ``rlperf/Snake-v0`` (single board and native vector entry points)."""

from __future__ import annotations

ENV_ID = "rlperf/Snake-v0"


def register_envs() -> None:
    """Register ``rlperf/Snake-v0`` with Gymnasium (once; ``import rlperf`` arranges the call)."""
    import gymnasium

    if ENV_ID in gymnasium.registry:
        return
    gymnasium.register(
        id=ENV_ID,
        entry_point="rlperf.env.single:SnakeEnv",
        vector_entry_point="rlperf.env.vector:VectorSnake",
    )
