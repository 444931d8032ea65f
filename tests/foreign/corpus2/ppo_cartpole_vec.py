"""PPO (clipped, GAE) on gymnasium SyncVectorEnv CartPole with minibatched updates."""
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn


@dataclass
class Hparams:
    n_envs: int = 8
    n_steps: int = 128
    iterations: int = 30
    epochs: int = 4
    minibatch: int = 256
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    lr: float = 2.5e-4


def layer(i, o, std=np.sqrt(2)):
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.zeros_(lin.bias)
    return lin


class AC(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 2, 0.01))
        self.critic = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))


def run(hp: Hparams):
    torch.set_num_threads(1)
    torch.manual_seed(1)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(hp.n_envs)])
    ac = AC()
    opt = torch.optim.Adam(ac.parameters(), lr=hp.lr, eps=1e-5)
    N, T = hp.n_envs, hp.n_steps
    obs_b = torch.zeros(T, N, 4)
    act_b = torch.zeros(T, N, dtype=torch.long)
    lp_b, rew_b, done_b, val_b = (torch.zeros(T, N) for _ in range(4))
    obs, _ = envs.reset(seed=1)
    obs = torch.as_tensor(obs)
    done = torch.zeros(N)
    ep_ret, rets = np.zeros(N), []
    for it in range(hp.iterations):
        for t in range(T):
            obs_b[t], done_b[t] = obs, done
            with torch.no_grad():
                logits = ac.actor(obs)
                dist = torch.distributions.Categorical(logits=logits)
                a = dist.sample()
                val_b[t] = ac.critic(obs).squeeze(-1)
            act_b[t], lp_b[t] = a, dist.log_prob(a)
            o, r, term, trunc, _ = envs.step(a.numpy())
            rew_b[t] = torch.as_tensor(r)
            d = term | trunc
            ep_ret += r
            rets.extend(ep_ret[d].tolist())
            ep_ret[d] = 0
            obs, done = torch.as_tensor(o), torch.as_tensor(d, dtype=torch.float32)
        with torch.no_grad():
            nv = ac.critic(obs).squeeze(-1)
            adv = torch.zeros(T, N)
            last = torch.zeros(N)
            for t in reversed(range(T)):
                nonterm = 1.0 - (done if t == T - 1 else done_b[t + 1])
                nxt = nv if t == T - 1 else val_b[t + 1]
                delta = rew_b[t] + hp.gamma * nxt * nonterm - val_b[t]
                last = delta + hp.gamma * hp.lam * nonterm * last
                adv[t] = last
            ret = adv + val_b
        b_o, b_a, b_lp = obs_b.reshape(-1, 4), act_b.reshape(-1), lp_b.reshape(-1)
        b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
        for _ in range(hp.epochs):
            for mb in torch.randperm(N * T).split(hp.minibatch):
                dist = torch.distributions.Categorical(logits=ac.actor(b_o[mb]))
                ratio = (dist.log_prob(b_a[mb]) - b_lp[mb]).exp()
                madv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg = torch.max(-madv * ratio, -madv * ratio.clamp(1 - hp.clip, 1 + hp.clip)).mean()
                vl = 0.5 * (ac.critic(b_o[mb]).squeeze(-1) - b_ret[mb]).pow(2).mean()
                loss = pg + 0.5 * vl - 0.01 * dist.entropy().mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(ac.parameters(), 0.5)
                opt.step()
    envs.close()
    return rets


if __name__ == "__main__":
    t0 = time.perf_counter()
    r = run(Hparams())
    print(f"episodes={len(r)} last20={np.mean(r[-20:]):.1f} time={time.perf_counter() - t0:.2f}s")
