"""DQN with a small CNN on a NumPy pixel game ("Catch": a paddle catches falling balls), 8 boards.

Planted (preprocessing): each RGB frame is turned into a 2x-downsampled grayscale image with a
per-pixel Python loop. ``--fixed`` does the same arithmetic with NumPy on the whole batch.
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

H = W = 48
N = 8


class Catch:
    def __init__(self, n, seed=0):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.ball = np.stack([np.zeros(n, np.int64), self.rng.integers(0, W, n)], 1)
        self.paddle = np.full(n, W // 2)
        self.frames = np.zeros((n, H, W, 3), np.uint8)

    def render_frames(self):
        self.frames[:] = (10, 10, 40)
        rows = np.arange(self.n)
        self.frames[rows, self.ball[:, 0], self.ball[:, 1]] = (250, 250, 250)
        for dx in range(-3, 4):
            self.frames[rows, H - 1, np.clip(self.paddle + dx, 0, W - 1)] = (200, 80, 40)
        return self.frames

    def step(self, actions):
        self.paddle = np.clip(self.paddle + 2 * (actions - 1), 0, W - 1)
        self.ball[:, 0] += 2
        landed = self.ball[:, 0] >= H - 1
        caught = landed & (np.abs(self.ball[:, 1] - self.paddle) <= 3)
        reward = np.where(landed, np.where(caught, 1.0, -1.0), 0.0).astype(np.float32)
        k = int(landed.sum())
        self.ball[landed] = np.stack([np.zeros(k, np.int64), self.rng.integers(0, W, k)], 1)
        return self.render_frames(), reward, landed


def preprocess_loop(frames):
    out = np.zeros((frames.shape[0], 1, H // 2, W // 2), np.float32)
    for b in range(frames.shape[0]):
        for y in range(0, H, 2):
            for x in range(0, W, 2):
                r, g, bl = frames[b, y, x]
                out[b, 0, y // 2, x // 2] = (0.299 * r + 0.587 * g + 0.114 * bl) / 255.0
    return out


def preprocess_numpy(frames):
    small = frames[:, ::2, ::2].astype(np.float32)
    gray = small @ np.array([0.299, 0.587, 0.114], np.float32) / 255.0
    return gray[:, None]


class ConvQ(nn.Module):
    def __init__(self, actions=3):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 4, stride=2)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2)
        self.fc = nn.Linear(32 * 5 * 5, 128)
        self.out = nn.Linear(128, actions)

    def forward(self, x):
        x = F.relu(self.c2(F.relu(self.c1(x))))
        return self.out(F.relu(self.fc(x.flatten(1))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=350)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    preprocess = preprocess_numpy if args.fixed else preprocess_loop
    env = Catch(N)
    q, target = ConvQ(), ConvQ()
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=2.5e-4)
    cap = 20_000
    mem_obs = np.zeros((cap, 1, H // 2, W // 2), np.float32)
    mem_next = np.zeros_like(mem_obs)
    mem_act = np.zeros(cap, np.int64)
    mem_rew = np.zeros(cap, np.float32)
    mem_done = np.zeros(cap, np.float32)
    size = head = 0
    obs = preprocess(env.render_frames())
    steps = int(args.steps * args.scale)
    for step in range(steps):
        with torch.no_grad():
            greedy = q(torch.from_numpy(obs)).argmax(1).numpy()
        eps = max(0.05, 1 - step / (0.5 * steps))
        actions = np.where(rng.random(N) < eps, rng.integers(0, 3, N), greedy)
        frames, reward, done = env.step(actions)
        next_obs = preprocess(frames)  # planted: preprocessing
        idx = (head + np.arange(N)) % cap
        mem_obs[idx], mem_next[idx], mem_act[idx], mem_rew[idx], mem_done[idx] = obs, next_obs, actions, reward, done
        head, size = (head + N) % cap, min(size + N, cap)
        obs = next_obs
        if step % 4 == 0 and size >= 64:
            b = rng.integers(0, size, 64)
            with torch.no_grad():
                next_q = target(torch.from_numpy(mem_next[b])).max(1).values
                y = torch.from_numpy(mem_rew[b]) + 0.99 * (1 - torch.from_numpy(mem_done[b])) * next_q
            qa = q(torch.from_numpy(mem_obs[b])).gather(1, torch.from_numpy(mem_act[b])[:, None]).squeeze(1)
            loss = F.smooth_l1_loss(qa, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % 200 == 0:
            target.load_state_dict(q.state_dict())
    print(f"{steps} steps done")


if __name__ == "__main__":
    main()
