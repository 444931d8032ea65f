"""The CI gate: is a candidate slower than its baseline by more than a threshold, beyond the noise?

``rlperf compare BASELINE --candidate CANDIDATE --fail-if-slower 5%`` exits 1 only then, 0
otherwise (2 on bad input). Each side is a config run now (``--repeats`` times, interleaved with
the other side when both are configs) or run records (``rlperf train``/``profile``/``compare``
runs, or ``kind: "external"`` records written by :class:`rlperf.PhaseTimer`).

**The metric.** By default (``step-p25``), the time per env step at the 25th percentile of a run's
vector steps (``timing.vector_step.p25_ms`` over env steps per vector step). Other processes on
a shared machine stretch steps, never shorten them, so the fastest quarter of the steps is where
the code's own cost shows: on the 2-core box BENCHMARKS.md describes, ten identical runs varied by
±1% at the p25 step, ±4% at the median step and ±20% in mean throughput. A cost that lands on
fewer than three steps in four (an update every fourth step, a periodic log or checkpoint, a GC
pause) does not move the p25: gate those with ``step-median`` (half the steps) or
``throughput`` (mean env steps/s: sees everything, needs a quiet machine or many repeats).

**The test.** With ``x`` the baseline's log times per env step and ``y`` the candidate's, the
candidate is slower by more than the threshold ``t`` when ``y > x − ln(1 − t)`` (its throughput
below ``(1 − t)`` × the baseline's). The gate shifts the candidate's samples by ``ln(1 − t)`` and
runs a one-sided exact Mann–Whitney U test (no assumption about the noise's distribution): exit 1
when p < 0.05 and the Hodges–Lehmann estimate of the slowdown is above ``t``. Under identical
code the chance of a false alarm is below 5% (far below, as identical code is ``t`` away from the
alternative); the verdict also gives the slowdown's 95% confidence interval (the exact interval
that inverts the same test). Interleaving the two sides' runs (A B A B ...) spreads slow drift of
the machine over both, and every run uses the config's seed: on the CPU each repeat then does
the same work step by step, so the spread is the machine's, not the workload's.

Nothing here knows about Typer; :func:`verdict` is plain data.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from rlperf.errors import RlperfError
from rlperf.report.stats import is_number

ALPHA = 0.05
METRICS = ("step-p25", "step-median", "throughput")
_STEP_FIELD = {"step-p25": "p25_ms", "step-median": "p50_ms"}
TEST = ("one-sided exact Mann–Whitney U test on log time per env step, the candidate's samples shifted by the "
        "threshold; fail when p < 0.05 and the Hodges–Lehmann slowdown is above the threshold")


def parse_threshold(text: str) -> float:
    """``"5%"`` or ``"0.05"`` -> 0.05; one-line error otherwise (0 ≤ t < 100%)."""
    raw = str(text).strip()
    match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*(%?)", raw)
    if match is None:
        raise RlperfError(f"--fail-if-slower {raw!r} is not a percentage", hint="write e.g. --fail-if-slower 5%")
    value = float(match.group(1)) / (100 if match.group(2) else 1)
    if not 0 <= value < 1:
        raise RlperfError(f"--fail-if-slower {raw} is out of range", hint="give a slowdown from 0% up to (not) 100%")
    return value


def time_per_env_step(record: Mapping[str, Any], metric: str) -> float | None:
    """Seconds per env step of one record for the gate ``metric``; None when the record lacks it."""
    totals = record.get("totals") or {}
    if metric == "throughput":
        rate = (record.get("throughput") or {}).get("env_steps_per_s")
        return 1.0 / rate if is_number(rate) and rate > 0 else None
    step = ((record.get("timing") or {}).get("vector_step") or {}).get(_STEP_FIELD[metric])
    env_steps, vector_steps = totals.get("env_steps"), totals.get("vector_steps")
    if not (is_number(step) and is_number(env_steps) and is_number(vector_steps)) or not env_steps or step <= 0:
        return None
    return step / 1e3 / (env_steps / vector_steps)


# -- the statistics -------------------------------------------------------------------------------


@functools.cache
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) orderings of n x's and m y's have U = u (U = #{x_i > y_j}), u = 0..nm."""
    if n == 0 or m == 0:
        return (1,)
    # An ordering ends in an x (every y is below it: +m to U) or in a y (+0).
    a, b = _u_counts(n - 1, m), _u_counts(n, m - 1)
    out = [0] * (n * m + 1)
    for u, c in enumerate(a):
        out[u + m] += c
    for u, c in enumerate(b):
        out[u] += c
    return tuple(out)


def u_cdf(u: float, n: int, m: int) -> float:
    """P(U ≤ u) under the null (no ties), exactly."""
    counts = _u_counts(n, m)
    return sum(counts[: math.floor(u + 1e-9) + 1]) / math.comb(n + m, n)


def min_p(n: int, m: int) -> float:
    """The smallest p-value n against m samples can give: every ordering is equally likely."""
    return 1 / math.comb(n + m, n)


