"""Env steps per second of the batched Snake over N, both env kernels, against Gymnasium's vector wrappers.

    python scripts/bench_env.py                       # CPU: N = 16 ... 65536, fused and ops, flood fill off/tensor/bfs
    python scripts/bench_env.py --device cuda --max-n 2097152
    python scripts/bench_env.py --quick --json        # what the test suite runs

Actions are generated before the timed loop (PufferLib's rule: RNG stays out of the timing), the
first steps are warm-up and excluded (the fused kernel's compilation happens when its env is
built), each figure is the median of ``--repeats`` timed blocks. At each (N, flood fill) the
kernels' blocks are interleaved (fused, ops, fused, ops, ...), so their ratio sees the same load.
The Gymnasium baselines (``SyncVectorEnv`` / ``AsyncVectorEnv`` over the single-board
``SnakeEnv``) run in the same invocation so the ratios compare like with like. The envs run with
``copy=False`` (the trainer's mode); ``--overheads`` times what ``copy=True`` (the default, what
``gymnasium.make_vec`` users get: new tensors every step) and the action checks add, with the
page faults each step takes and the load average around the blocks, ``--overheads-only`` that alone:

    python scripts/bench_env.py --overheads-only --kernels fused,ops --max-n 4096 --steps 1000 --repeats 9
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import platform
import resource
import statistics
import time
from pathlib import Path

import gymnasium
import torch
from gymnasium.vector import AutoresetMode

from benchutil import emit, figure, measure, save_figure, summarize
from rlperf.device import resolve_device, synchronize
from rlperf.system import cpu_model
from rlperf.env.single import SnakeEnv
from rlperf.env import fused
from rlperf.env.vector import VectorSnake, resolve_kernel


def time_vector_snakes(
    n: int, device: torch.device, flood_fill: str, kernels: list[str], steps: int, repeats: int, obs: str = "features"
) -> dict[str, list[float]]:
    """Env steps/s of VectorSnake with each kernel at ``n`` boards, the kernels' blocks interleaved
    (``copy=False``, the trainer's mode: what the env itself costs)."""
    envs = {
        kernel: VectorSnake(num_envs=n, size=10, obs=obs, flood_fill=flood_fill, device=device, kernel=kernel, copy=False)
        for kernel in kernels
    }
    actions = torch.randint(0, 3, (steps, n), device=device)
    for env in envs.values():
        env.reset(seed=0)
        for i in range(min(5, steps)):  # warm-up
            env.step(actions[i])
    rates: dict[str, list[float]] = {kernel: [] for kernel in kernels}
    for _ in range(repeats):
        for kernel, env in envs.items():
            synchronize(device)
            start = time.perf_counter()
            for i in range(steps):
                env.step(actions[i])
            synchronize(device)
            rates[kernel].append(n * steps / (time.perf_counter() - start))
    return rates


def overheads(n: int, repeats: int, steps: int, kernels: list[str]) -> dict:
    """What the env's contracts cost per step at ``n`` boards, for each kernel on the CPU: returning
    new tensors that are the caller's (``copy=True`` against ``copy=False``, interleaved blocks, each
    step's results held during the next as ``obs, ... = env.step(a)`` holds them; minor page faults
    per step, which fresh memory every step would show) and checking the actions (the fused
    kernel's scan, run alone; the ops kernel's min/max and host read, run alone)."""
    device = torch.device("cpu")
    actions = torch.randint(0, 3, (steps, n))
    row: dict = {"n": n, "load_before": os.getloadavg()[0]}
    for kernel in kernels:
        envs = {copy: VectorSnake(num_envs=n, size=10, device=device, kernel=kernel, copy=copy) for copy in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        faults: dict[bool, list[float]] = {False: [], True: []}
        for env in envs.values():
            env.reset(seed=0)
            for i in range(min(5, steps)):  # warm-up, the results held as in the timed loop
                out = env.step(actions[i])
        for _ in range(repeats):
            for copy, env in envs.items():
                faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                for i in range(steps):
                    out = env.step(actions[i])  # held during the next step, as a loop holds it
                times[copy].append((time.perf_counter() - start) / steps)
                faults[copy].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted) / steps)
                del out
        plain, copied = statistics.median(times[False]), statistics.median(times[True])
        env = envs[False]
        if kernel == "fused":
            check = functools.partial(fused.first_bad_action, actions[0].numpy())
        else:
            check = functools.partial(env._checked_actions, actions[0])
        check_s = statistics.median(measure(check, device, repeats, 0.05))
        row[kernel] = {
            "step_us": summarize([1e6 * t for t in times[False]]),
            "copy_step_us": summarize([1e6 * t for t in times[True]]),
            "copy_extra_us": 1e6 * (copied - plain),
            "copy_ratio": copied / plain,
            "rate": n / plain,
            "copy_rate": n / copied,
            "copy_rate_ratio": plain / copied,
            "faults_per_step": statistics.median(faults[False]),
            "copy_faults_per_step": statistics.median(faults[True]),
            "check_us": 1e6 * check_s,
            "check_share": check_s / plain,
        }
    row["load_after"] = os.getloadavg()[0]
    return row


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
    for kernel, style in (("fused", "-"), ("ops", "--")):
        for flood in ("off", "tensor", "bfs"):
            rows = [r for r in results["tensor"] if r["flood_fill"] == flood and r["kernel"] == kernel]
            if rows:
                ax.errorbar(
                    [r["n"] for r in rows],
                    [r["median"] for r in rows],
                    yerr=[[r["median"] - r["min"] for r in rows], [r["max"] - r["median"] for r in rows]],
                    marker="o",
                    ms=4,
                    capsize=2,
                    ls=style,
                    label=f"VectorSnake {kernel}, flood fill {flood}",
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


def time_gym_baselines(args: argparse.Namespace, results: dict, kernels: list[str]) -> None:
    """Gymnasium's (and SB3's) vector envs over SnakeEnv, and VectorSnake's ratio to each."""
    gym_sizes = [16] if args.quick else [16, 256]
    gym_steps = 5 if args.quick else 50
    kinds = ["sync", "async"] + (["sb3-dummy"] if importlib.util.find_spec("stable_baselines3") else [])
    for kind in kinds:
        for gym_n in gym_sizes:
            rates = time_gym(kind, gym_n, gym_steps, args.repeats)
            results["gym"].append({"n": gym_n, "kind": kind, **summarize(rates)})
            if not args.json:
                print(f"{kind:>9s} over SnakeEnv N={gym_n:>6,}  {statistics.median(rates):>14,.0f} steps/s", flush=True)
    rows = {(r["kernel"], r["flood_fill"], r["n"]): r for r in results["tensor"]}
    for row in results["gym"]:
        for kernel in kernels:
            native = rows.get((kernel, "off", row["n"]))
            if native:
                row[f"{kernel}_ratio"] = native["median"] / row["median"]
                if not args.json:
                    print(f"VectorSnake {kernel} / {row['kind']} at N={row['n']}: {row[f'{kernel}_ratio']:.1f}x")


def time_kernels(args: argparse.Namespace, device: torch.device, sizes: list[int], kernels: list[str], results: dict) -> None:
    """VectorSnake with each kernel and flood fill at every N; fused / ops ratios and fused's best N."""
    for flood in args.floods.split(","):
        for n in sizes:
            if flood == "bfs" and n > 4096:
                continue  # the Python BFS reference: minutes per block beyond this
            steps = max(3, args.steps // 10) if flood == "bfs" else args.steps
            run = ["ops"] if flood == "bfs" else kernels  # the fused kernel has its own fill
            if flood == "bfs" and "ops" not in kernels:
                continue
            for kernel, rates in time_vector_snakes(n, device, flood, run, steps, args.repeats).items():
                results["tensor"].append({"n": n, "flood_fill": flood, "kernel": kernel, **summarize(rates)})
                if not args.json:
                    line = f"VectorSnake {kernel:5s} flood={flood:6s} N={n:>8,}  {statistics.median(rates):>14,.0f} steps/s"
                    print(line, flush=True)
    rows = {(r["kernel"], r["flood_fill"], r["n"]): r for r in results["tensor"]}
    results["fused_over_ops"] = [
        {"n": n, "flood_fill": flood, "ratio": rows[("fused", flood, n)]["median"] / rows[("ops", flood, n)]["median"]}
        for (kernel, flood, n) in rows
        if kernel == "fused" and ("ops", flood, n) in rows
    ]
    fused_off = [r for r in results["tensor"] if r["kernel"] == "fused" and r["flood_fill"] == "off"]
    if fused_off:
        best = max(fused_off, key=lambda r: r["median"])
        results["best_fused"] = {"n": best["n"], "median": best["median"]}
    if not args.json:
        for r in results["fused_over_ops"]:
            print(f"fused / ops at N={r['n']:,}, flood fill {r['flood_fill']}: {r['ratio']:.1f}x")
        if fused_off:
            print(f"fused, best N: {best['n']:,} at {best['median']:,.0f} env steps/s")


def time_overheads(args: argparse.Namespace, results: dict, kernels: list[str]) -> None:
    """The copy and action-check costs at N = 256 and at --max-n."""
    sizes = sorted({min(256, args.max_n), args.max_n})
    results["overheads"] = [overheads(n, args.repeats, args.steps, kernels) for n in sizes]
    if args.json:
        return
    for r in results["overheads"]:
        for kernel in kernels:
            o = r[kernel]
            print(
                f"{kernel:5s} N={r['n']:>8,}: copy=True +{o['copy_extra_us']:.1f} µs per step ({o['copy_ratio']:.2f}x "
                f"the {o['step_us']['median']:.1f} µs step; {o['copy_rate'] / 1e6:.2f} M against "
                f"{o['rate'] / 1e6:.2f} M env steps/s, {o['copy_rate_ratio']:.2f}x; page faults per step "
                f"{o['copy_faults_per_step']:.2f} against {o['faults_per_step']:.2f}); action check "
                f"{o['check_us']:.2f} µs ({o['check_share']:.1%} of the step)"
            )
        print(f"load average {r['load_before']:.1f} before, {r['load_after']:.1f} after")


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
    parser.add_argument(
        "--kernels",
        default="fused,ops",
        help="env kernels to time, interleaved (fused alone: no torch thread pool between its blocks)",
    )
    parser.add_argument(
        "--overheads",
        action="store_true",
        help="also time copy=True against copy=False and the action checks (CPU; N = 256 and --max-n)",
    )
    parser.add_argument("--floods", default="off,tensor,bfs", help="flood fill modes to time (bfs: the Python reference)")
    parser.add_argument("--overheads-only", action="store_true", help="only --overheads (no rates over N, no peers)")
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
    asked = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not asked or any(k not in ("fused", "ops") for k in asked):
        parser.error(f"--kernels takes fused and/or ops, got {args.kernels!r}")
    kernels = [k for k in asked if resolve_kernel(k if k == "ops" else "auto", device)[0] == k]
    results["kernels"] = kernels
    if not args.overheads_only:
        time_kernels(args, device, sizes_between(args.min_n, args.max_n), kernels, results)
    if args.overheads or args.overheads_only:
        time_overheads(args, results, kernels)
    if not args.no_gym and not args.overheads_only:
        time_gym_baselines(args, results, kernels)
    if args.plot:
        plot(results, args.plot)
    emit(results, args.out, args.json)


if __name__ == "__main__":
    main()
