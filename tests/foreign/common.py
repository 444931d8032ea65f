"""What the foreign test loops share: a toy vectorized env, a Q-network, and a clean DQN loop whose
pieces each loop replaces with one slow form. Written for the tests as a user would write a script:
it knows nothing of rlperf except the optional phase timer."""

from __future__ import annotations

import argparse
import contextlib
import copy

import numpy as np
import torch
from torch import nn


class ToyEnvs:
    """N random walks stepped at once with NumPy: observation 8 floats, 2 actions, episodes of ~20 steps."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.pos = np.zeros(n, dtype=np.float32)
        self.t = np.zeros(n, dtype=np.int64)
        self.w = self.rng.standard_normal((1, 8)).astype(np.float32)

    def observe(self) -> np.ndarray:
        return np.tanh(self.pos[:, None] * self.w + self.t[:, None] * 0.01).astype(np.float32)

    def reset(self) -> np.ndarray:
        self.pos[:] = 0.0
        self.t[:] = 0
        return self.observe()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.pos += np.where(actions == 1, 0.1, -0.1) + self.rng.normal(0, 0.05, self.n).astype(np.float32)
        self.t += 1
        done = (np.abs(self.pos) > 1.0) | (self.t >= 20)
        reward = (1.0 - np.abs(self.pos)).astype(np.float32)
        self.pos[done] = 0.0
        self.t[done] = 0
        return self.observe(), reward, done


def q_network(width: int = 64, obs: int = 8, actions: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(obs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, actions))


class Replay:
    """A tensor ring buffer: one vectorized write per push, one index draw and gather per sample."""

    def __init__(self, capacity: int, obs: int = 8) -> None:
        self.obs = torch.zeros(capacity, obs)
        self.actions = torch.zeros(capacity, dtype=torch.int64)
        self.rewards = torch.zeros(capacity)
        self.next_obs = torch.zeros(capacity, obs)
        self.dones = torch.zeros(capacity)
        self.capacity, self.cursor, self.size = capacity, 0, 0

    def push(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
             dones: torch.Tensor) -> None:
        idx = (self.cursor + torch.arange(obs.shape[0])) % self.capacity
        self.obs[idx], self.actions[idx], self.rewards[idx] = obs, actions, rewards
        self.next_obs[idx], self.dones[idx] = next_obs, dones.float()
        self.cursor = (self.cursor + obs.shape[0]) % self.capacity
        self.size = min(self.size + obs.shape[0], self.capacity)

    def sample(self, batch: int) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(0, self.size, (batch,))
        return self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx], self.dones[idx]


def act(q: nn.Module, obs: torch.Tensor, epsilon: float) -> torch.Tensor:
    with torch.inference_mode():
        greedy = q(obs).argmax(1)
    explore = torch.rand(obs.shape[0]) < epsilon
    return torch.where(explore, torch.randint(0, 2, (obs.shape[0],)), greedy)


def update(q: nn.Module, target: nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    obs, actions, rewards, next_obs, dones = batch
    with torch.no_grad():
        y = rewards + 0.99 * (1 - dones) * target(next_obs).max(1).values
    loss = nn.functional.smooth_l1_loss(q(obs).gather(1, actions[:, None]).squeeze(1), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def soft_update(q: nn.Module, target: nn.Module, tau: float = 0.01) -> None:
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(q.parameters()), tau)


def run(steps: int = 300, envs: int = 64, *, env: object = None, replay: object = None, act_fn=act, update_fn=update,
        target_fn=soft_update, updates_per_step: int = 1, log_every: int = 100, on_log=None, timer=None,
        width: int = 64, batch: int = 64, obs_dim: int = 8) -> float:
    """The loop: select, step, push, train, log. Returns the last mean loss."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=steps)
    steps = parser.parse_known_args()[0].steps
    torch.manual_seed(0)
    env = env if env is not None else ToyEnvs(envs)
    replay = replay if replay is not None else Replay(50_000, obs_dim)
    q = q_network(width, obs_dim)
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    obs = torch.as_tensor(env.reset())
    losses = torch.zeros(())
    count = 0

    def phase(name: str):
        return timer.phase(name) if timer is not None else contextlib.nullcontext()

    for t in range(steps):
        with phase("select"):
            actions = act_fn(q, obs, max(0.05, 1 - t / steps))
        with phase("step"):
            next_obs, rewards, dones = env.step(actions.numpy())
            next_obs, rewards, dones = torch.as_tensor(next_obs), torch.as_tensor(rewards), torch.as_tensor(dones)
        with phase("push"):
            replay.push(obs, actions, rewards, next_obs, dones)
            obs = next_obs
        with phase("train"):
            if replay.size >= batch:
                for _ in range(updates_per_step):
                    losses += update_fn(q, target, opt, replay.sample(batch))
                    target_fn(q, target)
                    count += 1
        with phase("log"):
            if (t + 1) % log_every == 0 and count:
                mean = float(losses) / count
                losses.zero_()
                count = 0
                if on_log is not None:
                    on_log(t, mean)
        if timer is not None:
            timer.step_done()
    return float(losses)
