"""The run flags every command shares (``--envs``, ``--episodes``, ``--steps``, ``--train-ratio``,
``--device``, ``--seed``), declared once: each flag's name, the config key it sets, its type and its
help. :mod:`rlperf.cli.options` builds the options from this table and :func:`rlperf.config.config_from`
maps the flags to their keys with it; importing it imports nothing else (``rlperf --help`` stays fast).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """One shared run flag: ``name`` is its keyword (``train_ratio``), ``key`` the config key it sets."""

    name: str
    key: str
    type: type
    help: str

    @property
    def option(self) -> str:
        """The command-line option, ``--train-ratio``."""
        return "--" + self.name.replace("_", "-")


RUN_FLAGS = (
    Flag("envs", "env.num_envs", int, "Boards stepped at once (env.num_envs)."),
    Flag("episodes", "train.episodes", int, "Stop after N finished episodes across all boards."),
    Flag("steps", "train.steps", int, "Stop after N env transitions."),
    Flag("train_ratio", "train.train_ratio", float, "Gradient updates per vector step (0.25 = one every 4)."),
    Flag("device", "run.device", str, "auto, cpu, cuda or cuda:N."),
    Flag("seed", "run.seed", int, "Random seed (run.seed)."),
)
