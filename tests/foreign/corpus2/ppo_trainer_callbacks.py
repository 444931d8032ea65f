"""PPO trainer object with pluggable callbacks on a batched numpy point-mass task."""
import os
import time

import numpy as np
import torch
import torch.nn as nn

from trainer_kit.callbacks import ProgressCallback, StepRecorder

FIX = os.environ.get("FIX", "0") == "1"


class PointMassEnv:
    """Batched 2-D point mass that must reach a random target; discrete thrust."""
    THRUST = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], dtype=np.float32)

    def __init__(self, n, seed):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.pos = np.zeros((n, 2), np.float32)
        self.vel = np.zeros((n, 2), np.float32)
        self.goal = np.zeros((n, 2), np.float32)
        self.t = np.zeros(n, np.int64)
        self._reset_idx(np.arange(n))

    def _reset_idx(self, idx):
        k = len(idx)
        self.pos[idx] = self.rng.uniform(-1, 1, (k, 2))
        self.vel[idx] = 0
        self.goal[idx] = self.rng.uniform(-1, 1, (k, 2))
        self.t[idx] = 0

    def obs(self):
        return np.concatenate([self.pos, self.vel, self.goal - self.pos], 1)

    def step(self, a):
        self.vel = 0.9 * self.vel + 0.05 * self.THRUST[a]
        self.pos = np.clip(self.pos + 0.1 * self.vel, -1.5, 1.5)
        dist = np.linalg.norm(self.goal - self.pos, axis=1)
        self.t += 1
        reached = dist < 0.1
        rew = (-dist + 5.0 * reached).astype(np.float32)
        done = reached | (self.t >= 100)
        if done.any():
            self._reset_idx(np.flatnonzero(done))
        return self.obs(), rew, done


class Policy(nn.Module):
    def __init__(self, obs_dim, n_act):
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_act))
        self.v = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

    def forward(self, x):
        return self.pi(x), self.v(x).squeeze(-1)


class PPOTrainer:
    def __init__(self, env, policy, callbacks=(), n_steps=64, epochs=4, minibatch=256,
                 gamma=0.99, lam=0.95, clip=0.2, lr=3e-4):
        self.env, self.policy, self.callbacks = env, policy, list(callbacks)
        self.n_steps, self.epochs, self.minibatch = n_steps, epochs, minibatch
        self.gamma, self.lam, self.clip = gamma, lam, clip
        self.opt = torch.optim.Adam(policy.parameters(), lr=lr)
        self.global_step = 0
        self.ep_returns = []
        self._running = np.zeros(env.n)

    def _emit(self, hook, *args):
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    def collect(self, obs):
        n = self.env.n
        O = np.zeros((self.n_steps, n, obs.shape[1]), np.float32)
        A = np.zeros((self.n_steps, n), np.int64)
        R = np.zeros((self.n_steps, n), np.float32)
        D = np.zeros((self.n_steps, n), np.float32)
        V = np.zeros((self.n_steps + 1, n), np.float32)
        LP = np.zeros((self.n_steps, n), np.float32)
        for t in range(self.n_steps):
            with torch.no_grad():
                logits, v = self.policy(torch.from_numpy(obs))
                dist = torch.distributions.Categorical(logits=logits)
                a = dist.sample()
                lp = dist.log_prob(a)
            O[t], A[t], V[t], LP[t] = obs, a.numpy(), v.numpy(), lp.numpy()
            obs, r, done = self.env.step(A[t])
            R[t], D[t] = r, done
            self._running += r
            for k in np.flatnonzero(done):
                self.ep_returns.append(self._running[k])
                self._running[k] = 0
            self.global_step += n
            self._emit("on_step", {"global_step": self.global_step, "reward": r, "done": done,
                                   "action": A[t], "value": V[t]})
        with torch.no_grad():
            V[-1] = self.policy(torch.from_numpy(obs))[1].numpy()
        return obs, (O, A, R, D, V, LP)

    def advantages(self, R, D, V):
        adv = np.zeros_like(R)
        last = 0.0
        for t in reversed(range(len(R))):
            nonterm = 1.0 - D[t]
            delta = R[t] + self.gamma * V[t + 1] * nonterm - V[t]
            last = delta + self.gamma * self.lam * nonterm * last
            adv[t] = last
        return adv, adv + V[:-1]

    def update(self, batch):
        O, A, R, D, V, LP = batch
        adv, ret = self.advantages(R, D, V)
        flat = lambda x: torch.from_numpy(x.reshape(-1, *x.shape[2:]))
        o, a, lp_old, adv, ret = flat(O), flat(A), flat(LP), flat(adv), flat(ret)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        n = o.shape[0]
        for _ in range(self.epochs):
            perm = torch.randperm(n)
            for s in range(0, n, self.minibatch):
                mb = perm[s:s + self.minibatch]
                logits, v = self.policy(o[mb])
                dist = torch.distributions.Categorical(logits=logits)
                ratio = (dist.log_prob(a[mb]) - lp_old[mb]).exp()
                pg = -torch.min(ratio * adv[mb], ratio.clamp(1 - self.clip, 1 + self.clip) * adv[mb]).mean()
                loss = pg + 0.5 * (v - ret[mb]).pow(2).mean() - 0.01 * dist.entropy().mean()
                self.opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.policy.parameters(), 0.5)
                self.opt.step()
        return float(loss.detach())

    def fit(self, n_updates):
        self._emit("on_train_start")
        obs = self.env.obs()
        for u in range(n_updates):
            obs, batch = self.collect(obs)
            loss = self.update(batch)
            mean_ret = float(np.mean(self.ep_returns[-50:])) if self.ep_returns else 0.0
            self._emit("on_update", {"update": u, "loss": loss, "mean_return": mean_ret})
        self._emit("on_train_end")


def main():
    torch.set_num_threads(1)
    torch.manual_seed(5)
    env = PointMassEnv(16, seed=5)
    policy = Policy(6, 5)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs", "ppo_pointmass", "steps.jsonl")
    trainer = PPOTrainer(env, policy, callbacks=[ProgressCallback(every=20), StepRecorder(out, buffered=FIX)])
    trainer.fit(60)
    return trainer


if __name__ == "__main__":
    t0 = time.perf_counter()
    tr = main()
    print(f"episodes={len(tr.ep_returns)} time={time.perf_counter() - t0:.2f}s")
