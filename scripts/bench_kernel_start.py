"""How long a process waits for the fused env kernel: compiling it once, then loading numba's disk cache.

    python scripts/bench_kernel_start.py                 # 3 cold and 5 warm starts
    python scripts/bench_kernel_start.py --json

Each start is a fresh ``python`` process that imports rlperf, builds a 256-board VectorSnake with
``kernel="fused"`` and steps it once. "Cold" starts point ``NUMBA_CACHE_DIR`` at an empty
directory, so numba compiles; "warm" starts reuse the directory the cold start filled. Reported per
start: the kernel's own time (``fused.compile_kernel``: compile, or load from the cache), the
import of rlperf (torch, gymnasium, numba), and the process's wall time to its first step.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from benchutil import emit, machine_info, summarize

CHILD = """
import time
started = time.perf_counter()
import torch
from rlperf.env import fused
from rlperf.env.vector import VectorSnake
imported = time.perf_counter()
env = VectorSnake(256, device="cpu", kernel="fused")
env.reset(seed=0)
env.step(torch.zeros(256, dtype=torch.long))
stepped = time.perf_counter()
seconds, error = fused.compile_kernel()
assert error is None, error
print({"kernel_s": seconds, "import_s": imported - started, "first_step_s": stepped - started})
"""


def start(cache_dir: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - began
    if proc.returncode:
        raise SystemExit(f"child failed: {proc.stderr.strip().splitlines()[-1]}")
    figures = eval(proc.stdout.strip().splitlines()[-1])
    return {**figures, "process_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=3, help="starts with an empty cache")
    parser.add_argument("--warm", type=int, default=5, help="starts with the cache filled")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.cold):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(start(cache))
    with tempfile.TemporaryDirectory() as cache:
        start(cache)  # fills it
        warm = [start(cache) for _ in range(args.warm)]
    results = {
        "machine": machine_info(),
        "cold": cold,
        "warm": warm,
        "summary": {
            kind: {key: summarize(r[key] for r in runs) for key in runs[0]}
            for kind, runs in (("cold", cold), ("warm", warm))
            if runs
        },
    }
    if emit(results, None, args.json):
        return
    print(
        f"fused kernel start-up | {results['machine']['cpu']}, {results['machine']['cores']} cores | "
        f"{results['machine']['date']}"
    )
    for kind, summary in results["summary"].items():
        print(
            f"{kind:>5}: kernel {summary['kernel_s']['median']:.2f} s "
            f"({summary['kernel_s']['min']:.2f}-{summary['kernel_s']['max']:.2f}), "
            f"import {summary['import_s']['median']:.2f} s, "
            f"first step after {summary['first_step_s']['median']:.2f} s, process {summary['process_s']['median']:.2f} s "
            f"(medians of {summary['kernel_s']['repeats']})"
        )


if __name__ == "__main__":
    main()
