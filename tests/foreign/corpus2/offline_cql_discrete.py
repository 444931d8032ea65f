"""Discrete-action CQL trained offline on a logged dataset held as device tensors."""
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

GRID = 10
ACTIONS = np.array([[0, 1], [0, -1], [1, 0], [-1, 0]])


def log_dataset(n_episodes=1500, horizon=40, seed=0):
    """Roll out an epsilon-noisy goal-seeking behaviour policy in a batched grid world."""
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, GRID, (n_episodes, 2))
    goal = rng.integers(0, GRID, (n_episodes, 2))
    rows = []
    alive = np.ones(n_episodes, bool)
    for t in range(horizon):
        diff = goal - pos
        greedy = np.where(np.abs(diff[:, 0]) > np.abs(diff[:, 1]),
                          np.where(diff[:, 0] > 0, 2, 3), np.where(diff[:, 1] > 0, 0, 1))
        act = np.where(rng.random(n_episodes) < 0.4, rng.integers(0, 4, n_episodes), greedy)
        nxt = np.clip(pos + ACTIONS[act], 0, GRID - 1)
        reached = np.all(nxt == goal, 1)
        rew = np.where(reached, 1.0, -0.02)
        feats = lambda p: np.concatenate([p / GRID, goal / GRID, (goal - p) / GRID], 1)
        rows.append((feats(pos)[alive], act[alive], rew[alive], feats(nxt)[alive], reached[alive]))
        alive &= ~reached
        pos = nxt
    cols = list(zip(*rows))
    return [torch.as_tensor(np.concatenate(c), dtype=dt)
            for c, dt in zip(cols, (torch.float32, torch.long, torch.float32, torch.float32, torch.float32))]


class QNet(nn.Module):
    def __init__(self, d, n, h=256):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, n))

    def forward(self, x):
        return self.f(x)


def train(steps=1500, batch=256, alpha=1.0, gamma=0.97):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    O, A, R, O2, D = log_dataset()
    n = len(A)
    q, qt = QNet(6, 4), QNet(6, 4)
    qt.load_state_dict(q.state_dict())
    qt.requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(0)
    for s in range(steps):
        j = torch.randint(0, n, (batch,), generator=g)
        o, a, r, o2, d = O[j], A[j], R[j], O2[j], D[j]
        with torch.no_grad():
            a_star = q(o2).argmax(1, keepdim=True)
            y = r + gamma * (1 - d) * qt(o2).gather(1, a_star).squeeze(1)
        qs = q(o)
        q_sa = qs.gather(1, a[:, None]).squeeze(1)
        cql = (torch.logsumexp(qs, 1) - q_sa).mean()
        loss = F.mse_loss(q_sa, y) + alpha * cql
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if s % 200 == 0:
            qt.load_state_dict(q.state_dict())
    return n, float(loss.detach())


if __name__ == "__main__":
    t0 = time.perf_counter()
    n, l = train()
    print(f"transitions={n} final_loss={l:.4f} time={time.perf_counter() - t0:.2f}s")
