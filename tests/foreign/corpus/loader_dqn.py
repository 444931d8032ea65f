"""An object-oriented DQN in the style of a small library: Agent, Buffer and Trainer classes, a
``learn()`` entry point. The buffer hands out batches through torch.utils.data.

Planted (replay_sampling): every update builds a DataLoader over the whole buffer with shuffle=True and
takes one batch: a random permutation of all stored transitions, then 64 single-item reads collated
with torch.stack. ``--fixed`` draws 64 indices with torch.randint and gathers each field at once.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Walks:
    """64 noisy random walks stepped at once (observation 12 floats, 3 actions)."""

    def __init__(self, n: int = 64, seed: int = 1) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)
        self.x = np.zeros((n, 12), np.float32)
        self.t = np.zeros(n, np.int64)

    def reset(self) -> np.ndarray:
        self.x[:] = 0
        self.t[:] = 0
        return self.x.copy()

    def step(self, a: np.ndarray):
        self.x[:, 0] += (a - 1) * 0.1
        self.x[:, 1:] = 0.9 * self.x[:, 1:] + self.rng.normal(0, 0.1, (self.n, 11)).astype(np.float32)
        self.t += 1
        r = -np.abs(self.x[:, 0])
        done = (self.t >= 30) | (np.abs(self.x[:, 0]) > 2)
        self.x[done] = 0
        self.t[done] = 0
        return self.x.copy(), r.astype(np.float32), done


class Buffer(Dataset):
    def __init__(self, capacity: int, obs_dim: int) -> None:
        self.obs = torch.zeros(capacity, obs_dim)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.act = torch.zeros(capacity, dtype=torch.long)
        self.rew = torch.zeros(capacity)
        self.done = torch.zeros(capacity)
        self.capacity, self.ptr, self.full = capacity, 0, False

    def __len__(self) -> int:
        return self.capacity if self.full else self.ptr

    def __getitem__(self, i: int):
        return self.obs[i], self.act[i], self.rew[i], self.next_obs[i], self.done[i]

    def add(self, obs, act, rew, next_obs, done) -> None:
        n = obs.shape[0]
        idx = (self.ptr + torch.arange(n)) % self.capacity
        self.obs[idx], self.act[idx], self.rew[idx] = obs, act, rew
        self.next_obs[idx], self.done[idx] = next_obs, done
        self.full = self.full or self.ptr + n >= self.capacity
        self.ptr = (self.ptr + n) % self.capacity

    def sample(self, batch_size: int, fixed: bool):
        if fixed:
            i = torch.randint(0, len(self), (batch_size,))
            return self.obs[i], self.act[i], self.rew[i], self.next_obs[i], self.done[i]
        loader = DataLoader(self, batch_size=batch_size, shuffle=True)  # planted: replay_sampling
        return next(iter(loader))


class Agent:
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        self.q = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, n_actions))
        self.target = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, n_actions))
        self.target.load_state_dict(self.q.state_dict())
        self.opt = torch.optim.Adam(self.q.parameters(), lr=5e-4)
        self.n_actions = n_actions

    @torch.no_grad()
    def act(self, obs: torch.Tensor, eps: float) -> torch.Tensor:
        greedy = self.q(obs).argmax(1)
        rand = torch.randint(0, self.n_actions, greedy.shape)
        return torch.where(torch.rand(greedy.shape) < eps, rand, greedy)

    def update(self, batch) -> float:
        obs, act, rew, next_obs, done = batch
        with torch.no_grad():
            y = rew + 0.99 * (1 - done) * self.target(next_obs).max(1).values
        q = self.q(obs).gather(1, act[:, None]).squeeze(1)
        loss = nn.functional.mse_loss(q, y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.detach()


class Trainer:
    def __init__(self, steps: int, fixed: bool) -> None:
        self.env, self.steps, self.fixed = Walks(), steps, fixed
        self.agent = Agent(12, 3)
        self.buffer = Buffer(100_000, 12)

    def learn(self) -> None:
        obs = torch.as_tensor(self.env.reset())
        total = torch.zeros(())
        for step in range(self.steps):
            act = self.agent.act(obs, max(0.05, 1 - step / (0.5 * self.steps)))
            nxt, rew, done = self.env.step(act.numpy())
            nxt = torch.as_tensor(nxt)
            self.buffer.add(obs, act, torch.as_tensor(rew), nxt, torch.as_tensor(done, dtype=torch.float32))
            obs = nxt
            if len(self.buffer) >= 1000:
                total += self.agent.update(self.buffer.sample(64, self.fixed))  # planted: replay_sampling
            if step % 500 == 499:
                self.agent.target.load_state_dict(self.agent.q.state_dict())
                print(f"step {step + 1}: loss {float(total) / 500:.4f}")
                total.zero_()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixed", action="store_true")
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    Trainer(int(2000 * args.scale), args.fixed).learn()
