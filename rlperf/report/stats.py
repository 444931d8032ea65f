"""Statistics shared by compare, sweep and the CI gate: median and spread of repeated runs.

A column of repeats is summarised as its median and half its min–max range (as
``torch.utils.benchmark`` reports medians and interquartile ranges, with fewer samples here); two
columns whose ranges overlap differ by less than the noise.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

SPREAD_RULE = "median ± half the min–max range"


def is_number(x: Any) -> TypeGuard[int | float]:
    """A finite int or float (not a bool, not NaN or inf)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Summary:
    """A column's samples of one metric: median and spread (half the min–max range)."""

    samples: tuple[float, ...]
    median: float
    spread: float
    lo: float
    hi: float

    @property
    def n(self) -> int:
        return len(self.samples)

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "spread": self.spread, "min": self.lo, "max": self.hi, "n": self.n,
                "samples": list(self.samples)}


def summarize(samples: Sequence[float | None]) -> Summary | None:
    """Median and spread of the numeric samples; None when there are none."""
    xs = tuple(float(x) for x in samples if is_number(x))
    if not xs:
        return None
    lo, hi = min(xs), max(xs)
    return Summary(xs, statistics.median(xs), (hi - lo) / 2, lo, hi)


def overlaps(a: Summary, b: Summary) -> bool:
    """Whether two columns' min–max ranges overlap: their difference is inside the noise."""
    return a.lo <= b.hi and b.lo <= a.hi


GROWTH_NOTED = 1.5
"""Time per episode that grows by this factor from the first to the last quarter of a run is explained."""


def episode_split(intervals: Sequence[Mapping[str, Any]], parts: int = 4, start_env_steps: int = 0) -> dict[str, Any] | None:
    """Time per episode as steps per episode × time per env step, in the first and the last
    ``1/parts`` of a run's log intervals (a record's ``intervals``), and the growth of each.

    Only intervals from ``start_env_steps`` on count (the replay's fill and the warm-up run no or
    first updates: cheaper, or dearer, steps); from the start, the first interval is left out (it
    holds the start-up). None when there are too few intervals or either part has no finished episode.
    """
    rows = [r for r in intervals if is_number(r.get("env_steps")) and is_number(r.get("wall_s"))]
    spans = []
    previous: Mapping[str, Any] = {"env_steps": 0, "wall_s": 0.0}
    for r in rows:
        if previous["env_steps"] >= start_env_steps:
            spans.append({"env_steps": r["env_steps"] - previous["env_steps"], "wall_s": r["wall_s"] - previous["wall_s"],
                          "episodes": r.get("episodes") or 0,
                          "episode_steps": (r.get("episodes") or 0) * (r.get("mean_episode_length") or 0.0),
                          "end": r["env_steps"]})
        previous = r
    if start_env_steps <= 0:
        spans = spans[1:]
    if len(spans) < 2 * parts:
        return None
    start = spans[0]["end"] - spans[0]["env_steps"]
    total = spans[-1]["end"] - start
    first = [s for s in spans if s["end"] - start <= total / parts] or spans[:1]
    last = [s for s in spans if s["end"] - start > total * (parts - 1) / parts] or spans[-1:]

    def part(group: list[dict[str, float]]) -> dict[str, float] | None:
        episodes = sum(s["episodes"] for s in group)
        steps, seconds = sum(s["env_steps"] for s in group), sum(s["wall_s"] for s in group)
        if episodes <= 0 or steps <= 0 or seconds <= 0:
            return None
        per_episode = sum(s["episode_steps"] for s in group) / episodes
        return {"env_steps": steps, "episodes": episodes, "steps_per_episode": per_episode,
                "s_per_env_step": seconds / steps, "s_per_episode": per_episode * seconds / steps}

    a, b = part(first), part(last)
    if a is None or b is None:
        return None
    growth = {key: b[key] / a[key] for key in ("s_per_episode", "steps_per_episode", "s_per_env_step")}
    return {"first": a, "last": b, "growth": growth, "parts": parts, "from_env_steps": start}


