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
COLD_RUN = ["train", "--steps", "64", "--quiet", "--no-plot", "--out", _RUNS]
"""The default config, ended after its first vector step: every kernel it uses is compiled (or loaded)."""

# The console script the user types, where it is installed next to this interpreter.
_SCRIPT = Path(sys.executable).parent / "rlperf"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "rlperf"]

# ``python -c`` running the CLI as the console script does, and writing the process's CPU and clock
# when the loop first selects actions (a post-import hook: nothing is imported earlier than the run
# imports it). Everything before that call is start-up: imports, config, the kernels, env and agent.
FIRST_STEP = """
import os, sys, time
from rlperf._after_import import after_import
def _hook():
    from rlperf.dqn import Agent
    act = Agent.act
    def first(self, *args):
        Agent.act = act
        t = os.times()
        sys.stderr.write(f"bench-first-step cpu={t.user + t.system} clock={time.time()}\\n")
        return act(self, *args)
    Agent.act = first
after_import("rlperf.dqn", _hook)
from rlperf.__main__ import main
sys.argv[0] = "rlperf"
main()
"""


def run_once(args: list[str], env: dict[str, str]) -> float:
    return run_timed(args, env)[0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(args: list[str], env: dict[str, str], command: list[str] | None = None) -> tuple[float, float, str]:
    """A fresh process's wall time, CPU time and stderr."""
    cpu, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run([*(command or COMMAND), *args], env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    return time.perf_counter() - t0, _children_cpu() - cpu, proc.stderr


def tiny_run(tree: str | None, args: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """One run of ``args`` importing rlperf from ``tree`` (None: as installed; ``-P``: not from the
    working directory): its whole process's wall and CPU seconds, and its CPU and wall seconds when
    the loop first selected actions."""
    extra = {**(env or {}), **({"PYTHONPATH": tree} if tree else {})}
    clock = time.time()
    wall, cpu, err = run_timed(args, extra, [sys.executable, "-P", "-c", FIRST_STEP])
    first = [line.split() for line in err.splitlines() if line.startswith("bench-first-step ")]
    if not first:
        raise SystemExit(f"the run never stepped:\n{err}")
    fields = dict(part.split("=") for part in first[0][1:])
    return {"wall_s": wall, "cpu_s": cpu, "first_step_cpu_s": float(fields["cpu"]),
            "first_step_wall_s": float(fields["clock"]) - clock,
            "compile_lines": [line for line in err.splitlines() if line.startswith("rlperf: compil")]}  # type: ignore[dict-item]


def _summaries(runs: list[dict]) -> dict[str, dict[str, float]]:
    return {key: summarize(r[key] for r in runs) for key in ("first_step_cpu_s", "first_step_wall_s", "cpu_s", "wall_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the results here (JSON)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--cold", action="store_true", help="also time runs with an empty numba cache")
    parser.add_argument("--before", metavar="TREE", help="a second source tree (e.g. `git archive` of an older "
                        "commit) whose runs are interleaved with this one's, for a before/after on one machine")
    parser.add_argument("--no-cli", action="store_true", help="skip the --help/--version/completion cases")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"after": here, **({"before": args.before} if args.before else {})}
    load_before = os.getloadavg()
    run_once(["--version"], {})  # warm the OS file cache: the first start reads every .pyc from disk
    results = {} if args.no_cli else {
        label: summarize(run_once(argv, env) for _ in range(args.repeats)) for label, (argv, env) in CASES.items()}
    for tree in trees.values():
        tiny_run(tree, TINY_RUN)  # numba's cache filled, if this is the first run after install
        tiny_run(tree, COLD_RUN)
    tiny: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeats):  # interleaved, so a change of load hits both trees alike
        for name, tree in trees.items():
            tiny[name].append(tiny_run(tree, TINY_RUN))
    data: dict = {"machine": machine_info(), "repeats": args.repeats, "results": results,
                  "tiny_run": {"command": f"rlperf {' '.join(TINY_RUN[:5])}", "target_cpu_s": 1.5,
                               **{name: _summaries(runs) for name, runs in tiny.items()}}}
    if args.cold:
        data["cold_run"] = {"command": f"rlperf {' '.join(COLD_RUN[:3])} (empty NUMBA_CACHE_DIR)", "target_s": 8.0}
        for name, tree in trees.items():
            with tempfile.TemporaryDirectory(prefix="rlperf-numba-cold-") as cache:
                data["cold_run"][name] = tiny_run(tree, COLD_RUN, {"NUMBA_CACHE_DIR": cache})
    data["load_before"], data["load_after"] = load_before, os.getloadavg()
    if emit(data, args.out, args.json):
        return
    print(machine_line(machine_info()) + f"; load {load_before[0]:.1f} before, {data['load_after'][0]:.1f} after")
    if results:
        print(f"{'command':<32}{'median s':>10}{'min s':>8}{'max s':>8}")
    for label, s in results.items():
        print(f"{label:<32}{s['median']:>10.3f}{s['min']:>8.3f}{s['max']:>8.3f}")
    t = data["tiny_run"]
    for name in trees:
        m = {key: t[name][key]["median"] for key in t[name]}
        print(f"{t['command']} ({name}): CPU to the first step {m['first_step_cpu_s']:.2f} s, whole process "
              f"{m['cpu_s']:.2f} s; wall {m['first_step_wall_s']:.2f} s, {m['wall_s']:.2f} s (median of "
              f"{args.repeats}; target CPU to the first step ≤ {t['target_cpu_s']} s)")
    if "cold_run" in data:
        for name in trees:
            c = data["cold_run"][name]
            print(f"{data['cold_run']['command']} ({name}): wall {c['wall_s']:.1f} s, CPU {c['cpu_s']:.1f} s")
            for line in c["compile_lines"]:
                print(f"  {line}")


if __name__ == "__main__":
    main()
