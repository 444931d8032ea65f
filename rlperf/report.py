"""Rich renderers for run data: pure functions from records to tables and text.

Nothing here computes a metric; every number comes from a record section (DESIGN §4) or a
``PhaseTimer.to_dict()``: ``totals``, ``throughput``, ``phases``, ``learning``, ``memory``.
A missing value renders as "–".
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from rlperf.timers import PHASES

MISSING = "–"


def render_to_str(renderable: RenderableType, width: int = 100) -> str:
    """Render to plain text (no colour, no terminal codes): for tests, logs and ``--quiet``."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        color_system=None,
        force_terminal=False,
        no_color=True,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )
    console.print(renderable)
    return buffer.getvalue()


def ordered_phases(phases: Mapping[str, Any]) -> list[str]:
    """Phase names in loop order (:data:`PHASES`), then any others in the order given."""
    return [name for name in PHASES if name in phases] + [name for name in phases if name not in PHASES]


def phase_table(
    phases: Mapping[str, Mapping[str, Any]],
    title: str | None = None,
    timing_mode: str | None = None,
) -> Table:
    """Per-phase time: total, share of the phase total, calls, mean, p50 and p95 per call."""
    table = Table(title=title, caption=f"timing: {timing_mode}" if timing_mode else None)
    table.add_column("phase")
    for header in ("total s", "share", "calls", "mean ms", "p50 ms", "p95 ms"):
        table.add_column(header, justify="right")
    names = ordered_phases(phases)
    for name in names:
        p = phases[name]
        called = bool(p.get("calls"))
        table.add_row(
            name,
            _fixed(p.get("total_s"), 3),
            _percent(p.get("share")),
            _count(p.get("calls")),
            _ms(p.get("mean_ms")) if called else MISSING,
            _ms(p.get("p50_ms")) if called else MISSING,
            _ms(p.get("p95_ms")) if called else MISSING,
        )
    totals = [phases[n].get("total_s") for n in names]
    calls = [phases[n].get("calls") for n in names]
    table.add_section()
    table.add_row(
        "total",
        _fixed(sum(t for t in totals if t is not None), 3) if names else MISSING,
        _percent(1.0) if any(totals) else MISSING,
        _count(sum(c for c in calls if c is not None)) if names else MISSING,
        "",
        "",
        "",
        style="bold",
    )
    return table


def summary_table(record: Mapping[str, Any], title: str | None = "summary") -> Table:
    """The headline numbers of a run: work done, rates, learning, memory."""
    totals = record.get("totals") or {}
    throughput = record.get("throughput") or {}
    learning = record.get("learning") or {}
    memory = record.get("memory") or {}
    caption = None
    if totals.get("warmup_s") is not None:
        caption = f"rates exclude {_duration(totals['warmup_s'])} of warm-up"
    table = Table(title=title, caption=caption, show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("status", record["status"])] if record.get("status") else []
    rows += [
        ("episodes", _count(totals.get("episodes"))),
        ("env steps", _count(totals.get("env_steps"))),
        ("updates", _count(totals.get("updates"))),
        ("wall time", _duration(totals.get("wall_s"))),
        ("env steps/s", _rate(throughput.get("env_steps_per_s"))),
        ("updates/s", _rate(throughput.get("updates_per_s"))),
        ("replay ratio", _general(throughput.get("replay_ratio"))),
        ("mean score (last 100)", _fixed(learning.get("mean_score_last_100"), 2)),
        ("best score", _general(learning.get("best_score"))),
        ("peak RSS", _megabytes(memory.get("peak_rss_mb"))),
        ("peak CUDA memory", _megabytes(memory.get("peak_cuda_mb"))),
    ]
    for label, value in rows:
        table.add_row(label, value)
    return table


def phase_shares_text(phases: Mapping[str, Mapping[str, Any]]) -> Text:
    """One line of phase shares for a live dashboard: ``select 12% · step 30% · ...``."""
    text = Text()
    for i, name in enumerate(ordered_phases(phases)):
        if i:
            text.append(" · ", style="dim")
        text.append(name, style="bold")
        text.append(f" {_percent(phases[name].get('share'))}")
    return text


# -- number formats (one place, so every table reads the same) ----------------------------------


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # NaN is missing


def _count(x: Any) -> str:
    return f"{int(x):,}" if _is_number(x) else MISSING


def _fixed(x: Any, digits: int) -> str:
    return f"{x:,.{digits}f}" if _is_number(x) else MISSING


def _general(x: Any) -> str:
    if not _is_number(x):
        return MISSING
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.3g}"


def _percent(x: Any) -> str:
    return f"{100 * x:.1f}%" if _is_number(x) else MISSING


def _ms(x: Any) -> str:
    """Milliseconds with about three significant digits, never in exponent form."""
    if not _is_number(x):
        return MISSING
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _rate(x: Any) -> str:
    """Per-second rates: exact below ten thousand, then in k / M / G with three digits."""
    if not _is_number(x):
        return MISSING
    for threshold, scale, unit in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(x) >= threshold:
            return f"{x / scale:.3g} {unit}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _duration(x: Any) -> str:
    if not _is_number(x):
        return MISSING
    if x < 60:
        return f"{x:.1f} s"
    minutes, seconds = divmod(x, 60)
    if minutes < 60:
        return f"{int(minutes)}m {seconds:04.1f}s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)}h {int(minutes):02d}m {seconds:02.0f}s"


def _megabytes(x: Any) -> str:
    if not _is_number(x):
        return MISSING
    return f"{x / 1024:.2f} GiB" if x >= 10 * 1024 else f"{x:,.1f} MiB"
