"""Tabular-feature SARSA on a procedurally generated terrain (a gymnasium.Env subclass), module-level script.

Planted (env_reset): a fresh env is constructed for every episode ("so each episode starts clean"),
and construction generates and smooths a 96x96 height map. ``--fixed`` builds the env once and calls
``reset()`` between episodes.
"""
import sys

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class TerrainWalker(gym.Env):
    """Walk from the west edge to the east edge of a height map; climbing costs reward."""

    def __init__(self, size=96, seed=0):
        rng = np.random.default_rng(seed)
        height = rng.random((size, size))
        for _ in range(12):  # smooth the noise into hills
            neighbours = np.roll(height, 1, 0) + np.roll(height, -1, 0) + np.roll(height, 1, 1) + np.roll(height, -1, 1)
            height = (height + neighbours) / 5
            height = np.clip(height + 0.02 * rng.standard_normal((size, size)), 0, 1)
        self.height = height
        self.size = size
        self.slope_x, self.slope_y = np.gradient(height)
        self.observation_space = spaces.Box(-1.0, 1.0, (6,), np.float32)
        self.action_space = spaces.Discrete(4)
        self.moves = np.array([[0, 1], [1, 0], [-1, 0], [0, -1]])

    def _obs(self):
        r, c = self.pos
        return np.array([r / self.size, c / self.size, self.height[r, c], self.slope_x[r, c], self.slope_y[r, c],
                         self.t / 200], np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.array([self.np_random.integers(0, self.size), 0])
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        old = self.height[self.pos[0], self.pos[1]]
        self.pos = np.clip(self.pos + self.moves[action], 0, self.size - 1)
        self.t += 1
        climb = self.height[self.pos[0], self.pos[1]] - old
        reward = -0.01 - max(climb, 0.0) + (1.0 if self.pos[1] == self.size - 1 else 0.0)
        terminated = bool(self.pos[1] == self.size - 1)
        truncated = self.t >= 40
        return self._obs(), reward, terminated, truncated, {}


fixed = "--fixed" in sys.argv
scale = float(sys.argv[sys.argv.index("--scale") + 1]) if "--scale" in sys.argv else 1.0
episodes = int(2000 * scale)
rng = np.random.default_rng(0)
weights = np.zeros((4, 6), np.float32)
alpha, gamma, epsilon = 0.05, 0.98, 0.1
returns = []
env = TerrainWalker(seed=0)

for episode in range(episodes):
    if not fixed:
        env = TerrainWalker(seed=0)  # planted: env_reset
    obs, _ = env.reset(seed=episode)
    action = int(rng.integers(4)) if rng.random() < epsilon else int(np.argmax(weights @ obs))
    total, done = 0.0, False
    while not done:
        next_obs, reward, terminated, truncated, _ = env.step(action)
        next_action = int(rng.integers(4)) if rng.random() < epsilon else int(np.argmax(weights @ next_obs))
        target = reward + (0.0 if terminated else gamma * weights[next_action] @ next_obs)
        weights[action] += alpha * (target - weights[action] @ obs) * obs
        obs, action, total = next_obs, next_action, total + reward
        done = terminated or truncated
    returns.append(total)

print(f"{episodes} episodes, mean return of the last 100: {np.mean(returns[-100:]):.3f}")
