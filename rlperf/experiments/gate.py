"""The CI gate: is a candidate slower than its baseline by more than a threshold, and can the runs tell?

``rlperf compare BASELINE --candidate CANDIDATE --fail-if-slower 5%`` has three verdicts: PASS (exit
0) when the candidate is slower by less than the threshold with confidence, FAIL (exit 1) when by
more with confidence, and INCONCLUSIVE (exit 3; ``--inconclusive pass|fail`` maps it to 0 or 1) when
the runs cannot tell; 2 is bad input. Each side is a config run now (``--repeats`` times, interleaved
with the other side, and while inconclusive one more interleaved pair at a time up to
``--max-repeats``) or run records (``rlperf train``/``profile``/``compare`` runs, or ``kind:
"external"`` records written by :class:`rlperf.PhaseTimer`).

**The metrics.** By default (``step-p25+mean``) two: the time per env step at the 25th percentile of
a run's vector steps (``timing.vector_step.p25_ms`` over env steps per vector step) and at their mean
less the time the loop's thread waited for a CPU that other processes held (``mean_less_wait_ms``,
Linux's run-queue wait: see :mod:`rlperf.timers`). Other processes on a shared machine stretch steps,
never shorten them, so the fastest quarter of the steps is where the code's own cost shows (±1% on
the 2-core box BENCHMARKS.md describes); but a cost on fewer than three steps in four (an update every
fourth step, a periodic log, a GC pause) does not move the p25, and the mean less its CPU waits does
(±2% under load). ``step-p25``, ``step-mean``, ``step-median`` and ``throughput`` (mean env steps/s:
sees everything, needs a quiet machine or many repeats) test one metric alone. Records without the
mean are gated on the p25 alone, and the verdict warns that it is blind to such costs.

**The test.** A run's figure is one sample, on log seconds per env step ("5% slower" is 1.05 × the
baseline's time per env step, as pytest-benchmark and asv read it). Where the gate runs both sides
itself it runs them in pairs, the order alternating (baseline first, then candidate first...), and
tests the pairs' log ratios: the Hodges–Lehmann estimate with the Wilcoxon signed-rank interval
(:class:`~rlperf.report.stats.PairedShift`). A shared machine changes speed in steps within seconds
(measured here: ±20% per run); two runs side by side share the step, so the pairs cancel what two
samples see as spread, and a pair split across a step is an outlier that ranks discount. Records
given as they are have no pairs: ``mean(y) − mean(x)`` with Welch's t interval. FAIL when the
interval's lower bound is above ``ln(1.05)``, PASS when its upper bound is below, else INCONCLUSIVE.
With two metrics a FAIL needs one of them above the threshold at 2.5% each (either may raise a false
alarm), and a PASS needs both below (a slowdown passes only if the metric that sees it passes it).
Adaptive repeats look again after every pair and stop at the first look that decides: identical code
sits a whole threshold below a FAIL, but a slowdown just above the threshold gets many chances to
PASS, so a look of adaptive repeats passes at 1% (:data:`ALPHA_PASS_ADAPTIVE`), else at 5% (measured:
scripts/bench_gate.py). The verdict also gives what the runs could see: the smallest slowdown their
spread tells from none 95% of the time (:func:`detectable_line`), and how many runs a side would
decide an inconclusive one. Every run uses the config's seed: on the CPU each repeat does the same
work step by step, so the spread is the machine's, not the workload's.

**Why it got slower.** Each phase's time per vector step (less CPU waits where the record has them)
is tested the same way (pairs with the paired t: :func:`phase_changes`), and where both sides carry
the line sampler's counts (``rlperf profile -- python x.py``) the lines, else where they carry
cProfile's table the functions, whose time per vector step grew most (:func:`line_changes`,
:func:`function_changes`).

**What is compared.** Like with like: every record must agree on :data:`MEASURES` (what kind of
run, which env and size, how many boards, the device, the machine, the timing mode, the rlperf
version), and the records of one side on the config's knobs that change the work
(:func:`check_like_with_like`; ``--allow-mismatch KEY`` lifts a key). A run counts once
(:func:`check_duplicates`); a run that did not complete is left out and the verdict says so.

Nothing here knows about Typer; :func:`verdict` is plain data.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import re
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlperf.errors import RlperfError
from rlperf.report.stats import PairedShift, Shift, is_number, paired_mean_shift, paired_shift, shift
from rlperf.report.units import terminal_safe
from rlperf.system import machine_text

ALPHA = 0.05
POWER = 0.95
"""The chance with which the detectable slowdown is detected (the same as the confidence)."""
EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 3}
MIN_RUNS = 2
"""Runs a side for a spread; a verdict from few runs is honest, and INCONCLUSIVE more often."""
DEFAULT_REPEATS = 6
"""Pairs the gate runs first: the fewest whose signed-rank interval can exclude anything at 2.5% (1 in 2**6)."""
DEFAULT_MAX_REPEATS = 60
"""Pairs at most while inconclusive: at 30, a 10% slowdown on one step in four stayed INCONCLUSIVE in 3 of 20
verdicts of the `ci` config at a 5% gate (reading +6-10% at 30 pairs; scripts/bench_gate.py). Only an
undecided verdict runs the later pairs: most decide within 6-12."""
ALPHA_PASS_ADAPTIVE = 0.01
"""A PASS's error at each look of adaptive repeats. The gate looks again after every pair while inconclusive
and stops at the first look that decides: the looks favour a PASS of a slowdown just above the threshold
(at 5% a look, a 7.5% slowdown passed a 5% gate in one window of ten: scripts/bench_gate.py). A FAIL keeps
ALPHA (identical code sits a whole threshold below it), and a PASS is the error that ships a regression."""
DEFAULT_METRIC = "step-p25+mean"
METRICS = (DEFAULT_METRIC, "step-p25", "step-mean", "step-median", "throughput")
_STEP_FIELD = {"step-p25": "p25_ms", "step-median": "p50_ms", "step-mean": "mean_less_wait_ms"}
_DESCRIBED = {"step-p25": "time per env step at the p25 vector step",
              "step-median": "time per env step at the median vector step",
              "step-mean": "mean time per env step less CPU waits",
              "throughput": "mean throughput (env steps/s)"}


def parts(metric: str) -> tuple[str, ...]:
    """The single metrics ``metric`` tests: the default's two, or itself."""
    return ("step-p25", "step-mean") if metric == DEFAULT_METRIC else (metric,)


def required(metric: str) -> str:
    """The metric every record must have for ``metric`` (the default's mean is used where all have it)."""
    return parts(metric)[0]