def u_statistic(x: Sequence[float], y: Sequence[float]) -> float:
    """#{(i, j): x_i > y_j}, ties counted ½."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def shift_interval(x: Sequence[float], y: Sequence[float], alpha: float = ALPHA) -> tuple[float, float] | None:
    """The exact ``1 − alpha`` confidence interval for the shift ``y − x`` from the ordered pairwise
    differences (the interval that inverts the two-sided U test); None when too few samples."""
    n, m = len(x), len(y)
    diffs = sorted(b - a for a in x for b in y)
    k = 0
    while u_cdf(k, n, m) <= alpha / 2:
        k += 1
    if k == 0:
        return None
    return diffs[k - 1], diffs[n * m - k]


def verdict(baseline: Sequence[float], candidate: Sequence[float], threshold: float, metric: str = "step-p25",
            alpha: float = ALPHA) -> dict[str, Any]:
    """The gate's decision on seconds per env step of each side's runs; see the module docstring."""
    if min(len(baseline), len(candidate)) < 1 or min_p(len(baseline), len(candidate)) >= alpha:
        raise RlperfError(
            f"{len(baseline)} baseline and {len(candidate)} candidate runs cannot show a slowdown at p < {alpha:g}",
            hint="run each side at least 4 times (--repeats 5 is the default), or pass more baseline records",
        )
    x, y = [math.log(v) for v in baseline], [math.log(v) for v in candidate]
    shift = -math.log(1 - threshold)
    u = u_statistic(x, [b - shift for b in y])  # small when the shifted candidate is still slower
    p = u_cdf(u, len(x), len(y))
    estimate = statistics.median(b - a for a in x for b in y)
    slowdown = 1 - math.exp(-estimate)
    interval = shift_interval(x, y)
    ci = None if interval is None else [1 - math.exp(-interval[0]), 1 - math.exp(-interval[1])]
    fail = p < alpha and slowdown > threshold
    if fail:
        reason = (f"the candidate is {_pct(slowdown)} slower, beyond the {_pct(threshold)} threshold and the noise "
                  f"(p = {p:.3g} < {alpha:g})")
    elif slowdown > threshold:
        reason = (f"the candidate looks {_pct(slowdown)} slower, but that is inside the noise "
                  f"(p = {p:.3g}, not below {alpha:g})")
    else:
        word = "slower" if slowdown > 0 else "faster"
        reason = f"the candidate is {_pct(abs(slowdown))} {word}, within the {_pct(threshold)} threshold"
    return {
        "schema": 1,
        "kind": "gate",
        "verdict": "fail" if fail else "pass",
        "exit_code": 1 if fail else 0,
        "metric": metric,
        "threshold": threshold,
        "slowdown": slowdown,
        "ci95": ci,
        "p_value": p,
        "alpha": alpha,
        "test": TEST,
        "reason": reason,
        "n": [len(x), len(y)],
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def verdict_line(v: Mapping[str, Any]) -> str:
    """``gate: FAIL — ...`` for the terminal and CI logs."""
    ci = v.get("ci95")
    interval = f" (95% CI {_pct(ci[0])} to {_pct(ci[1])})" if ci else ""
    metric = {"step-p25": "time per env step at the p25 vector step",
              "step-median": "time per env step at the median vector step"}.get(v["metric"], "mean throughput (env steps/s)")
    return (f"gate: {v['verdict'].upper()} — {v['reason']}; slowdown {_pct(v['slowdown'])}{interval} in {metric}, "
            f"{v['n'][0]} baseline vs {v['n'][1]} candidate runs, one-sided exact Mann–Whitney U")


# -- the two sides ------------------------------------------------------------------------------

DEFAULT_REPEATS = 5


def load_side(args: Sequence[str], side: str, make_config: Any) -> list[Any]:
    """A side of the gate: one config (run now), or one or more run records; one-line errors otherwise."""
    from rlperf.experiments.compare import source_from

    if not args:
        raise RlperfError(f"the gate needs a {side}", hint="rlperf compare BASELINE --candidate CONFIG --fail-if-slower 5%")
    sources = [source_from(arg, make_config) for arg in args]
    if any(s.config is not None for s in sources) and len(sources) > 1:
        raise RlperfError(f"the {side} is one config or run records, got {len(sources)} arguments with a config among them",
                          hint=f"give the {side} config once; --repeats runs it several times")
    for s in sources:
        s.label = side
    return sources


def check_records(sources: Sequence[Any], metric: str) -> None:
    """Refuse a record without the gate's metric (before anything runs)."""
    for s in sources:
        if s.record is not None and time_per_env_step(s.record, metric) is None:
            other = "throughput" if metric != "throughput" else "step-p25"
            raise RlperfError(f"{s.origin} has no {metric} figure (an async run, or a record older than the gate)",
                              hint=f"use --gate-metric {other}, or rerun it")


def gather(baseline: list[Any], candidate: list[Any], repeats: int, metric: str, **run_kwargs: Any) -> tuple[Any, Any, bool]:
    """Run the config sides (interleaved when both are configs) and collect each side's records.

    Returns the two :class:`~rlperf.experiments.compare.Side` objects and whether a Ctrl-C cut
    the runs short. Refuses, before anything runs, a record without the gate's metric.
    """
    from rlperf.experiments.compare import Side, run_sources

    check_records(baseline + candidate, metric)
    to_run = [s for s in (baseline[0], candidate[0]) if s.config is not None]
    sides = {"baseline": Side("baseline", baseline[0].origin), "candidate": Side("candidate", candidate[0].origin)}
    for s in baseline + candidate:
        if s.record is not None:
            sides[s.label].records.append(s.record)
    interrupted = False
    if to_run:
        ran, interrupted = run_sources(to_run, repeats, prefix="gate", vary_seed=False, **run_kwargs)
        for side in ran:  # only config sources ran: their sides hold the new runs alone
            sides[side.label].records.extend(side.records)
    return sides["baseline"], sides["candidate"], interrupted


def samples(side: Any, metric: str) -> list[float]:
    """Seconds per env step of each of a side's completed runs."""
    values = [time_per_env_step(r, metric) for r in side.records if r.get("status", "completed") == "completed"]
    return [v for v in values if v is not None]
