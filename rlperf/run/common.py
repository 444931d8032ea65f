"""What both run modes share before and after their loops: preparing the process (device, knobs,
threads, seeds) and the result a run hands back."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlperf.config import Config
from rlperf.device import resolve_device
from rlperf.dqn import check_knobs
from rlperf.env.plan import EnvPlan, plan_env
from rlperf import threads
from rlperf.errors import RlperfError
from rlperf.fused_update import why_not_fused


@dataclass
class RunResult:
    """What a run leaves behind: its directory, its record and the process exit code."""

    run_dir: Path
    record: dict[str, Any]
    exit_code: int


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _refuse(cfg: Config) -> tuple[torch.device, EnvPlan]:
    """The device and the env as it will run there, after refusing the knobs that cannot apply on it
    and a missing TensorBoard."""
    device = resolve_device(cfg.run.device)
    env = plan_env(cfg, device)
    check_knobs(cfg, device)
    if cfg.train.tensorboard:
        try:
            import tensorboard  # noqa: F401
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            raise RlperfError("--tensorboard needs the tensorboard package", hint="pip install 'rlperf[tb]'") from None
    return device, env


def check_run(cfg: Config) -> None:
    """Refuse what :func:`rlperf.run.lifecycle.train_run` would refuse before it writes anything (the
    device, knobs that cannot apply, a run that does not fit in memory), changing nothing: so that
    ``sweep`` and ``compare`` refuse a bad grid point or variant before their first run."""
    from rlperf.env.backends import env_spec
    from rlperf.run.memory import check_run_memory

    device, _ = _refuse(cfg)
    obs_shape, _ = env_spec(cfg)  # an env id that does not fit is refused here
    if cfg.run.mode == "sync":
        check_run_memory(cfg, obs_shape, device)


def prepare(cfg: Config) -> tuple[torch.device, EnvPlan]:
    """Resolve the device and the env (once per run: the env factory and the record read the plan),
    refuse knobs that cannot apply, and cap every thread pool at ``run.threads`` (:mod:`rlperf.threads`;
    call it from the thread that runs the loop, inside :func:`thread_settings_restored`)."""
    device, env = _refuse(cfg)
    others = cfg.async_.actors if cfg.run.mode == "async" else 0
    # The fused update's np.dot loads SciPy's BLAS on its first compile: loaded now, its pool is capped too.
    preload = ("scipy.linalg.cython_blas",) if cfg.train.update != "torch" and why_not_fused(cfg, device) is None else ()
    threads.apply(threads.choose(cfg.run.threads, device, other_processes=others), preload=preload)
    return device, env


def thread_settings_restored() -> contextlib.AbstractContextManager[None]:
    """``run.threads`` is a run's setting, not the process's from then on: every pool's thread count is
    restored when the run ends (so the next run of a sweep starts clean)."""
    return threads.restored()
