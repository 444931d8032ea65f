"""Planar navigation among circular obstacles with a ray-cast range sensor."""
import math
import os

import gymnasium as gym
import numpy as np
from gymnasium import spaces

N_RAYS = 64
N_OBS = 32
MAX_RANGE = 3.0


def cast_rays_scalar(px, py, heading, centers, radii):
    readings = []
    for k in range(N_RAYS):
        ang = heading + 2.0 * math.pi * k / N_RAYS
        dx, dy = math.cos(ang), math.sin(ang)
        best = MAX_RANGE
        for j in range(len(radii)):
            ox, oy = centers[j][0] - px, centers[j][1] - py
            proj = ox * dx + oy * dy
            if proj <= 0.0:
                continue
            perp2 = ox * ox + oy * oy - proj * proj
            r2 = radii[j] * radii[j]
            if perp2 > r2:
                continue
            hit = proj - math.sqrt(r2 - perp2)
            if 0.0 < hit < best:
                best = hit
        readings.append(best / MAX_RANGE)
    return readings


def cast_rays_vector(px, py, heading, centers, radii):
    ang = heading + 2.0 * np.pi * np.arange(N_RAYS) / N_RAYS
    d = np.stack([np.cos(ang), np.sin(ang)], 1)             # (R, 2)
    o = centers - np.array([px, py])                        # (M, 2)
    proj = d @ o.T                                          # (R, M)
    perp2 = (o * o).sum(1)[None, :] - proj ** 2
    r2 = (radii ** 2)[None, :]
    ok = (proj > 0) & (perp2 <= r2)
    hit = proj - np.sqrt(np.where(ok, r2 - perp2, 0.0))
    hit = np.where(ok & (hit > 0), hit, MAX_RANGE)
    return np.minimum(hit.min(1), MAX_RANGE) / MAX_RANGE


class LidarNav(gym.Env):
    def __init__(self, max_steps=150):
        self.fast = os.environ.get("FIX", "0") == "1"
        self.max_steps = max_steps
        self.action_space = spaces.Discrete(3)
        self.observation_space = spaces.Box(0, 1, (N_RAYS + 3,), np.float32)

    def _sense(self):
        x, y = self.pos
        if self.fast:
            rays = cast_rays_vector(x, y, self.heading, self.centers, self.radii)
        else:
            rays = cast_rays_scalar(x, y, self.heading, self.centers.tolist(), self.radii.tolist())
        g = self.goal - self.pos
        rel = math.atan2(g[1], g[0]) - self.heading
        extra = [math.cos(rel), math.sin(rel), min(1.0, float(np.hypot(*g)) / 10.0)]
        return np.asarray(list(rays) + extra, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        r = self.np_random
        self.centers = r.uniform(-4, 4, (N_OBS, 2))
        self.radii = r.uniform(0.2, 0.6, N_OBS)
        self.pos = np.array([-4.5, -4.5])
        self.goal = np.array([4.5, 4.5])
        self.heading = math.pi / 4
        self.t = 0
        return self._sense(), {}

    def step(self, action):
        self.heading += (-0.3, 0.0, 0.3)[int(action)]
        prev = np.hypot(*(self.goal - self.pos))
        self.pos = np.clip(self.pos + 0.15 * np.array([math.cos(self.heading), math.sin(self.heading)]), -5, 5)
        dist = np.hypot(*(self.goal - self.pos))
        collide = bool(np.any(np.hypot(*(self.centers - self.pos).T) < self.radii))
        self.t += 1
        reached = dist < 0.5
        reward = float(prev - dist) - (1.0 if collide else 0.0) + (10.0 if reached else 0.0)
        return self._sense(), reward, bool(reached or collide), self.t >= self.max_steps, {}
