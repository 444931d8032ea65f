"""Synthetic offline dataset of transitions collected by a noisy scripted controller."""
import numpy as np
import torch
from torch.utils.data import Dataset


def generate_transitions(n_steps, n_envs=64, seed=0):
    """Batched 2-D double-integrator driven by a noisy PD controller toward the origin."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(-1, 1, (n_envs, 2))
    vel = np.zeros((n_envs, 2))
    obs_l, act_l, rew_l, nobs_l, done_l = [], [], [], [], []
    for t in range(n_steps // n_envs):
        obs = np.concatenate([pos, vel], 1)
        act = np.clip(-1.5 * pos - 0.8 * vel + rng.normal(0, 0.4, (n_envs, 2)), -1, 1)
        vel = 0.9 * vel + 0.1 * act
        pos = pos + 0.1 * vel
        rew = -np.linalg.norm(pos, axis=1) - 0.05 * (act ** 2).sum(1)
        done = np.full(n_envs, (t + 1) % 100 == 0)
        nobs = np.concatenate([pos, vel], 1)
        obs_l.append(obs); act_l.append(act); rew_l.append(rew); nobs_l.append(nobs); done_l.append(done)
        if done[0]:
            pos = rng.uniform(-1, 1, (n_envs, 2))
            vel = np.zeros((n_envs, 2))
    cat = lambda xs: np.concatenate(xs).astype(np.float32)
    return {"obs": cat(obs_l), "act": cat(act_l), "rew": cat(rew_l), "next_obs": cat(nobs_l),
            "done": cat(done_l)}


class TransitionDataset(Dataset):
    def __init__(self, arrays):
        self.t = {k: torch.from_numpy(v) for k, v in arrays.items()}
        self.n = len(arrays["rew"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(i, (list, tuple)):
            i = torch.as_tensor(i)
        return {k: v[i] for k, v in self.t.items()}
