"""rlperf's own runs on a busy machine: wall time beside busy processes against quiet, back to back.

    python scripts/bench_busy.py                       # 3 repeats, 2 busy processes
    python scripts/bench_busy.py --repeats 5 --out docs/bench/busy_$(date +%F).json

Cases: the default ``rlperf train``, and ``configs/fast.toml --steps 25600``, each with every thread
pool at the CPU count (``run.threads=<cores>``: what torch, numba and OpenBLAS do by default, the
behaviour before the thread policy) and with ``run.threads=0`` (auto: one thread on the CPU). Each is
timed quiet and beside ``--hog`` busy processes (``python -c 'while True: pass'``, as
``shared/tools/hog`` starts them), interleaved: repeat by repeat, case by case, quiet then busy, so
that drift on a shared machine falls on both. Each figure is a fresh process's wall time (interpreter
start included); the result is the median over the repeats and the busy/quiet ratio (target ≤ 1.8×).

Then ``rlperf profile --config naive --episodes 100`` with ``run.threads=0``, quiet and busy: its
wall time (target: busy ≤ 3× quiet) and the advisor's findings in order (``threads`` first, with its
measured figure, when it is the largest).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchutil import emit, machine_info, machine_line

ROOT = Path(__file__).resolve().parent.parent
_SCRIPT = Path(sys.executable).parent / "rlperf"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "rlperf"]
CORES = os.cpu_count() or 1

CASES = {
    "train default": ["train"],
    "train fast --steps 25600": ["train", "--config", str(ROOT / "configs" / "fast.toml"), "--steps", "25600"],
}
VARIANTS = {
    f"every pool at {CORES} threads (before)": [f"run.threads={CORES}"],
    "run.threads=0 (auto, after)": ["run.threads=0"],
}
PROFILE = ["profile", "--config", str(ROOT / "configs" / "naive.toml"), "--episodes", "100"]


@contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes that each keep a CPU busy, for the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        if procs:
            time.sleep(0.2)  # let them reach the run queue
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


TIMEOUT_S = 600.0
"""A run still going after this long is stopped and counted at this time (a lower bound), as failed."""


def timed(args: list[str], sets: list[str], out: Path, timeout: float = TIMEOUT_S) -> tuple[float, int]:
    """A fresh ``rlperf`` process's wall time and exit code (124: stopped at ``timeout``)."""
    argv = [*COMMAND, *args, "--quiet", "--no-plot", "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                            timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return timeout, 124
    return time.perf_counter() - t0, rc


def loadavg() -> float:
    return os.getloadavg()[0]


def profile_once(hog: int, out: Path, timeout: float) -> dict[str, object]:
    """The naive profile with run.threads=0: wall time, and the advisor's findings in order."""
    argv = [*COMMAND, *PROFILE, "--set", "run.threads=0", "--no-plot", "--json", "--out", str(out)]
    load = loadavg()
    with busy(hog):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"wall_s": timeout, "rc": 124, "loadavg_1m_before": load, "error": "timed out"}
        wall = time.perf_counter() - t0
    entry: dict[str, object] = {"wall_s": wall, "rc": proc.returncode, "loadavg_1m_before": load}
    try:
        record = json.loads(proc.stdout)
    except json.JSONDecodeError:
        entry["error"] = proc.stderr.strip().splitlines()[-1:] or ["no JSON on stdout"]
        return entry
    findings = ((record.get("profile") or {}).get("advisor") or {}).get("findings") or []
    entry["findings"] = [{"id": f.get("id"), "est_saving_s": f.get("est_saving_s"), "knob": f.get("knob")}
                         for f in findings]
    entry["threads_evidence"] = next((f.get("evidence") for f in findings if f.get("id") == "threads"), None)
    entry["cpu_wait_share"] = ((record.get("timing") or {}).get("vector_step") or {}).get("cpu_wait_share")
    entry["threads"] = {k: v for k, v in (record.get("threads") or {}).items() if k != "pools"}
    return entry


Results = dict[str, dict[str, dict[str, object]]]


