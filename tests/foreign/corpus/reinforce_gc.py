"""REINFORCE on CartPole (gymnasium) with a demonstration archive kept as dicts (for a BC baseline)
and every new transition appended to it.

Planted (gc_pauses): after every episode the script calls ``gc.collect()`` "to keep memory flat";
with the archive holding a few hundred thousand objects, each full collection walks all of them.
``--fixed`` leaves collection to the interpreter.
"""
import argparse
import gc
import random

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import Categorical


def load_demonstrations(n, rng):
    """Stand-in for unpickling a demonstration set: one dict of Python values per transition."""
    return [{"episode": -1, "obs": [rng.random() for _ in range(4)], "action": rng.randrange(2), "reward": 1.0,
             "next_obs": [rng.random() for _ in range(4)], "done": False, "tags": ["demo", "cartpole"]} for _ in range(n)]


def run(episodes, fixed):
    env = gym.make("CartPole-v1")
    policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    archive = load_demonstrations(10_000, random.Random(0))
    lengths = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        log_probs, rewards = [], []
        done = False
        while not done:
            dist = Categorical(logits=policy(torch.as_tensor(obs)))
            action = dist.sample()
            next_obs, reward, terminated, truncated, _ = env.step(int(action))
            archive.append({"episode": episode, "obs": obs.tolist(), "action": int(action), "reward": float(reward),
                            "next_obs": next_obs.tolist(), "done": bool(terminated), "tags": ["train", "cartpole"]})
            log_probs.append(dist.log_prob(action))
            rewards.append(reward)
            obs, done = next_obs, terminated or truncated
        g, returns = 0.0, []
        for r in reversed(rewards):
            g = r + 0.99 * g
            returns.insert(0, g)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        loss = -(torch.stack(log_probs) * returns).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        lengths.append(len(rewards))
        if not fixed:
            gc.collect()  # planted: gc_pauses
    return lengths, archive


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lengths, archive = run(max(1, int(50 * args.scale)), args.fixed)
    print(f"{len(lengths)} episodes, {len(archive)} transitions archived, last length {lengths[-1]}")
