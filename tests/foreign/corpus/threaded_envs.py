"""Evolution strategies with a thread pool: 8 worker threads each evaluate perturbed MLP policies on
their own batch of NumPy cart-pole physics; the main thread combines the returns.

Planted (threads): the script sets ``torch.set_num_threads(16)`` (copied from a workstation) while 8
Python threads already run torch ops at once on a 2-core box. ``--fixed`` uses one intra-op thread.
"""
import argparse
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

WORKERS, POP_PER_WORKER, ENVS, HIDDEN = 8, 2, 256, 256


def cartpole_batch(x, force):
    """Vectorized cart-pole dynamics (Euler step), state columns x, x_dot, theta, theta_dot."""
    g, mc, mp_, length, dt = 9.8, 1.0, 0.1, 0.5, 0.02
    cos, sin = torch.cos(x[:, 2]), torch.sin(x[:, 2])
    temp = (force + mp_ * length * x[:, 3] ** 2 * sin) / (mc + mp_)
    theta_acc = (g * sin - cos * temp) / (length * (4 / 3 - mp_ * cos ** 2 / (mc + mp_)))
    x_acc = temp - mp_ * length * theta_acc * cos / (mc + mp_)
    return x + dt * torch.stack([x[:, 1], x_acc, x[:, 3], theta_acc], 1)


def evaluate(params, seed, horizon=60):
    w1, b1, w2 = params
    gen = torch.Generator().manual_seed(int(seed))
    x = 0.05 * torch.randn(ENVS, 4, generator=gen)
    alive = torch.ones(ENVS)
    total = torch.zeros(ENVS)
    for _ in range(horizon):
        h = torch.tanh(x @ w1 + b1)
        force = 10.0 * torch.tanh(h @ w2).squeeze(1)
        x = cartpole_batch(x, force)
        alive = alive * ((x[:, 2].abs() < 0.21) & (x[:, 0].abs() < 2.4)).float()
        total += alive
    return total.mean().item()


def worker(theta, sigma, seeds):
    scores = []
    for seed in seeds:
        gen = torch.Generator().manual_seed(int(seed))
        noise = [torch.randn(p.shape, generator=gen) for p in theta]
        scores.append(evaluate([p + sigma * n for p, n in zip(theta, noise, strict=True)], seed) -
                      evaluate([p - sigma * n for p, n in zip(theta, noise, strict=True)], seed))
    return scores


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    if args.fixed:
        torch.set_num_threads(1)
    else:
        torch.set_num_threads(16)  # planted: threads
    torch.manual_seed(0)
    theta = [0.5 * torch.randn(4, HIDDEN), torch.zeros(HIDDEN), 0.5 * torch.randn(HIDDEN, 1)]
    sigma, lr = 0.1, 0.05
    pool = ThreadPoolExecutor(WORKERS)
    for gen in range(max(1, int(args.generations * args.scale))):
        seeds = np.arange(WORKERS * POP_PER_WORKER).reshape(WORKERS, POP_PER_WORKER) + 1000 * gen
        results = list(pool.map(worker, [theta] * WORKERS, [sigma] * WORKERS, seeds))
        flat_seeds, flat_scores = seeds.ravel(), np.concatenate(results)
        grads = [torch.zeros_like(p) for p in theta]
        for seed, score in zip(flat_seeds, flat_scores, strict=True):
            noise_gen = torch.Generator().manual_seed(int(seed))
            for g, p in zip(grads, theta, strict=True):
                g += score * torch.randn(p.shape, generator=noise_gen)
        theta = [p + lr / (len(flat_seeds) * sigma) * g for p, g in zip(theta, grads, strict=True)]
    pool.shutdown()
    print(f"final score {evaluate(theta, 0):.1f}")


if __name__ == "__main__":
    main()