def tested(metric: str, records: Iterable[Mapping[str, Any]]) -> tuple[tuple[str, ...], str | None]:
    """The single metrics the gate tests on ``records`` for ``metric``, and a warning when the default
    falls back to the p25 alone (a record without the mean less CPU waits)."""
    wanted = parts(metric)
    if len(wanted) == 1:
        return wanted, None
    lacking = [r for r in records if time_per_env_step(r, "step-mean") is None]
    if not lacking:
        return wanted, None
    name = str(lacking[0].get("name") or lacking[0].get("run_dir") or "a record")
    return ("step-p25",), (f"{len(lacking)} record(s) ({terminal_safe(name)}{', …' if len(lacking) > 1 else ''}) carry no "
                           "mean step less CPU waits (an older rlperf, or no per-thread schedstat): only the p25 step "
                           "was tested, and it does not see a cost on fewer than 3 steps in 4 (--gate-metric throughput does)")
TEST = ("Welch's t interval of the ratio of the sides' times per env step (on log times); fail when its lower "
        "bound is above 1 + threshold, pass when its upper bound is below, else inconclusive")
TEST_PAIRED = ("Wilcoxon signed-rank interval of the ratio of the sides' times per env step, pair by pair (on log "
               "times; the runs interleaved, the order alternating in each pair), around its Hodges-Lehmann estimate; "
               "fail when its lower bound is above 1 + threshold, pass when its upper bound is below, else inconclusive")


def parse_threshold(text: str) -> float:
    """``"5%"`` -> 0.05; one-line error otherwise (0% ≤ t ≤ 1000%: 100% is twice the time).

    The percent sign is required: a bare ``5`` (5%? 500%?) and ``0.05`` (5%? 0.05%?) are each read
    one way by some CI tools and the other way by others, and a gate that reads 0.5 as 50% passes
    a regression silently."""
    raw = str(text).strip()
    match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*%", raw)
    if match is None:
        if re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", raw):
            fraction = f", or {100 * float(raw):g}% if {raw} was a fraction" if float(raw) < 1 else ""
            raise RlperfError(f"--fail-if-slower {raw} has no % sign",
                              hint=f"the threshold is a slowdown in percent: write --fail-if-slower {raw}%{fraction}")
        raise RlperfError(f"--fail-if-slower {raw!r} is not a percentage", hint="write e.g. --fail-if-slower 5%")
    value = float(match.group(1)) / 100
    if not 0 <= value <= 10:
        raise RlperfError(f"--fail-if-slower {raw} is out of range",
                          hint="give a slowdown from 0% to 1000% (100%: twice the baseline's time per env step)")
    return value


def time_per_env_step(record: Mapping[str, Any], metric: str) -> float | None:
    """Seconds per env step of one record for the gate ``metric``; None when the record lacks it."""
    totals = record.get("totals") or {}
    if metric == "throughput":
        rate = (record.get("throughput") or {}).get("env_steps_per_s")
        return 1.0 / rate if is_number(rate) and rate > 0 else None
    step = ((record.get("timing") or {}).get("vector_step") or {}).get(_STEP_FIELD[metric])
    env_steps, vector_steps = totals.get("env_steps"), totals.get("vector_steps")
    if not (is_number(step) and is_number(env_steps) and is_number(vector_steps)):
        return None
    if env_steps <= 0 or vector_steps <= 0 or step <= 0:  # a run without steps has no time per step
        return None
    return step / 1e3 / (env_steps / vector_steps)


# -- the statistics -------------------------------------------------------------------------------

PLAUSIBLE_S = (1e-12, 1e5)
"""Seconds per env step a measurement can have: a picosecond (a thousand times past the fastest env) to
a day's fraction. A record outside it is damaged, not slow, and its logarithms would overflow the test."""


def check_plausible(value: float, what: str, where: str) -> float:
    """``value`` (seconds) when a measurement could give it; a one-line error naming the record otherwise."""
    if not PLAUSIBLE_S[0] <= value <= PLAUSIBLE_S[1]:
        raise RlperfError(f"{where}: {what} of {value:.3g} s is not a measurement (a damaged record)",
                          hint="record the run again, or leave this record out")
    return value


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _signed_pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _ratio(log_shift: float) -> float:
    """A shift of log times as a slowdown (the candidate's time over the baseline's, less 1)."""
    return math.inf if log_shift == math.inf else math.expm1(min(log_shift, 700.0))


def _bound_pct(log_bound: float) -> str:
    return _signed_pct(_ratio(log_bound)) if math.isfinite(log_bound) else "unbounded"


def verdict(baseline: Sequence[float], candidate: Sequence[float], threshold: float, metric: str = "step-p25",
            alpha_fail: float = ALPHA, alpha_pass: float = ALPHA, paired: bool = False) -> dict[str, Any]:
    """The gate's decision on seconds per env step of each side's runs, for one metric; see the module docstring.

    FAIL when the ``1 − alpha_fail`` lower bound of the slowdown is above the threshold, PASS when the
    ``1 − alpha_pass`` upper bound is below it, INCONCLUSIVE otherwise. ``paired``: each side's k-th runs
    ran side by side (the signed-rank test of their ratios), else the sides are two samples (Welch)."""
    if min(len(baseline), len(candidate)) < MIN_RUNS:
        raise RlperfError(f"{len(baseline)} baseline and {len(candidate)} candidate runs have no spread to test",
                          hint=f"run each side at least {MIN_RUNS} times (--repeats {DEFAULT_REPEATS} is the default), "
                               "or pass more records")
    logs = [math.log(v) for v in baseline], [math.log(v) for v in candidate]
    d: Shift | PairedShift = paired_shift(*logs) if paired else shift(*logs)
    limit = math.log1p(threshold)
    lower, upper = d.bound(alpha_fail, upper=False), d.bound(alpha_pass, upper=True)
    slowdown = _ratio(d.estimate)
    word = "slower" if slowdown >= 0 else "faster"
    interval = f"{_bound_pct(lower)} to {_bound_pct(upper)}"
    detectable = d.resolution(alpha_fail, POWER)
    more: int | None = None
    if lower > limit:
        outcome = "fail"
        reason = (f"the candidate is {_pct(abs(slowdown))} {word} (interval {interval}): above the {_pct(threshold)} "
                  f"threshold with confidence")
    elif upper < limit:
        outcome = "pass"
        reason = (f"the candidate is {_pct(abs(slowdown))} {word} (interval {interval}): below the {_pct(threshold)} "
                  f"threshold with confidence")
    else:
        outcome = "inconclusive"
        above = d.estimate > limit
        more = d.runs_to_decide(abs(d.estimate - limit), alpha_fail if above else alpha_pass)
        decide = (f"about {more} runs a side would decide it (from the measured spread, if the estimate holds)"
                  if more is not None else "it sits on the threshold: no number of runs decides it at this estimate")
        reason = (f"the candidate looks {_pct(abs(slowdown))} {word}, but its interval {interval} holds the "
                  f"{_pct(threshold)} threshold: the runs cannot tell; {decide}")
    speedup, said = _speedup(lower, upper, slowdown)
    return {
        "schema": 2,
        "kind": "gate",
        "verdict": outcome,
        "exit_code": EXIT_CODES[outcome],
        "metric": metric,
        "threshold": threshold,
        "slowdown": slowdown,
        "interval": [_ratio(x) if math.isfinite(x) else None for x in (lower, upper)],
        "confidence": {"fail": 1 - alpha_fail, "pass": 1 - alpha_pass},
        "p_value": d.p_above(limit),
        "p_below": 1 - d.p_above(limit),
        "alpha": alpha_fail,
        "detectable_slowdown": _ratio(detectable),
        "fails_above": _ratio(limit + detectable),
        "more_runs_a_side": more,
        "spread": [math.expm1(s) for s in d.sd],
        "pair_spread": math.expm1(d.pair_spread) if isinstance(d, PairedShift) else None, "paired": paired,
        "speedup": speedup,
        "test": TEST_PAIRED if paired else TEST,
        "reason": reason + said,
        "n": [len(baseline), len(candidate)],
    }


