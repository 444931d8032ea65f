"""Planted: numpy's BLAS pool and torch's OpenMP pool each at the machine's CPU count, working at
the same time (a planner's NumPy linear algebra in a thread of its own beside the torch network,
as a prefetching data thread would). ``--capped``: the clean twin, both pools at one thread, as
the finding says."""

import sys
import threading
import time

import numpy as np
import torch

if "--capped" in sys.argv:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    torch.set_num_threads(1)

rng = np.random.default_rng(0)
dynamics = rng.standard_normal((384, 384))
q = torch.nn.Sequential(torch.nn.Linear(384, 384), torch.nn.ReLU(), torch.nn.Linear(384, 4))
batch = torch.randn(256, 384)
done = threading.Event()


def plan() -> None:
    state = rng.standard_normal((384, 384))
    while not done.is_set():
        state = np.tanh(dynamics @ state)


planner = threading.Thread(target=plan)
planner.start()
started = time.process_time()
while time.process_time() - started < 3.0:  # CPU time: as much work on a busy machine as on a quiet one
    with torch.no_grad():
        q(batch)
done.set()
planner.join()
