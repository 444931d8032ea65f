"""Two-link planar reacher as a gymnasium.Env with an rgb_array renderer in numpy."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Reacher2D(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None, size=192, max_steps=40):
        self.render_mode = render_mode
        self.size = size
        self.max_steps = max_steps
        self.action_space = spaces.Discrete(5)
        self.observation_space = spaces.Box(-np.inf, np.inf, (8,), np.float32)
        ys, xs = np.mgrid[0:size, 0:size]
        self._grid = np.stack([xs, ys], -1).astype(np.float32) / size * 2.4 - 1.2
        self.q = np.zeros(2)
        self.dq = np.zeros(2)
        self.goal = np.zeros(2)
        self.t = 0

    def _tip(self):
        e = np.array([np.cos(self.q[0]), np.sin(self.q[0])]) * 0.6
        return e, e + np.array([np.cos(self.q.sum()), np.sin(self.q.sum())]) * 0.5

    def _obs(self):
        _, tip = self._tip()
        return np.concatenate([np.cos(self.q), np.sin(self.q), self.dq * 0.1, self.goal - tip]).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.q = self.np_random.uniform(-np.pi, np.pi, 2)
        self.dq = np.zeros(2)
        r = self.np_random.uniform(0.3, 1.0)
        a = self.np_random.uniform(-np.pi, np.pi)
        self.goal = np.array([r * np.cos(a), r * np.sin(a)])
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        torque = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], dtype=np.float64)[action]
        self.dq = np.clip(0.95 * self.dq + 0.2 * torque, -3, 3)
        self.q = self.q + 0.1 * self.dq
        self.t += 1
        _, tip = self._tip()
        dist = float(np.linalg.norm(tip - self.goal))
        term = dist < 0.08
        rew = -dist + (2.0 if term else 0.0)
        return self._obs(), rew, term, self.t >= self.max_steps, {}

    def _segment_mask(self, a, b, width):
        ab = b - a
        ap = self._grid - a
        t = np.clip((ap @ ab) / (ab @ ab), 0.0, 1.0)
        closest = a + t[..., None] * ab
        d = np.linalg.norm(self._grid - closest, axis=-1)
        return np.clip(1.0 - (d - width) / 0.01, 0.0, 1.0)

    def render(self):
        img = np.full((self.size, self.size, 3), 245.0, dtype=np.float32)
        elbow, tip = self._tip()
        for (a, b, col) in ((np.zeros(2), elbow, (40, 90, 200)), (elbow, tip, (200, 80, 40))):
            m = self._segment_mask(a, b, 0.035)[..., None]
            img = img * (1 - m) + m * np.array(col, np.float32)
        g = np.clip(1.0 - (np.linalg.norm(self._grid - self.goal, axis=-1) - 0.05) / 0.01, 0, 1)[..., None]
        img = img * (1 - g) + g * np.array((30, 180, 60), np.float32)
        return img.astype(np.uint8)


class EpisodeThumbnails(gym.Wrapper):
    """Keeps a downsampled first frame of each episode for a training montage."""

    def __init__(self, env, every=1, keep=64):
        super().__init__(env)
        self.every = every
        self.keep = keep
        self.frames = []
        self.episode = 0

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        if self.episode % self.every == 0:
            frame = self.env.render()
            self.frames.append(frame[::4, ::4].copy())
            self.frames = self.frames[-self.keep:]
        self.episode += 1
        return out
