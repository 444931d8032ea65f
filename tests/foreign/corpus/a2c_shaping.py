"""Synchronous A2C on 64 NumPy "forager" envs with a potential-based shaping term.

Planted (reward_shaping): the shaping potential (distance to the nearest of 64 food items) is
computed in Python loops over envs and items every step. ``--fixed`` computes it with NumPy
broadcasting.
"""
import argparse
import math

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

N_ENVS, N_FOOD = 64, 64


class Foragers:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.pos = self.rng.uniform(0, 1, (N_ENVS, 2))
        self.food = self.rng.uniform(0, 1, (N_ENVS, N_FOOD, 2))
        self.t = np.zeros(N_ENVS, np.int64)
        self.dirs = np.array([[0, 0.02], [0.02, 0], [0, -0.02], [-0.02, 0]])

    def observe(self):
        nearest = self.food[np.arange(N_ENVS), np.argmin(np.linalg.norm(self.food - self.pos[:, None], axis=2), axis=1)]
        return np.concatenate([self.pos, nearest - self.pos, self.t[:, None] / 200], axis=1).astype(np.float32)

    def step(self, actions):
        self.pos = np.clip(self.pos + self.dirs[actions], 0, 1)
        dist = np.linalg.norm(self.food - self.pos[:, None], axis=2)
        eaten = dist < 0.03
        reward = eaten.sum(1).astype(np.float32)
        self.food[eaten] = self.rng.uniform(0, 1, (int(eaten.sum()), 2))
        self.t += 1
        done = self.t >= 200
        self.t[done] = 0
        return self.observe(), reward, done


def potential_loops(env):
    phi = np.zeros(N_ENVS, np.float32)
    for i in range(N_ENVS):
        best = float("inf")
        for j in range(N_FOOD):
            d = math.hypot(env.food[i, j, 0] - env.pos[i, 0], env.food[i, j, 1] - env.pos[i, 1])
            best = min(best, d)
        phi[i] = -best
    return phi


def potential_vectorized(env):
    return -np.linalg.norm(env.food - env.pos[:, None], axis=2).min(1).astype(np.float32)


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, 4)
        self.v = nn.Linear(64, 1)

    def forward(self, x):
        h = self.body(x)
        return self.pi(h), self.v(h).squeeze(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = Foragers(0)
    model = ActorCritic()
    opt = torch.optim.RMSprop(model.parameters(), lr=7e-4)
    potential = potential_vectorized if args.fixed else potential_loops
    obs = env.observe()
    phi = potential(env)
    gamma, n_steps = 0.99, 5
    for _ in range(int(args.updates * args.scale)):
        logps, values, rewards, masks, entropies = [], [], [], [], []
        for _ in range(n_steps):
            logits, value = model(torch.from_numpy(obs))
            dist = Categorical(logits=logits)
            action = dist.sample()
            obs, reward, done = env.step(action.numpy())
            next_phi = potential(env)  # planted: reward_shaping
            shaped = reward + gamma * next_phi - phi
            phi = next_phi
            logps.append(dist.log_prob(action))
            entropies.append(dist.entropy())
            values.append(value)
            rewards.append(torch.from_numpy(shaped))
            masks.append(torch.from_numpy(1.0 - done.astype(np.float32)))
        with torch.no_grad():
            ret = model(torch.from_numpy(obs))[1]
        returns = []
        for r, m in zip(reversed(rewards), reversed(masks), strict=True):
            ret = r + gamma * ret * m
            returns.insert(0, ret)
        adv = torch.stack(returns) - torch.stack(values)
        loss = -(torch.stack(logps) * adv.detach()).mean() + 0.5 * adv.pow(2).mean() - 0.01 * torch.stack(entropies).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    print(f"{int(args.updates * args.scale)} updates, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
