"""Env steps per second of the batched Snake over N, against Gymnasium's vector wrappers.

    python scripts/bench_env.py                       # CPU: N = 256 ... 65536, flood fill off/tensor/bfs
    python scripts/bench_env.py --device cuda --max-n 2097152
    python scripts/bench_env.py --quick --json        # what the test suite runs

Actions are generated before the timed loop (PufferLib's rule: RNG stays out of the timing), the
first steps are warm-up and excluded, each figure is the median of ``--repeats`` timed blocks.
The Gymnasium baselines (``SyncVectorEnv`` / ``AsyncVectorEnv`` over the single-board
``SnakeEnv``) run in the same invocation so the ratio compares like with like.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import time
from pathlib import Path

import gymnasium
import torch
from gymnasium.vector import AutoresetMode

from benchutil import emit, figure, save_figure, summarize
from rlperf.device import resolve_device, synchronize
from rlperf.run.record import cpu_model
from rlperf.env.single import SnakeEnv
from rlperf.env.vector import VectorSnake


def time_vector_snake(
    n: int, device: torch.device, flood_fill: str, steps: int, repeats: int, obs: str = "features"
) -> list[float]:
    env = VectorSnake(num_envs=n, size=10, obs=obs, flood_fill=flood_fill, device=device)
    env.reset(seed=0)
    actions = torch.randint(0, 3, (steps, n), device=device)
    for i in range(min(5, steps)):  # warm-up
        env.step(actions[i])
    rates = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for i in range(steps):
            env.step(actions[i])
        synchronize(device)
        rates.append(n * steps / (time.perf_counter() - start))
    return rates


def time_gym(kind: str, n: int, steps: int, repeats: int) -> list[float]:
    """Gymnasium's vector envs (``sync``/``async``) or SB3's ``DummyVecEnv`` (``sb3-dummy``) over ``SnakeEnv``."""
    if kind == "sb3-dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        envs = DummyVecEnv([lambda: SnakeEnv(size=10) for _ in range(n)])
        envs.seed(0)
        envs.reset()
    else:
        cls = gymnasium.vector.SyncVectorEnv if kind == "sync" else gymnasium.vector.AsyncVectorEnv
        envs = cls([lambda: SnakeEnv(size=10) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP)
        envs.reset(seed=0)
    actions = torch.randint(0, 3, (steps, n)).numpy()
    for i in range(min(5, steps)):
        envs.step(actions[i])
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            envs.step(actions[i])
        rates.append(n * steps / (time.perf_counter() - start))
    envs.close()
    return rates


PEER_LABELS = {"sync": "gymnasium SyncVectorEnv", "async": "gymnasium AsyncVectorEnv", "sb3-dummy": "SB3 DummyVecEnv"}


def plot(results: dict, path: Path) -> None:
    plt, fig, ax = figure()
    for flood in ("off", "tensor", "bfs"):
        rows = [r for r in results["tensor"] if r["flood_fill"] == flood]
        if rows:
            ax.errorbar(
                [r["n"] for r in rows],
                [r["median"] for r in rows],
                yerr=[[r["median"] - r["min"] for r in rows], [r["max"] - r["median"] for r in rows]],
                marker="o",
                ms=4,
                capsize=2,
                label=f"rlperf VectorSnake, flood fill {flood}",
            )
    for kind, marker in (("sync", "s"), ("async", "^"), ("sb3-dummy", "D")):
        rows = [r for r in results["gym"] if r["kind"] == kind]
        if rows:
            ax.plot(
                [r["n"] for r in rows],
                [r["median"] for r in rows],
                marker,
                ms=7,
                ls=":",
                label=f"{PEER_LABELS[kind]} over SnakeEnv (flood off)",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("boards stepped together (N)")
    ax.set_ylabel("env steps/s")
    m = results["machine"]
    ax.set_title(
        f"Snake 10x10, features obs | {m['gpu'] or m['cpu']}, torch {m['torch']}, {m['threads']} threads | {results['date']}",
        fontsize=8,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(plt, fig, path)


def sizes_between(low: int, high: int) -> list[int]:
    """low, 4 × low, 16 × low, ... up to high."""
    sizes = []
    while low <= high:
        sizes.append(low)
        low *= 4
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--min-n", type=int, default=16)
    parser.add_argument("--max-n", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=100, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: library default)")
    parser.add_argument("--no-gym", action="store_true", help="skip the Gymnasium baselines")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--json", action="store_true", help="print results as one JSON document")
    parser.add_argument("--plot", type=Path, help="write env steps/s vs N (log-log) with the peers' points as PNG here")
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    args = parser.parse_args()
    if args.quick:
        args.min_n, args.max_n, args.steps, args.repeats = 16, 64, 5, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)

    results: dict = {
        "machine": {
            "cpu": cpu_model(),
            "device": str(device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        },
        "date": time.strftime("%Y-%m-%d"),
        "tensor": [],
        "gym": [],
    }
    for flood in ("off", "tensor", "bfs"):
        for n in sizes_between(args.min_n, args.max_n):
            if flood == "bfs" and n > 4096:
                continue  # the Python BFS reference: minutes per block beyond this
            steps = max(3, args.steps // 10) if flood == "bfs" else args.steps
            rates = time_vector_snake(n, device, flood, steps, args.repeats)
            results["tensor"].append({"n": n, "flood_fill": flood, **summarize(rates)})
            if not args.json:
                print(f"VectorSnake  flood={flood:6s} N={n:>8,}  {statistics.median(rates):>14,.0f} steps/s", flush=True)
    if not args.no_gym:
        gym_sizes = [16] if args.quick else [16, 256]
        gym_steps = 5 if args.quick else 50
        kinds = ["sync", "async"] + (["sb3-dummy"] if importlib.util.find_spec("stable_baselines3") else [])
        for kind in kinds:
            for gym_n in gym_sizes:
                rates = time_gym(kind, gym_n, gym_steps, args.repeats)
                results["gym"].append({"n": gym_n, "kind": kind, **summarize(rates)})
                if not args.json:
                    print(f"{kind:>9s} over SnakeEnv N={gym_n:>6,}  {statistics.median(rates):>14,.0f} steps/s", flush=True)
        for row in results["gym"]:
            native = [r for r in results["tensor"] if r["n"] == row["n"] and r["flood_fill"] == "off"]
            if native:
                row["native_ratio"] = native[0]["median"] / row["median"]
                if not args.json:
                    print(f"VectorSnake / {row['kind']} at N={row['n']}: {row['native_ratio']:.1f}x")
    if args.plot:
        plot(results, args.plot)
    emit(results, args.out, args.json)


if __name__ == "__main__":
    main()
