"""rlperf's replay buffer against Stable-Baselines3's and TorchRL's, side by side in one process.

    python scripts/bench_replay.py                  # CPU: capacity 100k, 256 transitions per push, batch 256
    python scripts/bench_replay.py --device cuda    # buffers (and the pushed data) on the GPU
    python scripts/bench_replay.py --quick --json   # what the test suite runs

Each library gets the data in the form its own training loop hands it over, generated before the
timed loop:

- rlperf ``ReplayBuffer`` (``tensor`` storage, ``batch`` push): torch tensors on the device, one
  ``push`` of N transitions per vector step.
- SB3 ``ReplayBuffer(buffer_size=capacity, n_envs=N)``: numpy arrays of shape ``(N, ...)`` and a list
  of N info dicts, as ``OffPolicyAlgorithm`` passes them after ``VecEnv.step``; ``sample`` returns
  tensors on the device. SB3 stores ``capacity // N`` rows of N transitions: the same capacity.
- TorchRL ``ReplayBuffer(storage=LazyTensorStorage(capacity))``: one ``extend`` of a TensorDict with
  batch size N (obs, action, reward, done and ``("next", "observation")``).

All three are filled to capacity before timing, so pushes overwrite and samples draw from all
slots. Figures are µs per call, median of ``--repeats`` repeats (spread = half the range over the
median); the ratios compare medians measured in this one invocation. A library that is not
installed is reported as missing (``pip install -e ".[bench]"`` brings both).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchutil import emit, print_header, machine_info, machine_line, measure, spread, summarize
from rlperf.buffer import ReplayBuffer
from rlperf.device import resolve_device
from rlperf.env.vector import VectorSnake

NUM_ACTIONS = 3


def make_data(count: int, n: int, obs_dim: int) -> list[dict[str, np.ndarray]]:
    """``count`` vector steps of N transitions, as numpy arrays (the common source for all three)."""
    rng = np.random.default_rng(0)
    return [
        {
            "obs": rng.random((n, obs_dim), dtype=np.float32),
            "action": rng.integers(0, NUM_ACTIONS, n),
            "reward": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.random((n, obs_dim), dtype=np.float32),
            "done": rng.random(n) < 0.02,
        }
        for _ in range(count)
    ]


def cycle(items: list) -> Callable[[], object]:
    """A function returning the items in turn, forever."""
    state = {"i": 0}

    def next_item():
        state["i"] += 1
        return items[state["i"] % len(items)]

    return next_item


def bench_rlperf(data: list[dict], capacity: int, batch: int, device: torch.device, repeats: int, min_time: float) -> tuple:
    pushes = [
        tuple(torch.as_tensor(d[k]).to(device) for k in ("obs", "action", "reward", "next_obs", "done")) for d in data
    ]
    buf = ReplayBuffer(capacity, data[0]["obs"].shape[1:], device, storage="tensor")
    for k in range(-(-capacity // len(data[0]["obs"]))):
        buf.push(*pushes[k % len(pushes)])
    assert len(buf) == capacity
    item = cycle(pushes)
    push = measure(lambda: buf.push(*item()), device, repeats, min_time)
    sample = measure(lambda: buf.sample(batch), device, repeats, min_time)
    return push, sample


def bench_sb3(data: list[dict], capacity: int, batch: int, device: torch.device, repeats: int, min_time: float) -> tuple:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    n, obs_dim = data[0]["obs"].shape
    obs_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    buf = SB3ReplayBuffer(capacity, obs_space, spaces.Discrete(NUM_ACTIONS), device=device, n_envs=n)
    # As OffPolicyAlgorithm._store_transition hands them over: actions (N, 1), one info dict per env.
    pushes = [
        (d["obs"], d["next_obs"], d["action"].reshape(n, 1), d["reward"], d["done"], [{} for _ in range(n)]) for d in data
    ]
    for k in range(buf.buffer_size):
        buf.add(*pushes[k % len(pushes)])
    assert buf.full and buf.buffer_size * n == capacity
    item = cycle(pushes)
    push = measure(lambda: buf.add(*item()), device, repeats, min_time)
    sample = measure(lambda: buf.sample(batch), device, repeats, min_time)
    return push, sample


def bench_torchrl(data: list[dict], capacity: int, batch: int, device: torch.device, repeats: int, min_time: float) -> tuple:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer as TorchRLReplayBuffer

    logging.getLogger("torchrl").setLevel(logging.WARNING)  # its INFO line on every storage init

    n = data[0]["obs"].shape[0]
    buf = TorchRLReplayBuffer(storage=LazyTensorStorage(capacity, device=device), batch_size=batch)
    pushes = [
        TensorDict(
            {
                "observation": torch.as_tensor(d["obs"]),
                "action": torch.as_tensor(d["action"]),
                "reward": torch.as_tensor(d["reward"]),
                "done": torch.as_tensor(d["done"]),
                "next": {"observation": torch.as_tensor(d["next_obs"])},
            },
            batch_size=[n],
        ).to(device)
        for d in data
    ]
    for k in range(-(-capacity // n)):
        buf.extend(pushes[k % len(pushes)])
    assert len(buf) == capacity
    item = cycle(pushes)
    push = measure(lambda: buf.extend(item()), device, repeats, min_time)
    sample = measure(lambda: buf.sample(), device, repeats, min_time)
    return push, sample


LIBRARIES = {
    "rlperf": ("rlperf ReplayBuffer (tensor, batch push)", bench_rlperf, None),
    "sb3": ("SB3 ReplayBuffer (n_envs=N)", bench_sb3, "stable_baselines3"),
    "torchrl": ("TorchRL ReplayBuffer + LazyTensorStorage", bench_torchrl, "torchrl"),
}


def installed(module: str | None) -> bool:
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--capacity", type=int, default=102_400, help="transitions held (a multiple of --n)")
    parser.add_argument("--n", type=int, default=256, help="transitions per push (boards per vector step)")
    parser.add_argument("--batch", type=int, default=256, help="transitions per sample")
    parser.add_argument("--obs-dim", type=int, default=0, help="observation size (default: the default config's)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per repeat")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: library default)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    parser.add_argument("--json", action="store_true", help="print results as one JSON document")
    args = parser.parse_args()
    if args.quick:
        args.capacity, args.repeats, args.min_time = 4096, 3, 0.005
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if not args.obs_dim:
        env = VectorSnake(num_envs=1, size=10, obs="features", flood_fill="tensor")
        args.obs_dim = env.single_observation_space.shape[0]
    if args.capacity % args.n:
        parser.error("--capacity must be a multiple of --n (SB3 stores capacity // n rows of n)")

    data = make_data(8, args.n, args.obs_dim)
    results: dict = {
        "machine": machine_info(device),
        "capacity": args.capacity, "n": args.n, "batch": args.batch, "obs_dim": args.obs_dim,
        "libraries": [], "missing": [],
    }
    for key, (label, bench, module) in LIBRARIES.items():
        if not installed(module):
            results["missing"].append(key)
            print(f"  {label}: not installed (pip install -e \".[bench]\")", file=sys.stderr)
            continue
        push_s, sample_s = bench(data, args.capacity, args.batch, device, args.repeats, args.min_time)
        push, sample = summarize(x * 1e6 for x in push_s), summarize(x * 1e6 for x in sample_s)
        results["libraries"].append({"library": key, "label": label, "push_us": push, "sample_us": sample,
                                     "push_plus_sample_us": push["median"] + sample["median"]})
        print(f"  {label}: push {push['median']:.1f} µs, sample {sample['median']:.1f} µs", file=sys.stderr, flush=True)

    rows = {row["library"]: row for row in results["libraries"]}
    ours = rows["rlperf"]
    for row in results["libraries"]:
        row["rlperf_speedup"] = {
            "push": row["push_us"]["median"] / ours["push_us"]["median"],
            "sample": row["sample_us"]["median"] / ours["sample_us"]["median"],
            "push_plus_sample": row["push_plus_sample_us"] / ours["push_plus_sample_us"],
        }
    if emit(results, args.out, args.json):
        return

    m = results["machine"]
    print(f"replay buffers on {device} | {machine_line(m)}")
    print(f"capacity {args.capacity:,}, {args.n} transitions per push, batch {args.batch}, obs ({args.obs_dim},) float32; "
          f"µs per call, median of {args.repeats}")
    header = (f"{'buffer':<42} {'push µs':>9} {'':>5} {'sample µs':>10} {'':>5} "
              f"{'rlperf is ×faster (push / sample / both)':>42}")
    print_header(header)
    for row in results["libraries"]:
        s = row["rlperf_speedup"]
        print(
            f"{row['label']:<42} {row['push_us']['median']:>9.1f} {spread(row['push_us']):>5} "
            f"{row['sample_us']['median']:>10.1f} {spread(row['sample_us']):>5} "
            f"{s['push']:>14.1f}× {s['sample']:>7.1f}× {s['push_plus_sample']:>7.1f}×"
        )
    for key in results["missing"]:
        print(f"{LIBRARIES[key][0]}: not installed")


if __name__ == "__main__":
    main()
