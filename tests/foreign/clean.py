"""A clean loop: batched env, vectorized replay, one update per step, soft target, actions under
inference_mode, a log every 100 steps, one torch thread. The phase timer is rlperf's public API."""

import sys

import torch

import rlperf
from common import run

torch.set_num_threads(1)
timer = rlperf.PhaseTimer("cpu", warmup_steps=10)
run(timer=timer, on_log=lambda t, loss: print(f"step {t + 1}: loss {loss:.4f}"))
if "--save" in sys.argv:
    print(timer.save(sys.argv[sys.argv.index("--save") + 1], name="clean", num_envs=64))