def _speedup(lower: float, upper: float, slowdown: float) -> tuple[str, str]:
    """A speed-up is claimed on the same rule as a slowdown, faster with confidence: the claim, and
    what the reason adds."""
    if upper < 0:
        return "faster", "; faster with confidence"
    if lower > 0:
        return "not faster", ""
    return "inconclusive", "; not shown faster (the interval holds no change)" if slowdown < 0 else ""


def decide(samples: Mapping[str, tuple[Sequence[float], Sequence[float]]], threshold: float,
           metric: str, paired: bool = False, alpha_pass: float = ALPHA) -> dict[str, Any]:
    """The gate's decision over one or more single metrics (``samples``: metric -> (baseline,
    candidate) seconds per env step): FAIL when one fails, each tested at ``ALPHA / len(samples)``
    (a false alarm on either stays below ALPHA); PASS when every one passes, each at ``ALPHA`` (a
    slowdown passes only if the metric that sees it passes it; ``alpha_pass`` with adaptive repeats);
    INCONCLUSIVE otherwise. The verdict
    is the deciding metric's (the larger slowdown among those failing, else among those
    inconclusive, else among all); ``checks`` holds each metric's own. ``paired``: see :func:`verdict`."""
    checks = {m: verdict(b, c, threshold, m, ALPHA / len(samples), alpha_pass, paired) for m, (b, c) in samples.items()}
    by = {o: [v for v in checks.values() if v["verdict"] == o] for o in EXIT_CODES}
    outcome = "fail" if by["fail"] else "inconclusive" if by["inconclusive"] else "pass"
    chosen = max(by[outcome], key=lambda v: v["slowdown"])
    out = dict(chosen)
    out.update(metric=metric if len(checks) > 1 else chosen["metric"], decided_by=chosen["metric"], alpha=ALPHA,
               # whichever form a slowdown takes, the metrics that see it detect it at this size
               detectable_slowdown=max(v["detectable_slowdown"] for v in checks.values()),
               fails_above=max(v["fails_above"] for v in checks.values()),
               checks={m: {k: v[k] for k in ("verdict", "slowdown", "interval", "confidence", "p_value",
                                             "detectable_slowdown", "more_runs_a_side", "spread", "pair_spread",
                                             "reason")}
                       for m, v in checks.items()})
    if outcome == "inconclusive":
        wanted = [v["more_runs_a_side"] for v in by["inconclusive"]]
        out["more_runs_a_side"] = None if None in wanted else max(wanted)
    if len(checks) > 1:
        out["test"] = chosen["test"] + (f"; fail when either of {' and '.join(checks)} fails (each at "
                                        f"{ALPHA / len(checks):g}), pass when both pass")
    return out


def missing_note(left: Mapping[str, Sequence[str]], outcome: str, paired: bool = False) -> str:
    """``2 candidate runs did not complete (c4, c5), counted as missing; the others still decide it: ``
    (``paired``: each with its pair)."""
    parts = [f"{len(names)} {side} run{'s' if len(names) != 1 else ''} did not complete ({', '.join(names[:4])}"
             f"{', …' if len(names) > 4 else ''})" for side, names in left.items() if names]
    still = "the others still decide it" if outcome != "inconclusive" else "the others do not decide it"
    return terminal_safe(f"{' and '.join(parts)}, counted as missing{' with their pairs' if paired else ''}; {still}: ")


def too_few(n: int, m: int, left: Mapping[str, Sequence[str]], threshold: float, metric: str) -> dict[str, Any]:
    """The INCONCLUSIVE verdict of sides left with fewer than MIN_RUNS completed runs."""
    reason = (missing_note(left, "inconclusive") + f"{n} baseline and {m} candidate runs completed, too few for a "
              f"spread (at least {MIN_RUNS} a side); see the runs' records for why the others did not complete")
    return {"schema": 2, "kind": "gate", "verdict": "inconclusive", "exit_code": EXIT_CODES["inconclusive"],
            "metric": metric, "decided_by": parts(metric)[0], "threshold": threshold, "slowdown": None, "interval": None,
            "p_value": 1.0, "alpha": ALPHA, "detectable_slowdown": None, "fails_above": None, "more_runs_a_side": None,
            "speedup": "inconclusive", "test": TEST, "reason": reason, "n": [n, m], "checks": {}}


def verdict_line(v: Mapping[str, Any]) -> str:
    """``gate: FAIL — ...`` for the terminal and CI logs."""
    decided = v.get("decided_by", v["metric"])
    others = [f"{_DESCRIBED[m]}: {_pct(abs(c['slowdown']))} {'slower' if c['slowdown'] >= 0 else 'faster'}, "
              f"{c['verdict']}" for m, c in (v.get("checks") or {}).items() if m != decided]
    also = f" (the {'; '.join(others)})" if others else ""
    exit_note = ""
    if v["verdict"] == "inconclusive" and v["exit_code"] != EXIT_CODES["inconclusive"]:
        exit_note = f"; counted as {'a pass' if v['exit_code'] == 0 else 'a fail'} (--inconclusive)"
    return (f"gate: {v['verdict'].upper()} — {v['reason']}; in {_DESCRIBED[decided]}{also}, {v['n'][0]} baseline "
            f"vs {v['n'][1]} candidate runs{exit_note}")


def add_reach(v: dict[str, Any], most: int) -> None:
    """What adaptive repeats could see: the detectable slowdown at ``most`` pairs (``v["reach"]``), where
    the verdict stopped at fewer. The estimate's error shrinks as one over the root of the pairs, so the
    figure is the verdict's own scaled by ``sqrt(n / most)`` if the spread held; from 6 pairs it errs
    high (their signed-rank interval spans the outermost pairs), never promising what 30 cannot show."""
    n = v["n"][0]
    if v.get("detectable_slowdown") is None or n >= most:
        return
    detectable = math.log1p(v["detectable_slowdown"]) * math.sqrt(n / most)
    v["reach"] = {"pairs": most, "detectable_slowdown": _ratio(detectable),
                  "fails_above": _ratio(math.log1p(v["threshold"]) + detectable)}


