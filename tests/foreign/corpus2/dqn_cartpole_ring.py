"""DQN on a synchronous vector of CartPole envs with a preallocated ring buffer."""
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Ring:
    def __init__(self, cap, obs_dim):
        self.o = np.empty((cap, obs_dim), np.float32)
        self.o2 = np.empty((cap, obs_dim), np.float32)
        self.a = np.empty(cap, np.int64)
        self.r = np.empty(cap, np.float32)
        self.d = np.empty(cap, np.float32)
        self.cap, self.i, self.full = cap, 0, False

    def __len__(self):
        return self.cap if self.full else self.i

    def add_batch(self, o, a, r, o2, d):
        k = len(a)
        idx = np.arange(self.i, self.i + k) % self.cap
        self.o[idx], self.a[idx], self.r[idx], self.o2[idx], self.d[idx] = o, a, r, o2, d
        self.full = self.full or self.i + k >= self.cap
        self.i = (self.i + k) % self.cap

    def sample(self, rng, n):
        j = rng.integers(0, len(self), n)
        return [torch.from_numpy(x[j]) for x in (self.o, self.a, self.r, self.o2, self.d)]


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n_envs = 4
    envs = gym.make_vec("CartPole-v1", num_envs=n_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    qt = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    qt.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=5e-4)
    buf = Ring(50_000, 4)
    obs, _ = envs.reset(seed=0)
    finished, ep = [], np.zeros(n_envs)
    for it in range(3000):
        eps = max(0.05, 1 - it / 1500)
        with torch.no_grad():
            greedy = q(torch.from_numpy(obs)).argmax(1).numpy()
        a = np.where(rng.random(n_envs) < eps, rng.integers(0, 2, n_envs), greedy)
        nobs, r, term, trunc, info = envs.step(a)
        real_next = nobs.copy()
        done = term | trunc
        if done.any():
            real_next[done] = np.stack(info["final_obs"][done])
        buf.add_batch(obs, a, r, real_next, term)
        ep += r
        finished.extend(ep[done].tolist())
        ep[done] = 0
        obs = nobs
        if len(buf) >= 1000:
            o, ac, rw, o2, d = buf.sample(rng, 128)
            with torch.no_grad():
                y = rw + 0.99 * (1 - d) * qt(o2).max(1).values
            loss = F.smooth_l1_loss(q(o).gather(1, ac[:, None]).squeeze(1), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if it % 250 == 0:
            qt.load_state_dict(q.state_dict())
    envs.close()
    return finished


if __name__ == "__main__":
    t0 = time.perf_counter()
    f = main()
    print(f"episodes={len(f)} last20={np.mean(f[-20:]):.1f} time={time.perf_counter() - t0:.2f}s")
