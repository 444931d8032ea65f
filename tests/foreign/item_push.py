"""Planted: the replay push loops over the batch, copying each transition to the host with .item()/.cpu()."""

import numpy as np
import torch

from common import run


class HostReplay:
    def __init__(self, capacity: int = 50_000) -> None:
        self.obs = np.zeros((capacity, 8), np.float32)
        self.next_obs = np.zeros((capacity, 8), np.float32)
        self.actions = np.zeros(capacity, np.int64)
        self.rewards = np.zeros(capacity, np.float32)
        self.dones = np.zeros(capacity, np.float32)
        self.capacity, self.cursor, self.size = capacity, 0, 0

    def push(self, obs, actions, rewards, next_obs, dones) -> None:
        for i in range(obs.shape[0]):  # one transition at a time, each field copied to the host
            j = self.cursor
            self.obs[j] = obs[i].cpu().numpy()
            self.actions[j] = actions[i].item()
            self.rewards[j] = rewards[i].item()
            self.next_obs[j] = next_obs[i].cpu().numpy()
            self.dones[j] = dones[i].item()
            self.cursor = (j + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def sample(self, batch):
        idx = np.random.randint(0, self.size, batch)
        return (torch.from_numpy(self.obs[idx]), torch.from_numpy(self.actions[idx]), torch.from_numpy(self.rewards[idx]),
                torch.from_numpy(self.next_obs[idx]), torch.from_numpy(self.dones[idx]))


torch.set_num_threads(1)
run(replay=HostReplay(), steps=150)
