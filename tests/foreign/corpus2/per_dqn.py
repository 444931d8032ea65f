"""DQN with proportional prioritized replay on a vectorized CartPole."""
import os
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from replay_lib.array_tree import FlatPriorities
from replay_lib.sumtree import SumTree

FIX = os.environ.get("FIX", "0") == "1"


class PrioritizedBuffer:
    def __init__(self, capacity, obs_dim, alpha=0.6, seed=0):
        self.tree = FlatPriorities(capacity) if FIX else SumTree(capacity)
        self.cap = capacity
        self.alpha = alpha
        self.max_p = 1.0
        self.rng = np.random.default_rng(seed)
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.nobs = np.zeros((capacity, obs_dim), np.float32)
        self.act = np.zeros(capacity, np.int64)
        self.rew = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.ptr = 0
        self.n = 0

    def extend(self, o, a, r, o2, d):
        k = len(a)
        idx = (self.ptr + np.arange(k)) % self.cap
        self.obs[idx], self.act[idx], self.rew[idx], self.nobs[idx], self.done[idx] = o, a, r, o2, d
        self.tree.set_many(idx, np.full(k, self.max_p ** self.alpha))
        self.ptr = (self.ptr + k) % self.cap
        self.n = min(self.n + k, self.cap)

    def sample(self, batch, beta):
        seg = self.tree.total / batch
        masses = (np.arange(batch) + self.rng.random(batch)) * seg
        idx = np.minimum(np.asarray(self.tree.find_many(masses)), self.n - 1)
        total = self.tree.total
        p = np.asarray(self.tree.get(idx)) / total
        max_w = (self.n * self.tree.min_priority(self.n) / total) ** (-beta)
        w = (self.n * p) ** (-beta) / max_w
        return idx, (self.obs[idx], self.act[idx], self.rew[idx], self.nobs[idx], self.done[idx]), w

    def update(self, idx, td):
        pr = np.abs(td) + 1e-3
        self.max_p = max(self.max_p, float(pr.max()))
        self.tree.set_many(idx, pr ** self.alpha)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(3)
    n_envs = 16
    envs = gym.make_vec("CartPole-v1", num_envs=n_envs, vectorization_mode="sync")
    obs_dim = envs.single_observation_space.shape[0]
    n_act = envs.single_action_space.n
    q = nn.Sequential(nn.Linear(obs_dim, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, n_act))
    qt = nn.Sequential(nn.Linear(obs_dim, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, n_act))
    qt.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=5e-4)
    buf = PrioritizedBuffer(1 << 17, obs_dim, seed=3)
    rng = np.random.default_rng(3)
    obs, _ = envs.reset(seed=3)
    iters, batch = 800, 512
    for it in range(iters):
        eps = max(0.05, 1 - it / 600)
        with torch.no_grad():
            greedy = q(torch.from_numpy(obs)).argmax(1).numpy()
        a = np.where(rng.random(n_envs) < eps, rng.integers(0, n_act, n_envs), greedy)
        nobs, r, term, trunc, info = envs.step(a)
        # with autoreset the step after a done is a reset step; skip storing those
        buf.extend(obs, a, r.astype(np.float32), nobs, term.astype(np.float32))
        obs = nobs
        if buf.n >= batch:
            beta = min(1.0, 0.4 + 0.6 * it / iters)
            idx, (o, ac, rw, o2, d), w = buf.sample(batch, beta)
            o, o2 = torch.from_numpy(o), torch.from_numpy(o2)
            with torch.no_grad():
                tgt = torch.from_numpy(rw) + 0.99 * (1 - torch.from_numpy(d)) * qt(o2).max(1).values
            pred = q(o).gather(1, torch.from_numpy(ac)[:, None]).squeeze(1)
            td = pred - tgt
            loss = (torch.as_tensor(w, dtype=torch.float32) * td.pow(2)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            buf.update(idx, td.detach().numpy())
        if it % 200 == 0:
            qt.load_state_dict(q.state_dict())
    envs.close()
    return buf.max_p


if __name__ == "__main__":
    t0 = time.perf_counter()
    mp_ = main()
    print(f"max_priority={mp_:.3f} time={time.perf_counter() - t0:.2f}s")
