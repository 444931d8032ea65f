"""Q-learning with a small MLP on a key-and-door grid world that draws itself, for a training video.

Planted (rendering): ``env.render()`` runs every step and every frame is kept for the video.
``--fixed`` renders only the last episode.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

COLORS = {0: (20, 20, 20), 1: (120, 120, 120), 2: (240, 200, 0), 3: (160, 60, 20), 4: (40, 200, 80)}


class KeyDoorWorld:
    def __init__(self, size: int = 12, cell_px: int = 24, seed: int = 0) -> None:
        self.size, self.cell_px = size, cell_px
        self.rng = np.random.default_rng(seed)
        self.walls = np.zeros((size, size), bool)
        self.walls[0, :] = self.walls[-1, :] = self.walls[:, 0] = self.walls[:, -1] = True
        self.walls[:, size // 2] = True
        self.door = (size // 2, size // 2)
        self.walls[self.door] = False

    def reset(self) -> np.ndarray:
        self.agent = np.array([1 + self.rng.integers(self.size // 2 - 2), 1])
        self.key = (int(self.rng.integers(2, self.size - 2)), int(self.rng.integers(1, self.size // 2 - 1)))
        self.has_key, self.t = False, 0
        return self.observe()

    def observe(self) -> np.ndarray:
        key = np.array(self.key) / self.size
        return np.array([*self.agent / self.size, *key, float(self.has_key), self.t / 100], np.float32)

    def step(self, action: int):
        move = [(0, 1), (1, 0), (0, -1), (-1, 0)][action]
        nxt = self.agent + move
        if not self.walls[tuple(nxt)] and (tuple(nxt) != self.door or self.has_key):
            self.agent = nxt
        if tuple(self.agent) == self.key:
            self.has_key = True
        self.t += 1
        won = self.agent[1] == self.size - 2
        return self.observe(), float(won) - 0.01, bool(won), self.t >= 100

    def render(self) -> np.ndarray:
        grid = np.zeros((self.size, self.size), np.int64)
        grid[self.walls] = 1
        grid[self.door] = 3
        if not self.has_key:
            grid[self.key] = 2
        grid[tuple(self.agent)] = 4
        px = self.cell_px
        frame = np.zeros((self.size * px, self.size * px, 3), np.uint8)
        for r in range(self.size):
            for c in range(self.size):
                frame[r * px:(r + 1) * px, c * px:(c + 1) * px] = COLORS[int(grid[r, c])]
                frame[r * px, c * px:(c + 1) * px] = 60
                frame[r * px:(r + 1) * px, c * px] = 60
        return frame


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true", help="render only the last episode")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    env = KeyDoorWorld()
    q = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(q.parameters(), lr=1e-2)
    episodes = max(1, int(args.episodes * args.scale))
    video: list[np.ndarray] = []
    for episode in range(episodes):
        obs = env.reset()
        record = not args.fixed or episode == episodes - 1
        if record:
            video = []  # the video shows the latest episode
        done = False
        while not done:
            obs_t = torch.from_numpy(obs)
            with torch.no_grad():
                qs = q(obs_t)
            action = int(rng.integers(4)) if rng.random() < 0.2 else int(qs.argmax())
            next_obs, reward, terminated, truncated = env.step(action)
            if record:
                video.append(env.render())  # planted: rendering
            with torch.no_grad():
                target = reward + (0.0 if terminated else 0.97 * float(q(torch.from_numpy(next_obs)).max()))
            loss = (q(obs_t)[action] - target) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            obs, done = next_obs, terminated or truncated
    print(f"{episodes} episodes, {len(video)} frames in the last video")


if __name__ == "__main__":
    main()
