"""The CI gate: is a candidate slower than its baseline by more than a threshold, beyond the noise?

``rlperf compare BASELINE --candidate CANDIDATE --fail-if-slower 5%`` exits 1 only then, 0
otherwise (2 on bad input). Each side is a config run now (``--repeats`` times, interleaved with
the other side when both are configs) or run records (``rlperf train``/``profile``/``compare``
runs, or ``kind: "external"`` records written by :class:`rlperf.PhaseTimer`).

**The metrics.** By default (``step-p25+mean``) two, each tested at p < 0.025 so that the gate's
false alarms stay below 5%: the time per env step at the 25th percentile of a run's vector steps
(``timing.vector_step.p25_ms`` over env steps per vector step) and at their mean less the time
the loop's thread waited for a CPU that other processes held (``mean_less_wait_ms``, Linux's
run-queue wait: see :mod:`rlperf.timers`); the gate fails when either is slower. Other processes
on a shared machine stretch steps, never shorten them, so the fastest quarter of the steps is
where the code's own cost shows: on the 2-core box BENCHMARKS.md describes, ten identical runs varied
by ±1% at the p25 step, ±4% at the median step and ±20% in mean throughput. But a cost that lands on
fewer than three steps in four (an update every fourth step, a periodic log or checkpoint, a GC
pause) does not move the p25, and the mean does: less its CPU waits it held ±2% under a load that
put half of each step in the run queue. ``step-p25``, ``step-mean``, ``step-median`` and
``throughput`` (mean env steps/s: sees everything, needs a quiet machine or many repeats) test one
metric alone, at p < 0.05. Records without the mean (from an rlperf before it, or a machine without
per-thread schedstat) are gated on the p25 alone, and the verdict warns that it is blind to such costs.

**The test.** With ``x`` the baseline's log times per env step and ``y`` the candidate's, the
candidate is slower by more than the threshold ``t`` when ``y > x + ln(1 + t)``: it takes more than
``(1 + t)`` × the baseline's time per env step (as pytest-benchmark and asv read "5% slower"; its
throughput below ``1 / (1 + t)`` × the baseline's). The gate shifts the candidate's samples by
``ln(1 + t)`` and runs a one-sided exact Mann–Whitney U test (no assumption about the noise's distribution): exit 1
when p < 0.05 and the Hodges–Lehmann estimate of the slowdown is above ``t``. Under identical
code the chance of a false alarm is below 5% (far below, as identical code is ``t`` away from the
alternative); the verdict also gives the slowdown's 95% confidence interval (the exact interval
that inverts the same test). Interleaving the two sides' runs (A B A B ...) spreads slow drift of
the machine over both, and every run uses the config's seed: on the CPU each repeat then does
the same work step by step, so the spread is the machine's, not the workload's.

**What is compared.** Like with like: every record must agree on :data:`MEASURES` (what kind of
run, which env and size, how many boards, the device, the timing mode, the rlperf version), and
the records of one side on the config's knobs that change the work (:func:`check_like_with_like`;
``--allow-mismatch KEY`` lifts a key). A run counts once (:func:`check_duplicates`). Records were
validated when read (:mod:`rlperf.run.schema`), so the figures below come from sane numbers.

Nothing here knows about Typer; :func:`verdict` is plain data.
"""

from __future__ import annotations

import functools
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
from rlperf.report.stats import is_number
from rlperf.report.units import terminal_safe

ALPHA = 0.05
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
TEST = ("one-sided exact Mann–Whitney U test on log time per env step, the candidate's samples shifted by the "
        "threshold; fail when p < 0.05 and the Hodges–Lehmann slowdown is above the threshold")


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
    """The gate's decision on seconds per env step of each side's runs, for one metric; see the module docstring."""
    if min(len(baseline), len(candidate)) < 1 or min_p(len(baseline), len(candidate)) >= alpha:
        raise RlperfError(
            f"{len(baseline)} baseline and {len(candidate)} candidate runs cannot show a slowdown at p < {alpha:g}",
            hint="run each side at least 4 times (--repeats 5 is the default), or pass more baseline records",
        )
    x, y = [math.log(v) for v in baseline], [math.log(v) for v in candidate]
    shift = math.log1p(threshold)
    u = u_statistic(x, [b - shift for b in y])  # small when the shifted candidate is still slower
    p = u_cdf(u, len(x), len(y))
    estimate = statistics.median(b - a for a in x for b in y)
    slowdown = math.expm1(estimate)  # the candidate's time per env step over the baseline's, less 1
    interval = shift_interval(x, y)
    ci = None if interval is None else [math.expm1(interval[0]), math.expm1(interval[1])]
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


