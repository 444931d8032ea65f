"""How long the command line takes to answer before it does any work: ``--help``, ``--version``,
shell completion, and a command's own ``--help``; and what a tiny run costs before its first step.

    python scripts/bench_startup.py                 # median of 5 fresh processes each
    python scripts/bench_startup.py --repeats 11 --out docs/bench/startup.json
    python scripts/bench_startup.py --cold          # also the first run after install (numba compiles)

Each figure is the wall time of a fresh ``rlperf ...`` process (the console script; interpreter
start included), as a user's shell sees it, and its CPU time (user + system, children's rusage:
what a busy machine cannot inflate by making the process wait). The target is 0.3 s median for the
CLI cases: the CLI imports Typer and the command modules only; torch, numpy, Gymnasium and rich
tables are imported when a command runs. ``rlperf train --config smoke --steps 64`` is a run that
ends at its first steps: its CPU time is the start-up a run pays (imports, loading numba's cache
of the env kernel and the fused update); target ≤ 1.5 s. ``--cold`` times the same run once with an
empty ``NUMBA_CACHE_DIR``, where both are compiled (target ≤ 8 s), and keeps the compile lines the
run printed on stderr.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchutil import emit, machine_info, machine_line, summarize

CASES = {
    "rlperf --help": (["--help"], {}),
    "rlperf --version": (["--version"], {}),
    "rlperf train --help": (["train", "--help"], {}),
    # What bash's completion function runs on <TAB> after "rlperf tr".
    "completion (rlperf tr<TAB>)": ([], {"_RLPERF_COMPLETE": "complete_bash", "COMP_WORDS": "rlperf tr", "COMP_CWORD": "1"}),
}
_RUNS = tempfile.mkdtemp(prefix="rlperf-bench-startup-")
TINY_RUN = ["train", "--config", "smoke", "--steps", "64", "--quiet", "--no-plot", "--out", _RUNS]
"""A run that ends at its first steps: the start-up every run pays."""


# The console script the user types, where it is installed next to this interpreter.
_SCRIPT = Path(sys.executable).parent / "rlperf"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "rlperf"]


def run_once(args: list[str], env: dict[str, str]) -> float:
    return run_timed(args, env)[0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """A fresh process's wall time, CPU time and stderr."""
    cpu, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run([*COMMAND, *args], env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    return time.perf_counter() - t0, _children_cpu() - cpu, proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the results here (JSON)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--cold", action="store_true", help="also time one run with an empty numba cache")
    args = parser.parse_args()
    run_once(["--version"], {})  # warm the OS file cache: the first start reads every .pyc from disk
    results = {label: summarize(run_once(argv, env) for _ in range(args.repeats)) for label, (argv, env) in CASES.items()}
    run_once(TINY_RUN, {})  # numba's cache filled, if this is the first run after install
    tiny = [run_timed(TINY_RUN, {})[:2] for _ in range(args.repeats)]
    data: dict = {"machine": machine_info(), "repeats": args.repeats, "results": results,
                  "tiny_run": {"command": f"rlperf {' '.join(TINY_RUN[:5])}", "wall_s": summarize(w for w, _ in tiny),
                               "cpu_s": summarize(c for _, c in tiny), "target_cpu_s": 1.5}}
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="rlperf-numba-cold-") as cache:
            wall, cpu, err = run_timed(TINY_RUN, {"NUMBA_CACHE_DIR": cache})
        data["cold_run"] = {"wall_s": wall, "cpu_s": cpu, "target_s": 8.0,
                            "compile_lines": [line for line in err.splitlines() if line.startswith("rlperf: compil")]}
    if emit(data, args.out, args.json):
        return
    print(machine_line(machine_info()))
    print(f"{'command':<32}{'median s':>10}{'min s':>8}{'max s':>8}")
    for label, s in results.items():
        print(f"{label:<32}{s['median']:>10.3f}{s['min']:>8.3f}{s['max']:>8.3f}")
    t = data["tiny_run"]
    print(f"{t['command']}: wall {t['wall_s']['median']:.2f} s, CPU {t['cpu_s']['median']:.2f} s (median; target CPU "
          f"≤ {t['target_cpu_s']} s)")
    if "cold_run" in data:
        c = data["cold_run"]
        print(f"first run after install (empty NUMBA_CACHE_DIR): wall {c['wall_s']:.1f} s, CPU {c['cpu_s']:.1f} s")
        for line in c["compile_lines"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
