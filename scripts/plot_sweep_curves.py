"""Score against wall time for every trial of an ``rlperf sweep``: which setting gets good fastest.

    python scripts/plot_sweep_curves.py runs/sweep-*/ --target 20 --out docs/bench/tuning_curves.png

Reads the sweep directory's ``sweep.json`` and each trial's ``metrics.csv`` (mean score of the last
100 episodes at every log row, against the run's wall seconds). One colour per grid point, one line
per repeat; the legend lists points best first when the sweep was ranked (``--objective``), with
their median time to ``--target`` from the records (warm-up excluded, docs/bottlenecks.md §19).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from benchutil import figure, save_figure


def curve(run_dir: Path) -> tuple[list[float], list[float]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["mean_score_100"] not in ("", "nan")]
    return [float(r["wall_s"]) for r in rows], [float(r["mean_score_100"]) for r in rows]


def point_label(entry: dict, target: str) -> str:
    params = ", ".join(f"{k.split('.', 1)[-1]}={json.dumps(v) if isinstance(v, list) else v}"
                       for k, v in entry["params"].items())
    stat, (reached, tracked) = entry.get(f"time_to_{target}"), entry.get(f"reached_{target}") or (0, 0)
    when = f"t→{target} {stat['median']:.1f} s" if stat else f"t→{target} not reached"
    if stat and reached < tracked:
        when += f" ({reached}/{tracked})"
    return f"{params}: {when}" if tracked else params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a directory written by rlperf sweep")
    parser.add_argument("--target", default="20", help="the score whose time the legend shows (a train.score_targets)")
    parser.add_argument("--out", type=Path, help="PNG to write (default: SWEEP_DIR/score_vs_wall.png)")
    parser.add_argument("--top", type=int, default=8, help="plot at most this many grid points (best first)")
    args = parser.parse_args()
    data = json.loads((args.sweep_dir / "sweep.json").read_text())
    target = format(float(args.target), "g")
    points = data["summary"][: args.top]
    trials = {}
    for row in data["trials"]:
        trials.setdefault(row["point"], []).append(row)
    plt, fig, ax = figure(figsize=(8.5, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, entry in enumerate(points):
        colour = colours[i % len(colours)]
        for j, row in enumerate(t for t in trials.get(entry["point"], []) if t["run_dir"] and t["status"] == "completed"):
            xs, ys = curve(Path(row["run_dir"]))
            ax.plot(xs, ys, color=colour, alpha=0.8, lw=1.2, label=point_label(entry, target) if j == 0 else None)
    ax.axhline(float(target), color="grey", ls="--", lw=0.8)
    ax.set_xlabel("wall seconds from the run's start")
    ax.set_ylabel("mean score, last 100 episodes")
    ranked = data.get("objective")
    ax.set_title(f"{args.sweep_dir.name}" + (f" — ranked by {ranked['name']}" if ranked else ""), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    out = args.out or args.sweep_dir / "score_vs_wall.png"
    save_figure(plt, fig, out)
    print(out)


if __name__ == "__main__":
    main()
