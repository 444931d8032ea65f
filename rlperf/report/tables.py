"""Rich renderers for run data: pure functions from records to tables and text.

Nothing here computes a metric; every number comes from a run record (:mod:`rlperf.run.record`) or a
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

from rlperf.report import units
from rlperf.report.stats import GROWTH_NOTED, episode_split, training_start
from rlperf.report.units import MISSING
from rlperf.score import NOT_REACHED, target_key, time_to, tracked_targets
from rlperf.timers import PHASES



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
            units.fixed(p.get("total_s"), 3),
            units.percent(p.get("share")),
            units.count(p.get("calls")),
            units.ms(p.get("mean_ms")) if called else MISSING,
            units.ms(p.get("p50_ms")) if called else MISSING,
            units.ms(p.get("p95_ms")) if called else MISSING,
        )
    totals = [phases[n].get("total_s") for n in names]
    calls = [phases[n].get("calls") for n in names]
    table.add_section()
    table.add_row(
        "total",
        units.fixed(sum(t for t in totals if t is not None), 3) if names else MISSING,
        units.percent(1.0) if any(totals) else MISSING,
        units.count(sum(c for c in calls if c is not None)) if names else MISSING,
        "",
        "",
        "",
        style="bold",
    )
    return safe_table(table)  # phase names are a user's own when the record is a script's


def summary_table(record: Mapping[str, Any], title: str | None = "summary") -> Table:
    """The headline numbers of a run: work done, rates, learning, memory."""
    totals = record.get("totals") or {}
    throughput = record.get("throughput") or {}
    learning = record.get("learning") or {}
    memory = record.get("memory") or {}
    caption = None
    if totals.get("warmup_s") is not None:
        caption = f"rates exclude {units.duration(totals['warmup_s'])} of warm-up"
        if (record.get("timing") or {}).get("measured_steps") == 0:  # rlperf.run.lifecycle.sync_record
            caption = "every step was warm-up: rates are over the whole run"
    table = Table(title=title, caption=caption, show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("status", record["status"])] if record.get("status") else []
    rows += [
        ("episodes", units.count(totals.get("episodes"))),
        ("env steps", units.count(totals.get("env_steps"))),
        ("updates", units.count(totals.get("updates"))),
        ("wall time", units.duration(totals.get("wall_s"))),
        ("env steps/s", units.rate(throughput.get("env_steps_per_s"))),
        ("updates/s", units.rate(throughput.get("updates_per_s"))),
        ("replay ratio", units.general(throughput.get("replay_ratio"))),
        ("steps per episode", units.fixed(learning.get("mean_episode_length"), 1)),
        ("s / 1000 env steps", units.general(throughput.get("s_per_1000_env_steps"))),
        ("s / 1000 episodes", units.general(throughput.get("s_per_1000_episodes"))),
        ("mean score (last 100)", units.fixed(learning.get("mean_score_last_100"), 2)),
        ("best score", units.general(learning.get("best_score"))),
        *((f"time to score {target_key(t)}", _time_to_cell(record, t)) for t in tracked_targets([record])),
        ("peak RSS", units.megabytes(memory.get("peak_rss_mb"))),
        ("peak CUDA memory", units.megabytes(memory.get("peak_cuda_mb"))),
    ]
    env = record.get("env") or {}
    if env.get("kernel"):
        # A fallback says why; a kernel that ran as asked needs no explanation.
        fallback = str(env.get("reason") or "").startswith("auto:") and env["kernel"] == "ops"
        rows.append(("env kernel", f"{env['kernel']} ({env['reason'].removeprefix('auto: ')})" if fallback else env["kernel"]))
    update = record.get("update") or {}
    if update.get("form"):
        fallback = str(update.get("reason") or "").startswith("auto:") and update["form"] == "torch"
        rows.append(("update", f"torch ({update['reason'].removeprefix('auto: ')})" if fallback else update["form"]))
    for label, value in rows:
        table.add_row(label, value)
    return safe_table(table)


def _time_to_cell(record: Mapping[str, Any], target: float) -> str:
    """``12.3 s (51,200 env steps)`` or ``not reached``: the measured wall time (warm-up excluded)."""
    hit = time_to(record, target)
    if hit is None or not hit[0]:
        return NOT_REACHED
    steps = time_to(record, target, "env_steps")
    return f"{units.duration(hit[1])} ({units.count(steps[1] if steps else None)} env steps)"


def episode_growth_line(record: Mapping[str, Any]) -> str | None:
    """Time per episode split into steps per episode × time per env step, first to last quarter of
    the run, when it grew by :data:`GROWTH_NOTED` or more (docs/bottlenecks.md §19); else None."""
    split = episode_split(record.get("intervals") or [], start_env_steps=training_start(record))
    if split is None or split["growth"]["s_per_episode"] < GROWTH_NOTED:
        return None
    return growth_text(split) + " (docs/bottlenecks.md §19, rlperf explain 19)"


def growth_text(split: Mapping[str, Any]) -> str:
    """One sentence: how much time per episode grew, its two factors, and which of them grew."""
    a, b, g = split["first"], split["last"], split["growth"]
    lengths, per_step = g["steps_per_episode"], g["s_per_env_step"]
    cause = ("the episodes got longer while the cost per env step did not grow: the agent survives longer, the loop "
             "did not slow down" if per_step < 1.2 else
             "each env step got slower" + (", and the episodes longer" if lengths >= 1.2 else ""))
    after = f" after its first {split['from_env_steps']:,} env steps (fill, warm-up)" if split["from_env_steps"] else ""
    return (f"time per episode grew {g['s_per_episode']:.1f}× from the first to the last quarter of the run{after} "
            f"= steps per "
            f"episode ×{lengths:.2f} ({a['steps_per_episode']:.1f} → {b['steps_per_episode']:.1f}) × time per env step "
            f"×{per_step:.2f} ({1e6 * a['s_per_env_step']:.1f} → {1e6 * b['s_per_env_step']:.1f} µs): {cause}")


def _safe(value: Any) -> Any:
    """A cell, title or header as rich should draw it: text shown as it is (never read as markup:
    a record named ``[/]`` is a name, not a closing tag), control characters escaped."""
    if isinstance(value, str):
        return Text(units.terminal_safe(value))
    if isinstance(value, Text) and units.terminal_safe(value.plain) != value.plain:
        return Text(units.terminal_safe(value.plain), style=value.style)
    return value


def safe_table(table: Table) -> Table:
    """``table`` with every string in it made safe for a terminal (:func:`_safe`), in place.

    Tables carry names from records, configs and command lines in their titles, headers and cells;
    doing it here, where every table is printed, covers them all."""
    table.title, table.caption = _safe(table.title), _safe(table.caption)
    for column in table.columns:
        column.header, column.footer = _safe(column.header), _safe(column.footer)
        column._cells[:] = [_safe(cell) for cell in column._cells]  # rich has no public setter for a column's cells
    return table


def print_table(table: Table) -> None:
    """Print to stdout, every string escaped (:func:`safe_table`); on a pipe or a file, at the
    table's natural width instead of truncating to 80."""
    safe_table(table)
    stdout_console().print(table)


