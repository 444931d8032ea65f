"""An actor-critic agent class on batched NumPy bandit-mazes that owns its rlperf.PhaseTimer and
checkpoints itself (model, optimizer, step) as it trains.

Planted (checkpointing): the agent writes a full checkpoint with ``torch.save`` after every update
("never lose progress"). ``--fixed`` checkpoints every 1000 updates.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

import rlperf


class Chains:
    """32 chain MDPs of length 10: moving right pays at the end, moving left pays a little now."""

    def __init__(self, n: int = 32, length: int = 10, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.n, self.length = n, length
        self.state = np.zeros(n, np.int64)

    def obs(self) -> np.ndarray:
        return np.eye(self.length, dtype=np.float32)[self.state]

    def step(self, actions: np.ndarray):
        slip = self.rng.random(self.n) < 0.1
        move = np.where(slip, 1 - actions, actions)
        self.state = np.clip(self.state + np.where(move == 1, 1, -1), 0, self.length - 1)
        reward = np.where(self.state == self.length - 1, 1.0, np.where(move == 0, 0.01, 0.0)).astype(np.float32)
        done = self.state == self.length - 1
        self.state[done] = 0
        return self.obs(), reward, done


class Agent:
    def __init__(self, ckpt_dir: Path, ckpt_every: int) -> None:
        self.net = nn.Sequential(nn.Linear(10, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=3e-4)
        self.timer = rlperf.PhaseTimer("cpu")
        self.ckpt_dir, self.ckpt_every = ckpt_dir, ckpt_every
        self.updates = 0

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = self.net(obs)[:, :2]
        return torch.distributions.Categorical(logits=logits).sample()

    def update(self, obs, actions, rewards, next_obs, dones) -> float:
        out = self.net(obs)
        with torch.no_grad():
            target = rewards + 0.95 * (1 - dones) * self.net(next_obs)[:, 2]
        value = out[:, 2]
        adv = (target - value).detach()
        logp = torch.log_softmax(out[:, :2], 1).gather(1, actions[:, None]).squeeze(1)
        loss = -(logp * adv).mean() + 0.5 * (target - value).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.updates += 1
        return loss.item()

    def save(self) -> None:
        torch.save({"net": self.net.state_dict(), "opt": self.opt.state_dict(), "updates": self.updates},
                   self.ckpt_dir / "latest.pt")

    def train(self, env: Chains, steps: int) -> None:
        obs = torch.from_numpy(env.obs())
        for _ in range(steps):
            with self.timer.phase("select"):
                actions = self.act(obs)
            with self.timer.phase("step"):
                next_obs, rewards, dones = (torch.from_numpy(a) for a in env.step(actions.numpy()))
            with self.timer.phase("train"):
                self.update(obs, actions, rewards, next_obs, dones.float())
            with self.timer.phase("checkpoint"):
                if self.updates % self.ckpt_every == 0:
                    self.save()  # planted: checkpointing
            obs = next_obs
            self.timer.step_done()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ckpt_dir = Path(tempfile.mkdtemp(prefix="ckpt-"))
    try:
        agent = Agent(ckpt_dir, ckpt_every=1000 if args.fixed else 1)
        agent.train(Chains(), int(args.steps * args.scale))
        print({name: f"{stats.share:.0%}" for name, stats in agent.timer.stats().items()})
    finally:
        shutil.rmtree(ckpt_dir)


if __name__ == "__main__":
    main()
