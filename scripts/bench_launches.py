"""Kernel launches per env step and per update on CUDA: what the fused env kernel and the CUDA-graph
update remove.

    python scripts/bench_launches.py --json      # needs CUDA

torch.profiler (CUDA activities, through CUPTI, which also sees the kernels numba launches) records
``--steps`` env steps at ``--boards`` boards for each env kernel, and ``--steps`` updates for each
update form; the figures are GPU kernels per call and the host-side launch calls per call
(``cudaLaunchKernel``/``cuLaunchKernel``/``cudaGraphLaunch``), with the wall time per call measured
apart, outside the profiler.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rlperf.buffer import ReplayBuffer
from rlperf.config import config_from
from rlperf.dqn import Agent
from rlperf.env.backends import env_spec
from rlperf.env.vector import VectorSnake

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def counted(fn, calls: int) -> dict:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    per_call_us = 1e6 * (time.perf_counter() - started) / calls
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  and not e.name.startswith(("Memcpy", "Memset")))
    launches = sum(1 for e in prof.events() if e.name in LAUNCH_CALLS)
    return {"gpu_kernels_per_call": kernels / calls, "launch_calls_per_call": launches / calls,
            "wall_us_per_call": per_call_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "boards": args.boards, "env": {},
                     "update": {}}
    for kernel in ("ops", "fused"):
        for flood in ("off", "tensor"):
            env = VectorSnake(args.boards, device="cuda", kernel=kernel, flood_fill=flood, copy=False)
            env.reset(seed=0)
            actions = torch.randint(0, 3, (args.boards,), device="cuda")
            results["env"][f"{kernel}, flood {flood}"] = counted(lambda env=env, actions=actions: env.step(actions),
                                                                args.steps)
    for form in ("torch", "graph"):
        cfg = config_from(None, [f"train.update={form}", "buffer.batch_size=128"])
        obs_shape, n_actions = env_spec(cfg)
        agent = Agent(cfg, obs_shape, torch.device("cuda"), n_actions)
        buf = ReplayBuffer(20_000, obs_shape, torch.device("cuda"), seed=1)
        n = 10_000
        buf.push(torch.rand(n, *obs_shape, device="cuda"), torch.randint(0, n_actions, (n,), device="cuda"),
                 torch.randn(n, device="cuda"), torch.rand(n, *obs_shape, device="cuda"),
                 (torch.rand(n, device="cuda") < 0.05).float())
        results["update"][form] = counted(lambda agent=agent, buf=buf: agent.update(buf), args.steps)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for part in ("env", "update"):
        for name, row in results[part].items():
            print(f"{part} {name}: {row['gpu_kernels_per_call']:.1f} GPU kernels, {row['launch_calls_per_call']:.1f} "
                  f"launch calls, {row['wall_us_per_call']:.0f} µs per call")


if __name__ == "__main__":
    main()
