"""How long the command line takes to answer before it does any work: ``--help``, ``--version``,
shell completion, and a command's own ``--help``.

    python scripts/bench_startup.py                 # median of 5 fresh processes each
    python scripts/bench_startup.py --repeats 11 --out docs/bench/startup.json

Each figure is the wall time of a fresh ``rlperf ...`` process (the console script; interpreter
start included), as a user's shell sees it. The target is 0.3 s median: the CLI imports Typer and the
command modules only; torch, numpy, Gymnasium and rich tables are imported when a command runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
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


# The console script the user types, where it is installed next to this interpreter.
_SCRIPT = Path(sys.executable).parent / "rlperf"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "rlperf"]


def run_once(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([*COMMAND, *args], env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the results here (JSON)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    run_once(["--version"], {})  # warm the OS file cache: the first start reads every .pyc from disk
    results = {label: summarize(run_once(argv, env) for _ in range(args.repeats)) for label, (argv, env) in CASES.items()}
    data = {"machine": machine_info(), "repeats": args.repeats, "results": results}
    if emit(data, args.out, args.json):
        return
    print(machine_line(machine_info()))
    print(f"{'command':<32}{'median s':>10}{'min s':>8}{'max s':>8}")
    for label, s in results.items():
        print(f"{label:<32}{s['median']:>10.3f}{s['min']:>8.3f}{s['max']:>8.3f}")


if __name__ == "__main__":
    main()
