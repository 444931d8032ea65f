"""Statistics shared by compare, sweep and the CI gate: median and spread of repeated runs.

A column of repeats is summarised as its median and half its min–max range (as
``torch.utils.benchmark`` reports medians and interquartile ranges, with fewer samples here); two
columns whose ranges overlap differ by less than the noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
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
