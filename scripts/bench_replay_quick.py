"""Quick replay-buffer benchmark: µs per push and per sample for each buffer.storage × buffer.push.

    python scripts/bench_replay_quick.py                 # CPU, capacity 100k, n = batch = 256, obs 11
    python scripts/bench_replay_quick.py --device cuda   # buffer and env data on the GPU

The buffer is filled before timing, so pushes run in the steady state (overwriting, wrapping) and
samples draw from all ``capacity`` slots. Push data is generated up front and on the env's device
(the same as the buffer's model device), so RNG and data creation stay out of the timed loop.
Each cell is the median over ``--repeats`` repeats of a loop sized to take about ``--min-time``
seconds; the ± column is half the range (max - min) over those repeats, relative to the median. On
CUDA the device is synchronized at the edges of every repeat, so queued work is counted.
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch

from benchutil import measure
from rlperf.buffer import PUSH_MODES, STORAGES, ReplayBuffer
from rlperf.device import resolve_device


def make_pushes(count: int, n: int, obs_dim: int, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(0)
    pushes = []
    for _ in range(count):
        obs = torch.rand(n, obs_dim, generator=gen)
        pushes.append(
            tuple(
                t.to(device)
                for t in (
                    obs,
                    torch.randint(0, 3, (n,), generator=gen),
                    torch.randn(n, generator=gen),
                    torch.rand(n, obs_dim, generator=gen),
                    torch.rand(n, generator=gen) < 0.02,
                )
            )
        )
    return pushes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="auto, cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=256, help="transitions per push (boards)")
    parser.add_argument("--batch", type=int, default=256, help="sample batch size")
    parser.add_argument("--obs-dim", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per repeat")
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats must be at least 5 (the figures are medians)")

    device = resolve_device(args.device)
    pushes = make_pushes(8, args.n, args.obs_dim, device)

    rows = []
    for storage in STORAGES:
        filled = ReplayBuffer(args.capacity, (args.obs_dim,), device, storage=storage)
        for k in range(-(-args.capacity // args.n)):  # fill the ring once, fast path
            filled.push(*pushes[k % len(pushes)])
        for mode in PUSH_MODES:
            buf = ReplayBuffer(args.capacity, (args.obs_dim,), device, storage=storage, push=mode)
            buf.load_state_dict(filled.state_dict())
            step = iter(range(1 << 62))

            def push(buf: ReplayBuffer = buf, step=step) -> None:
                buf.push(*pushes[next(step) % len(pushes)])

            def sample(buf: ReplayBuffer = buf) -> None:
                buf.sample(args.batch)

            push_s = measure(push, device, args.repeats, args.min_time)
            sample_s = measure(sample, device, args.repeats, args.min_time)
            rows.append((storage, mode, push_s, sample_s))

    def med(xs: list[float]) -> float:
        return statistics.median(xs) * 1e6

    def spread(xs: list[float]) -> str:
        return f"±{(max(xs) - min(xs)) / statistics.median(xs) / 2:.0%}"

    base = med(rows[0][2]) + med(rows[0][3])  # list / loop: the seeds' original buffer
    print(
        f"rlperf replay buffer, {device} | torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}"
    )
    print(
        f"capacity {args.capacity:,}, push n={args.n}, sample batch={args.batch}, obs ({args.obs_dim},) "
        f"float32; median of {args.repeats} repeats, µs per call"
    )
    header = (
        f"{'storage':<8} {'push':<6} {'push µs':>10} {'':>5} {'sample µs':>10} {'':>5} "
        f"{'push+sample':>12} {'speedup':>8}"
    )
    print(header)
    print("-" * len(header))
    for storage, mode, push_s, sample_s in rows:
        total = med(push_s) + med(sample_s)
        print(
            f"{storage:<8} {mode:<6} {med(push_s):>10.1f} {spread(push_s):>5} {med(sample_s):>10.1f} "
            f"{spread(sample_s):>5} {total:>12.1f} {base / total:>7.1f}×"
        )
    print("speedup: push+sample against list/loop (the seeds' buffer); one push and one sample per vector step")


if __name__ == "__main__":
    main()
