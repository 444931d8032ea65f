"""Evolution strategies (antithetic, rank-shaped) with a multiprocessing Pool of evaluators."""
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import multiprocessing as mp  # noqa: E402

import numpy as np  # noqa: E402

from es_parts.noise import NoiseTable  # noqa: E402
from es_parts.rollout import N_PARAMS, episode, evaluate_pair, init_worker  # noqa: E402


def centered_ranks(x):
    ranks = np.empty(len(x))
    ranks[x.argsort()] = np.arange(len(x))
    return ranks / (len(x) - 1) - 0.5


def main(generations=16, pop_pairs=16, sigma=0.05, lr=0.03, seed=0):
    rng = np.random.default_rng(seed)
    table = NoiseTable()
    theta = rng.normal(0, 0.1, N_PARAMS).astype(np.float32)
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    history = []
    with mp.get_context("fork").Pool(2, initializer=init_worker) as pool:
        for g in range(generations):
            offsets = [table.sample_offset(rng, N_PARAMS) for _ in range(pop_pairs)]
            tasks = [(theta, off, sigma, 1000 * g + k) for k, off in enumerate(offsets)]
            results = pool.map(evaluate_pair, tasks, chunksize=1)
            offs = np.array([r[0] for r in results])
            fit = np.array([[r[1], r[2]] for r in results])
            shaped = centered_ranks(fit.ravel()).reshape(fit.shape)
            weights = shaped[:, 0] - shaped[:, 1]
            grad = sum(w * table.get(o, N_PARAMS) for w, o in zip(weights, offs)) / (2 * pop_pairs * sigma)
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad ** 2
            theta = theta + lr * (m / (1 - 0.9 ** (g + 1))) / (np.sqrt(v / (1 - 0.999 ** (g + 1))) + 1e-8)
            history.append(episode(theta, 10**6 + g))
    return history


if __name__ == "__main__":
    t0 = time.perf_counter()
    h = main()
    print(f"first={h[0]:.2f} last={h[-1]:.2f} time={time.perf_counter() - t0:.2f}s")
