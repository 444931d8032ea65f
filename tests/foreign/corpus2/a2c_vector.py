"""Synchronous A2C on a gymnasium SyncVectorEnv (CartPole), n-step returns."""
import os
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

FIX = os.environ.get("FIX", "0") == "1"

NUM_ENVS = 16
ROLLOUT = 32
UPDATES = 80
GAMMA = 0.99
ENT_COEF = 0.01
VF_COEF = 0.5


def configure_runtime(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    intra_op = 1 if FIX else 32
    torch.set_num_threads(intra_op)


class ActorCritic(nn.Module):
    def __init__(self, obs_dim, n_act, width=256):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, width), nn.Tanh(),
                                   nn.Linear(width, width), nn.Tanh())
        self.pi = nn.Linear(width, n_act)
        self.v = nn.Linear(width, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.pi(h), self.v(h).squeeze(-1)


def nstep_returns(rewards, dones, last_value, gamma):
    out = torch.zeros_like(rewards)
    running = last_value
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        out[t] = running
    return out


def train():
    configure_runtime(7)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(NUM_ENVS)])
    obs_dim = envs.single_observation_space.shape[0]
    n_act = envs.single_action_space.n
    model = ActorCritic(obs_dim, n_act)
    opt = torch.optim.RMSprop(model.parameters(), lr=7e-4, alpha=0.99, eps=1e-5)
    obs, _ = envs.reset(seed=7)
    finished = []
    ep_ret = np.zeros(NUM_ENVS)
    for update in range(UPDATES):
        obs_buf, act_buf, rew_buf, done_buf = [], [], [], []
        for _ in range(ROLLOUT):
            o = torch.as_tensor(obs, dtype=torch.float32)
            with torch.no_grad():
                logits, _ = model(o)
            act = torch.distributions.Categorical(logits=logits).sample()
            obs, rew, term, trunc, _ = envs.step(act.numpy())
            done = np.logical_or(term, trunc)
            ep_ret += rew
            for k in np.flatnonzero(done):
                finished.append(ep_ret[k])
                ep_ret[k] = 0
            obs_buf.append(o)
            act_buf.append(act)
            rew_buf.append(torch.as_tensor(rew, dtype=torch.float32))
            done_buf.append(torch.as_tensor(term, dtype=torch.float32))
        with torch.no_grad():
            _, last_v = model(torch.as_tensor(obs, dtype=torch.float32))
        returns = nstep_returns(torch.stack(rew_buf), torch.stack(done_buf), last_v, GAMMA)
        b_obs = torch.cat(obs_buf)
        b_act = torch.cat(act_buf)
        logits, values = model(b_obs)
        dist = torch.distributions.Categorical(logits=logits)
        adv = returns.flatten() - values
        loss = (-(dist.log_prob(b_act) * adv.detach()).mean()
                + VF_COEF * adv.pow(2).mean() - ENT_COEF * dist.entropy().mean())
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    envs.close()
    return finished


if __name__ == "__main__":
    t0 = time.perf_counter()
    rets = train()
    print(f"episodes={len(rets)} last20={np.mean(rets[-20:]):.1f} time={time.perf_counter() - t0:.2f}s")
