"""Actor process: runs a batched numpy environment with the latest published policy."""
import os

import numpy as np
import torch
import torch.nn as nn


def build_policy(obs_dim, n_act):
    return nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, n_act))


class Catch:
    """Batched 'catch the falling ball' on a 10x5 grid, flattened position features."""

    def __init__(self, n, rng):
        self.n, self.rng = n, rng
        self.ball = np.zeros((n, 2), np.int64)
        self.paddle = np.zeros(n, np.int64)
        self._reset(np.arange(n))

    def _reset(self, idx):
        self.ball[idx, 0] = 0
        self.ball[idx, 1] = self.rng.integers(0, 5, len(idx))
        self.paddle[idx] = self.rng.integers(0, 5, len(idx))

    def obs(self):
        o = np.zeros((self.n, 20), np.float32)
        r = np.arange(self.n)
        o[r, self.ball[:, 0]] = 1
        o[r, 10 + self.ball[:, 1]] = 1
        o[r, 15 + self.paddle] = 1
        return o

    def step(self, a):
        self.paddle = np.clip(self.paddle + a - 1, 0, 4)
        self.ball[:, 0] += 1
        done = self.ball[:, 0] == 9
        rew = np.where(done, np.where(self.ball[:, 1] == self.paddle, 1.0, -1.0), 0.0).astype(np.float32)
        if done.any():
            self._reset(np.flatnonzero(done))
        return self.obs(), rew, done


def actor_loop(rank, weights_path, version, traj_queue, stop, unroll, fresh_weights_check):
    torch.set_num_threads(1)
    rng = np.random.default_rng(100 + rank)
    torch.manual_seed(100 + rank)
    env = Catch(8, rng)
    policy = build_policy(20, 3)
    seen = -1
    obs = env.obs()
    while not stop.is_set():
        O, A, R, D, LP = [], [], [], [], []
        for _ in range(unroll):
            if fresh_weights_check:
                if version.value != seen:
                    seen = version.value
                    policy.load_state_dict(torch.load(weights_path, weights_only=True))
            else:
                policy.load_state_dict(torch.load(weights_path, weights_only=True))
            with torch.no_grad():
                logits = policy(torch.from_numpy(obs))
                dist = torch.distributions.Categorical(logits=logits)
                a = dist.sample()
            O.append(obs)
            A.append(a.numpy())
            LP.append(dist.log_prob(a).numpy())
            obs, r, d = env.step(A[-1])
            R.append(r)
            D.append(d)
        traj = tuple(np.stack(x) for x in (O, A, R, D, LP)) + (obs,)
        while not stop.is_set():
            try:
                traj_queue.put(traj, timeout=0.1)
                break
            except Exception:
                continue
    traj_queue.cancel_join_thread()
    os._exit(0)
