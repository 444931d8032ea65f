"""How well the advisor reads code nobody here wrote: ``rlperf profile`` over the foreign corpus.

    python scripts/bench_advisor.py --scale 0.3                 # every corpus script, once each way
    python scripts/bench_advisor.py --only cleanrl_dqn --repeats 3 --json bench.json
    python scripts/bench_advisor.py --calibrate --write         # planted vs --fixed alone -> MANIFEST.toml

Each script in ``tests/foreign/corpus/MANIFEST.toml`` has one planted bottleneck (its lines marked
``# planted: <id>``) and a clean variant (``--fixed``). For each script this runs, interleaved,
``python -m rlperf profile --json -- python SCRIPT`` planted and fixed, and the script alone both
ways, then reports:

- named first / named anywhere: the expected id is the first finding / among the findings;
- false alarms: clean (``--fixed``) runs with any finding, and how many findings they had;
- location: the first finding with the expected id points (``where`` = FILE:LINE) at a marked line;
- estimate: that finding's ``est_saving_s`` over the measured saving (planted minus fixed wall of
  the script alone); within 2x, and estimates larger than the profiled run itself;
- overhead: wall of ``rlperf profile`` over wall of the script alone, same variant.

The rlperf used is whatever ``python -m rlperf`` resolves to (set PYTHONPATH for a worktree).
Findings are read from the JSON document on stdout, else from the run directory's run.json,
wherever a list named ``findings`` sits; findings without an ``id`` count as unnamed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "foreign" / "corpus"
MANIFEST = CORPUS / "MANIFEST.toml"
MARKER = re.compile(r"#\s*planted:\s*([a-z_]+)")
WHERE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)\b")


def load_manifest(path: Path = MANIFEST) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return list(tomllib.load(f)["script"])


def planted_lines(script: Path) -> dict[int, str]:
    """Line number -> planted id, from the ``# planted: <id>`` markers."""
    marks = {}
    for number, line in enumerate(script.read_text().splitlines(), start=1):
        match = MARKER.search(line)
        if match:
            marks[number] = match.group(1)
    return marks


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def script_args(scale: float, fixed: bool) -> list[str]:
    return ["--scale", f"{scale:g}"] + (["--fixed"] if fixed else [])


