"""Plots of rlperf results, drawn headless: ``run.png`` (a run over time), ``compare.png`` (runs side
by side, and the gate's verdict) and ``sweep.png``.

Every figure is drawn from records and ``metrics.csv`` alone (never from a live run), so it can be
redrawn later from a run directory copied off a CI machine. Figures are built on
:class:`matplotlib.figure.Figure` with the Agg canvas directly, not ``pyplot``: no global backend is
touched (importing rlperf never changes the user's matplotlib setup) and the import is lighter.
The builders (:func:`run_figure`, :func:`compare_figure`) return the figure, so tests inspect its
axes before it is saved; :func:`draw` saves one and turns any failure into one warning line.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlperf.report.stats import config_section, is_number, summarize
from rlperf.timers import PHASES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANELS = (("env_steps_per_s", "env steps/s"), ("mean_score", "final mean score (last 100)"))
SIZE_PX = (1200, 800)
DPI = 100
# One colour per phase in every figure (the async learner's "wait" and a script's own names after them).
PHASE_COLORS = {"select": "#4c72b0", "step": "#55a868", "push": "#c44e52", "train": "#8172b2", "log": "#ccb974",
                "sync": "#64b5cd", "wait": "#b0b0b0"}
_OTHER_COLORS = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#ff7f0e")


def sweep_figure(summary: Sequence[Mapping[str, Any]], keys: Sequence[str],
                 data: Mapping[str, Any] | None = None) -> Figure:
    """Throughput and final score against the first swept key with more than one value, one line
    per combination of the other keys' values; error bars show the spread over repeats. With
    ``data`` (``sweep.json``'s document) a header says what was swept, how often and where; an
    ``--objective`` that is not already a panel gets its own, and the best point is starred.

    ``summary`` is :func:`rlperf.experiments.sweep.summarize_points`'s output. Numeric x values are plotted on a
    log axis when they span a factor of 10 or more (train_ratio 1, 4, 16, 64), else linearly;
    other values are categories in the order swept.
    """
    x_key = next((k for k in keys if len({_label(e["params"].get(k)) for e in summary}) > 1), keys[0] if keys else None)
    others = [k for k in keys if k != x_key]
    xs_raw = list(dict.fromkeys(_label(e["params"].get(x_key)) for e in summary)) if x_key else ["-"]
    numeric = x_key is not None and all(_number(e["params"].get(x_key)) is not None for e in summary)

    def x_of(e: Mapping[str, Any]) -> float | None:
        x_value = e["params"].get(x_key) if x_key else "-"
        return _number(x_value) if numeric else xs_raw.index(_label(x_value))

    objective = (data or {}).get("objective") or None
    panels, summary = _sweep_panels(summary, objective)
    fig = new_figure((5.5 * len(panels), 4.6 if data else 4))
    axes = fig.subplots(1, len(panels), squeeze=False)
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for e in summary:
        name = ", ".join(f"{k.split('.', 1)[-1]}={_label(e['params'].get(k))}" for k in others) or "all"
        lines.setdefault(name, []).append(e)
    markers = itertools.cycle("osD^v<>")
    for name, entries in lines.items():
        marker = next(markers)
        for ax, (column, _) in zip(axes[0], panels, strict=True):
            pts = sorted((x_of(e), e[column]["median"], e[column]["spread"] if e[column]["n"] > 1 else 0.0)
                         for e in entries if e.get(column))
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker=marker,
                            capsize=3, label=name)
            best = next((e for e in entries if e.get("rank") == 1 and e.get(column)), None)
            if best is not None:  # the objective's best point, on every panel
                ax.plot([x_of(best)], [best[column]["median"]], marker="*", markersize=16, color="#dd8452",
                        linestyle="none", zorder=5)
    values = [_number(e["params"].get(x_key)) for e in summary] if numeric else []
    _sweep_axes(axes[0], panels, x_key, values if numeric else None, xs_raw)
    if len(lines) > 1 or others:
        axes[0][-1].legend(fontsize="small")
    if data:
        fig.suptitle(_sweep_header(data, summary, objective), fontsize="medium")
    fig.tight_layout()
    return fig


def _sweep_panels(summary: Sequence[Mapping[str, Any]], objective: Mapping[str, Any] | None
                  ) -> tuple[list[tuple[str, str]], Sequence[Mapping[str, Any]]]:
    """sweep.png's panels (column, title): the objective named in its panel's title, or a panel of its
    own (the summary's entries then carry its value as a figure)."""
    panels = list(PANELS)
    if objective is None:
        return panels, summary
    column = {"final_score": "mean_score"}.get(objective["name"], objective["name"])
    title = f"objective: {objective['name']} ({objective['better']} is better)"
    if column in dict(PANELS):
        return [(c, f"{t}\n{title}" if c == column else t) for c, t in panels], summary
    return [*panels, ("objective", title)], [{**e, "objective": _objective_stat(e)} for e in summary]


def _sweep_axes(axes: Sequence[Axes], panels: Sequence[tuple[str, str]], x_key: str | None,
                values: Sequence[float | None] | None, categories: Sequence[str]) -> None:
    """Titles, labels and x ticks: numeric ``values`` on a log axis where they span 10× or more, else
    the ``categories`` in the order swept."""
    positive = [v for v in values or () if v is not None and v > 0]
    log_x = values is not None and len(positive) == len(values) and positive and max(positive) / min(positive) >= 10
    for ax, (column, title) in zip(axes, panels, strict=True):
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel(x_key or "")
        ax.grid(True, alpha=0.3)
        if values is not None:
            if log_x:
                ax.set_xscale("log")
                ax.minorticks_off()
            ticks = sorted({v for v in values if v is not None})
            if len(ticks) <= 12:  # the swept values themselves, not matplotlib's round numbers
                ax.set_xticks(ticks)
                ax.set_xticklabels([_label(t) for t in ticks])
        else:
            ax.set_xticks(range(len(categories)))
            ax.set_xticklabels(categories)
        if column == "env_steps_per_s":
            ax.set_ylim(bottom=0)


def _objective_stat(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """A point's objective value in the shape of the summary's figures (None: not reached)."""
    value = entry.get("objective")
    return {"median": value, "spread": 0.0, "n": 1} if is_number(value) else None


def _sweep_header(data: Mapping[str, Any], summary: Sequence[Mapping[str, Any]], objective: Any) -> str:
    """What was swept, how often, on what, and the best point by the objective."""
    axes = data.get("axes") or {}
    grid = " × ".join(f"{k} {', '.join(_label(v) for v in values)}" for k, values in axes.items()) or "one point"
    base = data.get("base_config") or {}
    device = (base.get("run") or {}).get("device")
    where = ", ".join(str(x) for x in (data.get("backend") and f"backend {data['backend']}",
                                        device and f"device {device}") if x)
    name = Path(str(data.get("sweep_dir") or "sweep")).name
    runs = f"{len(summary)} points × {data.get('repeats', 1)} repeat(s)"
    lines = [f"{name}: {grid}", runs + (f"; {where}" if where else "")]
    best = next((e for e in summary if e.get("rank") == 1), None)
    if objective is not None and best is not None:
        params = ", ".join(f"{k.split('.', 1)[-1]}={_label(v)}" for k, v in best["params"].items())
        value = best.get("objective")
        shown = f"{value['median']:.4g}" if isinstance(value, Mapping) else (
            f"{value:.4g}" if is_number(value) else "not reached")
        lines.append(f"best by {objective['name']}: {params} ({shown}) ★")
    return "\n".join(_wrap(line, 130) for line in lines)


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _label(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return json.dumps(x) if isinstance(x, (list, dict)) else str(x)


# -- drawing and saving -------------------------------------------------------------------------


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure on its own Agg canvas (no pyplot: no global state, nothing left open)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: str | Path, dpi: int = DPI) -> Path:
    """Write ``fig`` as a PNG, atomically (never half a PNG on a full disk)."""
    from rlperf.atomic import write_bytes_atomic

    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=dpi)
    write_bytes_atomic(path, image.getvalue())
    return Path(path)


def draw(build: Callable[[], Figure], path: str | Path) -> Path | None:
    """Build a figure and save it to ``path``; None, after one warning line on stderr, when that fails.

    A picture is never worth a failed run: no matplotlib, no usable backend, a read-only or full
    directory, or a record too damaged to draw all end here (hence the broad ``except``)."""
    try:
        return save(build(), path)
    except Exception as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        hint = " (pip install matplotlib)" if isinstance(exc, ImportError) else ""
        print(f"rlperf: warning: {Path(path).name} not drawn: {detail}{hint}", file=sys.stderr)
        return None


def phase_color(name: str, order: Sequence[str] = ()) -> str:
    """The colour of phase ``name`` in every figure."""
    if name in PHASE_COLORS:
        return PHASE_COLORS[name]
    others = [n for n in order if n not in PHASE_COLORS]
    return _OTHER_COLORS[(others.index(name) if name in others else len(others)) % len(_OTHER_COLORS)]


def _phase_order(names: Sequence[str]) -> list[str]:
    known = [p for p in (*PHASES, "sync", "wait") if p in names]
    return known + [n for n in names if n not in known]


# -- run.png ------------------------------------------------------------------------------------


def run_series(record: Mapping[str, Any], metrics: str | Path | None = None) -> list[dict[str, Any]]:
    """The run over time, one row per log interval (``wall_s`` and ``env_steps`` where it ended,
    ``updates``, ``mean_score_100``, ``phase_s``: each phase's seconds in it, where known): the
    record's ``intervals``, or ``metrics`` (a ``metrics.csv``) for a record written before its
    intervals carried the score and updates."""
    intervals = [r for r in record.get("intervals") or [] if is_number(r.get("wall_s")) and is_number(r.get("env_steps"))]
    if any("updates" in r or "phase_s" in r for r in intervals) or metrics is None or not Path(metrics).is_file():
        return intervals
    rows = []
    with open(metrics, newline="", encoding="utf-8") as f:
        for line in csv.DictReader(f):
            row: dict[str, Any] = {k: _float(line.get(k)) for k in ("wall_s", "env_steps", "updates", "mean_score_100")}
            phases = {p: _float(line.get(f"{p}_s")) for p in PHASES}
            if all(v is not None for v in phases.values()):
                row["phase_s"] = phases
            if row["wall_s"] is not None and row["env_steps"] is not None:
                rows.append(row)
    return rows


def _float(text: Any) -> float | None:
    try:
        x = float(text)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def run_figure(record: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Figure:
    """``run.png``: the run against wall time, in three panels sharing the x axis.

    1. the mean score of the last 100 episodes, with a mark where each score target was first reached;
    2. env steps/s and updates/s in each log interval;
    3. each phase's share of the phase time in each log interval, stacked (the slow-down question:
       the update starting at ``train.learning_starts``, a phase that grows).
    A dotted line marks where the updates started.
    """
    fig = new_figure((SIZE_PX[0] / DPI, SIZE_PX[1] / DPI))
    score_ax, rate_ax, phase_ax = fig.subplots(3, 1, sharex=True)
    wall = [float(r["wall_s"]) for r in rows]
    _score_panel(score_ax, record, rows, wall)
    _rate_panel(rate_ax, rows, wall)
    _phase_panel(phase_ax, rows, wall)
    phase_ax.set_xlabel("wall time since the run started (s)")
    phase_ax.set_xlim(0, max(wall, default=1.0) or 1.0)
    start = _update_start(rows)
    if start is not None:
        for ax in (score_ax, rate_ax, phase_ax):
            ax.axvline(start, color="black", linestyle=":", linewidth=1)
        rate_ax.annotate("updates start", (start, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                         textcoords="offset points", fontsize="small")
    fig.suptitle(_run_title(record), fontsize="medium")
    fig.tight_layout()
    return fig


def _update_start(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """Wall seconds where the interval with the first update began (None: no updates, or from the start)."""
    previous = 0.0
    for r in rows:
        updates = r.get("updates")
        if not is_number(updates):
            return None
        if updates > 0:
            return previous if previous > 0 else None
        previous = float(r["wall_s"])
    return None


def _score_panel(ax: Axes, record: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], wall: Sequence[float]) -> None:
    points = [(w, r["mean_score_100"]) for w, r in zip(wall, rows, strict=True) if is_number(r.get("mean_score_100"))]
    ax.set_ylabel("mean score,\nlast 100 episodes")
    ax.grid(True, alpha=0.3)
    if not points:
        ax.text(0.5, 0.5, "no episode scores in this record", transform=ax.transAxes, ha="center", va="center")
        return
    # Markers while there are few points: one interval is one point, invisible as a line alone.
    ax.plot([p[0] for p in points], [p[1] for p in points], color="#4c72b0", label="mean score (last 100)",
            marker="o" if len(points) <= 30 else None, markersize=7 if len(points) == 1 else 4, clip_on=False)
    if len(points) == 1:  # at the run's end, on the axis's edge: its value beside it
        ax.annotate(f"{points[0][1]:.3g}", points[0], xytext=(-8, 0), textcoords="offset points", ha="right",
                    va="center", color="#4c72b0")
    section = record.get("time_to_score") or {}
    missed = []
    for target in section.get("targets") or []:
        at = target.get("run_wall_s")
        if target.get("reached") and is_number(at):
            ax.axvline(at, color="#dd8452", linestyle="--", linewidth=1)
            ax.plot([at], [target["score"]], marker="*", markersize=12, color="#dd8452", linestyle="none",
                    label=f"score {target['score']:g} reached at {at:.1f} s")
        elif is_number(target.get("score")):
            missed.append(f"{target['score']:g}")
    if missed:
        ax.plot([], [], linestyle="none", label=f"not reached: {', '.join(missed)}")
    ax.legend(loc="upper left", fontsize="small")


def _rate_panel(ax: Axes, rows: Sequence[Mapping[str, Any]], wall: Sequence[float]) -> None:
    ax.set_ylabel("env steps/s")
    ax.grid(True, alpha=0.3)
    if not rows:
        ax.text(0.5, 0.5, "no log intervals in this record", transform=ax.transAxes, ha="center", va="center")
        return
    nan = float("nan")  # an interval without a rate: a gap in the line
    steps: list[float] = []
    updates: list[float] = []
    t0 = e0 = u0 = 0.0
    for w, r in zip(wall, rows, strict=True):
        dt = w - t0
        steps.append((r["env_steps"] - e0) / dt if dt > 0 else nan)
        u = r.get("updates")
        updates.append((u - u0) / dt if dt > 0 and is_number(u) else nan)
        t0, e0, u0 = w, r["env_steps"], u if is_number(u) else u0
    # Each interval's rate is drawn across that interval (steps ending at its end).
    xs = [0.0, *wall]
    ax.plot(xs, [steps[0], *steps], drawstyle="steps-pre", color="#55a868", label="env steps/s")
    ax.set_ylim(0, _top(steps) * 1.1)
    ax.tick_params(axis="y", colors="#55a868")
    handles, labels = ax.get_legend_handles_labels()
    if any(u == u for u in updates):
        # Its own axis, topped at twice its peak: with a constant train_ratio the two rates are
        # proportional, and on matched axes one line would hide the other.
        twin = ax.twinx()
        twin.plot(xs, [updates[0], *updates], drawstyle="steps-pre", color="#8172b2", linestyle="--",
                  label="updates/s (right axis)")
        twin.set_ylabel("updates/s", color="#8172b2")
        twin.tick_params(axis="y", colors="#8172b2")
        twin.set_ylim(0, _top(updates) * 2.0)
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="lower right", fontsize="small")


def _top(values: Sequence[float]) -> float:
    """The largest finite value (1 when there is none), for an axis's upper limit."""
    finite = [v for v in values if v == v and math.isfinite(v)]
    return max(finite, default=0.0) or 1.0


def _phase_panel(ax: Axes, rows: Sequence[Mapping[str, Any]], wall: Sequence[float]) -> None:
    ax.set_ylabel("share of phase time\nin the interval (%)")
    timed = [(w, r["phase_s"]) for w, r in zip(wall, rows, strict=True) if isinstance(r.get("phase_s"), Mapping)]
    if not timed:
        ax.text(0.5, 0.5, "no per-interval phase times in this record", transform=ax.transAxes, ha="center",
                va="center")
        return
    names = _phase_order(list(dict.fromkeys(n for _, spent in timed for n in spent)))
    xs, shares = phase_shares(timed, names)
    ax.stackplot(xs, [shares[n] for n in names], labels=names, colors=[phase_color(n, names) for n in names],
                 step="pre")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="phase")


def phase_shares(timed: Sequence[tuple[float, Mapping[str, float]]],
                 names: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
    """Stacked-step data of the phase panel: x from 0 to each interval's end, and each phase's
    percentage of the interval's phase time (the first interval repeated at x = 0)."""
    xs = [0.0]
    shares: dict[str, list[float]] = {n: [] for n in names}
    for w, spent in timed:
        total = sum(v for v in spent.values() if is_number(v))
        for n in names:
            shares[n].append(100 * spent.get(n, 0.0) / total if total > 0 else 0.0)
        xs.append(w)
    for n in names:
        shares[n].insert(0, shares[n][0])
    return xs, shares


def _run_title(record: Mapping[str, Any]) -> str:
    command = list(record.get("command") or [])
    shown = " ".join([_program(command[0], record.get("kind")), *command[1:]]) if command else ""
    env, train = config_section(record, "env"), config_section(record, "train")
    knobs = ", ".join(f"{k}={v}" for k, v in (
        ("envs", env.get("num_envs")), ("train_ratio", train.get("train_ratio")),
        ("learning_starts", train.get("learning_starts"))) if v is not None)
    config = f"{shown[:110] + '…' if len(shown) > 111 else shown}" + (f"  [{knobs}]" if knobs else "")
    status = f"{record.get('kind', 'run')}, {record.get('status', '?')}"
    return f"{record.get('name', 'run')} ({status})\n{config}\n{_machine(record)}"


def _program(argv0: str, kind: Any) -> str:
    """How the command line starts: ``rlperf`` for rlperf's runs, ``python x.py`` for a script's own timer."""
    if kind != "external":
        return "rlperf"
    return f"python {argv0}" if argv0.endswith(".py") else Path(argv0).name


def _machine(record: Mapping[str, Any]) -> str:
    system = record.get("system") or {}
    parts = [str(system.get("device_name") or system.get("device") or "unknown device")]
    if system.get("device") and system.get("device_name") and system["device"] != "cpu":
        parts[0] = f"{system['device']} ({system['device_name']})"
    if system.get("torch_threads"):
        parts.append(f"torch threads: {system['torch_threads']}")
    if system.get("hostname"):
        parts.append(str(system["hostname"]))
    if system.get("rlperf"):
        parts.append(f"rlperf {system['rlperf']}")
    return " · ".join(parts)


# -- compare.png --------------------------------------------------------------------------------


def phase_time_per_env_step(record: Mapping[str, Any]) -> dict[str, float]:
    """Each phase's measured seconds per env step of one record (from its phase table and measured env
    steps; from the shares and the throughput where the record has no measured env steps)."""
    phases = record.get("phases") or {}
    steps = (record.get("timing") or {}).get("measured_env_steps")
    if is_number(steps) and steps > 0:
        return {n: p["total_s"] / steps for n, p in phases.items() if is_number(p.get("total_s"))}
    rate = (record.get("throughput") or {}).get("env_steps_per_s")
    if not (is_number(rate) and rate > 0):
        return {}
    return {n: p["share"] / rate for n, p in phases.items() if is_number(p.get("share"))}


def compare_figure(sides: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], gate: Mapping[str, Any] | None = None,
                   gate_samples: tuple[Sequence[float], Sequence[float]] | None = None) -> Figure:
    """``compare.png``: time per env step per phase, stacked, one bar per side with the spread over its
    repeats (min–max of the total); throughput and time to score side by side below. With ``gate``
    (:func:`rlperf.experiments.gate.verdict`) and its two sides' seconds per env step, a fourth
    panel puts each run as a point beside the threshold line, and the verdict is the title."""
    fig = new_figure((SIZE_PX[0] / DPI, SIZE_PX[1] / DPI))
    grid = fig.add_gridspec(2, 3 if gate_samples else 2)
    phase_ax = fig.add_subplot(grid[0, :])
    rate_ax, score_ax = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    labels = [_wrap(label) for label, _ in sides]
    x = list(range(len(sides)))

    _compare_phase_panel(phase_ax, sides, x, labels)

    rates = [[(r.get("throughput") or {}).get("env_steps_per_s") for r in records] for _, records in sides]
    _bars_with_points(rate_ax, x, rates, "#55a868")
    rate_ax.set_xticks(x, labels)
    rate_ax.set_ylabel("env steps/s")
    rate_ax.set_title("throughput (measured window)", fontsize="medium")

    records = [r for _, rs in sides for r in rs]
    _compare_score_panel(score_ax, sides, x, labels, records)

    title = "compare: " + " vs ".join(label for label, _ in sides)
    if gate is not None and gate_samples is not None:
        _gate_panel(fig.add_subplot(grid[1, 2]), gate, gate_samples)
        title = f"gate: {gate['verdict'].upper()}: {gate['reason']}"
    machines = list(dict.fromkeys(_machine(r) for r in records))
    fig.suptitle(f"{_wrap(title, 120)}\n{'; '.join(machines)}", fontsize="medium")
    fig.tight_layout()
    return fig


def _compare_phase_panel(ax: Axes, sides: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], x: list[int],
                         labels: list[str]) -> None:
    """compare.png's top panel: each side's median time per env step by phase, stacked, with the
    min–max of its repeats' totals."""
    per_record = [[phase_time_per_env_step(r) for r in records] for _, records in sides]
    names = _phase_order(list(dict.fromkeys(n for side in per_record for r in side for n in r)))
    bottoms = [0.0] * len(sides)
    heights_drawn: list[float] = []
    top = 0.0
    for name in names:
        heights = [1e6 * _median([r.get(name, 0.0) for r in side]) for side in per_record]
        heights_drawn += heights
        ax.bar(x, heights, bottom=bottoms, color=phase_color(name, names), label=name, width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    first = bottoms[0] if bottoms and bottoms[0] > 0 else None
    for i, side in enumerate(per_record):
        totals = summarize([1e6 * sum(r.values()) for r in side if r])
        if totals is None:
            continue
        top = max(top, totals.hi, bottoms[i])
        if totals.n > 1:
            _range_bar(ax, i, totals.lo, totals.hi)
        ratio = f"\n{_speed(first, bottoms[i])} than {sides[0][0]}" if i and first and bottoms[i] > 0 else ""
        ax.annotate(f"{bottoms[i]:.3g} µs" + (f" (n={totals.n})" if totals.n > 1 else "") + ratio, (i, totals.hi),
                    xytext=(0, 4), textcoords="offset points", ha="center", fontsize="small")
    ax.set_xticks(x, labels)
    ax.set_ylabel("time per env step (µs)")
    ax.set_title("time per env step by phase (median of the repeats; bar: min–max of the total)", fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="phase")
    if _wide(bottoms):  # a fast side would be a sliver beside a slow one on a linear axis
        ax.set_yscale("log")
        ax.set_ylabel("time per env step (µs, log scale)")
        # The smallest phase of the fastest side still shows.
        ax.set_ylim(min(h for h in heights_drawn if h > 0) / 2, top * 3)
    else:
        ax.set_ylim(0, top * 1.15 or 1.0)  # room for the whiskers and their labels


def _compare_score_panel(ax: Axes, sides: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], x: list[int],
                         labels: list[str], records: list[Mapping[str, Any]]) -> None:
    """compare.png's time-to-score panel: the first score target any run reached, per side (with the
    runs that missed it counted), or a note that none was reached."""
    from rlperf.score import time_to, tracked_targets

    targets = tracked_targets(records)
    reached = [t for t in targets if any((time_to(r, t) or (False, None))[0] for r in records)]
    ax.set_xticks(x, labels)
    if reached:
        target = reached[0]
        reach_times = [[(time_to(r, target) or (False, None))[1] for r in rs] for _, rs in sides]
        _bars_with_points(ax, x, reach_times, "#dd8452")
        for i, side_times in enumerate(reach_times):
            missed = sum(1 for t in side_times if t is None)
            if missed:
                ax.annotate(f"{missed} of {len(side_times)} not reached", (i, 0), xytext=(0, 4),
                            textcoords="offset points", ha="center", fontsize="small")
        ax.set_ylabel(f"seconds to mean score {target:g}")
        ax.set_title(f"time to score {target:g} (warm-up excluded)", fontsize="medium")
    else:
        ax.text(0.5, 0.5, "no run reached a score target\n(train.score_targets)", transform=ax.transAxes,
                ha="center", va="center")
        ax.set_xlim(-0.6, len(sides) - 0.4)
        ax.set_ylabel("seconds to score")
        ax.set_title("time to score", fontsize="medium")


def _gate_panel(ax: Axes, gate: Mapping[str, Any], samples: tuple[Sequence[float], Sequence[float]]) -> None:
    """Each run's seconds per env step (the gate's metric) as a point; the line where the candidate's
    runs would be slower than the baseline's median by the threshold."""
    baseline, candidate = ([1e6 * v for v in side] for side in samples)
    for i, (side, color) in enumerate(((baseline, "#4c72b0"), (candidate, "#c44e52"))):
        offsets = [0.15 * ((k % 5) - 2) / 2 for k in range(len(side))]
        ax.plot([i + o for o in offsets], side, marker="o", linestyle="none", color=color, alpha=0.8)
    if baseline:
        line = _median(baseline) * (1 + gate["threshold"])
        ax.axhline(line, color="black", linestyle="--", linewidth=1,
                   label=f"baseline median × (1 + {100 * gate['threshold']:g}%)")
        ax.legend(loc="best", fontsize="small")
    ax.set_xticks([0, 1], ["baseline", "candidate"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel(f"µs per env step ({gate.get('metric', '')})")
    ax.set_title(f"gate: {gate['verdict'].upper()} (p = {gate['p_value']:.2g})", fontsize="medium",
                 color=_VERDICT_COLORS.get(gate["verdict"], "#555555"))


# An inconclusive gate is not a pass: it gets its own colour, not the pass's green.
_VERDICT_COLORS = {"fail": "#c44e52", "pass": "#2e7d32", "inconclusive": "#dd8452"}


def _bars_with_points(ax: Axes, x: Sequence[int], values: Sequence[Sequence[Any]], color: str) -> None:
    """A bar at each side's median, its min–max as an error bar and each repeat as a point; each
    side's ratio to the first written on its bar, and a log axis where the medians span 10× or more."""
    medians: list[float] = []
    for i, side in zip(x, values, strict=True):
        s = summarize(side)
        if s is None:
            continue
        medians.append(s.median)
        ax.bar([i], [s.median], color=color, alpha=0.6, width=0.6)
        if s.n > 1:
            _range_bar(ax, i, s.lo, s.hi)
            ax.plot([i] * s.n, s.samples, marker="o", linestyle="none", color="black", markersize=3)
        if medians[0] > 0 and len(medians) > 1:
            ax.annotate(f"{s.median / medians[0]:.3g}× the first", (i, s.hi), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize="small")
    positive = [m for m in medians if m > 0]
    if _wide(medians):
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 4, max(positive) * 3)
    elif positive:
        ax.set_ylim(0, max(positive) * 1.15)  # room for the ratios
    else:
        ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=0.3)


def _speed(first: float, other: float) -> str:
    """``other``'s time beside ``first``'s: "30.1× faster" or "2× slower"."""
    return f"{first / other:.3g}× faster" if other <= first else f"{other / first:.3g}× slower"


def _wide(values: Sequence[float]) -> bool:
    """Whether positive values span a factor of 10 or more (then a linear axis hides the small ones)."""
    positive = [v for v in values if is_number(v) and v > 0]
    return len(positive) > 1 and max(positive) >= 10 * min(positive)


def _range_bar(ax: Axes, x: float, lo: float, hi: float) -> None:
    """A min–max whisker at ``x``."""
    ax.errorbar([x], [(lo + hi) / 2], yerr=[(hi - lo) / 2], fmt="none", ecolor="black", capsize=6)


def _median(values: Sequence[float]) -> float:
    s = summarize(values)
    return s.median if s is not None else 0.0


def _wrap(text: str, width: int = 28) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text