class _PipeConsole(Console):
    """Stdout off a terminal (a pipe, a file, CI's log): rich would fit every table to 80 columns
    and split names across lines (``_update_fuse`` / ``d)``); here each table gets its natural width."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for thing in objects:
            if isinstance(thing, Table):
                natural = self.measure(thing, options=self.options.update_width(10_000)).maximum
                self.width = max(self.width, natural)
        super().print(*objects, **kwargs)


def stdout_console() -> Console:
    """The console for a command's output on stdout: a terminal's width on a terminal; elsewhere
    tables at their natural width (:class:`_PipeConsole`)."""
    console = Console()
    return console if console.is_terminal else _PipeConsole()


def quiet_line(record: Mapping[str, Any]) -> str:
    """A finished run in one line, all that ``--quiet`` prints: status, where, work and rate, the
    learning, and (a profile) the advisor's first finding."""
    totals, throughput = record.get("totals") or {}, record.get("throughput") or {}
    learning = record.get("learning") or {}
    figures = [f"{units.count(totals.get('env_steps'))} env steps"]
    if totals.get("episodes") is not None:
        figures.append(f"{units.count(totals['episodes'])} episodes")
    if totals.get("wall_s") is not None:
        figures.append(f"in {units.duration(totals['wall_s'])}")
    if throughput.get("env_steps_per_s"):
        figures.append(f"{units.rate(throughput['env_steps_per_s'])} env steps/s")
    if learning.get("mean_score_last_100") is not None:
        figures.append(f"mean score {units.fixed(learning['mean_score_last_100'], 2)}")
    line = f"run {record.get('name', '')}: {record.get('status', '?')} -> {record.get('run_dir', '')}"
    if record.get("error"):
        line += f" ({record['error']})"
    line += f": {', '.join(figures)}"
    advisor = (record.get("profile") or {}).get("advisor")
    if isinstance(advisor, Mapping):
        findings = advisor.get("findings") or []
        line += f"; first finding: {findings[0].get('title')}" if findings else "; no finding"
    return " ".join(line.split())


def compare_quiet_line(comparison: Mapping[str, Any]) -> str:
    """A comparison in one line (``--quiet``): each run's env steps/s and its speed-up over the first."""
    rate = next((r for r in comparison.get("rows") or [] if r.get("metric") == "env_steps_per_s"), None)
    runs = comparison.get("runs") or []
    parts = []
    for i, run in enumerate(runs):
        cell = (rate or {}).get("cells", [None] * len(runs))[i] if rate else None
        text = f"{run.get('label')} {units.rate(cell['median'])} env steps/s" if cell else f"{run.get('label')} –"
        ratio = rate["ratios"][i - 1] if rate and i else None
        if ratio and ratio.get("value") is not None:
            text += f" ({ratio['value']:.3g}×)"
        parts.append(text)
    return "compare: " + "; ".join(parts)
