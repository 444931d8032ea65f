"""Number formatting for every table rlperf prints: units picked per row, digits trimmed to the noise.

Two families: :func:`pick_unit` and :func:`format_number` for columns of measured values with a
spread (compare, sweep), and the fixed formats of the single-run tables (:func:`count`,
:func:`rate`, :func:`duration`, ...). A missing value renders as :data:`MISSING` everywhere.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from rlperf.report.stats import is_number

MISSING = "–"

# C0 and C1 controls, DEL, and the bidirectional overrides and isolates (which reorder what follows).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\n``, ``\\u202e``): a
    string from a file or a command line (a record's name, a path, a phase name) cannot retitle the
    window, recolour, link or move the cursor, or break a one-line message in two. Rich markup is
    a separate matter: renderers pass such strings as :class:`rich.text.Text`, never as markup."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        text)


_UNITS: dict[str, tuple[tuple[float, str], ...]] = {
    # (scale, unit), largest first; a row takes the largest unit its smallest value reaches.
    "rate": ((1e9, "G/s"), (1e6, "M/s"), (1e3, "k/s"), (1.0, "/s")),
    "seconds": ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")),
    "memory": ((1024.0, "GiB"), (1.0, "MiB")),
    "score": ((1.0, ""),),
    "share": ((0.01, "%"),),
}


def pick_unit(kind: str, values: Sequence[float]) -> tuple[float, str]:
    """The (scale, unit) for a row of ``kind``: the largest unit in which the smallest magnitude is
    still ≥ 1 (for times, the next one up when the largest would need five digits)."""
    units = _UNITS[kind]
    magnitudes = [abs(v) for v in values if is_number(v) and v != 0]
    if not magnitudes:
        return units[-1] if kind != "seconds" else units[0]
    smallest, largest = min(magnitudes), max(magnitudes)
    for i, (scale, unit) in enumerate(units):
        if smallest >= scale:
            # Times go one unit up when the largest would need five digits (42,000 µs → 42 ms beside
            # 0.9 ms); rates read fine as 13,800 /s beside 700 /s.
            if kind == "seconds" and i > 0 and largest / scale >= 10_000:
                return units[i - 1]
            return scale, unit
    return units[-1]


def format_number(value: float, spread: float | None = None, scale: float = 1.0, signed: bool = False,
                  compact: bool = False, show_spread: bool = True) -> str:
    """``value`` (and ``± spread``) in ``scale`` units, with digits trimmed to what the spread supports.

    With a spread the last digit shown is the spread's first significant digit
    (12345 ± 234 → "12,300 ± 200") but never less than the value's own first digit (3 ± 14 → "3");
    without one, three significant digits. Never exponent form.
    ``compact`` drops the spaces around ±; ``show_spread=False`` shows only the trimmed value.
    """
    v = value / scale
    sign = "+" if signed and v > 0 else ""
    if spread is not None and spread > 0:
        s = spread / scale
        decimals = _decimals(s, 1) if v == 0 else max(_decimals(s, 1), _decimals(v, 1))
        s_shown = round(s, decimals)
        text = sign + _fixed_decimals(round(v, decimals), decimals)
        if not show_spread:
            return text
        pm = "±" if compact else " ± "
        return f"{text}{pm}{_fixed_decimals(s_shown, decimals)}"
    if v == 0:
        return "0"
    decimals = _decimals(v, 3)
    return sign + _fixed_decimals(round(v, decimals), decimals)


def _decimals(x: float, significant: int) -> int:
    """Decimal places that show ``x`` to ``significant`` digits (negative: round left of the point)."""
    decimals = significant - 1 - math.floor(math.log10(abs(x)))
    if abs(round(x, decimals)) >= 10 ** (significant - decimals):  # 0.0996 rounds up to 0.100
        decimals -= 1
    return decimals


def _fixed_decimals(x: float, decimals: int) -> str:
    text = f"{x:,.{max(decimals, 0)}f}"
    return "0" if text in ("-0", "-0.0") or re.fullmatch(r"-0\.0+", text) else text


def count(x: Any) -> str:
    return f"{int(x):,}" if is_number(x) else MISSING


def fixed(x: Any, digits: int) -> str:
    return f"{x:,.{digits}f}" if is_number(x) else MISSING


def general(x: Any) -> str:
    if not is_number(x):
        return MISSING
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.3g}"


def percent(x: Any) -> str:
    return f"{100 * x:.1f}%" if is_number(x) else MISSING


def ms(x: Any) -> str:
    """Milliseconds with about three significant digits, never in exponent form."""
    if not is_number(x):
        return MISSING
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def rate(x: Any) -> str:
    """Per-second rates: exact below ten thousand, then in k / M / G with three digits."""
    if not is_number(x):
        return MISSING
    for threshold, scale, unit in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(x) >= threshold:
            return f"{x / scale:.3g} {unit}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def duration(x: Any) -> str:
    if not is_number(x):
        return MISSING
    if x < 1:  # a tenth would print a short run as 0.0 s
        return seconds_short(x)
    if x < 60:
        return f"{x:.1f} s"
    minutes, seconds = divmod(x, 60)
    if minutes < 60:
        return f"{int(minutes)}m {seconds:04.1f}s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)}h {int(minutes):02d}m {seconds:02.0f}s"


def megabytes(x: Any) -> str:
    if not is_number(x):
        return MISSING
    return f"{x / 1024:.2f} GiB" if x >= 10 * 1024 else f"{x:,.1f} MiB"


def nbytes(n: float) -> str:
    """``1.5 GiB`` / ``12.0 MiB`` / ``3.0 KiB``: binary units, as ``free -h`` and nvidia-smi use."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def percent_short(x: float) -> str:
    """``41%``, or ``4.2%`` below ten percent."""
    return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.1f}%"


def seconds_short(x: float) -> str:
    """``3.14 s``, ``314 s`` from a hundred seconds up, and ``2.5 ms`` under 5 ms (where two decimals
    of a second would print 0.00)."""
    if 0 < x < 0.005:
        return f"{x * 1e3:.2g} ms"
    return f"{x:.2f} s" if x < 100 else f"{x:.0f} s"
