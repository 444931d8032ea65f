"""Cross-entropy method on a "billiards" env whose physics is written in pure Python (a user's own
simulator: N balls, pairwise elastic collisions, wall bounces).

Planted (hot_spot -- no checklist rule): the physics step loops over all ball pairs in Python.
``--fixed`` computes the same collisions with NumPy on all pairs at once.
"""
import argparse
import math

import numpy as np

N_BALLS = 24
RADIUS = 0.05


def physics_python(pos, vel, dt=0.02):
    pos += vel * dt
    for i in range(N_BALLS):
        for j in range(i + 1, N_BALLS):
            dx, dy = pos[j, 0] - pos[i, 0], pos[j, 1] - pos[i, 1]
            dist = math.sqrt(dx * dx + dy * dy)
            if 0 < dist < 2 * RADIUS:
                nx, ny = dx / dist, dy / dist
                rel = (vel[i, 0] - vel[j, 0]) * nx + (vel[i, 1] - vel[j, 1]) * ny
                if rel > 0:
                    vel[i, 0] -= rel * nx
                    vel[i, 1] -= rel * ny
                    vel[j, 0] += rel * nx
                    vel[j, 1] += rel * ny
    for k in range(N_BALLS):
        for d in range(2):
            if pos[k, d] < RADIUS or pos[k, d] > 1 - RADIUS:
                vel[k, d] = -vel[k, d]
    vel *= 0.995


def physics_numpy(pos, vel, dt=0.02):
    pos += vel * dt
    iu, ju = np.triu_indices(N_BALLS, 1)
    delta = pos[ju] - pos[iu]
    dist = np.sqrt((delta ** 2).sum(1))
    hits = np.nonzero((dist > 0) & (dist < 2 * RADIUS))[0]
    for i, j, d, dl in zip(iu[hits], ju[hits], dist[hits], delta[hits], strict=True):  # the few colliding pairs, in order
        n = dl / d
        rel = (vel[i] - vel[j]) @ n
        if rel > 0:
            vel[i] -= rel * n
            vel[j] += rel * n
    out = (pos < RADIUS) | (pos > 1 - RADIUS)
    vel[out] = -vel[out]
    vel *= 0.995


def episode(physics, params, seed, horizon=60):
    """Cue ball 0 is shot with (angle, power) from params; reward: balls pushed into the right third."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0.1, 0.9, (N_BALLS, 2))
    vel = np.zeros((N_BALLS, 2))
    vel[0] = params[1] * np.array([math.cos(params[0]), math.sin(params[0])])
    for _ in range(horizon):
        physics(pos, vel)
    return float((pos[1:, 0] > 0.66).sum())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    physics = physics_numpy if args.fixed else physics_python
    rng = np.random.default_rng(0)
    mean, std = np.array([0.0, 1.0]), np.array([1.0, 0.5])
    for it in range(max(1, int(args.iterations * args.scale))):
        samples = mean + std * rng.standard_normal((24, 2))
        scores = np.array([episode(physics, s, seed=it) for s in samples])  # planted: hot_spot
        elite = samples[np.argsort(scores)[-6:]]
        mean, std = elite.mean(0), elite.std(0) + 0.05
    print(f"mean shot {mean}, last best {scores.max():.0f}")


if __name__ == "__main__":
    main()
