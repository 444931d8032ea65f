"""Planted: the replay is a deque of tuples sampled with random.sample and rebuilt with comprehensions."""

import random
from collections import deque

import numpy as np
import torch

from common import run


class DequeReplay:
    def __init__(self) -> None:
        self.items: deque = deque(maxlen=50_000)
        self.size = 0

    def push(self, obs, actions, rewards, next_obs, dones) -> None:
        self.items.extend(zip(obs.numpy(), actions.numpy(), rewards.numpy(), next_obs.numpy(), dones.numpy(), strict=True))
        self.size = len(self.items)

    def sample(self, batch):
        rows = random.sample(self.items, batch)
        return (torch.tensor(np.array([r[0] for r in rows])), torch.tensor([int(r[1]) for r in rows]),
                torch.tensor([float(r[2]) for r in rows]), torch.tensor(np.array([r[3] for r in rows])),
                torch.tensor([float(r[4]) for r in rows]))


torch.set_num_threads(1)
run(replay=DequeReplay(), steps=1000)
