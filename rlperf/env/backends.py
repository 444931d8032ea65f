"""The ``env.backend`` knob: the native batched env, or Gymnasium's vector wrappers over single boards.

``tensor`` is :class:`rlperf.env.vector.VectorSnake`. ``gym-sync`` and ``gym-async`` run N copies of
the single-board :class:`rlperf.env.single.SnakeEnv` under ``gymnasium.vector.SyncVectorEnv`` /
``AsyncVectorEnv`` and convert their NumPy batches to tensors on the trainer's device every step:
that is the usual way to vectorize, and what native batching is measured against (docs/bottlenecks.md §5).
All three present the same interface to the trainer (tensors in, tensors out, same-step autoreset,
dense ``final_obs`` and the ended episodes' ``final_info`` -- score, steps, return -- in ``infos``).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlperf.env.gym_env import GymnasiumEnv, env_spaces
from rlperf.env.registration import ENV_ID as SNAKE_ID
from rlperf.env.single import SnakeEnv
from rlperf.env.plan import EnvPlan
from rlperf.env.vector import N_ACTIONS, VectorSnake, observation_shape

BACKENDS = ("tensor", "gym-sync", "gym-async")


class GymVectorBackend:
    """Gymnasium's ``SyncVectorEnv``/``AsyncVectorEnv`` over ``SnakeEnv``, speaking tensors."""

    def __init__(self, kind: str, num_envs: int, device: torch.device, **env_kwargs: Any) -> None:
        fns = [lambda: SnakeEnv(**env_kwargs) for _ in range(num_envs)]
        if kind == "gym-sync":
            self.envs: gymnasium.vector.VectorEnv = gymnasium.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        else:
            # A process forked after CUDA is initialised inherits a CUDA context it cannot use: start the
            # workers from a fork server (a clean process) then. Plain fork is faster where CUDA is unused.
            context = "forkserver" if torch.cuda.is_initialized() else None
            self.envs = gymnasium.vector.AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, context=context)
        self.num_envs = num_envs
        self.device = device
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        obs, infos = self.envs.reset(seed=seed)
        return torch.as_tensor(obs, device=self.device), infos

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        obs, rewards, terminated, truncated, infos = self.envs.step(actions.cpu().numpy())
        done = terminated | truncated
        final_obs = obs.copy()
        score = np.zeros(self.num_envs, dtype=np.int64)
        length = np.zeros(self.num_envs, dtype=np.int64)
        returns = np.zeros(self.num_envs, dtype=np.float32)
        for i in np.flatnonzero(done):
            final_obs[i] = infos["final_obs"][i]
            info = infos["final_info"]
            score[i] = info["score"][i]
            length[i] = info["steps"][i]
            returns[i] = info["score"][i] - float(terminated[i] and rewards[i] < 0)

        def to(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(a, device=self.device)

        done_t = to(done)
        infos = {
            "final_obs": to(final_obs),
            "_final_obs": done_t,
            "final_info": {"score": to(score), "steps": to(length), "return": to(returns)},
            "_final_info": done_t,
        }
        return to(obs), to(rewards.astype(np.float32)), to(terminated), to(truncated), infos

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("Gymnasium vector backends cannot be checkpointed")

    def close(self) -> None:
        self.envs.close()


def make_env(
    backend: str,
    num_envs: int,
    device: torch.device,
    size: int = 10,
    obs: str = "features",
    flood_fill: str = "off",
    initial_length: int = 3,
    hunger: int | None = None,
    kernel: str = "auto",
    env_id: str = SNAKE_ID,
) -> VectorSnake | GymVectorBackend | GymnasiumEnv:
    """Build the training env for ``backend`` with the same rules and observation everywhere; an
    ``env_id`` other than Snake's is that Gymnasium env (:class:`~rlperf.env.gym_env.GymnasiumEnv`).

    ``kernel`` (``env.kernel``) picks VectorSnake's step kernel; it does not apply to the Gymnasium
    backends (:func:`rlperf.env.plan.plan_env` says which kernel runs and why, for the run record).
    """
    if env_id != SNAKE_ID:
        return GymnasiumEnv(env_id, backend, num_envs, device)
    kwargs: dict[str, Any] = dict(size=size, obs=obs, flood_fill=flood_fill, initial_length=initial_length, hunger=hunger)
    if backend == "tensor":
        # The trainer reads each step's results before the next one: the env's buffers, no copies.
        return VectorSnake(num_envs=num_envs, device=device, kernel=kernel, copy=False, **kwargs)
    if backend in ("gym-sync", "gym-async"):
        return GymVectorBackend(backend, num_envs, device, **kwargs)
    raise ValueError(f"env.backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def env_spec(cfg: Any) -> tuple[tuple[int, ...], int]:
    """(observation shape, number of actions) of a config's env: Snake's from its keys, another
    Gymnasium env's from its spaces (a one-line ConfigError when it does not fit)."""
    e = cfg.env
    if e.id == SNAKE_ID:
        return observation_shape(e.size, e.obs, e.flood_fill), N_ACTIONS
    return env_spaces(e.id)


def build_env(cfg: Any, plan: EnvPlan) -> VectorSnake | GymVectorBackend | GymnasiumEnv:
    """The training env of a config, as :func:`rlperf.env.plan.plan_env` resolved it (:func:`make_env`
    with its keys, on the plan's device, with the plan's kernel)."""
    e = cfg.env
    return make_env(plan.backend, e.num_envs, plan.device, size=e.size, obs=e.obs, flood_fill=e.flood_fill,
                    initial_length=e.initial_length, hunger=e.hunger or None, kernel=plan.kernel or "auto", env_id=plan.id)