def detectable_line(v: Mapping[str, Any]) -> str:
    """What the gate could see, from the runs' spread, and whether its threshold is inside it."""
    spread = v.get("spread") or [0.0, 0.0]
    per = (f"spread of a pair's ratio ±{_pct(v['pair_spread'])}" if v.get("pair_spread") is not None
           else f"spread per run ±{_pct(spread[0])} baseline, ±{_pct(spread[1])} candidate")
    line = (f"detectable: {_pct(v['detectable_slowdown'])} — the smallest slowdown these runs tell from none "
            f"({round(100 * POWER)}% of the time, at {round(100 * (1 - v['alpha']))}% confidence; {per}); "
            f"at this threshold a slowdown above "
            f"{_pct(v['fails_above'])} fails {round(100 * POWER)}% of the time")
    reach = v.get("reach")
    if reach:
        line += (f"; with up to {reach['pairs']} pairs (--max-repeats), if the spread holds: "
                 f"{_pct(reach['detectable_slowdown'])}, failing above {_pct(reach['fails_above'])}")
    if v["threshold"] < (reach or v)["detectable_slowdown"]:
        runs = f"up to {reach['pairs']} pairs" if reach else "these runs"
        line += (f"; the {_pct(v['threshold'])} threshold is below what {runs} can see: more runs a side "
                 "(--repeats, --max-repeats), a quieter machine or a larger threshold")
    return line


# -- the two sides ------------------------------------------------------------------------------


def load_side(args: Sequence[str], side: str, make_config: Any) -> list[Any]:
    """A side of the gate: one config (run now), or one or more run records; one-line errors otherwise."""
    from rlperf.experiments.compare import source_from

    if not args:
        raise RlperfError(f"the gate needs a {side}", hint="rlperf compare BASELINE --candidate CONFIG --fail-if-slower 5%")
    sources = [source_from(arg, make_config) for arg in expand_globs(args)]
    if any(s.config is not None for s in sources) and len(sources) > 1:
        raise RlperfError(f"the {side} is one config or run records, got {len(sources)} arguments with a config among them",
                          hint=f"give the {side} config once; --repeats runs it several times")
    for s in sources:
        s.label = side
    return sources


def expand_globs(args: Sequence[str]) -> list[str]:
    """Each argument as given, or, when it is a glob pattern that names no path itself (quoted on a
    command line, or from a shell that does not expand it), the paths it matches, sorted; a folder of
    run directories (``baseline/`` holding ``run-1/``, ``run-2/``...), the runs in it."""
    from rlperf.experiments.compare import runs_in
    from rlperf.run.files import RECORD_NAME

    out: list[str] = []
    for arg in args:
        folder = Path(arg)
        if folder.is_dir() and not (folder / RECORD_NAME).exists() and (inside := runs_in(folder)):
            out.extend(str(p) for p in inside)
        elif glob.has_magic(arg) and not Path(arg).exists():
            found = sorted(glob.glob(arg))
            if not found:
                raise RlperfError(f"no run, record or config matches {arg}", hint="check the pattern, e.g. 'baseline/*/'")
            out.extend(found)
        else:
            out.append(arg)
    return out


def check_records(sources: Sequence[Any], metric: str) -> None:
    """Refuse a record without the gate's metric (before anything runs): one that measured no step,
    or lacks the figure (naming a metric it has)."""
    for s in sources:
        r = s.record
        if r is None or time_per_env_step(r, metric) is not None:
            continue
        timing, totals = r.get("timing") or {}, r.get("totals") or {}
        if 0 in (timing.get("measured_steps"), totals.get("vector_steps"), totals.get("env_steps")):
            raise RlperfError(f"{s.origin} measured no steps: its loop never called step_done() after the warm-up",
                              hint="a PhaseTimer counts one step at each timer.step_done(): call it once per loop "
                                   "iteration (past warmup_steps), and record the run again")
        others = [m for m in METRICS[1:] if m != metric and time_per_env_step(r, m) is not None]
        hint = (f"use --gate-metric {others[0]}, or record it again with this rlperf" if others
                else "record it again with this rlperf")
        raise RlperfError(f"{s.origin} has no {metric} figure (an async run, or a record older than the gate)", hint=hint)


def gather(baseline: list[Any], candidate: list[Any], repeats: int, metric: str, max_repeats: int | None = None,
           undecided: Any = None, **run_kwargs: Any) -> tuple[Any, Any, bool]:
    """Run the config sides (interleaved when both are configs) and collect each side's records.

    Returns the two :class:`~rlperf.experiments.compare.Side` objects and whether a Ctrl-C cut
    the runs short. Refuses, before anything runs, a record without the gate's metric. Adaptive
    repeats: while ``undecided(baseline_side, candidate_side)`` holds, one more run of each config
    side (interleaved, into the same folder) until ``max_repeats`` a side. Two config sides run as pairs
    whose order alternates (baseline first, then candidate first, ...), tested pair by pair (``paired``
    in :func:`result`).
    """
    from rlperf.experiments.compare import Side, run_sources

    check_records(baseline + candidate, required(metric))
    to_run = [s for s in (baseline[0], candidate[0]) if s.config is not None]
    sides = {"baseline": Side("baseline", baseline[0].origin), "candidate": Side("candidate", candidate[0].origin)}
    for s in baseline + candidate:
        if s.record is not None:
            sides[s.label].records.append(s.record)
    if not to_run:
        return sides["baseline"], sides["candidate"], False
    into: Path | None = None
    done, batch = 0, repeats
    while True:
        ran, interrupted = run_sources(to_run, batch, prefix="gate", vary_seed=False, into=into, alternate_from=done,
                                       **run_kwargs)
        for side in ran:  # only config sources ran: their sides hold the new runs alone
            sides[side.label].records.extend(side.records)
            if side.records and into is None:  # the later pairs go beside the first runs
                into = Path(side.records[0]["run_dir"]).parent
        done += batch
        base, cand = sides["baseline"], sides["candidate"]
        if interrupted or undecided is None or done >= (max_repeats or repeats) or not undecided(base, cand):
            return base, cand, interrupted
        batch = 1


def _completed(record: Mapping[str, Any]) -> bool:
    return record.get("status", "completed") == "completed"


def _name(record: Mapping[str, Any]) -> str:
    return terminal_safe(str(record.get("name") or record.get("run_dir") or "a record"))


def samples(side: Any, metric: str) -> list[float]:
    """Seconds per env step of each of a side's completed runs (a value no measurement could have is
    a damaged record: refused in one line)."""
    out = []
    for r in side.records:
        v = time_per_env_step(r, metric) if _completed(r) else None
        if v is not None:
            out.append(check_plausible(v, f"its time per env step ({metric})", _name(r)))
    return out


