"""Planted: 128 CartPole envs stepped one by one by gymnasium's SyncVectorEnv."""

import gymnasium
import numpy as np
import torch

from common import run


class Envs:
    def __init__(self, n: int) -> None:
        self.envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1") for _ in range(n)])

    def reset(self) -> np.ndarray:
        return self.envs.reset(seed=0)[0].astype(np.float32)

    def step(self, actions):
        obs, reward, terminated, truncated, _ = self.envs.step(actions)
        return obs.astype(np.float32), reward.astype(np.float32), terminated | truncated


def act4(q, obs, epsilon):
    with torch.inference_mode():
        return q(obs).argmax(1)


torch.set_num_threads(1)
run(env=Envs(128), act_fn=act4, steps=150, obs_dim=4)
