"""Double DQN with Polyak-averaged target on CartPole (class-based agent)."""
import copy
import os
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FIX = os.environ.get("FIX", "0") == "1"


@dataclass
class Config:
    total_steps: int = 3000
    batch_size: int = 32
    train_every: int = 4
    buffer_size: int = 20_000
    gamma: float = 0.99
    tau: float = 0.005
    lr: float = 3e-4
    learning_starts: int = 300
    hidden: int = 128
    seed: int = 1


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions, hidden):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.LayerNorm(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(),
        )
        self.value = nn.Linear(hidden, 1)
        self.advantage = nn.Linear(hidden, n_actions)

    def forward(self, x):
        h = self.body(x)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=1, keepdim=True)


class Replay:
    def __init__(self, size, obs_dim, rng):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.act = np.zeros(size, np.int64)
        self.rew = np.zeros(size, np.float32)
        self.done = np.zeros(size, np.float32)
        self.size, self.ptr, self.cap, self.rng = 0, 0, size, rng

    def add(self, o, a, r, o2, d):
        i = self.ptr
        self.obs[i], self.act[i], self.rew[i], self.next_obs[i], self.done[i] = o, a, r, o2, d
        self.ptr = (i + 1) % self.cap
        self.size = min(self.size + 1, self.cap)

    def sample(self, n):
        j = self.rng.integers(0, self.size, n)
        return (torch.from_numpy(self.obs[j]), torch.from_numpy(self.act[j]),
                torch.from_numpy(self.rew[j]), torch.from_numpy(self.next_obs[j]),
                torch.from_numpy(self.done[j]))


class DoubleDQNAgent:
    def __init__(self, obs_dim, n_actions, cfg: Config):
        self.cfg = cfg
        self.n_actions = n_actions
        self.online = QNetwork(obs_dim, n_actions, cfg.hidden)
        self.target = copy.deepcopy(self.online)
        self.target.requires_grad_(False)
        self.optim = torch.optim.Adam(self.online.parameters(), lr=cfg.lr)
        self.rng = np.random.default_rng(cfg.seed)

    def act(self, obs, eps):
        if self.rng.random() < eps:
            return int(self.rng.integers(self.n_actions))
        with torch.no_grad():
            q = self.online(torch.as_tensor(obs, dtype=torch.float32)[None])
        return int(q.argmax())

    def _blend_target(self):
        tau = self.cfg.tau
        if FIX:
            with torch.no_grad():
                torch._foreach_lerp_(list(self.target.parameters()),
                                     list(self.online.parameters()), tau)
            return
        fresh = copy.deepcopy(self.online)
        with torch.no_grad():
            for p_new, p_old in zip(fresh.parameters(), self.target.parameters()):
                p_new.mul_(tau).add_(p_old, alpha=1.0 - tau)
        fresh.requires_grad_(False)
        self.target = fresh

    def learn(self, batch):
        obs, act, rew, next_obs, done = batch
        with torch.no_grad():
            next_a = self.online(next_obs).argmax(dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_a).squeeze(1)
            y = rew + self.cfg.gamma * (1.0 - done) * next_q
        q = self.online(obs).gather(1, act[:, None]).squeeze(1)
        loss = F.mse_loss(q, y)
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.online.parameters(), 10.0)
        self.optim.step()
        return loss

    def on_env_step(self):
        self._blend_target()


def run(cfg: Config):
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    env = gym.make("CartPole-v1")
    obs_dim = env.observation_space.shape[0]
    agent = DoubleDQNAgent(obs_dim, env.action_space.n, cfg)
    buf = Replay(cfg.buffer_size, obs_dim, np.random.default_rng(cfg.seed))
    obs, _ = env.reset(seed=cfg.seed)
    ep_ret, returns = 0.0, []
    for step in range(cfg.total_steps):
        eps = max(0.05, 1.0 - step / (0.4 * cfg.total_steps))
        a = agent.act(obs, eps)
        nxt, r, term, trunc, _ = env.step(a)
        buf.add(obs, a, r, nxt, float(term))
        ep_ret += r
        obs = nxt
        if term or trunc:
            returns.append(ep_ret)
            ep_ret = 0.0
            obs, _ = env.reset()
        if step >= cfg.learning_starts and step % cfg.train_every == 0:
            agent.learn(buf.sample(cfg.batch_size))
        agent.on_env_step()
    return returns


if __name__ == "__main__":
    t0 = time.perf_counter()
    rets = run(Config())
    print(f"episodes={len(rets)} last10={np.mean(rets[-10:]):.1f} time={time.perf_counter() - t0:.2f}s")
