"""``rlperf profile --verify K -- python SCRIPT``: the top K findings measured by running the script again.

For each of the top K findings whose fix can be applied from outside the script
(:data:`rlperf.instruments.fixes.VERIFIABLE`), the script runs alone -- no profiler, no hooks, its
output not shown -- as it is and with the fix, :data:`VERIFY_REPEATS` times each, interleaved, with
the same arguments. The measured saving is the difference of the medians of the script's own time
(its first line to its end, imports before it left out), beside the advisor's estimate. A finding
whose fix changes what the script does says so and is not run.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlperf.instruments.fixes import VERIFIABLE
from rlperf.instruments.profilers import ProfileOptions

VERIFY_REPEATS = 3


def fix_for(finding: dict[str, Any], record: dict[str, Any]) -> list[str] | None:
    """The child's ``--apply`` values that apply ``finding``'s fix, or None when it has none."""
    if finding.get("id") == "threads":
        profile = record.get("profile") or {}
        cpus = float((profile.get("load") or {}).get("cpus") or 1)
        processes = 1 + int(((profile.get("threads") or {}).get("census") or {}).get("worker_processes") or 0)
        return [f"threads={max(1, int(cpus / processes))}"]
    if finding.get("id") == "gc_pauses":
        return ["gc=off"]
    if finding.get("id") == "autograd_forward":
        site = _forward_site(finding, record)
        if site is None or site.get("backward_reached"):
            return None
        return [f"no_grad={site['file']}:{site['line']}"]
    return None


def _forward_site(finding: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
    """The forward hooks' call site a finding names (its ``where``, written by the same ``short_file``)."""
    from rlperf.instruments.foreign import short_file

    sites = ((record.get("profile") or {}).get("evidence") or {}).get("forwards") or []
    where = str(finding.get("where") or "")
    return next((s for s in sites if where.startswith(f"{short_file(s['file'])}:{s['line']} ")), None)


def _unverifiable(finding: dict[str, Any], record: dict[str, Any]) -> str:
    if finding.get("id") not in VERIFIABLE:
        return "no mechanical check: its fix changes what the script does -- apply it and profile again"
    if finding.get("id") == "autograd_forward" and _forward_site(finding, record) is not None:
        return "no mechanical check here: a backward pass reached some of these graphs"
    return "no mechanical check here: the forward hooks recorded no call site at that line"


def verify_script(target: Any, record: dict[str, Any], k: int,
                  on_run: Callable[[str, int, str], None] | None = None) -> dict[str, Any]:
    """Verify the top ``k`` findings of ``record`` (a script's profile); each gains ``verified``.
    Returns the ``profile.verify`` section."""
    from rlperf.instruments.script import run_script_child

    findings = record["profile"]["advisor"]["findings"][:k]
    plans = []
    for f in findings:
        fix = fix_for(f, record)
        if fix is None:
            f["verified"] = {"error": _unverifiable(f, record)}
        else:
            plans.append((f, fix))
    if not plans:
        return {"ran": 0, "note": "none of the top findings has a fix rlperf can apply from outside the script "
                "(verifiable: " + ", ".join(VERIFIABLE) + ")"}
    options = ProfileOptions(cprofile=False)
    times: dict[str, list[float]] = {"as it is": []}
    failed: dict[str, str] = {}
    stopped = False
    with tempfile.TemporaryDirectory(prefix="rlperf-verify-") as scratch:
        for repeat in range(VERIFY_REPEATS):
            for label, fix in [("as it is", []), *((f["id"], fx) for f, fx in plans)]:
                if on_run is not None:
                    on_run(label, repeat, "")
                report = Path(scratch) / "child.json"
                end = run_script_child(target, report, options, quiet_stdout=True, silent=True,
                                       child_args=["--plain", *(a for x in fix for a in ("--apply", x))])
                if end.signum is not None:
                    stopped = True
                    break
                data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
                if end.returncode != 0 or data.get("loop_s") is None:
                    failed[label] = f"the run {label!r} failed (exit code {end.returncode})"
                    continue
                times.setdefault(label, []).append(float(data["loop_s"]))
            if stopped:
                break
    base = times["as it is"]
    for f, fix in plans:
        runs = times.get(f["id"]) or []
        if failed.get("as it is") or failed.get(f["id"]) or not runs or not base:
            f["verified"] = {"error": failed.get(f["id"]) or failed.get("as it is") or "interrupted before it ran"}
            continue
        f["verified"] = {"saving_s": statistics.median(base) - statistics.median(runs),
                         "baseline_s": statistics.median(base), "fixed_s": statistics.median(runs),
                         "baseline_runs": base, "fixed_runs": runs, "repeats": min(len(base), len(runs)),
                         "inside_noise": min(base) <= max(runs), "how": VERIFIABLE[f["id"]], "applied": fix}
    return {"ran": len(plans), "repeats": VERIFY_REPEATS, "interrupted": stopped,
            "verifiable": dict(VERIFIABLE)}
