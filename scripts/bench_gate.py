"""The CI gate's error rates on this machine: false alarms on identical code, detection of a planted slowdown.

    python scripts/bench_gate.py [--config smoke] [--steps 8000] [--repeats 7] [--trials 20] [--threshold 5]
                                 [--plant 0.15] [--plant-every 1] [--metric step-p25+mean] [--json] [--out FILE]

Each trial is one verdict of the gate on records, given the way the README's CI example gives them:
``--repeats`` runs a side, interleaved (baseline, candidate, baseline, ...) into ``base/`` and
``cand/``, then ``rlperf compare base/*/ --candidate cand/*/ --fail-if-slower 5% --json`` (the
arguments a shell passes for those globs, through the command's own entry point, in process). Two
kinds of trial, alternated so that the machine's state falls on both:

- **identical**: the same config on both sides. A verdict of "fail" is a false alarm (target ≤ 5%).
- **planted**: the candidate's every vector step is followed by ``plant`` × the step's own CPU time
  in more CPU work (a spin on the thread's CPU clock), so on a machine it has to itself it takes
  ``(1 + plant)`` × the baseline's time per env step: a ``plant`` (15%) slowdown made of work, as a
  regression in the code would be (the gate's reading of "15% slower"). A "fail" is a detection (target ≥ 90%).
  With ``--plant-every N`` only every N-th step gets it, N times as much (the same mean slowdown):
  an update every fourth step that got slower, which the p25 step does not see.

Reported: the false-alarm and detection rates with their Clopper–Pearson 95% intervals, the
estimated slowdowns, and the wall time per verdict. ``--quick`` runs 2 trials of each kind on
short runs (for the test suite; its rates mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import emit, machine_info, machine_line

from rlperf import cli
from rlperf.config import config_from
from rlperf.experiments import gate
from rlperf.run.common import thread_settings_restored
from rlperf.run.lifecycle import RunHooks, train_run


def planting(fraction: float, every: int = 1) -> Any:
    """A compare runner that adds ``fraction`` × each of the candidate's vector steps' CPU time in more
    CPU work: ``1 + fraction`` times the baseline's time per step on a machine it has to itself
    (``every``: after every ``every``-th step only, ``every`` × as much, timed over those steps)."""
    extra = fraction

    def runner(label: str, cfg: Any, **kwargs: Any) -> Any:
        if label != "candidate":
            return train_run(cfg, **kwargs)
        last = [time.thread_time()]
        count = [0]

        def on_step() -> None:
            # Sized and spent in this thread's CPU time, not wall time: on a loaded machine wall time
            # includes waiting for a CPU, and a wait (sleep or wall-clock spin) would be scheduled
            # differently from work. This is work, as a regression in the code would be.
            count[0] += 1
            if count[0] % every:
                return
            now = time.thread_time()
            end = now + extra * (now - last[0])
            while time.thread_time() < end:
                pass
            last[0] = time.thread_time()

        return train_run(cfg, hooks=RunHooks(on_step=on_step), **kwargs)

    return runner


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact binomial confidence interval for k successes in n trials (by bisection on the CDF)."""

    def cdf(p: float, upto: int) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(upto + 1))

    def solve(f: Any) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: 1 - cdf(p, k - 1) < alpha / 2)
    upper = 1.0 if k == n else solve(lambda p: cdf(p, k) > alpha / 2)
    return lower, upper


