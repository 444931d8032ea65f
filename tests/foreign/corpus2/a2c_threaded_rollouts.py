"""A2C where a background thread produces rollouts while the main thread learns.

The environment is a batched numpy 'mountain car'-style task; the rollout thread
uses a snapshot of the policy weights that the learner refreshes after each update.
"""
import queue
import threading
import time

import numpy as np
import torch
import torch.nn as nn


class BatchedMountainCar:
    def __init__(self, n, seed):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.x = self.rng.uniform(-0.6, -0.4, n)
        self.v = np.zeros(n)
        self.t = np.zeros(n, np.int64)

    def obs(self):
        return np.stack([self.x / 1.2, self.v / 0.07], 1).astype(np.float32)

    def step(self, a):
        force = (a - 1) * 0.0015
        self.v = np.clip(self.v + force - 0.0025 * np.cos(3 * self.x), -0.07, 0.07)
        self.x = np.clip(self.x + self.v, -1.2, 0.6)
        self.v[self.x <= -1.2] = 0
        self.t += 1
        goal = self.x >= 0.5
        done = goal | (self.t >= 200)
        # shaped reward: progress in height
        rew = (np.where(goal, 10.0, -0.1) + 10 * np.abs(self.v)).astype(np.float32)
        if done.any():
            k = done.sum()
            self.x[done] = self.rng.uniform(-0.6, -0.4, k)
            self.v[done] = 0
            self.t[done] = 0
        return self.obs(), rew, done


def make_net():
    return nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


class RolloutWorker(threading.Thread):
    def __init__(self, out_q, n_envs=32, horizon=32, seed=0):
        super().__init__(daemon=True)
        self.env = BatchedMountainCar(n_envs, seed)
        self.net = make_net()
        self.out_q, self.horizon = out_q, horizon
        self.lock = threading.Lock()
        self.pending = None
        self.stop = threading.Event()
        self.gen = torch.Generator().manual_seed(seed)

    def push_weights(self, state):
        with self.lock:
            self.pending = state

    def run(self):
        obs = self.env.obs()
        while not self.stop.is_set():
            with self.lock:
                if self.pending is not None:
                    self.net.load_state_dict(self.pending)
                    self.pending = None
            O = np.empty((self.horizon, self.env.n, 2), np.float32)
            A = np.empty((self.horizon, self.env.n), np.int64)
            R = np.empty((self.horizon, self.env.n), np.float32)
            D = np.empty((self.horizon, self.env.n), np.float32)
            with torch.no_grad():
                for t in range(self.horizon):
                    logits = self.net(torch.from_numpy(obs))[:, :3]
                    a = torch.multinomial(logits.softmax(-1), 1, generator=self.gen).squeeze(1).numpy()
                    O[t], A[t] = obs, a
                    obs, R[t], D[t] = self.env.step(a)
            try:
                self.out_q.put((O, A, R, D, obs.copy()), timeout=1.0)
            except queue.Full:
                pass


def main(updates=400):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    q = queue.Queue(maxsize=4)
    worker = RolloutWorker(q)
    learner = make_net()
    worker.push_weights({k: v.clone() for k, v in learner.state_dict().items()})
    opt = torch.optim.Adam(learner.parameters(), lr=1e-3)
    worker.start()
    gamma = 0.99
    scores = []
    for u in range(updates):
        O, A, R, D, last = q.get()
        o = torch.from_numpy(O)
        out = learner(o)
        logits, values = out[..., :3], out[..., 3]
        with torch.no_grad():
            boot = learner(torch.from_numpy(last))[:, 3]
            ret = torch.empty_like(values)
            run = boot
            r_t, d_t = torch.from_numpy(R), torch.from_numpy(D)
            for t in reversed(range(len(R))):
                run = r_t[t] + gamma * (1 - d_t[t]) * run
                ret[t] = run
        adv = ret - values
        logp = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(A)[..., None]).squeeze(-1)
        ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
        loss = -(logp * adv.detach()).mean() + 0.5 * adv.pow(2).mean() - 0.01 * ent
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(learner.parameters(), 1.0)
        opt.step()
        worker.push_weights({k: v.detach().clone() for k, v in learner.state_dict().items()})
        scores.append(float(R.mean()))
    worker.stop.set()
    worker.join(timeout=2)
    return scores


if __name__ == "__main__":
    t0 = time.perf_counter()
    s = main()
    print(f"mean_reward_last50={np.mean(s[-50:]):.3f} time={time.perf_counter() - t0:.2f}s")