def run_alone(file: str, scale: float, fixed: bool) -> float:
    """Wall seconds of ``python SCRIPT`` in the corpus folder; raises on a failed run."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, file, *script_args(scale, fixed)], cwd=CORPUS, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{file} {'--fixed' if fixed else ''} failed:\n{proc.stderr[-2000:]}")
    return wall


def find_findings(doc: Any) -> list[dict[str, Any]] | None:
    """The first list named ``findings`` anywhere in a JSON document (breadth first)."""
    queue = [doc]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            found = node.get("findings")
            if isinstance(found, list):
                return [f for f in found if isinstance(f, dict)]
            queue.extend(node.values())
        elif isinstance(node, list):
            queue.extend(node)
    return None


PROFILE_ARGS: list[str] = []
"""Extra options for every ``rlperf profile`` run (``--profile-arg``)."""


def run_profiled(file: str, scale: float, fixed: bool) -> dict[str, Any]:
    """``rlperf profile --json`` on one variant: its wall, the findings, the script's own wall."""
    with tempfile.TemporaryDirectory(prefix="bench-advisor-") as out:
        cmd = [sys.executable, "-m", "rlperf", "profile", "--json", "--out", out, *PROFILE_ARGS, "--",
               "python", file, *script_args(scale, fixed)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=CORPUS, env=_env(), capture_output=True, text=True)
        wall = time.perf_counter() - start
        doc: Any = None
        try:
            doc = json.loads(proc.stdout)
        except json.JSONDecodeError:
            pass
        findings = find_findings(doc) if doc is not None else None
        if findings is None:
            for record in Path(out).glob("*/run.json"):
                doc = json.loads(record.read_text())
                findings = find_findings(doc)
                break
    if doc is None:
        raise RuntimeError(f"rlperf profile on {file} gave no JSON (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    script_wall = (doc.get("script") or {}).get("wall_s") if isinstance(doc, dict) else None
    return {"wall_s": wall, "script_wall_s": script_wall, "exit": proc.returncode, "findings": findings or []}


def _line_of(finding: dict[str, Any], file: str) -> int | None:
    match = WHERE.match(str(finding.get("where") or ""))
    if not match or Path(match.group("file")).name != Path(file).name:
        return None
    return int(match.group("line"))


def score_case(case: dict[str, Any], planted: dict[str, Any], fixed: dict[str, Any], alone_planted: float,
               alone_fixed: float) -> dict[str, Any]:
    """One script's figures from its runs (medians already taken)."""
    expected, file = case["expected"], case["file"]
    marks = planted_lines(CORPUS / file)
    ids = [f.get("id") for f in planted["findings"]]
    rank = ids.index(expected) + 1 if expected in ids else None
    hit = planted["findings"][rank - 1] if rank else None
    line = _line_of(hit, file) if hit else None
    measured = alone_planted - alone_fixed
    est = hit.get("est_saving_s") if hit else None
    run_wall = planted["script_wall_s"] or planted["wall_s"]
    ratio = est / measured if isinstance(est, (int, float)) and measured > 0 else None
    return {
        "file": file, "expected": expected, "ids": ids, "titles": [f.get("title") for f in planted["findings"]],
        "rank": rank,
        "where": hit.get("where") if hit else None, "line_ok": line in marks if hit else None,
        "est_saving_s": est, "measured_saving_s": measured, "est_ratio": ratio,
        "est_within_2x": ratio is not None and 0.5 <= ratio <= 2.0,
        "est_over_run": isinstance(est, (int, float)) and est > run_wall,
        "clean_ids": [f.get("id") for f in fixed["findings"]],
        "alone_planted_s": alone_planted, "alone_fixed_s": alone_fixed,
        "profile_planted_s": planted["wall_s"], "profile_fixed_s": fixed["wall_s"],
        "overhead_planted": planted["wall_s"] / alone_planted, "overhead_fixed": fixed["wall_s"] / alone_fixed,
    }


def bench_case(case: dict[str, Any], scale: float, repeats: int) -> dict[str, Any]:
    """Interleaved repeats of the four runs; medians of the walls, the findings of the last runs."""
    walls: dict[str, list[float]] = {"alone_p": [], "alone_f": [], "prof_p": [], "prof_f": []}
    prof_p = prof_f = None
    for _ in range(repeats):
        walls["alone_p"].append(run_alone(case["file"], scale, fixed=False))
        prof_p = run_profiled(case["file"], scale, fixed=False)
        walls["prof_p"].append(prof_p["wall_s"])
        walls["alone_f"].append(run_alone(case["file"], scale, fixed=True))
        prof_f = run_profiled(case["file"], scale, fixed=True)
        walls["prof_f"].append(prof_f["wall_s"])
    assert prof_p is not None and prof_f is not None
    prof_p["wall_s"] = statistics.median(walls["prof_p"])
    prof_f["wall_s"] = statistics.median(walls["prof_f"])
    return score_case(case, prof_p, prof_f, statistics.median(walls["alone_p"]), statistics.median(walls["alone_f"]))


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "-"


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    hits = [r for r in rows if r["rank"]]
    ratios = [r["est_ratio"] for r in hits if r["est_ratio"] is not None]
    overheads = [r["overhead_planted"] for r in rows] + [r["overhead_fixed"] for r in rows]
    return {
        "scripts": n,
        "named_first": sum(r["rank"] == 1 for r in rows),
        "named_anywhere": len(hits),
        "clean_runs_with_findings": sum(bool(r["clean_ids"]) for r in rows),
        "clean_findings": sum(len(r["clean_ids"]) for r in rows),
        "location_ok": sum(bool(r["line_ok"]) for r in hits),
        "estimates": len(ratios),
        "estimates_within_2x": sum(r["est_within_2x"] for r in hits),
        "estimates_over_run": sum(r["est_over_run"] for r in hits),
        "overhead_median": statistics.median(overheads) if overheads else None,
        "overhead_worst": max(overheads) if overheads else None,
    }


def print_report(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    head = (f"{'script':<24} {'expected':<16} {'rank':>4} {'line':>4} {'est/meas':>8} {'clean':>5} {'ovh':>5}  "
            "found (planted run)")
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r['est_ratio']:.2f}" if r["est_ratio"] is not None else "-"
        line = "-" if r["line_ok"] is None else ("ok" if r["line_ok"] else "no")
        found = ", ".join(i or "?" for i in r["ids"]) or "(none)"  # "?": a finding without an id
        print(f"{r['file'][:-3]:<24} {r['expected']:<16} {r['rank'] or '-':>4} {line:>4} {ratio:>8} "
              f"{len(r['clean_ids']):>5} {r['overhead_planted']:>5.2f}  {found}")
    n = summary["scripts"]
    hits = summary["named_anywhere"]
    print()
    print(f"planted named first:    {_pct(summary['named_first'], n)}")
    print(f"planted named anywhere: {_pct(hits, n)}")
    print(f"false alarms on clean:  {summary['clean_runs_with_findings']} of {n} clean runs had findings "
          f"({summary['clean_findings']} findings in all)")
    print(f"location (offending line named): {_pct(summary['location_ok'], hits)} of the named")
    print(f"estimate within 2x of measured saving: {_pct(summary['estimates_within_2x'], hits)} of the named; "
          f"{summary['estimates_over_run']} estimates above 100% of the run")
    if summary["overhead_median"] is not None:
        print(f"overhead of rlperf profile vs alone: median {summary['overhead_median']:.2f}x, "
              f"worst {summary['overhead_worst']:.2f}x")


def calibrate(cases: list[dict[str, Any]], selected: list[dict[str, Any]], repeats: int, write: bool) -> None:
    """Planted vs fixed alone at scale 1.0, interleaved; fills each selected case's ``calibration``
    and, with ``write``, stores the manifest after each case (a long calibration keeps what it measured)."""
    for case in selected:
        planted, fixed = [], []
        for _ in range(repeats):
            planted.append(run_alone(case["file"], 1.0, fixed=False))
            fixed.append(run_alone(case["file"], 1.0, fixed=True))
        p, f = statistics.median(planted), statistics.median(fixed)
        case["calibration"] = {"planted_s": round(p, 2), "fixed_s": round(f, 2), "ratio": round(p / f, 2),
                               "repeats": repeats, "date": time.strftime("%Y-%m-%d"),
                               "load_1m": round(os.getloadavg()[0], 1)}
        print(f"{case['file']:<26} planted {p:6.2f}s  fixed {f:6.2f}s  ratio {p / f:5.2f}", flush=True)
        if write:
            write_manifest(cases)


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def write_manifest(cases: list[dict[str, Any]], path: Path = MANIFEST) -> None:
    """Rewrite the manifest's entries, keeping its header comment."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    out = [*header, ""]
    for case in cases:
        out.append("[[script]]")
        out += [f"{k} = {_toml_value(v)}" for k, v in case.items() if not isinstance(v, dict)]
        for key, table in case.items():
            if isinstance(table, dict):
                out.append(f"[script.{key}]")
                out += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        out.append("")
    path.write_text("\n".join(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.3, help="loop length passed to every script")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats; walls are medians")
    parser.add_argument("--only", action="append", default=[], help="script name (without .py); repeatable")
    parser.add_argument("--json", type=Path, help="write rows and totals here")
    parser.add_argument("--profile-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG to every rlperf profile (repeatable): --profile-arg=--cprofile-whole=1")
    parser.add_argument("--calibrate", action="store_true", help="only time planted vs fixed alone at scale 1")
    parser.add_argument("--write", action="store_true", help="with --calibrate: store the figures in MANIFEST.toml")
    args = parser.parse_args()
    PROFILE_ARGS.extend(args.profile_arg)
    cases = load_manifest()
    selected = [c for c in cases if not args.only or c["file"][:-3] in args.only]
    unknown = set(args.only) - {c["file"][:-3] for c in cases}
    if unknown:
        parser.error(f"not in the manifest: {', '.join(sorted(unknown))}")
    if args.calibrate:
        calibrate(cases, selected, max(args.repeats, 3), args.write)
        return
    rows = []
    for case in selected:
        rows.append(bench_case(case, args.scale, args.repeats))
        print(f"  {case['file']}: planted ids {rows[-1]['ids']}, clean ids {rows[-1]['clean_ids']}",
              file=sys.stderr, flush=True)
    summary = totals(rows)
    print(f"rlperf advisor on the foreign corpus: {len(rows)} scripts, scale {args.scale:g}, repeats {args.repeats}, "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print_report(rows, summary)
    if args.json:
        args.json.write_text(json.dumps({"scale": args.scale, "repeats": args.repeats, "rows": rows, "totals": summary},
                                        indent=2))


if __name__ == "__main__":
    main()
