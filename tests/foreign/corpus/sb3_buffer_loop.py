"""DQN over 256 NumPy "reacher" envs, storing transitions in Stable-Baselines3's ReplayBuffer.

Planted (host_copy): the buffer was created for one env, so each vector step pushes the 256
transitions one at a time, reading every action, reward and done with ``.item()``.
``--fixed`` creates the buffer with ``n_envs=256`` and adds the whole batch in one call.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from torch import nn

N_ENVS = 256
OBS_DIM = 6


class Reachers:
    """Point masses pushed toward a goal; 5 discrete pushes; 50-step episodes."""

    def __init__(self, n: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.n = n
        self.pos = np.zeros((n, 2), np.float32)
        self.vel = np.zeros((n, 2), np.float32)
        self.goal = self.rng.uniform(-1, 1, (n, 2)).astype(np.float32)
        self.t = np.zeros(n, np.int64)
        self.pushes = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], np.float32) * 0.05

    def obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.vel, self.goal - self.pos], axis=1)

    def step(self, actions: np.ndarray):
        self.vel = 0.9 * self.vel + self.pushes[actions]
        self.pos = np.clip(self.pos + self.vel, -1.5, 1.5)
        dist = np.linalg.norm(self.goal - self.pos, axis=1)
        reward = (-dist).astype(np.float32)
        self.t += 1
        done = (dist < 0.05) | (self.t >= 50)
        final = self.obs()
        k = int(done.sum())
        if k:
            self.pos[done], self.vel[done], self.t[done] = 0.0, 0.0, 0
            self.goal[done] = self.rng.uniform(-1, 1, (k, 2))
        return final, reward, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000, help="vector steps")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    envs = Reachers(N_ENVS, seed=0)
    obs_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    act_space = spaces.Discrete(5)
    rb = ReplayBuffer(100_000, obs_space, act_space, device="cpu", n_envs=N_ENVS if args.fixed else 1,
                      handle_timeout_termination=False)
    q = nn.Sequential(nn.Linear(OBS_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    target = nn.Sequential(nn.Linear(OBS_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)

    obs = envs.obs()
    steps = int(args.steps * args.scale)
    for step in range(steps):
        eps = max(0.05, 1.0 - step / (0.5 * steps))
        with torch.no_grad():
            actions = q(torch.as_tensor(obs)).argmax(1)
        explore = torch.rand(N_ENVS) < eps
        actions = torch.where(explore, torch.randint(0, 5, (N_ENVS,)), actions)
        next_obs, rewards, dones = envs.step(actions.numpy())

        if args.fixed:
            rb.add(obs, next_obs, actions.numpy(), rewards, dones, [{}] * N_ENVS)
        else:
            for i in range(N_ENVS):
                rb.add(obs[i], next_obs[i], np.array([actions[i].item()]), np.array([rewards[i].item()]),  # planted: host_copy
                       np.array([dones[i].item()]), [{}])
        obs = next_obs

        if step >= 10 and step % 8 == 0:
            batch = rb.sample(256)
            with torch.no_grad():
                next_q = target(batch.next_observations).max(1).values
                target_q = batch.rewards.flatten() + 0.99 * (1 - batch.dones.flatten()) * next_q
            q_sa = q(batch.observations).gather(1, batch.actions.long()).flatten()
            loss = nn.functional.smooth_l1_loss(q_sa, target_q)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % 250 == 0:
            target.load_state_dict(q.state_dict())
    print(f"done: {steps} vector steps, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
