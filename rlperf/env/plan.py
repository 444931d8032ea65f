"""The config's env section, resolved once per run: which env, which backend, where its boards step,
which step kernel runs there, and why (:class:`EnvPlan`).

The run builds its env from the plan (:func:`rlperf.env.backends.build_env`), the record's ``env``
section is the plan (:meth:`EnvPlan.record`), and the summary and the advisor read that section.
The rules of which kernel can run where live here and in :func:`rlperf.env.vector.resolve_kernel`:
the async mode's actors step their boards on the CPU whatever the learner's device
(:func:`boards_device`), and the Gymnasium backends and other envs have no step kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rlperf.env.registration import ENV_ID as SNAKE_ID
from rlperf.env.vector import resolve_kernel
from rlperf.errors import ConfigError

SNAKE_ONLY = ("env.size", "env.obs", "env.flood_fill", "env.hunger", "env.initial_length", "env.kernel")
"""The keys that describe rlperf's Snake and mean nothing to another Gymnasium env."""


@dataclass(frozen=True)
class EnvPlan:
    """A config's env, resolved: ``device`` is where the boards step; ``kernel`` is ``ops`` or
    ``fused`` for the native Snake, None where ``env.kernel`` does not apply; ``reason`` says why."""

    id: str
    backend: str
    device: torch.device
    kernel: str | None
    reason: str

    def record(self) -> dict[str, str | None]:
        """The record's ``env`` section."""
        return {"kernel": self.kernel, "reason": self.reason}


def boards_device(mode: str, device: torch.device) -> torch.device:
    """Where a run's boards step: async actors step theirs on the CPU, whatever the learner's device."""
    return torch.device("cpu") if mode == "async" else device


def plan_env(cfg: Any, device: torch.device) -> EnvPlan:
    """Resolve ``cfg``'s env section for a run on ``device`` (an explicit ``env.kernel=fused`` that
    cannot run is a one-line ConfigError; compiling the fused kernel happens here, once per process)."""
    e = cfg.env
    where = boards_device(cfg.run.mode, device)
    if e.id != SNAKE_ID:
        return EnvPlan(e.id, e.backend, where, None, f"env.id={e.id} is not rlperf's Snake (env.kernel does not apply)")
    if e.backend != "tensor":
        return EnvPlan(e.id, e.backend, where, None,
                       f"env.backend={e.backend} steps single-board SnakeEnvs (env.kernel does not apply)")
    kernel, reason = resolve_kernel(e.kernel, where, e.flood_fill, e.size)
    return EnvPlan(e.id, e.backend, where, kernel, reason)


def refuse_inapplicable(cfg: Any, explicit: Iterable[str]) -> None:
    """Refuse the ``explicit`` keys (given on the command line) that cannot take effect with the
    config's env: Snake's keys for another Gymnasium env, a step kernel for the Gymnasium backends.
    A config file's own values are left alone: the packaged configs set Snake's keys, and a run of
    another env with them simply does not use them (its record says so)."""
    e, given = cfg.env, set(explicit)
    defaults = type(e).model_fields
    if e.id != SNAKE_ID:
        for key in (k for k in SNAKE_ONLY if k in given):
            name = key.split(".")[1]
            if getattr(e, name) == defaults[name].default:  # what another env does anyway
                continue
            raise ConfigError(
                f"{key}={getattr(e, name)} cannot take effect: it is rlperf's Snake's, and env.id={e.id}",
                hint=f"drop --set {key}, or train on env.id={SNAKE_ID}",
            )
    if "env.kernel" in given and e.backend != "tensor" and e.kernel != "auto":
        raise ConfigError(
            f"env.kernel={e.kernel} cannot take effect: env.backend={e.backend} steps single boards with no step kernel",
            hint="use env.backend=tensor to choose a kernel, or drop --set env.kernel",
        )
