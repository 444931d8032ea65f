"""The CI gate's verdicts on this machine: identical code, planted slowdowns, and whether it names the phase.

    python scripts/bench_gate.py [--config ci] [--steps 8000] [--repeats 5] [--max-repeats 15] [--trials 20]
                                 [--threshold 5] [--kinds identical,step:0.10,step:0.10/4,push:0.10]
                                 [--metric step-p25+mean] [--json] [--out FILE] [--quick]

Each trial is one verdict of the gate running both sides itself, as ``rlperf compare CONFIG --candidate
CONFIG --fail-if-slower 5%`` does: ``--repeats`` runs a side, interleaved (baseline, candidate, ...),
then one more interleaved pair at a time while the verdict is INCONCLUSIVE, up to ``--max-repeats``
(``--max-repeats`` equal to ``--repeats``: fixed repeats, the records form). Kinds, alternated trial
by trial so that the machine's state falls on all of them:

- ``identical``: the same config on both sides. A FAIL is a false alarm (target: none); INCONCLUSIVE
  is counted apart.
- ``step:F`` (``step:F/N``): after the candidate's every (every N-th) vector step, F (N × F) × the
  step's own CPU time in more CPU work (a spin on the thread's CPU clock): on a machine it has to
  itself ``(1 + F)`` × the baseline's time per env step, made of work as a regression in the code would
  be. ``/4`` is a cost on one step in four, which the p25 step does not see.
- ``push:F``: the same work inside the replay push (the push phase): the verdict should name push.

Both sides run the same instruments (a clock read per step costs as much as a small plant on a VM);
only the candidate's do the planted work.

For the planted kinds a FAIL is a detection (target at 10% and above, 5% gate: no PASS, FAIL ≥ 95%).
Each verdict's printed detectable slowdown is kept, and from it (with adaptive repeats: its figure at
``--max-repeats`` pairs, which the gate also prints) the FAIL rate the gate's own figure predicts at the
planted size (normal approximation), beside the observed one. ``--quick`` runs 2
trials of two kinds on short runs (for the test suite; its rates mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchutil import emit, machine_info, machine_line

from rlperf.buffer import ReplayBuffer
from rlperf.config import config_from
from rlperf.experiments import gate
from rlperf.experiments.compare import Source
from rlperf.run.lifecycle import RunHooks, train_run


class Plant:
    """A compare runner that adds ``fraction`` × each of the candidate's vector steps' own CPU time in
    more CPU work, after the step (``where="step"``) or inside the replay push (``"push"``); ``every``:
    on every ``every``-th step only, ``every`` × as much."""

    def __init__(self, where: str, fraction: float, every: int = 1) -> None:
        self.where, self.planted, self.every = where, fraction, every
        self.fraction = fraction
        self.own = 0.0  # CPU seconds of the last vector step, the planted work left out
        self.spent = 0.0
        self.count = 0
        self.last = 0.0

    def spin(self) -> None:
        # Sized and spent in this thread's CPU time, not wall time: on a loaded machine wall time
        # includes waiting for a CPU; this is work, as a regression in the code would be. Each step
        # gets its own time × fraction (push: the last step's), so every step, its p25 and its mean
        # take (1 + fraction) × as long. The first two steps' time is the run's set-up: nothing then.
        if self.count < 3 or self.count % self.every:
            return
        start = time.thread_time()
        end = start + self.every * self.fraction * self.own
        while time.thread_time() < end:
            pass
        self.spent += time.thread_time() - start

    def on_step(self) -> None:
        now = time.thread_time()
        self.own = now - self.last - self.spent
        self.count += 1
        if self.where == "step":
            self.spent = 0.0
            self.spin()
        self.last, self.spent = time.thread_time(), 0.0

    @contextlib.contextmanager
    def in_push(self, cfg: Any) -> Iterator[None]:
        """The buffer's push method (the config's form) with the planted work after it."""
        name = "_push_loop" if cfg.buffer.push == "loop" else "_push_batch"
        original = getattr(ReplayBuffer, name)

        def push(buffer: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(buffer, *args, **kwargs)
            self.spin()
            return out

        setattr(ReplayBuffer, name, push)
        try:
            yield
        finally:
            setattr(ReplayBuffer, name, original)

    def __call__(self, label: str, cfg: Any, **kwargs: Any) -> Any:
        # Both sides run the same instruments (their clock reads cost as much as a small plant on a VM);
        # only the candidate's do the planted work.
        self.fraction = self.planted if label == "candidate" else 0.0
        self.count, self.spent, self.own, self.last = 0, 0.0, 0.0, time.thread_time()
        with self.in_push(cfg) if self.where == "push" else contextlib.nullcontext():
            return train_run(cfg, hooks=RunHooks(on_step=self.on_step), **kwargs)


def parse_kind(kind: str) -> tuple[str, float, int]:
    """``identical`` -> ("identical", 0, 1); ``step:0.10/4`` -> ("step", 0.10, 4)."""
    if kind == "identical":
        return "step", 0.0, 1
    where, _, size = kind.partition(":")
    fraction, _, every = size.partition("/")
    if where not in ("step", "push"):
        raise SystemExit(f"unknown kind {kind!r}: identical, step:F[/N] or push:F")
    return where, float(fraction), int(every or 1)


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact binomial confidence interval for k successes in n trials (by bisection on the CDF)."""

    def cdf(p: float, upto: int) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(upto + 1))

    def solve(f: Any) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: 1 - cdf(p, k - 1) < alpha / 2)
    upper = 1.0 if k == n else solve(lambda p: cdf(p, k) > alpha / 2)
    return lower, upper