def paired_samples(base: Any, cand: Any, metric: str) -> tuple[list[float], list[float]]:
    """Seconds per env step of the pairs the gate ran side by side (each side's k-th run) where both runs
    completed: a run that did not takes its pair with it."""
    b, c = [], []
    for x, y in _pairs(base, cand):
        vx, vy = time_per_env_step(x, metric), time_per_env_step(y, metric)
        if vx is not None and vy is not None:
            b.append(check_plausible(vx, f"its time per env step ({metric})", _name(x)))
            c.append(check_plausible(vy, f"its time per env step ({metric})", _name(y)))
    return b, c


def pair_records(base: Any, cand: Any) -> bool:
    """Whether two sides of records ran as interleaved pairs: as many runs a side, and by their start
    times each side's k-th run next to the other side's k-th (``base, cand, cand, base, ...`` or any
    order within a pair; the README's CI recipe). If so, each side's records are put in start order,
    for :func:`result` to test them pair by pair, and True; records run otherwise are two samples."""
    b, c = base.records, cand.records
    if len(b) != len(c) or len(b) < MIN_RUNS or not all(isinstance(r.get("started_at"), str) for r in b + c):
        return False
    b, c = sorted(b, key=lambda r: r["started_at"]), sorted(c, key=lambda r: r["started_at"])
    times = sorted([(r["started_at"], 0, k) for k, r in enumerate(b)] + [(r["started_at"], 1, k) for k, r in enumerate(c)])
    if any({(side, k) for _, side, k in times[2 * k:2 * k + 2]} != {(0, k), (1, k)} for k in range(len(b))):
        return False
    base.records[:], cand.records[:] = b, c
    return True


def _pairs(base: Any, cand: Any) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """Each side's k-th run, where both completed (a signal may leave the last pair half run)."""
    return [(x, y) for x, y in zip(base.records, cand.records, strict=False) if _completed(x) and _completed(y)]


def run_names(side: Any, completed: bool | None = None) -> list[str]:
    """The names of a side's runs, as their records give them (``completed``: only those that did, or did not)."""
    return [str(r.get("name") or r.get("run_dir") or "?") for r in side.records
            if completed is None or _completed(r) == completed]


def compared_line(v: Mapping[str, Any], show: int = 6) -> str:
    """``compared: baseline 5 runs (a, b, ...); candidate 5 runs (...)``: the runs the verdict is about
    (and those left out, not completed)."""
    out = []
    for side in ("baseline", "candidate"):
        names, left = v[side]["names"], v[side].get("left_out") or []
        listed = ", ".join(names[:show]) + (f", … {len(names) - show} more" if len(names) > show else "")
        dropped = f"; {len(left)} not completed, left out: {', '.join(left[:show])}" if left else ""
        out.append(f"{side} {len(names)} run{'s' if len(names) != 1 else ''} ({listed}{dropped})")
    return "compared: " + "; ".join(out)


def result(base: Any, cand: Any, threshold: float, metric: str, allow: Collection[str] = (),
           inconclusive: str | None = None, paired: bool = False,
           adaptive: bool = False) -> tuple[dict[str, Any], tuple[list[float], list[float]]]:
    """The verdict on the gathered sides with what it rests on (each side's samples, names and run
    directories, the config changes, the phases and functions that changed, what the runs could
    detect, the comparison), and the deciding metric's two samples. Runs that did not complete count
    as missing: too few left is an INCONCLUSIVE verdict that says so. ``inconclusive``: "pass" or
    "fail" makes an INCONCLUSIVE verdict exit 0 or 1 instead of 3. ``paired``: the gate ran both sides
    itself, interleaved, so each side's k-th runs are a pair (tested pair by pair: :func:`verdict`).
    ``adaptive``: these runs are one look of several (adaptive repeats): a PASS at ALPHA_PASS_ADAPTIVE."""
    from rlperf.experiments.compare import compare as build_comparison

    changed = check_like_with_like({side.label: [(name, measures(r)) for name, r in
                                                 zip(run_names(side), side.records, strict=True)]
                                    for side in (base, cand)}, allow)
    completed = [[r for r in side.records if _completed(r)] for side in (base, cand)]
    metrics, fallback = tested(metric, completed[0] + completed[1])
    if paired:
        pairs = _pairs(base, cand)
        completed = [[x for x, _ in pairs], [y for _, y in pairs]]
    per = {m: paired_samples(base, cand, m) if paired else (samples(base, m), samples(cand, m)) for m in metrics}
    left = {side.label: run_names(side, completed=False) for side in (base, cand)}
    b, c = per[metrics[0]]
    if min(len(b), len(c)) < MIN_RUNS:
        out = too_few(len(b), len(c), left, threshold, metric)
    else:
        out = decide(per, threshold, metric, paired, ALPHA_PASS_ADAPTIVE if adaptive else ALPHA)
        b, c = per[out["decided_by"]]
        if any(left.values()):
            out["reason"] = missing_note(left, out["verdict"], paired) + out["reason"]
    if out["verdict"] == "inconclusive" and inconclusive is not None:
        out["exit_code"] = 0 if inconclusive == "pass" else 1
    out["phases"] = phase_changes(completed[0], completed[1], paired)
    functions = function_changes(completed[0], completed[1], show=10**6, paired=paired)
    out["functions"] = functions[:3]
    out["lines"] = line_changes(completed[0], completed[1], paired=paired)
    out["why"] = why_line(out["phases"], functions, out["lines"])
    comparison = build_comparison([base, cand])
    for side, values in ((base, b), (cand, c)):
        out[side.label] = {"source": side.source, "samples_s_per_env_step": values,
                           "names": run_names(side, completed=True), "left_out": left[side.label],
                           "run_dirs": [r.get("run_dir") for r in side.records]}
    out["config_changes"] = changed
    out["allowed_mismatches"] = list(allow)
    out["warnings"] = ([fallback] if fallback else []) + comparison["warnings"]
    out["comparison"] = comparison
    return out, (b, c)


# -- why it got slower ---------------------------------------------------------------------------


def _step_ms(record: Mapping[str, Any]) -> tuple[float | None, bool]:
    """A record's mean vector step in ms, less its CPU waits where it has them (and whether it did)."""
    step = (record.get("timing") or {}).get("vector_step") or {}
    less = step.get("mean_less_wait_ms")
    if is_number(less) and less > 0:
        return float(less), True
    mean = step.get("mean_ms")
    return (float(mean) if is_number(mean) and mean > 0 else None), False


OUTSIDE = "outside the phases"
"""The step's time in none of the loop's phases (a hook, the loop's own Python): tested as a phase is,
so a cost there is named as such instead of spread over the phases by their shares."""


