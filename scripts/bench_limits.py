"""How far VectorSnake is from this machine's physical limits: memory bandwidth and per-op overhead.

    python scripts/bench_limits.py                   # CPU, N = 256 and 65,536, both env kernels
    python scripts/bench_limits.py --device cuda --n 256,65536,1048576
    python scripts/bench_limits.py --quick --json    # what the test suite runs

For one ``VectorSnake.step`` with the ``ops`` kernel (10x10 board, feature observation) it counts,
with a ``TorchDispatchMode``, the ATen operators that run and the bytes they touch (every tensor
argument read in full and every output written: an upper bound, since a gather reads only what it
indexes; view operators touch nothing). The ``fused`` kernel runs no ATen operator: its bytes per
env step are counted from its accesses (``fused_bytes_per_env_step``) and its fixed cost per step
(Python, the kernel call) is measured as the step time at N = 1. It then measures on this machine:

- memory bandwidth: ``dst.copy_(src)`` of a 256 MiB float32 tensor, bytes read + written per second;
- per-operator overhead: a one-element ``torch.add(..., out=...)``, which on the CPU is the
  dispatcher's cost and on CUDA the kernel launch (synchronized at the end of the loop only).

and gives two bounds on the vector step: ``ops x overhead`` (small N: the step is a fixed number of
operator calls) and ``bytes / bandwidth`` (large N: every byte has to move). The measured step time
is set against the larger of the two. All figures are medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from benchutil import emit, print_header, machine_info, machine_line, measure, summarize
from rlperf.device import resolve_device
from rlperf.env.vector import VectorSnake, resolve_kernel


class OpTally(TorchDispatchMode):
    """Counts ATen operators and the bytes of their tensor arguments and results."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.views = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            self.views += 1
            return out
        self.ops += 1
        seen = set()
        for t in tree_flatten((args, kwargs or {}, out))[0]:
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                self.bytes += t.numel() * t.element_size()
        return out


def tally_step(n: int, flood_fill: str, device: torch.device, steps: int = 20) -> dict:
    """Operators and bytes per step, averaged over ``steps`` steps of a running env (resets included)."""
    env = VectorSnake(num_envs=n, size=10, obs="features", flood_fill=flood_fill, device=device, kernel="ops")
    env.reset(seed=0)
    actions = torch.randint(0, 3, (steps + 10, n), device=device)
    for i in range(10):  # past the first steps, so deaths and resets happen at their usual rate
        env.step(actions[i])
    with OpTally() as tally:
        for i in range(steps):
            env.step(actions[10 + i])
    return {
        "ops_per_step": tally.ops / steps,
        "views_per_step": tally.views / steps,
        "bytes_per_env_step": tally.bytes / steps / n,
    }


def step_time(n: int, flood_fill: str, device: torch.device, repeats: int, min_time: float) -> list[float]:
    env = VectorSnake(num_envs=n, size=10, obs="features", flood_fill=flood_fill, device=device, kernel="ops")
    env.reset(seed=0)
    actions = torch.randint(0, 3, (64, n), device=device)
    state = {"i": 0}

    def step() -> None:
        state["i"] = (state["i"] + 1) % 64
        env.step(actions[state["i"]])

    return measure(step, device, repeats, min_time)


