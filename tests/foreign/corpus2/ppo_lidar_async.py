"""PPO with a gymnasium AsyncVectorEnv of lidar navigation environments."""
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from envs.lidar_nav import LidarNav, N_RAYS

N_ENVS = 2
HORIZON = 128


class Agent(nn.Module):
    def __init__(self, obs_dim, n_act):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.logits = nn.Linear(128, n_act)
        self.value = nn.Linear(128, 1)

    def forward(self, x):
        z = self.enc(x)
        return self.logits(z), self.value(z).squeeze(-1)


def collect(envs, agent, obs):
    buf = {k: [] for k in ("obs", "act", "logp", "val", "rew", "done")}
    for _ in range(HORIZON):
        o = torch.as_tensor(obs)
        with torch.no_grad():
            logits, v = agent(o)
            dist = torch.distributions.Categorical(logits=logits)
            a = dist.sample()
        obs, r, term, trunc, _ = envs.step(a.numpy())
        buf["obs"].append(o); buf["act"].append(a); buf["logp"].append(dist.log_prob(a))
        buf["val"].append(v); buf["rew"].append(torch.as_tensor(r, dtype=torch.float32))
        buf["done"].append(torch.as_tensor(term | trunc, dtype=torch.float32))
    return obs, {k: torch.stack(v) for k, v in buf.items()}


def ppo_update(agent, opt, batch, last_val, gamma=0.99, lam=0.95):
    rew, val, done = batch["rew"], batch["val"], batch["done"]
    adv = torch.zeros_like(rew)
    acc = torch.zeros(rew.shape[1])
    nxt = last_val
    for t in reversed(range(rew.shape[0])):
        delta = rew[t] + gamma * nxt * (1 - done[t]) - val[t]
        acc = delta + gamma * lam * (1 - done[t]) * acc
        adv[t] = acc
        nxt = val[t]
    ret = (adv + val).flatten()
    adv = adv.flatten()
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    o = batch["obs"].flatten(0, 1)
    a = batch["act"].flatten()
    lp = batch["logp"].flatten()
    for _ in range(2):
        for mb in torch.randperm(len(o)).split(256):
            logits, v = agent(o[mb])
            d = torch.distributions.Categorical(logits=logits)
            ratio = (d.log_prob(a[mb]) - lp[mb]).exp()
            loss = (-torch.min(ratio * adv[mb], ratio.clamp(0.8, 1.2) * adv[mb]).mean()
                    + 0.5 * (v - ret[mb]).pow(2).mean() - 0.01 * d.entropy().mean())
            opt.zero_grad()
            loss.backward()
            opt.step()


def main():
    torch.set_num_threads(1)
    torch.manual_seed(9)
    envs = gym.vector.AsyncVectorEnv([lambda: LidarNav() for _ in range(N_ENVS)])
    agent = Agent(N_RAYS + 3, 3)
    opt = torch.optim.Adam(agent.parameters(), lr=3e-4)
    obs, _ = envs.reset(seed=9)
    total_r = 0.0
    for it in range(10):
        obs, batch = collect(envs, agent, obs)
        total_r += float(batch["rew"].sum())
        with torch.no_grad():
            _, last_v = agent(torch.as_tensor(obs))
        ppo_update(agent, opt, batch, last_v)
    envs.close()
    return total_r


if __name__ == "__main__":
    t0 = time.perf_counter()
    tr = main()
    print(f"total_reward={tr:.2f} time={time.perf_counter() - t0:.2f}s")