def train_cases(repeats: int, hog: int, runs: Path, timeout: float) -> tuple[Results, list[str], list[float]]:
    """Every case and variant, quiet and busy, interleaved: medians, ratios and the raw figures."""
    raw: dict[str, dict[str, dict[str, list[float]]]] = {
        case: {variant: {"quiet": [], "busy": []} for variant in VARIANTS} for case in CASES}
    failures: list[str] = []
    loads: list[float] = []
    for _ in range(repeats):
        for case, case_args in CASES.items():
            for variant, sets in VARIANTS.items():
                for load in ("quiet", "busy"):
                    loads.append(loadavg())
                    with busy(hog if load == "busy" else 0):
                        seconds, rc = timed(case_args, sets, runs, timeout)
                    if rc != 0:
                        failures.append(f"{case} / {variant} / {load}: exit {rc}")
                    raw[case][variant][load].append(seconds)
    results: Results = {}
    for case, variants in raw.items():
        if not repeats:
            break
        results[case] = {}
        for variant, by_load in variants.items():
            quiet, slow = statistics.median(by_load["quiet"]), statistics.median(by_load["busy"])
            results[case][variant] = {"quiet_s": quiet, "busy_s": slow, "ratio": slow / quiet, "raw": by_load}
    return results, failures, loads


def show(data: dict[str, object]) -> None:
    print(machine_line(data["machine"]))  # type: ignore[arg-type]
    load = data["loadavg_1m"]
    print(f"{data['hog']} busy processes; load average before the runs {load['min']:.1f}–{load['max']:.1f}; "  # type: ignore[index]
          f"medians of {data['repeats']}")
    print(f"{'case':<28}{'threads':<36}{'quiet s':>9}{'busy s':>9}{'ratio':>8}")
    for case, variants in data["results"].items():  # type: ignore[attr-defined]
        for variant, r in variants.items():
            print(f"{case:<28}{variant:<36}{r['quiet_s']:>9.2f}{r['busy_s']:>9.2f}{r['ratio']:>7.2f}×")
    profile = data["profile_naive"]
    if profile.get("quiet_s"):  # type: ignore[attr-defined]
        print(f"profile naive --episodes 100 (run.threads=0): quiet {profile['quiet_s']:.1f} s, busy "  # type: ignore[index]
              f"{profile['busy_s']:.1f} s ({profile['ratio']:.2f}×)")  # type: ignore[index]
        for load, entries in profile["runs"].items():  # type: ignore[index]
            for e in entries:
                order = ", ".join(str(f["id"]) for f in e.get("findings") or [])
                print(f"  {load}: findings {order or e.get('error')}")
    for failure in data["failures"]:  # type: ignore[attr-defined]
        print(f"failed: {failure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="train runs a case, variant and load (0: skip them)")
    parser.add_argument("--hog", type=int, default=2, help="busy processes beside the busy runs")
    parser.add_argument("--profile-repeats", type=int, default=1, help="naive profiles a side (0: skip them)")
    parser.add_argument("--out", type=Path, help="also write the results here (JSON)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds a run may take (then counted so)")
    args = parser.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="rlperf-bench-busy-"))
    timed(["train", "--config", "smoke", "--steps", "64"], [], runs)  # warm the file cache and numba's
    results, failures, loads = train_cases(args.repeats, args.hog, runs, args.timeout)
    profile: dict[str, list[dict[str, object]]] = {"quiet": [], "busy": []}
    for _ in range(args.profile_repeats):
        for load, hog in (("quiet", 0), ("busy", args.hog)):
            loads.append(loadavg())
            profile[load].append(profile_once(hog, runs, args.timeout))
    summary: dict[str, float] = {}
    if profile["quiet"]:
        walls = {load: statistics.median(float(str(e["wall_s"])) for e in entries) for load, entries in profile.items()}
        summary = {"quiet_s": walls["quiet"], "busy_s": walls["busy"], "ratio": walls["busy"] / walls["quiet"]}
    data = {
        "machine": machine_info(), "repeats": args.repeats, "hog": args.hog,
        "loadavg_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "note": "wall time of fresh rlperf processes, quiet and beside busy processes, interleaved; "
                "the machine may have had other work too (loadavg_1m, read before each run)",
        "targets": {"busy_over_quiet_train": 1.8, "busy_over_quiet_profile": 3.0},
        "results": results, "profile_naive": {**summary, "runs": profile}, "failures": failures,
    }
    if not emit(data, args.out, args.json):
        show(data)


if __name__ == "__main__":
    main()