def config_section(record: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A section of a record's config (``train``, ``env``...), or an empty one: a PhaseTimer record's
    config is whatever the script passed, a flat ``vars(args)`` with ``env="CartPole-v1"`` included."""
    cfg = record.get("config")
    section = cfg.get(name) if isinstance(cfg, Mapping) else None
    return section if isinstance(section, Mapping) else {}


def training_start(record: Mapping[str, Any]) -> int:
    """Env steps after which a run's loop trains steadily: the replay's fill and the timer's warm-up done."""
    train, env, buffer = (config_section(record, name) for name in ("train", "env", "buffer"))
    n = int(env.get("num_envs") or 1)
    fill = max(int(train.get("learning_starts") or 0), int(buffer.get("batch_size") or 0))
    timing = record.get("timing") or {}
    warm = int(timing.get("warmup_steps") or 0) - int(timing.get("fill_steps") or 0)
    return fill + max(warm, 0) * n


# -- intervals for the gate -----------------------------------------------------------------------


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (scipy's; ``df`` need not be a whole number, as Welch's is not)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_cdf(x: float, df: float) -> float:
    """Student's t distribution function."""
    from scipy.stats import t

    return float(t.cdf(x, df))


@dataclass(frozen=True)
class Shift:
    """The difference of two samples' means, ``mean(y) − mean(x)``, with Welch's standard error.

    ``df`` is the Welch–Satterthwaite degrees of freedom; ``sd`` each sample's standard deviation.
    With no spread at all on either side the difference is exact: ``se`` is 0 and ``df`` infinite."""

    estimate: float
    se: float
    df: float
    sd: tuple[float, float]
    n: tuple[int, int]

    def bound(self, alpha: float, upper: bool) -> float:
        """The one-sided ``1 − alpha`` confidence bound (upper or lower) of the difference."""
        half = t_quantile(1 - alpha, self.df) * self.se if self.se > 0 else 0.0
        return self.estimate + half if upper else self.estimate - half

    def p_above(self, value: float) -> float:
        """One-sided p-value of "the difference is at most ``value``" (small: it is above ``value``)."""
        if self.se == 0:
            return 0.0 if self.estimate > value else 1.0
        return 1 - t_cdf((self.estimate - value) / self.se, self.df)

    def resolution(self, alpha: float, power: float) -> float:
        """The smallest true difference this spread tells from none: found (the ``1 − alpha`` bound
        excludes 0) with probability ``power``."""
        if self.se == 0:
            return 0.0
        return (t_quantile(1 - alpha, self.df) + t_quantile(power, self.df)) * self.se

    def runs_to_decide(self, gap: float, alpha: float, most: int = 1000) -> int | None:
        """How many runs a side (both sides alike) would put the ``1 − alpha`` bound past ``gap`` from
        the estimate, if the estimate and the spreads held; None when not within ``most``."""
        var = self.sd[0] ** 2 + self.sd[1] ** 2
        if gap <= 0:
            return None
        for k in range(max(self.n), most + 1):
            df = (k - 1) if var == 0 else welch_df(self.sd[0] ** 2 / k, self.sd[1] ** 2 / k, k, k)
            if var == 0 or t_quantile(1 - alpha, df) * math.sqrt(var / k) < gap:
                return k
        return None


def welch_df(vx: float, vy: float, n: int, m: int) -> float:
    """Welch–Satterthwaite degrees of freedom from the two squared standard errors."""
    denominator = (vx * vx / (n - 1) if n > 1 else 0.0) + (vy * vy / (m - 1) if m > 1 else 0.0)
    return (vx + vy) ** 2 / denominator if denominator > 0 else math.inf


def shift(x: Sequence[float], y: Sequence[float]) -> Shift:
    """:class:`Shift` of ``y`` over ``x`` (at least 2 samples a side, for a spread)."""
    n, m = len(x), len(y)
    if n < 2 or m < 2:
        raise ValueError("a shift's spread needs at least 2 samples a side")
    sx, sy = statistics.stdev(x), statistics.stdev(y)
    vx, vy = sx * sx / n, sy * sy / m
    se = math.sqrt(vx + vy)
    return Shift(statistics.fmean(y) - statistics.fmean(x), se, welch_df(vx, vy, n, m) if se > 0 else math.inf,
                 (sx, sy), (n, m))


# -- paired runs: the signed-rank interval ---------------------------------------------------------

EXACT_PAIRS = 400
"""Up to this many pairs the signed-rank statistic's null distribution is computed exactly; beyond, its
normal approximation (with the continuity correction) is within a rounding of it."""


@functools.lru_cache(maxsize=32)
def signed_rank_cdf(n: int) -> tuple[float, ...]:
    """``P(T <= t)`` for t = 0 … n(n+1)/2, T the Wilcoxon signed-rank statistic of ``n`` pairs with no
    shift (each rank's sign a fair coin): exact up to :data:`EXACT_PAIRS`, else the normal approximation."""
    import numpy as np

    top = n * (n + 1) // 2
    if n > EXACT_PAIRS:
        mean, sd = top / 2, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        z = statistics.NormalDist()
        return tuple(z.cdf((t + 0.5 - mean) / sd) for t in range(top + 1))
    counts = np.zeros(top + 1)
    counts[0] = 1.0
    for rank in range(1, n + 1):  # each rank joins the positive sum or not
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
        counts /= 2.0
    return tuple(float(c) for c in np.minimum(np.cumsum(counts), 1.0))


@dataclass(frozen=True)
class PairedShift:
    """The shift of paired differences ``d = y − x`` (each pair run side by side): the Hodges–Lehmann
    estimate (the median of the pairs' Walsh averages) with the Wilcoxon signed-rank interval.

    Why not the mean of the differences with a t interval: a machine shared with other jobs changes
    speed in steps (one run in a pair on the slow side of a step), and such pairs are outliers that
    widen a t interval for every pair; the signed-rank interval rests on the ranks of the differences,
    so a few such pairs cost little, and it assumes no distribution beyond symmetry about the shift
    (which alternating the order inside the pairs gives a step of the machine). Same interface as
    :class:`Shift` where the gate needs one."""

    diffs: tuple[float, ...]
    walsh: tuple[float, ...]
    sd: tuple[float, float]

    @property
    def n(self) -> tuple[int, int]:
        return len(self.diffs), len(self.diffs)

    @property
    def estimate(self) -> float:
        return statistics.median(self.walsh)

    @property
    def pair_spread(self) -> float:
        """A spread of one pair's difference robust to the outlying pairs: 1.4826 × its median absolute deviation."""
        mid = statistics.median(self.diffs)
        return 1.4826 * statistics.median(abs(d - mid) for d in self.diffs)

    def _depth(self, alpha: float) -> int:
        """How many Walsh averages the ``1 − alpha`` bound leaves outside it (0: it cannot exclude anything)."""
        cdf = signed_rank_cdf(len(self.diffs))
        return bisect.bisect_right(cdf, alpha)  # the largest c with P(T <= c - 1) <= alpha

    def bound(self, alpha: float, upper: bool) -> float:
        """The one-sided ``1 − alpha`` confidence bound (±inf when too few pairs to have one)."""
        c = self._depth(alpha)
        if c == 0:
            return math.inf if upper else -math.inf
        return self.walsh[len(self.walsh) - c] if upper else self.walsh[c - 1]

    def p_above(self, value: float) -> float:
        """One-sided p-value of "the shift is at most ``value``": the chance of this many Walsh averages above it."""
        above = sum(w > value for w in self.walsh) + 0.5 * sum(w == value for w in self.walsh)
        t = math.ceil(above)
        cdf = signed_rank_cdf(len(self.diffs))
        return 1.0 if t <= 0 else max(0.0, 1.0 - cdf[t - 1])

    def _se(self) -> float:
        """The estimate's standard error as the signed-rank interval implies it (its 95% two-sided width
        over 2 × 1.96), from the pairs' robust spread where too few pairs give no interval."""
        lower, upper = self.bound(0.025, upper=False), self.bound(0.025, upper=True)
        if math.isfinite(lower) and math.isfinite(upper):
            return (upper - lower) / (2 * statistics.NormalDist().inv_cdf(0.975))
        return self.pair_spread * math.sqrt(math.pi / 3) / math.sqrt(len(self.diffs))

    def resolution(self, alpha: float, power: float) -> float:
        """The smallest true shift these pairs tell from none with probability ``power`` at ``1 − alpha``."""
        z = statistics.NormalDist()
        return (z.inv_cdf(1 - alpha) + z.inv_cdf(power)) * self._se()

    def runs_to_decide(self, gap: float, alpha: float, most: int = 1000) -> int | None:
        """How many pairs would put the ``1 − alpha`` bound past ``gap`` from the estimate, if the estimate
        and the spread held (the interval narrows as one over the root of the pairs); None beyond ``most``."""
        if gap <= 0:
            return None
        n = len(self.diffs)
        need = n * (statistics.NormalDist().inv_cdf(1 - alpha) * self._se() / gap) ** 2
        k = max(n + 1, math.ceil(need))
        return k if k <= most else None


def paired_shift(x: Sequence[float], y: Sequence[float]) -> PairedShift:
    """:class:`PairedShift` of ``y`` over ``x``, pair by pair (at least 2 pairs)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("paired samples need the same length, at least 2")
    d = [b - a for a, b in zip(x, y, strict=True)]
    walsh = sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))
    return PairedShift(tuple(d), tuple(walsh), (statistics.stdev(x), statistics.stdev(y)))


def paired_mean_shift(x: Sequence[float], y: Sequence[float]) -> Shift:
    """:class:`Shift` of ``y`` over ``x`` pair by pair: the mean difference with the paired t interval
    (no floor on its p-value from few pairs, as the signed-rank test has: 1 in 2**n)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("paired samples need the same length, at least 2")
    d = [b - a for a, b in zip(x, y, strict=True)]
    sd = statistics.stdev(d)
    se = sd / math.sqrt(len(d))
    return Shift(statistics.fmean(d), se, len(d) - 1 if se > 0 else math.inf, (statistics.stdev(x), statistics.stdev(y)),
                 (len(x), len(y)))