def phase_ms(record: Mapping[str, Any], phase: str) -> dict[str, float]:
    """A phase's ms per vector step in one record, two ways as the gate's step: ``median``, its median
    call × calls per step (where waits for a CPU rarely land; blind to a cost on a few calls), and
    ``mean``, its total over the measured steps less its part of the CPU waits (waits fall on the
    phases as their time does; :func:`_mean_ms`). :data:`OUTSIDE`: the mean step less CPU waits less
    every phase's mean."""
    if phase == OUTSIDE:
        return _outside_ms(record)
    stats = (record.get("phases") or {}).get(phase) or {}
    steps = (record.get("timing") or {}).get("measured_steps")
    out = {}
    p50, calls = stats.get("p50_ms"), stats.get("calls")
    if is_number(p50) and p50 > 0 and is_number(calls) and is_number(steps) and steps > 0:
        out["median"] = p50 * calls / steps
    mean = _mean_ms(record, stats)
    if mean is not None:
        out["mean"] = mean
    return out


def _mean_ms(record: Mapping[str, Any], stats: Mapping[str, Any]) -> float | None:
    """A phase's total over the measured steps in ms per step, × the part of the steps' time not spent
    waiting for a CPU (where the record has it); its share × the mean step less waits where it has no total."""
    steps = (record.get("timing") or {}).get("measured_steps")
    total, share = stats.get("total_s"), stats.get("share")
    step, less_wait = _step_ms(record)
    if is_number(total) and total > 0 and is_number(steps) and steps > 0:
        mean = (((record.get("timing") or {}).get("vector_step") or {}).get("mean_ms"))
        scale = min(step / mean, 1.0) if less_wait and step is not None and is_number(mean) and mean > 0 else 1.0
        return 1e3 * total / steps * scale
    if less_wait and step is not None and is_number(share) and 0 < share <= 1:
        return share * step
    return None


def _outside_ms(record: Mapping[str, Any]) -> dict[str, float]:
    """``{"mean": ms}`` of the step outside every phase (at least a nanosecond: the phases' means and the
    step's are read over slightly different steps, and a log needs a positive time); none without phases."""
    step, _ = _step_ms(record)
    inside = [_mean_ms(record, stats) for stats in (record.get("phases") or {}).values() if isinstance(stats, Mapping)]
    if step is None or not inside or any(v is None for v in inside):
        return {}
    rest = step - sum(v for v in inside if v is not None)
    return {"mean": max(rest, 1e-6)}


def _change(name: str, b: Sequence[float], c: Sequence[float], tests: int, paired: bool = False) -> dict[str, Any] | None:
    """One phase's or function's change in ms per vector step: the difference of the sides' means, and
    the test of "slower at all" on log times (the machine's speed scales them; pair by pair with the
    paired t where ``paired``: a few pairs cannot reach ALPHA / tests on signed ranks, else Welch's) at
    ALPHA / tests, with its one-sided p-value and the ratio's 1 − ALPHA/tests interval."""
    if min(len(b), len(c)) < MIN_RUNS or min(*b, *c) <= 0:
        return None
    logs = [math.log(v) for v in b], [math.log(v) for v in c]
    d = paired_mean_shift(*logs) if paired else shift(*logs)
    alpha = ALPHA / max(tests, 1)
    return {"name": name, "baseline_ms": statistics.fmean(b), "candidate_ms": statistics.fmean(c),
            "delta_ms": statistics.fmean(c) - statistics.fmean(b),
            "ratio_interval": [math.exp(d.bound(alpha / 2, upper=False)), math.exp(d.bound(alpha / 2, upper=True))],
            "p_value": d.p_above(0.0), "alpha": alpha, "slower": d.bound(alpha, upper=False) > 0}


def phase_changes(base: Sequence[Mapping[str, Any]], cand: Sequence[Mapping[str, Any]],
                  paired: bool = False) -> list[dict[str, Any]]:
    """Each phase both sides timed, its change in ms per vector step tested like the gate's step (its
    median call and its mean, each at ALPHA / (2 × phases)): slower when either is; the phases that got
    slower first, by their change, then the rest. ``paired``: ``base[k]`` and ``cand[k]`` ran side by side."""
    names = [n for n in dict.fromkeys(k for r in [*base, *cand] for k in (r.get("phases") or {}))
             if all(n in (r.get("phases") or {}) for r in [*base, *cand])]
    if names and all(_outside_ms(r) for r in [*base, *cand]):
        names.append(OUTSIDE)
    out = []
    for name in names:
        found: dict[str, dict[str, Any]] = {}
        for form in ("median", "mean"):
            for r in [*base, *cand]:
                if form in (v := phase_ms(r, name)):
                    check_plausible(v[form] / 1e3, f"its {name} phase's time per vector step", _name(r))
            if paired:
                both = [(x[form], y[form]) for x, y in ((phase_ms(p, name), phase_ms(q, name))
                                                         for p, q in zip(base, cand, strict=True)) if form in x and form in y]
                values = [[x for x, _ in both], [y for _, y in both]]
            else:
                values = [[v[form] for v in (phase_ms(r, name) for r in side) if form in v] for side in (base, cand)]
            change = _change(name, values[0], values[1], 2 * len(names), paired)
            if change is not None:
                found[form] = dict(change, form=form)
        if found:
            # the form that shows it (the smaller p), its delta the one reported
            best = min(found.values(), key=lambda c: c["p_value"])
            out.append(dict(best, forms={f: {k: c[k] for k in ("delta_ms", "p_value", "slower")} for f, c in found.items()}))
    return sorted(out, key=lambda c: (not c["slower"], -c["delta_ms"]))


def _function_ms(record: Mapping[str, Any]) -> dict[str, float]:
    """cProfile's own time per function as ms per vector step: its share of the profile × the mean step."""
    table = ((record.get("profile") or {}).get("cprofile") or {})
    total, rows = table.get("total_s"), table.get("top") or []
    step, _ = _step_ms(record)
    if not (is_number(total) and total > 0 and step is not None):
        return {}
    return {str(row["function"]): row["tottime"] / total * step for row in rows
            if isinstance(row, Mapping) and isinstance(row.get("function"), str) and is_number(row.get("tottime"))}


def function_changes(base: Sequence[Mapping[str, Any]], cand: Sequence[Mapping[str, Any]],
                     show: int = 3, paired: bool = False) -> list[dict[str, Any]]:
    """Where both sides carry cProfile's table in every run: the functions in every one of them whose
    own time per vector step grew most (tested as the phases are)."""
    tables = [[_function_ms(r) for r in side] for side in (base, cand)]
    if not all(tables[0]) or not all(tables[1]):
        return []
    common = set.intersection(*(set(t) for side in tables for t in side))
    changes = [c for c in (_change(f, [t[f] for t in tables[0]], [t[f] for t in tables[1]], len(common), paired)
                           for f in sorted(common)) if c is not None]
    return sorted(changes, key=lambda c: -c["delta_ms"])[:show]


