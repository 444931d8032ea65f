"""The gate on records of ``rlperf profile -- python x.py``: does a FAIL name the phase and the line?

    python scripts/bench_gate_lines.py [--pairs 44] [--window 6] [--plant 0.10] [--kind python|torch]
                                       [--steps 300] [--threshold 5] [--json] [--out FILE] [--quick]

A user's loop (the clean DQN loop of ``tests/foreign/common.py`` with :class:`rlperf.PhaseTimer`) runs
under ``rlperf profile -- python`` as the baseline and, as the candidate, with planted work on one line
of its replay push: ``--plant`` × the CPU time of the step before it in more work, as a regression in
the code would be (the baseline runs the same line with nothing to do). ``--kind python``: a spin on
the thread's CPU clock, pure Python; ``--kind torch``: the same spin making a small torch call each
turn (torch lets go of the GIL in its calls; a pure-Python stretch between them holds it).
The two sides run in pairs whose order alternates, as the README's CI recipe makes its records. The
gate then judges windows of ``--window`` consecutive pairs (records, paired by their start times), a
window starting every 2nd pair, through ``rlperf compare ... --json``: each verdict, the phase its
"why" line names first and the line it names first (from the line sampler's counts both sides carry).

Targets (issue 40): a FAIL at a 10% plant, push named ≥ 95%, the planted line named where the
evidence exists. ``--quick`` runs 3 pairs of 60 steps, one window (for the test suite: the rates
mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_gate import add_common_args, clopper_pearson
from benchutil import emit, machine_info, machine_line

ROOT = Path(__file__).resolve().parents[1]
COMMON = ROOT / "tests" / "foreign"

LOOP = '''"""A DQN loop whose replay push can carry planted work (bench_gate_lines.py)."""
import sys
import time

import torch

import rlperf
from common import Replay, run

FRACTION = float(sys.argv[sys.argv.index("--plant") + 1]) if "--plant" in sys.argv else 0.0
scratch = torch.ones(64, 8)


class Timed(Replay):
    last = spent = 0.0

    def push(self, *args):
        super().push(*args)
        now = time.thread_time()
        own = now - self.last - self.spent if self.last else 0.0  # the step's own CPU time, the plant left out
        end = now + FRACTION * own
        while time.thread_time() < end: WORK  # planted
        self.last = time.thread_time()
        self.spent = self.last - now


torch.set_num_threads(1)
timer = rlperf.PhaseTimer("cpu", warmup_steps=10)
run(replay=Timed(50_000), timer=timer)
'''


def planted_line(source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if "# planted" in line)


def profile(script: Path, out: Path, steps: int, plant: float) -> Path:
    """One ``rlperf profile -- python`` run of the loop; its run directory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(COMMON), os.environ.get("PYTHONPATH"))))}
    before = set(out.iterdir()) if out.exists() else set()
    proc = subprocess.run([sys.executable, "-m", "rlperf", "profile", "--out", str(out), "--quiet", "--", sys.executable,
                           str(script), "--steps", str(steps), "--plant", str(plant)],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"rlperf profile failed ({proc.returncode}): {proc.stderr[-2000:]}")
    (run_dir,) = set(out.iterdir()) - before
    return run_dir


def verdict(base: list[Path], cand: list[Path], threshold: float, out: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "rlperf", "compare", *map(str, base), "--candidate", *map(str, cand),
                           "--fail-if-slower", f"{100 * threshold:g}%", "--json", "--no-plot", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"rlperf compare failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def named(v: dict[str, Any], key: str) -> str | None:
    """The first phase (``phases``) or line (``lines``) the verdict found slower, else None."""
    rows = v.get(key) or []
    return rows[0]["name"] if rows and rows[0]["slower"] else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=44, help="interleaved pairs of runs")
    parser.add_argument("--window", type=int, default=6, help="pairs a verdict judges")
    parser.add_argument("--plant", type=float, default=0.10, help="the candidate's planted work, a fraction of a step")
    parser.add_argument("--kind", choices=("python", "torch"), default="python", help="what the planted work does")
    parser.add_argument("--steps", type=int, default=300, help="vector steps of each run")
    add_common_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.window, args.steps = 3, 3, 60
    threshold = args.threshold / 100
    source = LOOP.replace("WORK", "pass" if args.kind == "python" else "scratch.mul_(1.0)")
    line = planted_line(source)
    verdicts: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlperf-gate-lines-") as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(source)
        runs: dict[str, list[Path]] = {"base": [], "cand": []}
        for k in range(args.pairs):  # base first, then cand first, ...: a pair shares the machine's state
            for side in (("base", "cand") if k % 2 == 0 else ("cand", "base")):
                runs[side].append(profile(script, Path(tmp) / side, args.steps, args.plant if side == "cand" else 0.0))
        run_s = time.perf_counter() - started
        for w in range(0, args.pairs - args.window + 1, 2):
            v = verdict(runs["base"][w:w + args.window], runs["cand"][w:w + args.window], threshold,
                        Path(tmp) / f"gate{w}")
            verdicts.append({"window": [w, w + args.window], "verdict": v["verdict"], "slowdown": v["slowdown"],
                             "paired": v["paired"], "phase": named(v, "phases"), "line": named(v, "lines"),
                             "why": v["why"],
                             "lines": [{k: c[k] for k in ("name", "delta_ms", "p_value", "alpha", "slower")}
                                       for c in (v.get("lines") or [])[:3]]})
            if not args.json:
                print(f"pairs {w:2d}-{w + args.window - 1:2d}: {v['verdict']:12s} {100 * v['slowdown']:+6.1f}%  "
                      f"{v['why'] or '-'}", flush=True)
    n = len(verdicts)
    fails = sum(v["verdict"] == "fail" for v in verdicts)
    push = sum(v["phase"] == "push" for v in verdicts)
    at_line = sum((v["line"] or "").endswith(f"loop.py:{line}(push)") for v in verdicts)
    results = {
        "machine": machine_info(),
        "settings": {"pairs": args.pairs, "window": args.window, "plant": args.plant, "kind": args.kind, "steps": args.steps,
                     "threshold": threshold, "planted_line": f"loop.py:{line}(push)"},
        "verdicts": verdicts,
        "summary": {"verdicts": n, "fail": fails, "fail_ci95": clopper_pearson(fails, n) if n else None,
                    "push_named": push, "push_named_ci95": clopper_pearson(push, n) if n else None,
                    "line_named": at_line, "line_named_ci95": clopper_pearson(at_line, n) if n else None,
                    "runs_s": run_s, "paired": all(v["paired"] for v in verdicts)},
    }
    if emit(results, args.out, args.json):
        return
    print(f"\n{machine_line(results['machine'], 1)}")
    print(f"{args.pairs} pairs of {args.steps}-step runs ({run_s:.0f} s), windows of {args.window}, plant {args.plant:g} "
          f"({args.kind}) at loop.py:{line}: FAIL {fails}/{n}, push named {push}/{n}, the planted line named {at_line}/{n}")


if __name__ == "__main__":
    main()
