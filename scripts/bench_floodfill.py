"""Benchmark the flood-fill forms: the seed's per-board BFS against the batched tensor fill.

    python scripts/bench_floodfill.py                  # S=10, M=768 and M=3*65536, on the CPU
    python scripts/bench_floodfill.py --threads 1 --repeats 21 --device cuda

Boards look like the env's: a snake body (a random self-avoiding walk of 3..60 cells) and a
start next to its head, free or not. Prints microseconds per call (median of the repeats,
warm-up call excluded; wall and this process's CPU time) and the speed-up over the BFS at
the same M. Forms: the seed's BFS; a plain bool-plane dilation (the obvious batched form,
also reachable_tensor's fallback for S > 62); the row-bitmask fill with torch ops only; and
reachable_tensor itself (which runs small batches' rounds on numpy views).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from rlperf.env import floodfill
from rlperf.device import resolve_device, synchronize

STEPS = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])


def snake_boards(m: int, size: int, gen: torch.Generator, max_length: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    """``m`` boards each blocked by a random self-avoiding walk, and a start next to its head."""
    blocked = torch.zeros(m, size, size, dtype=torch.bool)
    length = torch.randint(3, max_length + 1, (m,), generator=gen)
    head = torch.randint(0, size, (m, 2), generator=gen)
    boards = torch.arange(m)
    blocked[boards, head[:, 0], head[:, 1]] = True
    growing = torch.ones(m, dtype=torch.bool)
    for step in range(1, max_length):
        nxt = head.unsqueeze(1) + STEPS  # (m, 4, 2)
        inside = ((nxt >= 0) & (nxt < size)).all(2)
        nxt = nxt.clamp(0, size - 1)
        ok = inside & ~blocked[boards.unsqueeze(1), nxt[..., 0], nxt[..., 1]]
        growing &= ok.any(1) & (step < length)
        pick = torch.rand(m, 4, generator=gen).masked_fill(~ok, -1.0).argmax(1)
        head = torch.where(growing.unsqueeze(1), nxt[boards, pick], head)
        blocked[boards, head[:, 0], head[:, 1]] = True
    start = (head + STEPS[torch.randint(0, 4, (m,), generator=gen)]).clamp(0, size - 1)
    return blocked, start[:, 0] * size + start[:, 1]


def time_us(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int,
            budget_s: float) -> tuple[float, float]:
    """Median wall and process-CPU time of ``fn`` in microseconds, after one warm-up call.

    Stops early (after at least 3 calls) once ``budget_s`` is spent. The CPU time is the one
    to read on a shared machine: other processes stretch the wall time, not this one's CPU time.
    """
    fn()
    synchronize(device)
    wall, cpu = [], []
    while len(wall) < repeats and (len(wall) < 3 or sum(wall) < budget_s):
        begin, begin_cpu = time.perf_counter(), time.process_time()
        fn()
        synchronize(device)
        wall.append(time.perf_counter() - begin)
        cpu.append(time.process_time() - begin_cpu)
    return statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6


def main() -> None:
    """Parse the options, time every form, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10, help="board side S")
    parser.add_argument("--batches", type=int, nargs="+", default=[768, 3 * 65536], help="boards per call M")
    parser.add_argument("--bfs-max", type=int, default=768, help="time the BFS only up to this M (it is slow)")
    parser.add_argument("--repeats", type=int, default=11, help="timed calls per cell (median reported)")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timed calls per cell at most")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    gen = torch.Generator().manual_seed(args.seed)

    cpu = device.type == "cpu"
    forms: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "bfs (seed, per board)": floodfill.reachable_bfs,
        "tensor, bool dilation": lambda b, s: floodfill._reachable_dilated(b, s, early_exit=cpu),
        "tensor, bitmask, torch ops": lambda b, s: floodfill._reachable_packed(b, s, early_exit=cpu, use_numpy=False),
        "reachable_tensor": floodfill.reachable_tensor,
    }
    print(f"flood fill on snake boards, S={args.size}, device={device}, threads={torch.get_num_threads()}, "
          f"median of {args.repeats} calls or {args.budget:g} s")
    print(f"{'form':<28}{'M':>8}{'us/call':>13}{'cpu us':>13}{'ns/board':>10}{'vs bfs':>8}")
    for m in args.batches:
        blocked, start = snake_boards(m, args.size, gen)
        blocked, start = blocked.to(device), start.to(device)
        expected, bfs_us = None, None
        for name, form in forms.items():
            if form is floodfill.reachable_bfs and m > args.bfs_max:
                continue
            got = form(blocked, start)
            if expected is None:  # the BFS, or past --bfs-max the first tensor form
                expected = got
            elif not torch.equal(got, expected):
                raise SystemExit(f"{name} disagrees with {next(iter(forms))} at M={m}")
            us, cpu_us = time_us(
                lambda form=form, blocked=blocked, start=start: form(blocked, start), device, args.repeats, args.budget
            )
            bfs_us = us if form is floodfill.reachable_bfs else bfs_us
            ratio = f"{bfs_us / us:.0f}x" if bfs_us else "-"
            print(f"{name:<28}{m:>8}{us:>13,.0f}{cpu_us:>13,.0f}{us * 1e3 / m:>10,.0f}{ratio:>8}")


if __name__ == "__main__":
    main()
