"""rlperf: find and fix performance bottlenecks in deep-RL training loops.

Importing ``rlperf`` registers the Snake environment with Gymnasium as ``rlperf/Snake-v0``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from rlperf._registration import register_envs

register_envs()

__all__ = ["__version__"]