def fused_bytes_per_env_step(size: int, obs_floats: int) -> dict[str, float]:
    """Bytes the fused kernel moves per board and step, reads plus writes (the bandwidth's unit).

    Streamed (every board, in order): the action (read); the ten int64 state rows, three float32
    and three bool rows (read and written); the observation written to final_obs, read back and
    written to the returned buffer. Random access, counted in whole 64-byte cache lines: the ring
    lines holding the tail and the new head (two read, one written back) and the board's
    occupancy row (read and written back). Resets and fruit respawns only touch those same lines.
    The per-cell table and the flood fill's scratch stay in cache and are not counted.
    """
    line = 64
    streamed = 8 + 2 * (10 * 8 + 3 * 4 + 3 * 1) + 3 * obs_floats * 4
    occupancy_lines = -(-(size * size + 1) // line)
    random = 3 * line + 2 * occupancy_lines * line
    return {"streamed": streamed, "random_lines": random, "total": streamed + random}


def fused_step_time(n: int, flood_fill: str, repeats: int, min_time: float) -> list[float]:
    env = VectorSnake(num_envs=n, size=10, obs="features", flood_fill=flood_fill, device=torch.device("cpu"), kernel="fused")
    env.reset(seed=0)
    actions = torch.randint(0, 3, (64, n))
    state = {"i": 0}

    def step() -> None:
        state["i"] = (state["i"] + 1) % 64
        env.step(actions[state["i"]])

    return measure(step, torch.device("cpu"), repeats, min_time)


def bandwidth(device: torch.device, repeats: int, mib: int) -> list[float]:
    """Bytes read + written per second by a large tensor copy."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    seconds = measure(lambda: dst.copy_(src), device, repeats, 0.2)
    return [2 * src.numel() * 4 / s for s in seconds]


def op_overhead(device: torch.device, repeats: int) -> list[float]:
    x = torch.ones(1, device=device)
    y = torch.empty_like(x)
    return measure(lambda: torch.add(x, 1, out=y), device, repeats, 0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", default="256,65536", help="comma-separated board counts")
    parser.add_argument("--flood-fill", default="off,tensor", help="comma-separated flood_fill modes")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repeat of the step timing")
    parser.add_argument("--copy-mib", type=int, default=256, help="size of the bandwidth copy")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: library default)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(n) for n in args.n.split(",")]
    floods = args.flood_fill.split(",")
    if args.quick:
        sizes, args.repeats, args.min_time, args.copy_mib = [16, 256], 3, 0.01, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)

    bw = summarize(bandwidth(device, args.repeats, args.copy_mib))
    overhead = summarize(op_overhead(device, args.repeats))
    print(
        f"  memory bandwidth {bw['median'] / 1e9:.1f} GB/s, per-op overhead {overhead['median'] * 1e6:.2f} µs",
        file=sys.stderr,
        flush=True,
    )
    results: dict = {"machine": machine_info(device), "bandwidth_bytes_per_s": bw, "op_overhead_s": overhead, "rows": []}
    for flood in floods:
        for n in sizes:
            tally = tally_step(n, flood, device)
            step = summarize(step_time(n, flood, device, args.repeats, args.min_time))
            overhead_bound = tally["ops_per_step"] * overhead["median"]
            bandwidth_bound = tally["bytes_per_env_step"] * n / bw["median"]
            bound = max(overhead_bound, bandwidth_bound)
            row = {
                "kernel": "ops",
                "n": n,
                "flood_fill": flood,
                **tally,
                "step_s": step,
                "env_steps_per_s": n / step["median"],
                "overhead_bound_s": overhead_bound,
                "bandwidth_bound_s": bandwidth_bound,
                "limit_env_steps_per_s": n / bound,
                "bound_by": "overhead" if overhead_bound >= bandwidth_bound else "bandwidth",
                "fraction_of_limit": bound / step["median"],
            }
            results["rows"].append(row)
            print(
                f"  ops   flood={flood:6s} N={n:>8,}: {row['ops_per_step']:.0f} "
                f"ops, {row['bytes_per_env_step']:.0f} B/env step, "
                f"{row['env_steps_per_s']:,.0f} env steps/s ({row['fraction_of_limit']:.0%} of the {row['bound_by']} limit)",
                file=sys.stderr,
                flush=True,
            )
    if device.type == "cpu" and resolve_kernel("auto", device)[0] == "fused":
        fixed = summarize(fused_step_time(1, "off", args.repeats, args.min_time))
        results["fused_fixed_cost_s"] = fixed
        for flood in floods:
            traffic = fused_bytes_per_env_step(10, 14 if flood != "off" else 11)
            for n in sizes:
                step = summarize(fused_step_time(n, flood, args.repeats, args.min_time))
                rate = n / step["median"]
                bandwidth_bound = traffic["total"] * n / bw["median"]
                bound = max(fixed["median"], bandwidth_bound)
                row = {
                    "kernel": "fused",
                    "n": n,
                    "flood_fill": flood,
                    "ops_per_step": 0,
                    "bytes_per_env_step": traffic["total"],
                    "bytes_streamed": traffic["streamed"],
                    "bytes_random_lines": traffic["random_lines"],
                    "step_s": step,
                    "env_steps_per_s": rate,
                    "ns_per_env_step": 1e9 / rate,
                    "overhead_bound_s": fixed["median"],
                    "bandwidth_bound_s": bandwidth_bound,
                    "limit_env_steps_per_s": n / bound,
                    "bound_by": "overhead" if fixed["median"] >= bandwidth_bound else "bandwidth",
                    "fraction_of_limit": bound / step["median"],
                    "bandwidth_share": traffic["total"] * rate / bw["median"],
                }
                results["rows"].append(row)
                print(
                    f"  fused flood={flood:6s} N={n:>8,}: {traffic['total']} B/env step, {rate:,.0f} env steps/s, "
                    f"{row['bandwidth_share']:.0%} of the copy bandwidth",
                    file=sys.stderr,
                    flush=True,
                )
    if emit(results, args.out, args.json):
        return
    m = results["machine"]
    print(f"\nVectorSnake.step, 10x10, features | {machine_line(m)}")
    print(
        f"memory bandwidth (copy, read+write) {bw['median'] / 1e9:.1f} GB/s; per-op overhead {overhead['median'] * 1e6:.2f} µs"
        f"; medians of {args.repeats}"
    )
    if "fused_fixed_cost_s" in results:
        print(f"fused: fixed cost per step (N = 1) {results['fused_fixed_cost_s']['median'] * 1e6:.2f} µs")
    header = (
        f"{'kernel':<6} {'flood':<7} {'N':>9} {'ops/step':>9} {'B/env step':>11} {'step µs':>9} {'env steps/s':>13} "
        f"{'fixed µs':>9} {'bytes/bw µs':>12} {'limit steps/s':>14} {'of limit':>9} {'of bw':>6}"
    )
    print_header(header)
    for r in results["rows"]:
        share = f"{r['bandwidth_share']:>6.0%}" if "bandwidth_share" in r else f"{'':>6}"
        print(
            f"{r['kernel']:<6} {r['flood_fill']:<7} {r['n']:>9,} {r['ops_per_step']:>9.0f} {r['bytes_per_env_step']:>11.0f} "
            f"{r['step_s']['median'] * 1e6:>9.1f} "
            f"{r['env_steps_per_s']:>13,.0f} {r['overhead_bound_s'] * 1e6:>9.1f} "
            f"{r['bandwidth_bound_s'] * 1e6:>12.1f} {r['limit_env_steps_per_s']:>14,.0f} "
            f"{r['fraction_of_limit']:>9.0%} {share}"
        )


if __name__ == "__main__":
    main()