def predicted_fail(v: dict[str, Any], planted: float) -> float:
    """The chance of a FAIL at a true slowdown ``planted`` that the verdict's own detectable figure
    implies: its standard error is the figure over (z at the confidence + z at the power)."""
    z = statistics.NormalDist()
    checks = max(len(v.get("checks") or {}), 1)
    z_fail = z.inv_cdf(1 - gate.ALPHA / checks)
    # adaptive repeats: what the verdict could reach at --max-repeats pairs (it may stop sooner, deciding)
    se = math.log1p((v.get("reach") or v)["detectable_slowdown"]) / (z_fail + z.inv_cdf(gate.POWER))
    if se == 0:
        return float(planted > v["threshold"])
    return z.cdf((math.log1p(planted) - math.log1p(v["threshold"])) / se - z_fail)


def one_verdict(cfg: Any, repeats: int, most: int, threshold: float, metric: str, runner: Any,
                out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    sides = [[Source(label, f"{label} config", config=cfg)] for label in ("baseline", "candidate")]

    def undecided(base: Any, cand: Any) -> bool:
        return gate.result(base, cand, threshold, metric, paired=True, adaptive=most > repeats)[0]["verdict"] == "inconclusive"

    base, cand, _ = gate.gather(sides[0], sides[1], repeats, metric, max_repeats=most, undecided=undecided,
                                runner=runner, out=out)
    v, _samples = gate.result(base, cand, threshold, metric, paired=True, adaptive=most > repeats)
    v.pop("comparison")
    if most > repeats:
        gate.add_reach(v, most)
    v["wall_s"] = time.perf_counter() - started
    return v


def summary(kind: str, vs: list[dict[str, Any]]) -> dict[str, Any]:
    where, fraction, _every = parse_kind(kind)
    where = "identical" if kind == "identical" else where
    counts = {o: sum(v["verdict"] == o for v in vs) for o in gate.EXIT_CODES}
    lo, hi = clopper_pearson(counts["fail"], len(vs))
    out: dict[str, Any] = {
        **counts, "trials": len(vs), "fail_rate": counts["fail"] / len(vs), "fail_rate_ci95": [lo, hi],
        "slowdown_median": statistics.median(v["slowdown"] for v in vs if v["slowdown"] is not None),
        "slowdowns": [v["slowdown"] for v in vs], "verdicts": [v["verdict"] for v in vs],
        "runs_a_side": [v["n"][1] for v in vs], "detectable": [v["detectable_slowdown"] for v in vs],
        "detectable_at_max": [(v.get("reach") or v)["detectable_slowdown"] for v in vs],
        "detectable_median": statistics.median(v["detectable_slowdown"] for v in vs),
        "fails_above_median": statistics.median(v["fails_above"] for v in vs),
        "wall_s_per_verdict": statistics.median(v["wall_s"] for v in vs),
    }
    if where != "identical":
        out["predicted_fail_rate"] = statistics.fmean(predicted_fail(v, fraction) for v in vs)
    first = [v["phases"][0]["name"] if v["phases"] and v["phases"][0]["slower"] else None for v in vs]
    out["named_phase"] = first
    if where == "push":
        out["named_push"] = sum(name == "push" for name in first) / len(vs)
    return out


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The options every gate benchmark takes: the gate's threshold, a quick run, where results go."""
    parser.add_argument("--threshold", type=float, default=5.0, help="--fail-if-slower, in percent")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="ci")
    parser.add_argument("--steps", type=int, default=8000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=gate.DEFAULT_REPEATS, help="runs a side to start with")
    parser.add_argument("--max-repeats", type=int, default=gate.DEFAULT_MAX_REPEATS,
                        help="runs a side while inconclusive (= --repeats: fixed repeats)")
    parser.add_argument("--trials", type=int, default=20, help="verdicts of each kind")
    parser.add_argument("--kinds", default="identical,step:0.075,step:0.10,step:0.15,step:0.075/4,step:0.10/4,"
                                           "step:0.15/4,push:0.10")
    parser.add_argument("--metric", default=gate.DEFAULT_METRIC, choices=gate.METRICS)
    parser.add_argument("--threads", type=int, default=1, help="run.threads of every run")
    add_common_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.max_repeats, args.trials, args.kinds = 640, 3, 4, 2, "identical,push:0.15"
    cfg = config_from(args.config, [f"run.threads={args.threads}", "train.checkpoint=false"], steps=args.steps)
    threshold = args.threshold / 100
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    runners = {k: Plant(*parse_kind(k)) for k in kinds}
    verdicts: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}

    def results() -> dict[str, Any]:
        return {
            "machine": machine_info(),
            "settings": {"config": args.config, "steps": args.steps, "repeats": args.repeats,
                         "max_repeats": args.max_repeats, "trials": len(verdicts[kinds[-1]]), "threshold": threshold,
                         "kinds": kinds, "metric": args.metric, "threads": args.threads},
            "test": gate.TEST_PAIRED,
            "kinds": {k: summary(k, vs) for k, vs in verdicts.items() if vs},
        }

    with tempfile.TemporaryDirectory(prefix="rlperf-gate-") as tmp:
        for trial in range(args.trials):
            for kind in kinds:
                v = one_verdict(cfg, args.repeats, args.max_repeats, threshold, args.metric, runners[kind],
                                Path(tmp) / f"{kind.replace(':', '_').replace('/', '_')}{trial}")
                verdicts[kind].append(v)
                if not args.json:
                    named = v["phases"][0]["name"] if v["phases"] and v["phases"][0]["slower"] else "-"
                    print(f"{kind:13s} trial {trial + 1:2d}: {v['verdict']:12s} slowdown {100 * v['slowdown']:+6.1f}% "
                          f"detectable {100 * v['detectable_slowdown']:4.1f}% runs {v['n'][1]:2d} named {named:6s} "
                          f"({v['wall_s']:.1f} s)", flush=True)
            if args.out:  # after every round: a bench cut short keeps what it measured
                emit(results(), args.out, False)
    final = results()
    if emit(final, args.out, args.json):
        return
    print(f"\n{machine_line(final['machine'], args.threads)}")
    print(f"{args.config} config, {args.steps:,} env steps a run, {args.repeats} to {args.max_repeats} runs a side, "
          f"threshold {args.threshold:g}%, metric {args.metric}")
    for kind, r in final["kinds"].items():
        predicted = f", predicted {100 * r['predicted_fail_rate']:.0f}%" if "predicted_fail_rate" in r else ""
        named = f", push named {100 * r['named_push']:.0f}%" if "named_push" in r else ""
        print(f"{kind:13s} FAIL {r['fail']}/{r['trials']} (95% CI {100 * r['fail_rate_ci95'][0]:.0f}–"
              f"{100 * r['fail_rate_ci95'][1]:.0f}%{predicted}), PASS {r['pass']}, INCONCLUSIVE {r['inconclusive']}; "
              f"median slowdown {100 * r['slowdown_median']:+.1f}%, detectable {100 * r['detectable_median']:.1f}%, "
              f"median runs a side {statistics.median(r['runs_a_side']):g}{named}, {r['wall_s_per_verdict']:.1f} s a verdict")


if __name__ == "__main__":
    main()
