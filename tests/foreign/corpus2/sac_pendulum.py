"""Soft actor-critic on a batched numpy pendulum swing-up."""
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FIX = os.environ.get("FIX", "0") == "1"


class BatchedPendulum:
    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def __init__(self, n, seed):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.reset()

    def reset(self):
        self.th = self.rng.uniform(-math.pi, math.pi, self.n)
        self.thdot = self.rng.uniform(-1, 1, self.n)
        self.t = np.zeros(self.n, dtype=np.int64)
        return self._obs()

    def _obs(self):
        return np.stack([np.cos(self.th), np.sin(self.th), self.thdot], 1).astype(np.float32)

    def step(self, u):
        u = np.clip(u[:, 0], -self.max_torque, self.max_torque)
        ang = ((self.th + math.pi) % (2 * math.pi)) - math.pi
        cost = ang ** 2 + 0.1 * self.thdot ** 2 + 0.001 * u ** 2
        self.thdot = np.clip(self.thdot + (3 * self.g / (2 * self.l) * np.sin(self.th)
                                           + 3.0 / (self.m * self.l ** 2) * u) * self.dt,
                             -self.max_speed, self.max_speed)
        self.th = self.th + self.thdot * self.dt
        self.t += 1
        done = self.t >= 200
        obs_next = self._obs()
        if done.any():
            self.th[done] = self.rng.uniform(-math.pi, math.pi, done.sum())
            self.thdot[done] = self.rng.uniform(-1, 1, done.sum())
            self.t[done] = 0
        return obs_next, self._obs(), (-cost).astype(np.float32), done


class TransitionStore:
    def __init__(self, cap, obs_dim, act_dim, seed):
        self.cap, self.n, self.ptr = cap, 0, 0
        self.o = np.zeros((cap, obs_dim), np.float32)
        self.a = np.zeros((cap, act_dim), np.float32)
        self.r = np.zeros((cap,), np.float32)
        self.o2 = np.zeros((cap, obs_dim), np.float32)
        self.rng = np.random.default_rng(seed)

    def put(self, o, a, r, o2):
        k = len(o)
        i = (self.ptr + np.arange(k)) % self.cap
        self.o[i], self.a[i], self.r[i], self.o2[i] = o, a, r, o2
        self.ptr = (self.ptr + k) % self.cap
        self.n = min(self.n + k, self.cap)

    def draw(self, batch):
        idx = self.rng.integers(0, self.n, batch)
        if FIX:
            return tuple(torch.from_numpy(arr[idx]) for arr in (self.o, self.a, self.r, self.o2))
        fields = []
        for arr in (self.o, self.a, self.r, self.o2):
            fields.append(torch.stack([torch.tensor(arr[i]) for i in idx]))
        return tuple(fields)


def mlp(i, o, h=64):
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


class Actor(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim)

    def forward(self, o):
        mu, log_std = self.net(o).chunk(2, -1)
        log_std = log_std.clamp(-5, 2)
        eps = torch.randn_like(mu)
        pre = mu + log_std.exp() * eps
        act = torch.tanh(pre)
        logp = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - (2 * (math.log(2) - pre - F.softplus(-2 * pre))).sum(-1)
        return act * 2.0, logp


def main():
    torch.set_num_threads(1)
    torch.manual_seed(11)
    env = BatchedPendulum(8, seed=11)
    obs_dim, act_dim = 3, 1
    actor = Actor(obs_dim, act_dim)
    q1, q2 = mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)
    q1_t, q2_t = mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)
    q1_t.load_state_dict(q1.state_dict())
    q2_t.load_state_dict(q2.state_dict())
    log_alpha = torch.zeros(1, requires_grad=True)
    pi_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    q_opt = torch.optim.Adam(list(q1.parameters()) + list(q2.parameters()), lr=3e-4)
    a_opt = torch.optim.Adam([log_alpha], lr=3e-4)
    store = TransitionStore(100_000, obs_dim, act_dim, seed=11)
    obs = env.reset()
    gamma, tau, batch = 0.99, 0.005, 512
    tgt_params = list(q1_t.parameters()) + list(q2_t.parameters())
    src_params = list(q1.parameters()) + list(q2.parameters())
    ret_hist = []
    for it in range(800):
        with torch.no_grad():
            a, _ = actor(torch.from_numpy(obs))
        a = a.numpy()
        o_next, obs_after, r, done = env.step(a)
        store.put(obs, a, r, o_next)
        ret_hist.append(r.mean())
        obs = obs_after
        if store.n < 1000:
            continue
        o, ac, rw, o2 = store.draw(batch)
        with torch.no_grad():
            a2, logp2 = actor(o2)
            x2 = torch.cat([o2, a2], -1)
            qn = torch.min(q1_t(x2), q2_t(x2)).squeeze(-1) - log_alpha.exp() * logp2
            y = rw + gamma * qn
        x = torch.cat([o, ac], -1)
        q_loss = F.mse_loss(q1(x).squeeze(-1), y) + F.mse_loss(q2(x).squeeze(-1), y)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        pa, logp = actor(o)
        xa = torch.cat([o, pa], -1)
        pi_loss = (log_alpha.exp().detach() * logp - torch.min(q1(xa), q2(xa)).squeeze(-1)).mean()
        pi_opt.zero_grad()
        pi_loss.backward()
        pi_opt.step()
        alpha_loss = -(log_alpha * (logp.detach() - act_dim)).mean()
        a_opt.zero_grad()
        alpha_loss.backward()
        a_opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(tgt_params, src_params, tau)
    return float(np.mean(ret_hist[-200:]))


if __name__ == "__main__":
    t0 = time.perf_counter()
    score = main()
    print(f"avg_reward_last200={score:.3f} time={time.perf_counter() - t0:.2f}s")
