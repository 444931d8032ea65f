"""Planted: worker processes (a multiprocessing pool, one per CPU) that each run NumPy's BLAS pool at
the machine's CPU count: workers × threads busy threads on the CPUs. ``--capped``: the clean twin,
one BLAS thread per worker, set the way the finding says (the variable before numpy is imported)."""

import os
import sys

if "--capped" in sys.argv:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

import multiprocessing
import time

import numpy as np


def simulate(seed: int) -> float:
    rng = np.random.default_rng(seed)
    dynamics, state = rng.standard_normal((384, 384)), rng.standard_normal((384, 384))
    started = time.process_time()
    while time.process_time() - started < 3.0:  # CPU time: the same work on a busy machine as on a quiet one
        state = np.tanh(dynamics @ state)
    return float(state.sum())


if __name__ == "__main__":
    workers = max(2, len(os.sched_getaffinity(0)))
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        print(sum(pool.map(simulate, range(workers))))
