"""PPO on a SyncVectorEnv of Reacher2D with per-episode thumbnails for a montage."""
import os
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from envs.reacher2d import EpisodeThumbnails, Reacher2D

FIX = os.environ.get("FIX", "0") == "1"
N_ENVS = 8
MONTAGE_EVERY = 200 if FIX else 1


def make_env(rank):
    def thunk():
        return EpisodeThumbnails(Reacher2D(render_mode="rgb_array"), every=MONTAGE_EVERY)
    return thunk


def gae(rew, val, done, last_val, gamma=0.99, lam=0.95):
    T = rew.shape[0]
    adv = torch.zeros_like(rew)
    acc = torch.zeros(rew.shape[1])
    for t in reversed(range(T)):
        nv = last_val if t == T - 1 else val[t + 1]
        nonterm = 1.0 - done[t]
        delta = rew[t] + gamma * nv * nonterm - val[t]
        acc = delta + gamma * lam * nonterm * acc
        adv[t] = acc
    return adv


def main():
    torch.set_num_threads(1)
    torch.manual_seed(2)
    envs = gym.vector.SyncVectorEnv([make_env(i) for i in range(N_ENVS)])
    net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
    pi_head, v_head = nn.Linear(64, 5), nn.Linear(64, 1)
    params = list(net.parameters()) + list(pi_head.parameters()) + list(v_head.parameters())
    opt = torch.optim.Adam(params, lr=3e-4)
    obs, _ = envs.reset(seed=2)
    T = 128
    rets, run_ret = [], np.zeros(N_ENVS)
    for it in range(25):
        O, A, LP, R, V, D = [], [], [], [], [], []
        for _ in range(T):
            ot = torch.as_tensor(obs)
            with torch.no_grad():
                h = net(ot)
                dist = torch.distributions.Categorical(logits=pi_head(h))
                a = dist.sample()
                v = v_head(h).squeeze(-1)
            obs, r, term, trunc, _ = envs.step(a.numpy())
            done = term | trunc
            run_ret += r
            for k in np.flatnonzero(done):
                rets.append(run_ret[k])
                run_ret[k] = 0
            O.append(ot); A.append(a); LP.append(dist.log_prob(a)); V.append(v)
            R.append(torch.as_tensor(r, dtype=torch.float32)); D.append(torch.as_tensor(done, dtype=torch.float32))
        with torch.no_grad():
            last_v = v_head(net(torch.as_tensor(obs))).squeeze(-1)
        R, V, D = torch.stack(R), torch.stack(V), torch.stack(D)
        adv = gae(R, V, D, last_v)
        ret = (adv + V).flatten()
        O, A, LP = torch.cat(O), torch.cat(A), torch.cat(LP)
        adv = adv.flatten()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        for _ in range(4):
            perm = torch.randperm(len(O))
            for s in range(0, len(O), 256):
                mb = perm[s:s + 256]
                h = net(O[mb])
                d = torch.distributions.Categorical(logits=pi_head(h))
                ratio = (d.log_prob(A[mb]) - LP[mb]).exp()
                l_pi = -torch.min(ratio * adv[mb], ratio.clamp(0.8, 1.2) * adv[mb]).mean()
                l_v = (v_head(h).squeeze(-1) - ret[mb]).pow(2).mean()
                loss = l_pi + 0.5 * l_v - 0.01 * d.entropy().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    n_frames = sum(len(e.frames) for e in envs.envs)
    envs.close()
    return rets, n_frames


if __name__ == "__main__":
    t0 = time.perf_counter()
    rets, nf = main()
    print(f"episodes={len(rets)} last50={np.mean(rets[-50:]):.2f} thumbnails={nf} time={time.perf_counter() - t0:.2f}s")
