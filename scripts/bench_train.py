"""What each seed fix is worth in the training loop, and whether time per episode stays flat.

    python scripts/bench_train.py                  # knobs + naive vs fast + scaling (CPU: ~15 min)
    python scripts/bench_train.py --part knobs     # only the knob table
    python scripts/bench_train.py --quick --json   # what the test suite runs

Every trial is a real ``rlperf train --json`` in its own process (so peak RSS is the trial's own),
run back to back in one invocation; figures are the records' warm-up-excluded rates, medians over
``--repeats``. Knob trials run a fixed number of env steps so that every variant does the same
work; ``naive`` vs ``fast`` is also run at equal ``train_ratio`` (DESIGN §8).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Each seed fix undone alone, on top of configs/fast.toml: (label, --set overrides).
KNOBS = [
    ("fast (all fixes)", []),
    ("buffer.push=loop", ["buffer.push=loop"]),
    ("buffer.storage=list", ["buffer.storage=list"]),
    ("buffer.storage=numpy", ["buffer.storage=numpy"]),
    ("env.flood_fill=bfs", ["env.flood_fill=bfs"]),
    ("env.backend=gym-sync", ["env.backend=gym-sync", "env.flood_fill=bfs"]),
    ("agent.target_update=hard", ["agent.target_update=hard", "agent.target_every=100"]),
    ("agent.inference=grad", ["agent.inference=grad"]),
    ("train.log_every=1", ["train.log_every=1"]),
    ("train.gc=on", ["train.gc=on"]),
    ("train.train_ratio=64", ["train.train_ratio=64"]),
]
QUICK_KNOBS = ("fast (all fixes)", "buffer.push=loop", "env.flood_fill=bfs")
DEVICE = ["--device", "auto"]  # every trial's device; set from --device


def run(config: str, overrides: list[str], out: Path, *flags: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "rlperf",
        "train",
        "--config",
        config,
        "--out",
        str(out),
        "--json",
        "--quiet",
        *DEVICE,
        *flags,
    ]
    for item in overrides:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"trial failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def median(records: list[dict], path: tuple[str, str]) -> float:
    return statistics.median(r[path[0]][path[1]] or 0.0 for r in records)


def knobs(out: Path, steps: int, repeats: int, envs: int, variants: list[tuple[str, list[str]]] = KNOBS) -> list[dict]:
    rows = []
    for label, overrides in variants:
        records = [run("fast", overrides, out, "--steps", str(steps), "--envs", str(envs)) for _ in range(repeats)]
        rows.append(
            {
                "variant": label,
                "env_steps_per_s": median(records, ("throughput", "env_steps_per_s")),
                "phases": {p: statistics.median(r["phases"][p]["share"] for r in records) for p in records[0]["phases"]},
            }
        )
        print(f"  {label:28s} {rows[-1]['env_steps_per_s']:>10,.0f} env steps/s", file=sys.stderr, flush=True)
    base = rows[0]["env_steps_per_s"]
    for row in rows:
        row["fast_over_variant"] = base / row["env_steps_per_s"] if row["env_steps_per_s"] else None
    return rows


def naive_vs_fast(out: Path, steps: int, repeats: int, envs: int) -> list[dict]:
    rows = []
    for label, ratio in (("at naive's train_ratio 64", "64"), ("at each config's own train_ratio", None)):
        result = {}
        for config in ("naive", "fast"):
            flags = ["--steps", str(steps), "--envs", str(envs)] + (["--train-ratio", ratio] if ratio else [])
            records = [run(config, [], out, *flags) for _ in range(repeats)]
            result[config] = median(records, ("throughput", "env_steps_per_s"))
        rows.append(
            {
                "comparison": label,
                "naive_env_steps_per_s": result["naive"],
                "fast_env_steps_per_s": result["fast"],
                "speedup": result["fast"] / result["naive"],
            }
        )
        print(
            f"  {label:36s} naive {result['naive']:>9,.0f}  fast {result['fast']:>9,.0f}  {rows[-1]['speedup']:.1f}x",
            file=sys.stderr,
            flush=True,
        )
    return rows


def scaling(out: Path, small: int, large: int, envs: int, steps: int) -> dict:
    """Episodes 1024 vs 5000 (the seed's measurement) and, since a learning agent's episodes grow
    longer, equal work in env steps (S vs 5S): the cost per env step must stay flat."""
    result: dict = {}
    for label, flag, amount in (
        ("episodes", "--episodes", small),
        ("episodes", "--episodes", large),
        ("env_steps", "--steps", steps),
        ("env_steps", "--steps", 5 * steps),
    ):
        record = run("default", [], out, flag, str(amount), "--envs", str(envs))
        key = f"{amount}_{label}"
        result[key] = {
            "wall_s": record["totals"]["wall_s"],
            "env_steps": record["totals"]["env_steps"],
            "episodes": record["totals"]["episodes"],
            "updates": record["totals"]["updates"],
            "us_per_env_step": 1e6 * record["totals"]["wall_s"] / record["totals"]["env_steps"],
            "peak_rss_mb": record["memory"]["peak_rss_mb"],
            "mean_score_last_100": record["learning"]["mean_score_last_100"],
        }
        print(
            f"  {amount} {label}: {result[key]['wall_s']:.1f} s, {result[key]['us_per_env_step']:.1f} us/env step, "
            f"RSS {result[key]['peak_rss_mb']:.0f} MiB, score {result[key]['mean_score_last_100']}",
            file=sys.stderr,
            flush=True,
        )
    a, b = result[f"{small}_episodes"], result[f"{large}_episodes"]
    c, d = result[f"{steps}_env_steps"], result[f"{5 * steps}_env_steps"]
    return {
        "runs": result,
        "episode_time_ratio": b["wall_s"] / a["wall_s"],
        "episode_linear_ratio": large / small,
        "step_time_ratio": d["wall_s"] / c["wall_s"],
        "step_linear_ratio": 5.0,
        "step_ratio_over_linear": (d["wall_s"] / c["wall_s"]) / 5.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "knobs", "naive-fast", "scaling"), default="all")
    parser.add_argument("--steps", type=int, default=51_200, help="env steps per knob trial")
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto", help="run.device of every trial (auto, cpu, cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny trials, for the test suite")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    small, large, scale_steps = 1024, 5000, 73_728
    DEVICE[1] = args.device
    if args.quick:
        args.steps, args.envs, args.repeats, small, large, scale_steps = 2048, 32, 1, 20, 40, 2048
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "device": args.device,
        "steps": args.steps,
        "envs": args.envs,
        "repeats": args.repeats,
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if args.part in ("all", "knobs"):
            print("each fix undone alone, against fast:", file=sys.stderr)
            # --quick only checks the script works: the baseline and two knobs with a measurable effect.
            variants = [k for k in KNOBS if k[0] in QUICK_KNOBS] if args.quick else KNOBS
            results["knobs"] = knobs(out, args.steps, args.repeats, args.envs, variants)
        if args.part in ("all", "naive-fast"):
            print("naive vs fast:", file=sys.stderr)
            results["naive_vs_fast"] = naive_vs_fast(out, args.steps, args.repeats, args.envs)
        if args.part in ("all", "scaling"):
            print("scaling:", file=sys.stderr)
            results["scaling"] = scaling(out, small, large, args.envs, scale_steps)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for row in results.get("knobs", []):
        print(f"{row['variant']:28s} {row['env_steps_per_s']:>10,.0f} env steps/s   fast is {row['fast_over_variant']:.2f}x")
    for row in results.get("naive_vs_fast", []):
        print(f"naive vs fast {row['comparison']}: {row['speedup']:.1f}x")
    if "scaling" in results:
        s = results["scaling"]
        print(
            f"t({large} episodes)/t({small} episodes) = {s['episode_time_ratio']:.2f} (linear {s['episode_linear_ratio']:.2f})"
        )
        print(
            f"t(5S env steps)/t(S env steps) = {s['step_time_ratio']:.2f} "
            f"(linear 5; {s['step_ratio_over_linear']:.2f}x linear)"
        )


if __name__ == "__main__":
    main()
