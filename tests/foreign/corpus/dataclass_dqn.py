"""A dataclass-configured Double DQN on two vectorized CartPoles (gymnasium's SyncVectorEnv).

Planted (target_copy): the target network is rebuilt with ``copy.deepcopy`` at every vector step
("always fresh targets"), while updates run every ``train_every`` steps. ``--fixed`` copies the
weights every ``target_period`` updates instead.
"""
from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class NetConfig:
    hidden: tuple[int, ...] = (128, 128, 128)
    activation: str = "relu"


@dataclass(frozen=True)
class TrainConfig:
    num_envs: int = 2
    vector_steps: int = 5000
    train_every: int = 10
    batch_size: int = 64
    gamma: float = 0.99
    lr: float = 3e-4
    target_period: int = 100
    fresh_target_every_update: bool = True
    net: NetConfig = field(default_factory=NetConfig)

    @classmethod
    def from_argv(cls, argv: list[str]) -> TrainConfig:
        scale = float(argv[argv.index("--scale") + 1]) if "--scale" in argv else 1.0
        return cls(vector_steps=int(cls.vector_steps * scale), fresh_target_every_update="--fixed" not in argv)


def build_q(cfg: NetConfig, obs_dim: int, n_actions: int) -> nn.Module:
    layers: list[nn.Module] = []
    width = obs_dim
    for h in cfg.hidden:
        layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.ReLU() if cfg.activation == "relu" else nn.Tanh()]
        width = h
    layers.append(nn.Linear(width, n_actions))
    return nn.Sequential(*layers)


@dataclass
class Memory:
    capacity: int
    obs_dim: int
    obs: np.ndarray = field(init=False)
    next_obs: np.ndarray = field(init=False)
    actions: np.ndarray = field(init=False)
    rewards: np.ndarray = field(init=False)
    dones: np.ndarray = field(init=False)
    size: int = 0
    head: int = 0

    def __post_init__(self) -> None:
        self.obs = np.zeros((self.capacity, self.obs_dim), np.float32)
        self.next_obs = np.zeros((self.capacity, self.obs_dim), np.float32)
        self.actions = np.zeros(self.capacity, np.int64)
        self.rewards = np.zeros(self.capacity, np.float32)
        self.dones = np.zeros(self.capacity, np.float32)

    def extend(self, obs, actions, rewards, next_obs, dones) -> None:
        idx = (self.head + np.arange(len(obs))) % self.capacity
        self.obs[idx], self.actions[idx], self.rewards[idx] = obs, actions, rewards
        self.next_obs[idx], self.dones[idx] = next_obs, dones
        self.head = int(idx[-1] + 1) % self.capacity
        self.size = min(self.size + len(obs), self.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> list[torch.Tensor]:
        idx = rng.integers(0, self.size, n)
        return [torch.from_numpy(a[idx]) for a in (self.obs, self.actions, self.rewards, self.next_obs, self.dones)]


def main() -> None:
    cfg = TrainConfig.from_argv(sys.argv[1:])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    envs = gym.make_vec("CartPole-v1", num_envs=cfg.num_envs, vectorization_mode="sync")
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    online = build_q(cfg.net, obs_dim, n_actions)
    target = copy.deepcopy(online)
    opt = torch.optim.Adam(online.parameters(), lr=cfg.lr)
    memory = Memory(50_000, obs_dim)

    obs, _ = envs.reset(seed=0)
    updates = 0
    for step in range(cfg.vector_steps):
        eps = max(0.05, 1.0 - step / (0.5 * cfg.vector_steps))
        with torch.no_grad():
            greedy = online(torch.from_numpy(obs)).argmax(1).numpy()
        actions = np.where(rng.random(cfg.num_envs) < eps, rng.integers(0, n_actions, cfg.num_envs), greedy)
        next_obs, rewards, term, _, _ = envs.step(actions)
        memory.extend(obs, actions, rewards, next_obs, term.astype(np.float32))
        obs = next_obs
        if cfg.fresh_target_every_update:
            target = copy.deepcopy(online)  # planted: target_copy
        if memory.size < cfg.batch_size or step % cfg.train_every:
            continue
        b_obs, b_act, b_rew, b_next, b_done = memory.sample(cfg.batch_size, rng)
        with torch.no_grad():
            best = online(b_next).argmax(1, keepdim=True)
            y = b_rew + cfg.gamma * (1 - b_done) * target(b_next).gather(1, best).squeeze(1)
        q = online(b_obs).gather(1, b_act[:, None]).squeeze(1)
        loss = nn.functional.mse_loss(q, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        updates += 1
        if not cfg.fresh_target_every_update and updates % cfg.target_period == 0:
            target.load_state_dict(online.state_dict())
    print(f"{updates} updates, final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
