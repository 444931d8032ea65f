"""Any registered Gymnasium env as the training env (``--set env.id=CartPole-v1``).

rlperf's DQN needs a ``Discrete`` action space and a ``Box`` observation. :class:`GymnasiumEnv`
builds ``num_envs`` copies through the env's own vector entry point (``env.backend=tensor``: the
env's batched implementation, e.g. ``CartPoleVectorEnv``) or Gymnasium's ``SyncVectorEnv`` /
``AsyncVectorEnv`` (``gym-sync`` / ``gym-async``), and speaks what the loop expects of
:class:`~rlperf.env.vector.VectorSnake`: tensors on the trainer's device, ``infos["final_obs"]``
for every board and per-episode statistics (``score`` is the episode's return).

Autoreset. The wrappers run in ``SAME_STEP`` mode, as VectorSnake does. A vector entry point may
only offer ``NEXT_STEP`` (Gymnasium's default: the step after an episode ends resets the board and
ignores its action); then that step is not a transition, and ``infos["_valid"]`` marks the boards
the loop may push.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import numpy as np
import torch

from rlperf.errors import ConfigError


@functools.cache
def env_spaces(env_id: str) -> tuple[tuple[int, ...], int]:
    """(observation shape as the network sees it, number of actions) of a registered env; a one-line
    ConfigError when the env is unknown, cannot be built here, or does not fit rlperf's DQN."""
    import gymnasium

    if env_id not in gymnasium.registry:
        close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=1, cutoff=0.6)
        raise ConfigError(f"env.id={env_id!r} is not a registered Gymnasium env",
                          hint=f"did you mean {close[0]!r}?" if close else "see gymnasium.pprint_registry()")
    try:
        env = gymnasium.make(env_id)
    except Exception as exc:  # a missing extra (box2d, mujoco, ale-py...) or a bad registration
        text = " ".join(str(exc).split())[:200]
        raise ConfigError(f"env.id={env_id} cannot be built here: {type(exc).__name__}: {text}") from None
    try:
        obs_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(action_space, gymnasium.spaces.Discrete):
        raise ConfigError(f"env.id={env_id} has a {type(action_space).__name__} action space; rlperf's DQN needs "
                          f"Discrete actions", hint="pick an env with a Discrete action space, e.g. CartPole-v1")
    if not isinstance(obs_space, gymnasium.spaces.Box) or obs_space.shape is None:
        raise ConfigError(f"env.id={env_id} has a {type(obs_space).__name__} observation; rlperf's DQN needs a Box",
                          hint="wrap it to a Box observation (gymnasium.wrappers.FlattenObservation) and register that")
    return network_shape(tuple(obs_space.shape)), int(action_space.n)


def network_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Vectors stay vectors, (C, H, W) images stay images (for the CNN); anything else is flattened."""
    return shape if len(shape) in (1, 3) else (int(np.prod(shape)),)


class GymnasiumEnv:
    """``num_envs`` copies of a Gymnasium env, batched, returning tensors on ``device``."""

    def __init__(self, env_id: str, backend: str, num_envs: int, device: torch.device) -> None:
        import gymnasium
        from gymnasium.vector import AutoresetMode

        self.obs_shape, self.n_actions = env_spaces(env_id)
        spec = gymnasium.spec(env_id)
        if backend == "tensor":
            if spec.vector_entry_point is None:
                raise ConfigError(f"env.id={env_id} has no vector entry point (a batched implementation)",
                                  hint="use --set env.backend=gym-sync (or gym-async): Gymnasium's vector wrappers")
            self.envs = gymnasium.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
        else:
            mode = "sync" if backend == "gym-sync" else "async"
            self.envs = gymnasium.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode,
                                           vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
        self.same_step = self.envs.metadata.get("autoreset_mode") == AutoresetMode.SAME_STEP
        self.start = int(getattr(self.envs.single_action_space, "start", 0))
        self.num_envs = num_envs
        self.device = device
        self.env_id = env_id
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._resetting = np.zeros(num_envs, dtype=bool)  # NEXT_STEP: boards this step resets

    def _tensor(self, a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.as_tensor(a, dtype=dtype, device=self.device)

    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        return self._tensor(np.asarray(obs, dtype=np.float32).reshape(self.num_envs, *self.obs_shape))

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        obs, infos = self.envs.reset(seed=seed)
        self._returns[:] = 0
        self._lengths[:] = 0
        self._resetting[:] = False
        return self._obs(obs), infos

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        obs, rewards, terminated, truncated, infos = self.envs.step(actions.cpu().numpy() + self.start)
        done = np.logical_or(terminated, truncated)
        valid = ~self._resetting
        final_obs = np.array(obs, dtype=np.float32, copy=True)
        if self.same_step and done.any():
            for i in np.flatnonzero(done):
                final_obs[i] = infos["final_obs"][i]
        self._returns[valid] += rewards[valid]
        self._lengths[valid] += 1
        score, length = np.where(done, self._returns, 0.0), np.where(done, self._lengths, 0)
        self._returns[done] = 0
        self._lengths[done] = 0
        if not self.same_step:
            self._resetting = done
        done_t = self._tensor(done)
        out_infos: dict[str, Any] = {
            "final_obs": self._obs(final_obs),
            "_final_obs": done_t,
            "final_info": {"score": self._tensor(score, torch.float32), "steps": self._tensor(length),
                           "return": self._tensor(score, torch.float32)},
            "_final_info": done_t,
        }
        if not self.same_step:
            out_infos["_valid"] = self._tensor(valid)
        return (self._obs(obs), self._tensor(rewards, torch.float32), self._tensor(terminated), self._tensor(truncated),
                out_infos)

    def close(self) -> None:
        self.envs.close()
