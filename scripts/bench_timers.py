"""Cost of the phase timer: ns per phase enter/exit, enabled vs disabled vs a bare loop.

    python scripts/bench_timers.py [--steps 200000] [--repeats 7] [--device cpu] [--mode auto]

Two measurements, each the median (and min) of interleaved repeats:

1. Empty phases: each vector step enters the five loop phases once with an empty body and calls
   ``step_done()``, as the trainer does. The bare loop iterates over the same names without a
   timer; the difference is the timer's cost per phase entry (``step_done`` amortised in).
2. A ~100 us step: each phase body busy-waits step_us/5, so the relative slowdown against the
   bare loop is the overhead on a loop of that speed (DESIGN §5: <= 2% enabled, ~0 disabled).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from time import perf_counter, perf_counter_ns

import torch

from rlperf.timers import PHASES, PhaseTimer


def spin(seconds: float) -> None:
    end = perf_counter() + seconds
    while perf_counter() < end:
        pass


def bare(steps: int, body_s: float) -> int:
    t0 = perf_counter_ns()
    for _ in range(steps):
        for _name in PHASES:
            if body_s:
                spin(body_s)
    return perf_counter_ns() - t0


def timed(timer: PhaseTimer, steps: int, body_s: float) -> int:
    t0 = perf_counter_ns()
    for _ in range(steps):
        for name in PHASES:
            with timer.phase(name):
                if body_s:
                    spin(body_s)
        timer.step_done()
    return perf_counter_ns() - t0


def measure(args: argparse.Namespace, steps: int, body_s: float) -> tuple[dict[str, list[int]], str]:
    device = torch.device(args.device)
    variants: dict[str, Callable[[], int]] = {
        "bare loop": lambda: bare(steps, body_s),
        "disabled": lambda: timed(PhaseTimer(device, enabled=False), steps, body_s),
        "enabled": lambda: timed(PhaseTimer(device, mode=args.mode), steps, body_s),
    }
    runs: dict[str, list[int]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():  # interleaved, so drift hits all variants alike
            runs[name].append(run())
    return runs, PhaseTimer(device, mode=args.mode).mode


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000, help="vector steps, empty-phase test")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--step-us", type=float, default=100.0, help="vector step time of the second test")
    parser.add_argument("--work-steps", type=int, default=5_000, help="vector steps, ~100 us step test")
    args = parser.parse_args()

    runs, mode = measure(args, args.steps, 0.0)
    entries = args.steps * len(PHASES)
    print(f"device {args.device}, timing mode {mode}; {args.steps} steps x {len(PHASES)} empty phases, "
          f"{args.repeats} repeats")
    print(
        f"{'variant':<10} {'ns/phase':>9} {'cost ns':>8} {'min cost':>9} {'cost/step':>10} "
        f"{'of ' + format(args.step_us, 'g') + ' us':>8}"
    )
    base_med = statistics.median(runs["bare loop"]) / entries
    base_min = min(runs["bare loop"]) / entries
    for name, values in runs.items():
        per_entry = statistics.median(values) / entries
        cost = per_entry - base_med
        cost_min = min(values) / entries - base_min
        per_step_us = cost * len(PHASES) / 1e3
        print(
            f"{name:<10} {per_entry:>9.1f} {cost:>8.1f} {cost_min:>9.1f} {per_step_us:>8.2f}us "
            f"{per_step_us / args.step_us:>8.2%}"
        )

    body_s = args.step_us / len(PHASES) / 1e6
    runs, _ = measure(args, args.work_steps, body_s)
    base = statistics.median(runs["bare loop"])
    print(f"\n{args.work_steps} steps of ~{args.step_us:g} us (phase bodies busy-wait), {args.repeats} repeats")
    print(f"{'variant':<10} {'us/step':>9} {'overhead':>9}")
    for name, values in runs.items():
        med = statistics.median(values)
        print(f"{name:<10} {med / args.work_steps / 1e3:>9.2f} {(med - base) / base:>9.2%}")


if __name__ == "__main__":
    main()
