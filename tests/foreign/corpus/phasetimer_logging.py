"""DQN on a NumPy "pong rally" env, its phases timed with rlperf.PhaseTimer (the timer lives in main()).

Planted (logging): every step logs the loss, the epsilon, the Q-values, the actions and the
observations through ``logging`` (tensors formatted into the message, ``.item()`` reads for the
scalars). ``--fixed`` logs every 500
steps.
"""
import argparse
import logging
import os
import tempfile

import numpy as np
import torch
from torch import nn

import rlperf

log = logging.getLogger("dqn")


class Rally:
    """16 rallies: keep the ball in play by moving the bat under it."""

    def __init__(self, n=16, seed=0):
        self.rng = np.random.default_rng(seed)
        self.n = n
        self.ball = self.rng.uniform(0, 1, (n, 2))
        self.vel = self.rng.uniform(-0.03, 0.03, (n, 2))
        self.bat = np.full(n, 0.5)

    def obs(self):
        return np.concatenate([self.ball, self.vel * 10, self.bat[:, None]], 1).astype(np.float32)

    def step(self, actions):
        self.bat = np.clip(self.bat + (actions - 1) * 0.04, 0, 1)
        self.ball += self.vel
        self.vel[self.ball[:, 0] < 0, 0] *= -1
        self.vel[self.ball[:, 0] > 1, 0] *= -1
        top = self.ball[:, 1] > 1
        self.vel[top, 1] *= -1
        low = self.ball[:, 1] < 0
        hit = low & (np.abs(self.ball[:, 0] - self.bat) < 0.1)
        miss = low & ~hit
        self.vel[hit, 1] *= -1
        reward = hit.astype(np.float32) - miss.astype(np.float32)
        k = int(miss.sum())
        self.ball[miss] = self.rng.uniform(0.2, 0.8, (k, 2))
        self.ball = np.clip(self.ball, 0, 1)
        return self.obs(), reward, miss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    logdir = tempfile.mkdtemp(prefix="dqn-log-")
    handler = logging.FileHandler(os.path.join(logdir, "train.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log_every = 500 if args.fixed else 1

    env = Rally()
    q = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    cap = 30_000
    mem = {"obs": torch.zeros(cap, 5), "next": torch.zeros(cap, 5), "act": torch.zeros(cap, dtype=torch.long),
           "rew": torch.zeros(cap), "done": torch.zeros(cap)}
    size = head = 0
    timer = rlperf.PhaseTimer("cpu")
    obs = torch.from_numpy(env.obs())
    steps = int(args.steps * args.scale)
    for step in range(steps):
        eps = max(0.05, 1 - step / (0.5 * steps))
        with timer.phase("select"):
            with torch.no_grad():
                qvals = q(obs)
            actions = torch.where(torch.rand(env.n) < eps, torch.randint(0, 3, (env.n,)), qvals.argmax(1))
        with timer.phase("step"):
            next_obs, reward, done = env.step(actions.numpy())
            next_obs, reward, done = torch.from_numpy(next_obs), torch.from_numpy(reward), torch.from_numpy(done)
        with timer.phase("push"):
            idx = (head + torch.arange(env.n)) % cap
            mem["obs"][idx], mem["next"][idx], mem["act"][idx] = obs, next_obs, actions
            mem["rew"][idx], mem["done"][idx] = reward, done.float()
            head, size = (head + env.n) % cap, min(size + env.n, cap)
            obs = next_obs
        with timer.phase("train"):
            b = torch.randint(0, size, (64,))
            with torch.no_grad():
                y = mem["rew"][b] + 0.99 * (1 - mem["done"][b]) * q(mem["next"][b]).max(1).values
            loss = nn.functional.mse_loss(q(mem["obs"][b]).gather(1, mem["act"][b][:, None]).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with timer.phase("log"):
            if step % log_every == 0:
                log.info("step %d eps %.3f loss %.5f reward %.3f",  # planted: logging
                         step, eps, loss.item(), reward.mean().item())
                log.info("q %s actions %s obs %s", qvals, actions, next_obs)  # planted: logging
        timer.step_done()
    print({name: f"{stats.share:.0%}" for name, stats in timer.stats().items()})
    logging.shutdown()
    os.remove(os.path.join(logdir, "train.log"))
    os.rmdir(logdir)


if __name__ == "__main__":
    main()
