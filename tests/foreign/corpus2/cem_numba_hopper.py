"""Cross-entropy method over linear policies; the batched toy dynamics are jitted with numba."""
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numba  # noqa: E402
import numpy as np  # noqa: E402

OBS, ACT = 6, 2


@numba.njit(cache=False, fastmath=True)
def simulate(thetas, init_states, horizon):
    """Evaluate every candidate policy on every start state; returns mean return per candidate."""
    P = thetas.shape[0]
    S = init_states.shape[0]
    out = np.zeros(P)
    obs = np.empty(OBS)
    for p in range(P):
        W = thetas[p, :OBS * ACT].reshape(OBS, ACT)
        b = thetas[p, OBS * ACT:]
        total = 0.0
        for s in range(S):
            x, y, vx, vy = init_states[s, 0], init_states[s, 1], 0.0, 0.0
            gx, gy = init_states[s, 2], init_states[s, 3]
            for t in range(horizon):
                obs[0], obs[1], obs[2], obs[3], obs[4], obs[5] = x, y, vx, vy, gx - x, gy - y
                for a in range(ACT):
                    acc = b[a]
                    for i in range(OBS):
                        acc += obs[i] * W[i, a]
                    u = np.tanh(acc)
                    if a == 0:
                        vx = 0.92 * vx + 0.08 * u
                    else:
                        vy = 0.92 * vy + 0.08 * u - 0.002
                x += 0.1 * vx
                y = max(0.0, y + 0.1 * vy)
                d = np.sqrt((gx - x) ** 2 + (gy - y) ** 2)
                total -= d
        out[p] = total / S
    return out


def cem(iterations=60, pop=512, elite_frac=0.1, n_starts=16, horizon=120, seed=0):
    rng = np.random.default_rng(seed)
    dim = OBS * ACT + ACT
    mu, sd = np.zeros(dim), np.ones(dim)
    n_elite = int(pop * elite_frac)
    best = []
    for it in range(iterations):
        thetas = mu + sd * rng.standard_normal((pop, dim))
        starts = np.column_stack([rng.uniform(-1, 1, n_starts), rng.uniform(0, 1, n_starts),
                                  rng.uniform(-1, 1, n_starts), rng.uniform(0, 1, n_starts)])
        scores = simulate(thetas, starts, horizon)
        elite = thetas[np.argsort(scores)[-n_elite:]]
        mu = elite.mean(0)
        sd = elite.std(0) + max(0.0, 0.3 * (1 - it / iterations))
        best.append(scores.max())
    return mu, best


if __name__ == "__main__":
    t0 = time.perf_counter()
    mu, best = cem()
    print(f"best_first={best[0]:.2f} best_last={best[-1]:.2f} time={time.perf_counter() - t0:.2f}s")
