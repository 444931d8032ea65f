"""rlperf: find and fix performance bottlenecks in deep-RL training loops.

Importing ``rlperf`` registers the Snake environment with Gymnasium as ``rlperf/Snake-v0`` (at once
if Gymnasium is imported, else as soon as it is), so ``gymnasium.make("rlperf/Snake-v0")`` and
``gymnasium.make_vec(...)`` work after ``import rlperf``. Importing it imports nothing heavy.
"""

from __future__ import annotations

from rlperf._after_import import after_import

__version__ = "0.1.0"


def _register() -> None:
    from rlperf.env.registration import register_envs

    register_envs()


after_import("gymnasium", _register)

__all__ = ["__version__"]