def _line_ms(record: Mapping[str, Any]) -> dict[str, float]:
    """The line sampler's samples per line of the user's code (``rlperf profile -- python x.py``), as ms per
    vector step: the samples with the line innermost of the user's frames, each one sampling interval long (the
    record's ``interval_s``), over the run's vector steps. Not a share of all the samples: those count the
    script's imports and set-up too (two-thirds of a 300-step loop's, which read a line at a third of its time)."""
    sampled = (((record.get("profile") or {}).get("evidence") or {}).get("line_samples") or {})
    interval, rows = sampled.get("interval_s"), sampled.get("lines") or []
    steps = (record.get("totals") or {}).get("vector_steps")
    if not (is_number(interval) and interval > 0 and is_number(steps) and steps > 0):
        return {}
    return {f"{row[0]}:{row[1]}({row[2]})": row[3] * interval / steps * 1e3 for row in rows
            if isinstance(row, list) and len(row) >= 5 and is_number(row[3]) and row[3] > 0}


def line_changes(base: Sequence[Mapping[str, Any]], cand: Sequence[Mapping[str, Any]],
                 show: int = 3, paired: bool = False) -> list[dict[str, Any]]:
    """Where both sides carry the line sampler's counts in every run: the lines whose time per vector step
    grew most (tested as the functions are; a line sampled in some runs only counts 0 in the others).
    Tested: the lines sampled in at least half the runs of one side. A DQN loop's records name some
    forty-five lines, most sampled once in one run (set-up, a stray tick): tested each at ALPHA / 45, a
    line 0.1 ms slower in a 1 ms step, in every candidate run, went unnamed at p = 0.0017; a line seen
    in fewer runs cannot clear the test with a handful of runs a side."""
    tables = [[_line_ms(r) for r in side] for side in (base, cand)]
    if not all(tables[0]) or not all(tables[1]):
        return []
    columns = {line: ([t.get(line, 0.0) for t in tables[0]], [t.get(line, 0.0) for t in tables[1]])
               for line in sorted(set().union(*(set(t) for t in tables[1])))}
    tested = {line: bc for line, bc in columns.items()
              if any(2 * sum(v > 0 for v in side) >= len(side) for side in bc)}
    alpha = ALPHA / max(len(tested), 1)
    changes: list[dict[str, Any]] = []
    for line, (b, c) in tested.items():  # in ms, not log ms: a line new in the candidate has no time in the baseline
        if min(len(b), len(c)) < MIN_RUNS:
            continue
        d = paired_mean_shift(b, c) if paired and len(b) == len(c) else shift(b, c)
        changes.append({"name": line, "baseline_ms": statistics.fmean(b), "candidate_ms": statistics.fmean(c),
                        "delta_ms": statistics.fmean(c) - statistics.fmean(b), "p_value": d.p_above(0.0),
                        "alpha": alpha, "slower": d.bound(alpha, upper=False) > 0})
    return sorted(changes, key=lambda c: (not c["slower"], -c["delta_ms"]))[:show]  # what the verdict names first


def _p(p: float) -> str:
    return "p < 0.001" if p < 1e-3 else "p < 0.01" if p < 0.01 else f"p = {p:.2g}"


def _where(function: str) -> str:
    """``rlperf/buffer.py:88(add)`` -> ``buffer.py:88 add()``; a builtin as cProfile names it."""
    match = re.fullmatch(r"(?:.*/)?([^/]+):(\d+)\((.+)\)", function)
    return f"{match.group(1)}:{match.group(2)} {match.group(3)}()" if match else function


def _file_function(name: str) -> tuple[str, str] | None:
    """``/src/rlperf/buffer.py:91(add)`` -> ``("buffer.py", "add")``: a line and its function's ``def`` line alike."""
    match = re.fullmatch(r"(?:.*/)?([^/]+):\d+\((.+)\)", name)
    return (match.group(1), match.group(2)) if match else None


