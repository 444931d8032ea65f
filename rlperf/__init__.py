"""rlperf: find and fix performance bottlenecks in deep-RL training loops.

Importing ``rlperf`` registers the Snake environment with Gymnasium as ``rlperf/Snake-v0`` (at once
if Gymnasium is imported, else as soon as it is), so ``gymnasium.make("rlperf/Snake-v0")`` and
``gymnasium.make_vec(...)`` work after ``import rlperf``. Importing it imports nothing heavy.

The public API for your own loop is :class:`rlperf.PhaseTimer` (see :mod:`rlperf.external`),
imported when first used.
"""

from __future__ import annotations

from rlperf._after_import import after_import

__version__ = "0.1.0"


def _register() -> None:
    from rlperf.env.registration import register_envs

    register_envs()


after_import("gymnasium", _register)


def __getattr__(name: str) -> object:
    """The public API, imported on first use: ``rlperf.PhaseTimer`` (:mod:`rlperf.external`)."""
    if name == "PhaseTimer":
        from rlperf.external import PhaseTimer

        return PhaseTimer
    raise AttributeError(f"module 'rlperf' has no attribute {name!r}")


__all__ = ["PhaseTimer", "__version__"]