def decide(samples: Mapping[str, tuple[Sequence[float], Sequence[float]]], threshold: float,
           metric: str) -> dict[str, Any]:
    """The gate's decision over one or more single metrics (``samples``: metric -> (baseline,
    candidate) seconds per env step), each tested at ``ALPHA / len(samples)``: it fails when one
    fails. The verdict is the failing metric's (the larger slowdown if both fail; with none failing,
    the metric that shows the larger slowdown); ``checks`` holds each metric's own."""
    alpha = ALPHA / len(samples)
    checks = {m: verdict(b, c, threshold, m, alpha) for m, (b, c) in samples.items()}
    failed = [v for v in checks.values() if v["verdict"] == "fail"]
    chosen = max(failed or checks.values(), key=lambda v: v["slowdown"])
    out = dict(chosen)
    out.update(metric=metric if len(checks) > 1 else chosen["metric"], decided_by=chosen["metric"], alpha=ALPHA, checks={
        m: {k: v[k] for k in ("verdict", "slowdown", "ci95", "p_value", "alpha", "reason")} for m, v in checks.items()})
    if len(checks) > 1:
        out["test"] = TEST + f"; each of {' and '.join(checks)} at p < {alpha:g}, failing when either fails"
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def verdict_line(v: Mapping[str, Any]) -> str:
    """``gate: FAIL — ...`` for the terminal and CI logs."""
    ci = v.get("ci95")
    interval = f" (95% CI {_pct(ci[0])} to {_pct(ci[1])})" if ci else ""
    decided = v.get("decided_by", v["metric"])
    others = [f"{_DESCRIBED[m]}: {_pct(abs(c['slowdown']))} {'slower' if c['slowdown'] > 0 else 'faster'}"
              for m, c in (v.get("checks") or {}).items() if m != decided]
    also = f" (the {'; '.join(others)})" if others else ""
    return (f"gate: {v['verdict'].upper()} — {v['reason']}; slowdown {_pct(v['slowdown'])}{interval} in "
            f"{_DESCRIBED[decided]}{also}, {v['n'][0]} baseline vs {v['n'][1]} candidate runs, one-sided exact Mann–Whitney U")


# -- the two sides ------------------------------------------------------------------------------

DEFAULT_REPEATS = 5


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


def gather(baseline: list[Any], candidate: list[Any], repeats: int, metric: str, **run_kwargs: Any) -> tuple[Any, Any, bool]:
    """Run the config sides (interleaved when both are configs) and collect each side's records.

    Returns the two :class:`~rlperf.experiments.compare.Side` objects and whether a Ctrl-C cut
    the runs short. Refuses, before anything runs, a record without the gate's metric.
    """
    from rlperf.experiments.compare import Side, run_sources

    check_records(baseline + candidate, required(metric))
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


def _completed(record: Mapping[str, Any]) -> bool:
    return record.get("status", "completed") == "completed"


def samples(side: Any, metric: str) -> list[float]:
    """Seconds per env step of each of a side's completed runs."""
    values = [time_per_env_step(r, metric) for r in side.records if _completed(r)]
    return [v for v in values if v is not None]


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


# -- like with like -------------------------------------------------------------------------------

MEASURES = ("kind", "env.id", "env.size", "num_envs", "device", "timing", "rlperf")
"""What every record the gate compares must agree on, on both sides; ``--allow-mismatch KEY`` lifts one.
The config's knobs that change the work (``config.SECTION.KEY``) must agree within each side; across
the sides they are what a config change under review changes, and the verdict names them."""

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

    def measured(s: Any) -> tuple[str, dict[str, str]]:
        if s.config is None:
            return str(s.record.get("name") or s.origin), measures(s.record)
        record = {"kind": "compare", "config": config_to_dict(s.config), "system": {"rlperf": __version__}}
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