def why_line(phases: Sequence[Mapping[str, Any]], functions: Sequence[Mapping[str, Any]],
             lines: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """``slower: push +0.41 ms per vector step (p < 0.01), buffer.py:88 add()``: the phases that got slower
    beyond the noise, the largest first, with the lines (the line sampler's, but none in a function
    cProfile's table tested and found no slower) or else the functions (cProfile's, at their ``def`` line)
    whose time grew most; ``functions``: every one tested. None when no phase got slower."""
    slower = [c for c in phases if c["slower"]]
    if not slower:
        return None
    parts = [f"{terminal_safe(c['name'])} {c['delta_ms']:+.3g} ms per vector step ({_p(c['p_value'])})" for c in slower[:3]]
    # A line of a function cProfile tested and found no slower is not named: where the two disagree, the
    # samples (a few per line and run) are the likelier to be wrong than cProfile's count of every call.
    steady = {_file_function(f["name"]) for f in functions if not f["slower"]}
    grew = [line for line in lines if line["slower"] and _file_function(line["name"]) not in steady] or [
        f for f in functions if f["slower"]]
    if grew:
        parts[0] += ", " + "; ".join(f"{terminal_safe(_where(f['name']))} {f['delta_ms']:+.3g} ms" for f in grew[:2])
    return "slower: " + "; ".join(parts)


# -- like with like -------------------------------------------------------------------------------

MEASURES = ("kind", "env.id", "env.size", "num_envs", "device", "machine", "timing", "rlperf")
"""What every record the gate compares must agree on, on both sides; ``--allow-mismatch KEY`` lifts one.
The config's knobs that change the work (``config.SECTION.KEY``) must agree within each side; across
the sides they are what a config change under review changes, and the verdict names them. ``machine``
is the CPU model, CPU count and usable CPUs: a verdict across machines measures the machines."""

_KIND = {"train": "train", "compare": "train", "sweep": "train", "replay": "train", "profile": "profile",
         "external": "external"}
"""What a record's timings are: a plain training run (whichever command ran it), a run under the
profilers (cProfile stretches every Python call), or a user's own loop (``rlperf.PhaseTimer``)."""

NOT_WORK = frozenset({
    "run.seed", "run.device", "run.timing",  # the seed changes the draws, not the work; the others are MEASURES
    "env.id", "env.size", "env.num_envs",
    "train.episodes", "train.steps", "train.score_targets", "train.checkpoint", "train.tensorboard",
    "async.stall_timeout_s", "async.restart_actors",
})
"""Config keys that do not change the work of a vector step, or are compared as :data:`MEASURES`."""


_IDENTITY = re.compile(
    r"(?:.*_)?seeds?|(?:run|exp|experiment|wandb_run)_?(?:name|id)|wandb_.*|timestamp|date|started_at|"
    r"out|output|(?:out|output|log|save|checkpoint|ckpt|tensorboard|tb|video|model)_?(?:dir|path|folder)|tensorboard_log",
    re.IGNORECASE)
"""The last part of a config key that names a run rather than its work (a seed, a run or experiment name,
a tracker's fields, a time, a folder to write to): a script's repeats differ in these (CleanRL's ``args``
hold ``seed`` and ``exp_name``), so they are not compared."""


def _identity(key: str) -> bool:
    return _IDENTITY.fullmatch(key.rpartition(".")[2]) is not None


def _shown(value: Any) -> str:
    if value is None:
        return "unknown"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _flat(table: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """``(dotted key, leaf)`` of a nested table, iteratively (a record's config can be anything)."""
    stack: list[tuple[str, Any]] = [(str(k), v) for k, v in table.items()]
    while stack:
        key, value = stack.pop()
        if isinstance(value, Mapping) and value:
            stack.extend((f"{key}.{k}", v) for k, v in value.items())
        else:
            yield key, value


def measures(record: Mapping[str, Any], config_only: bool = False) -> dict[str, str]:
    """What a record measured, as text by key: :data:`MEASURES`, then its config's work knobs.
    ``config_only``: the record of a config not run yet (no device or timing mode known)."""
    def table(node: Any) -> Mapping[str, Any]:
        return node if isinstance(node, Mapping) else {}

    config = table(record.get("config"))
    env, totals, system = table(config.get("env")), table(record.get("totals")), table(record.get("system"))
    kind = record.get("kind")
    out = {
        "kind": _KIND.get(kind, _shown(kind)) if isinstance(kind, str) else _shown(kind),
        "env.id": _shown(env.get("id")),
        "env.size": _shown(env.get("size")),
        "num_envs": _shown(totals.get("num_envs", env.get("num_envs"))),
        "device": _shown(system.get("device")),
        "machine": machine_text(system),
        "timing": _shown(table(record.get("timing")).get("mode")),
        "rlperf": _shown(system.get("rlperf")),
    }
    if config_only:
        del out["device"], out["timing"]
    asynchronous = table(config.get("run")).get("mode") == "async"
    for key, value in sorted(_flat(config)):
        if key not in NOT_WORK and not _identity(key) and (asynchronous or not key.startswith("async.")):
            out[f"config.{key}"] = _shown(value)
    return out


def check_allowed(keys: Sequence[str]) -> list[str]:
    """``--allow-mismatch`` keys: one of :data:`MEASURES`, ``config`` or ``config.SECTION[.KEY]``."""
    for key in keys:
        if key not in MEASURES and key != "config" and not key.startswith("config."):
            raise RlperfError(f"unknown --allow-mismatch key {key!r}",
                              hint=f"use {', '.join(MEASURES)}, config or config.SECTION.KEY")
    return list(keys)


def _allowed(key: str, allow: Collection[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allow)


def _differences(runs: Sequence[tuple[str, str, Mapping[str, str]]], keys: Iterable[str]) -> list[str]:
    """``key (value in run, run; value in run)`` for each of ``keys`` the runs disagree on
    (``runs``: side, name, measures; a run without the key is not compared on it)."""
    out = []
    for key in keys:
        seen: dict[str, list[str]] = {}
        for side, name, m in runs:
            if key in m:
                seen.setdefault(m[key], []).append(f"{side} {name}")
        if len(seen) > 1:
            where = "; ".join(f"{value} in {', '.join(names[:2])}{' …' if len(names) > 2 else ''}"
                              for value, names in seen.items())
            out.append(terminal_safe(f"{key} ({where})"))  # a record's value may hold a newline: one line
    return out


def check_like_with_like(sides: Mapping[str, Sequence[tuple[str, Mapping[str, str]]]],
                         allow: Collection[str] = ()) -> list[str]:
    """Refuse records that do not measure the same thing (one line naming the keys); ``sides``:
    side -> [(run name, :func:`measures`)]. Returns the config knobs the two sides differ in
    (a config change under review), one ``key: value vs value`` each."""
    every = [(side, name, m) for side, runs in sides.items() for name, m in runs]
    keys = list(dict.fromkeys(k for _, _, m in every for k in m))
    problems = _differences(every, [k for k in MEASURES if k in keys and not _allowed(k, allow)])
    for side, runs in sides.items():
        config_keys = [k for k in keys if k not in MEASURES and not _allowed(k, allow)]
        problems += [f"{p} within the {side}" for p in _differences([(side, n, m) for n, m in runs], config_keys)]
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        first = problems[0].split(" (", 1)[0]
        raise RlperfError(f"the records do not measure the same thing: {shown}",
                          hint=f"gate like with like, or pass --allow-mismatch {first} to compare them anyway")
    changed = []
    for key in keys:
        if key in MEASURES:
            continue
        values = {side: {m[key] for _, m in runs if key in m} for side, runs in sides.items()}
        if all(len(v) == 1 for v in values.values()) and len(set().union(*values.values())) > 1:
            changed.append(f"{key}: " + " vs ".join(next(iter(v)) for v in values.values()))
    return changed


def check_sources(baseline: Sequence[Any], candidate: Sequence[Any], allow: Collection[str] = ()) -> list[str]:
    """:func:`check_like_with_like` before anything runs: records as they are, a config as what it
    will run (its device and timing mode are known once it ran; they are checked then)."""
    from rlperf import __version__
    from rlperf.config import config_to_dict
    from rlperf.system import machine

    def measured(s: Any) -> tuple[str, dict[str, str]]:
        if s.config is None:
            return str(s.record.get("name") or s.origin), measures(s.record)
        record = {"kind": "compare", "config": config_to_dict(s.config), "system": {"rlperf": __version__, **machine()}}
        return f"{Path(s.origin).name} (config)", measures(record, config_only=True)

    return check_like_with_like({"baseline": [measured(s) for s in baseline],
                                 "candidate": [measured(s) for s in candidate]}, allow)


def check_duplicates(sources: Sequence[Any]) -> None:
    """Refuse a run given twice: the same file, a copy of it, or the same run's record on both sides."""
    seen: dict[tuple[str, ...], Any] = {}
    for s in sources:
        if s.record is None:
            continue
        r = s.record
        keys: list[tuple[str, ...]] = [("file", str(Path(s.file).resolve()))] if s.file is not None else []
        if r.get("started_at"):
            system = r.get("system") or {}
            keys.append(("run", str(r["started_at"]), str(system.get("hostname")), str(r.get("run_dir") or r.get("name"))))
        keys.append(("content", hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest()))
        timer = (r.get("timing") or {}).get("timer_id")
        if isinstance(timer, str) and timer:
            # one PhaseTimer's records: the one the script saved and the one rlperf profile wrote around it
            keys.append(("timer", timer))
        for key in keys:
            other = seen.get(key)
            if other is not None:
                how = {"file": "the same file", "content": "the same record", "run": "the same run",
                       "timer": "the same run"}[key[0]]
                where = (f"both in the {s.label}" if other.label == s.label else "on both sides")
                why = (": one PhaseTimer's two records (e.g. the one the script saved and the one rlperf profile "
                       "wrote of it)" if key[0] == "timer" else "")
                raise RlperfError(f"{other.origin} and {s.origin} are {how}, {where}{why}",
                                  hint="each run counts once: pass every record once, and none on both sides")
            seen[key] = s
