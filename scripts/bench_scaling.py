"""Cost per episode and per env step as a run grows (256 → 5000 episodes), and memory over the run.

    python scripts/bench_scaling.py                               # default config, ~2 min on 2 cores
    python scripts/bench_scaling.py --plot docs/bench/scaling.png --out scaling.json
    python scripts/bench_scaling.py --quick --json                # what the test suite runs

Each run is a real ``rlperf train --episodes E --json`` in its own process (``--repeats`` per E,
median and range reported), while this script samples the process's resident memory (VmRSS from
``/proc``) every ``--sample-every`` seconds. The longest run's metrics.csv also gives the cost per
env step window by window, so a cost that grows within a run (the seed's 14x non-linearity: a
buffer or a log that gets slower as it fills) shows as a rising line, whatever the episode lengths.

Why both per episode and per env step: a learning agent's episodes get longer as it gets better
(a random snake dies in ~10 steps, a trained one survives ~65), so time per *episode* rises with
skill even when every step costs the same. The loop's own cost is the cost per env step.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchutil import emit, print_header, figure, machine_info, machine_line, save_figure, summarize
import itertools


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(config: str, episodes: int, threads: int, out: Path, sample_every: float, log_every: int) -> dict:
    cmd = [sys.executable, "-m", "rlperf", "train", "--config", config, "--episodes", str(episodes), "--out", str(out),
           "--json", "--quiet", "--device", "cpu", "--set", f"run.threads={threads}", "--set", f"train.log_every={log_every}"]
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True)
        memory = []
        while proc.poll() is None:
            rss = rss_mib(proc.pid)
            if rss is not None:
                memory.append({"t_s": time.perf_counter() - started, "rss_mib": rss})
            time.sleep(sample_every)
        stdout.seek(0)
        stderr.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"rlperf train failed ({' '.join(cmd)}):\n{stderr.read()[-2000:]}")
        record = json.loads(stdout.read())
    with open(Path(record["run_dir"]) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    totals = record["totals"]
    return {
        "episodes": totals["episodes"], "env_steps": totals["env_steps"], "updates": totals["updates"],
        "wall_s": totals["wall_s"], "s_per_episode": totals["wall_s"] / totals["episodes"],
        "us_per_env_step": 1e6 * totals["wall_s"] / totals["env_steps"],
        "peak_rss_mib": record["memory"]["peak_rss_mb"], "mean_score_100": record["learning"]["mean_score_last_100"],
        "memory": memory,
        "windows": windows(rows),
    }


def windows(rows: list[dict]) -> list[dict]:
    """Cost per env step and per episode between consecutive metrics.csv rows."""
    out = []
    for a, b in itertools.pairwise(rows):
        steps = int(b["env_steps"]) - int(a["env_steps"])
        episodes = int(b["episodes"]) - int(a["episodes"])
        wall = float(b["wall_s"]) - float(a["wall_s"])
        if steps <= 0 or wall <= 0:
            continue
        out.append({"episodes": int(b["episodes"]), "env_steps": int(b["env_steps"]), "updates": int(b["updates"]),
                    "us_per_env_step": 1e6 * wall / steps, "ms_per_episode": 1e3 * wall / episodes if episodes else None})
    return out


def plot(results: dict, path: Path) -> None:
    longest = results["runs"][-1]
    example = longest["example"]
    plt, fig, (left, right) = figure(2, figsize=(10, 4))
    w = [p for p in example["windows"] if p["updates"] > 0]  # after learning starts
    left.plot([p["env_steps"] / 1e3 for p in w], [p["us_per_env_step"] for p in w], ".-", ms=3, label="µs per env step")
    left.set_xlabel("thousand env steps into the run (after learning starts)")
    left.set_ylabel("µs per env step (window)")
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    left.set_title(f"cost per env step, {longest['episodes_asked']} episodes", fontsize=9)
    right.plot([m["t_s"] for m in example["memory"]], [m["rss_mib"] for m in example["memory"]])
    right.set_xlabel("seconds into the run")
    right.set_ylabel("resident memory, MiB")
    right.set_ylim(bottom=0)
    right.grid(alpha=0.3)
    right.set_title("memory as the run grows (process start-up included)", fontsize=9)
    m = results["machine"]
    fig.suptitle(f"rlperf train --config {results['config']} | {machine_line(m, results['threads'] or 'default')}", fontsize=9)
    save_figure(plt, fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--episodes", default="256,512,1024,2048,5000", help="comma-separated episode counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the runs (0: torch's default)")
    parser.add_argument("--sample-every", type=float, default=0.1, help="seconds between memory samples")
    parser.add_argument("--log-every", type=int, default=20, help="vector steps per metrics.csv row (the cost windows)")
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    parser.add_argument("--plot", type=Path, help="write cost-per-step and memory plots as PNG here")
    parser.add_argument("--quick", action="store_true", help="tiny runs, for the test suite")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(e) for e in args.episodes.split(",")]
    if args.quick:
        args.config, counts, args.repeats, args.sample_every, args.log_every = "smoke", [20, 60], 1, 0.02, 2

    results: dict = {"machine": machine_info(), "config": args.config, "threads": args.threads, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for episodes in counts:
            runs = [run(args.config, episodes, args.threads, Path(tmp), args.sample_every, args.log_every)
                    for _ in range(args.repeats)]
            entry = {"episodes_asked": episodes}
            for key in ("wall_s", "s_per_episode", "us_per_env_step", "peak_rss_mib", "env_steps", "mean_score_100"):
                entry[key] = summarize(r[key] for r in runs)
            entry["example"] = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]  # the median run, for plots
            results["runs"].append(entry)
            print(
                f"  {episodes:>5} episodes: {entry['wall_s']['median']:.1f} s, "
                f"{1e3 * entry['s_per_episode']['median']:.2f} ms/episode, "
                f"{entry['us_per_env_step']['median']:.1f} µs/env step, peak RSS {entry['peak_rss_mib']['median']:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
    first, last = results["runs"][0], results["runs"][-1]
    results["ratios"] = {
        "episodes": last["episodes_asked"] / first["episodes_asked"],
        "wall": last["wall_s"]["median"] / first["wall_s"]["median"],
        "per_episode": last["s_per_episode"]["median"] / first["s_per_episode"]["median"],
        "per_env_step": last["us_per_env_step"]["median"] / first["us_per_env_step"]["median"],
    }
    # Within the longest run, once learning has started: the last quarter's cost per env step over
    # the first quarter's, and memory at the end over memory when the buffer had just filled.
    learned = [w for w in last["example"]["windows"] if w["updates"] > 0]
    if len(learned) >= 4:
        q = len(learned) // 4
        early = sorted(w["us_per_env_step"] for w in learned[:q])[q // 2]
        late = sorted(w["us_per_env_step"] for w in learned[-q:])[q // 2]
        results["ratios"]["late_over_early_per_env_step"] = late / early
    memory = [m["rss_mib"] for m in last["example"]["memory"]]
    if memory:
        results["ratios"]["rss_end_over_half"] = memory[-1] / memory[len(memory) // 2]
    if args.plot:
        plot(results, args.plot)
    if emit(results, args.out, args.json):
        return
    m = results["machine"]
    print(
        f"\nrlperf train --config {args.config} --episodes E | {machine_line(m, args.threads or 'default')} | "
        f"median of {args.repeats} (± half range)"
    )
    header = (f"{'episodes':>8} {'env steps':>10} {'wall s':>8} {'ms/episode':>11} {'µs/env step':>12} "
              f"{'peak RSS MiB':>13} {'score':>6}")
    print_header(header)
    for r in results["runs"]:

        def pm(s, scale=1.0, fmt=".1f"):
            return f"{s['median'] * scale:{fmt}}±{(s['max'] - s['min']) * scale / 2:{fmt}}"

        print(
            f"{r['episodes_asked']:>8} {r['env_steps']['median']:>10,.0f} {pm(r['wall_s']):>8} "
            f"{pm(r['s_per_episode'], 1e3, '.2f'):>11} "
            f"{pm(r['us_per_env_step']):>12} {pm(r['peak_rss_mib'], fmt='.0f'):>13} {r['mean_score_100']['median']:>6.2f}"
        )
    ratio = results["ratios"]
    print(
        f"{last['episodes_asked']}/{first['episodes_asked']} episodes: wall {ratio['wall']:.1f}x "
        f"(linear in episodes {ratio['episodes']:.1f}x), per episode {ratio['per_episode']:.2f}x, "
        f"per env step {ratio['per_env_step']:.2f}x"
    )
    if "late_over_early_per_env_step" in ratio:
        print(
            f"within the {last['episodes_asked']}-episode run after learning starts: "
            f"last quarter / first quarter µs per env step "
            f"= {ratio['late_over_early_per_env_step']:.2f}"
        )
    if "rss_end_over_half" in ratio:
        print(f"resident memory at the end / halfway: {ratio['rss_end_over_half']:.3f}")


if __name__ == "__main__":
    main()