def one_verdict(cfg: Any, repeats: int, threshold: float, metric: str, runner: Any, out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    runner = runner or (lambda label, cfg, **kwargs: train_run(cfg, **kwargs))
    for k in range(repeats):
        for side in ("baseline", "candidate"):
            with thread_settings_restored():
                runner(side, cfg, out=out / side, name=f"{side}{k}", quiet=True, dashboard=False, kind="compare")
    # What a shell passes for base/*/ and cand/*/: the directories, sorted.
    argv = ["compare", *sorted(glob.glob(f"{out / 'baseline'}/*/")), "--candidate",
            *sorted(glob.glob(f"{out / 'candidate'}/*/")), "--fail-if-slower", f"{100 * threshold:g}%",
            "--gate-metric", metric, "--json", "--no-plot"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        try:
            cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    v = json.loads(stdout.getvalue())
    assert code == v["exit_code"] and v["n"] == [repeats, repeats], (code, v["n"])
    v["wall_s"] = time.perf_counter() - started
    return v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="smoke")
    parser.add_argument("--steps", type=int, default=8000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=7, help="runs per side and verdict")
    parser.add_argument("--trials", type=int, default=20, help="verdicts of each kind")
    parser.add_argument("--threshold", type=float, default=5.0, help="--fail-if-slower, in percent")
    parser.add_argument("--plant", type=float, default=0.15, help="the planted slowdown (0.15 = 15%%)")
    parser.add_argument("--plant-every", type=int, default=1, help="plant after every N-th vector step only (N x as much)")
    parser.add_argument("--metric", default=gate.DEFAULT_METRIC, choices=gate.METRICS)
    parser.add_argument("--threads", type=int, default=1, help="run.threads of every run")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.trials = 640, 4, 2
    cfg = config_from(args.config, [f"run.threads={args.threads}", "train.checkpoint=false"], steps=args.steps)
    threshold = args.threshold / 100
    kinds = {"identical": None, "planted": planting(args.plant, args.plant_every)}
    verdicts: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="rlperf-gate-") as tmp:
        for trial in range(args.trials):
            for kind, runner in kinds.items():
                v = one_verdict(cfg, args.repeats, threshold, args.metric, runner, Path(tmp) / f"{kind}{trial}")
                verdicts[kind].append(v)
                if not args.json:
                    print(f"{kind:9s} trial {trial + 1:2d}: {v['verdict']:4s} slowdown {100 * v['slowdown']:+6.1f}% "
                          f"p {v['p_value']:.3g}  ({v['wall_s']:.1f} s)", flush=True)
    results: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {"config": args.config, "steps": args.steps, "repeats": args.repeats, "trials": args.trials,
                     "threshold": threshold, "plant": args.plant, "plant_every": args.plant_every, "metric": args.metric,
                     "threads": args.threads},
        "test": gate.TEST,
    }
    for kind, vs in verdicts.items():
        fails = sum(v["verdict"] == "fail" for v in vs)
        lo, hi = clopper_pearson(fails, len(vs))
        results[kind] = {
            "fail": fails, "trials": len(vs), "rate": fails / len(vs), "rate_ci95": [lo, hi],
            "slowdown_median": statistics.median(v["slowdown"] for v in vs),
            "slowdowns": [v["slowdown"] for v in vs], "p_values": [v["p_value"] for v in vs],
            "wall_s_per_verdict": statistics.median(v["wall_s"] for v in vs),
        }
    if emit(results, args.out, args.json):
        return
    print(f"\n{machine_line(results['machine'], args.threads)}")
    print(f"{args.config} config, {args.steps:,} env steps a run, {args.repeats} runs a side, threshold "
          f"{args.threshold:g}%, metric {args.metric}, planted slowdown {100 * args.plant:g}%"
          + (f" on every {args.plant_every}th step" if args.plant_every > 1 else ""))
    for kind, label in (("identical", "false alarms (identical configs)"), ("planted", "detections (planted slowdown)")):
        r = results[kind]
        print(f"{label}: {r['fail']}/{r['trials']} = {100 * r['rate']:.0f}% (95% CI {100 * r['rate_ci95'][0]:.0f}–"
              f"{100 * r['rate_ci95'][1]:.0f}%), median slowdown {100 * r['slowdown_median']:+.1f}%, "
              f"{r['wall_s_per_verdict']:.1f} s per verdict")


if __name__ == "__main__":
    main()
