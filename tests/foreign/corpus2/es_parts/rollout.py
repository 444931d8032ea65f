"""Worker-side evaluation of antithetic parameter perturbations."""
import os

import numpy as np

from es_parts.noise import NoiseTable

_TABLE = None
OBS_DIM, HID, ACT_DIM = 6, 32, 2
N_PARAMS = OBS_DIM * HID + HID + HID * ACT_DIM + ACT_DIM


def init_worker():
    global _TABLE
    _TABLE = NoiseTable()


def _noise_source():
    if os.environ.get("FIX", "0") == "1":
        return _TABLE
    return NoiseTable()


def policy(theta, obs):
    i = 0
    w1 = theta[i:i + OBS_DIM * HID].reshape(OBS_DIM, HID); i += OBS_DIM * HID
    b1 = theta[i:i + HID]; i += HID
    w2 = theta[i:i + HID * ACT_DIM].reshape(HID, ACT_DIM); i += HID * ACT_DIM
    b2 = theta[i:i + ACT_DIM]
    return np.tanh(np.tanh(obs @ w1 + b1) @ w2 + b2)


def episode(theta, seed, n_envs=16, horizon=150):
    """Batched 2-D reaching task: drive a damped point mass to a target."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(-1, 1, (n_envs, 2))
    vel = np.zeros((n_envs, 2))
    goal = rng.uniform(-1, 1, (n_envs, 2))
    total = 0.0
    for _ in range(horizon):
        obs = np.concatenate([pos, vel, goal - pos], 1)
        act = policy(theta, obs)
        vel = 0.9 * vel + 0.1 * act
        pos = pos + 0.1 * vel
        total += float(-np.linalg.norm(goal - pos, axis=1).mean() - 0.01 * (act ** 2).sum(1).mean())
    return total


def evaluate_pair(args):
    theta, offset, sigma, ep_seed = args
    table = _noise_source()
    eps = table.get(offset, len(theta))
    return offset, episode(theta + sigma * eps, ep_seed), episode(theta - sigma * eps, ep_seed)
