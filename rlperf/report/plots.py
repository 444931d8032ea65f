"""Plots of rlperf results, drawn headless (matplotlib's Agg backend, chosen inside each function
so that importing rlperf never touches the user's matplotlib backend)."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PANELS = (("env_steps_per_s", "env steps/s"), ("mean_score", "final mean score (last 100)"))


def sweep_plot(summary: Sequence[Mapping[str, Any]], keys: Sequence[str], path: str | Path) -> Path:
    """Throughput and final score against the first swept key with more than one value, one line
    per combination of the other keys' values; error bars show the spread over repeats.

    ``summary`` is :func:`rlperf.experiments.sweep.summarize_points`'s output. Numeric x values are plotted on a
    log axis when they span a factor of 10 or more (train_ratio 1, 4, 16, 64), else linearly;
    other values are categories in the order swept.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    x_key = next((k for k in keys if len({_label(e["params"].get(k)) for e in summary}) > 1), keys[0] if keys else None)
    others = [k for k in keys if k != x_key]
    xs_raw = list(dict.fromkeys(_label(e["params"].get(x_key)) for e in summary)) if x_key else ["-"]
    numeric = x_key is not None and all(_number(e["params"].get(x_key)) is not None for e in summary)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.5 * len(PANELS), 4), squeeze=False)
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for e in summary:
        name = ", ".join(f"{k.split('.', 1)[-1]}={_label(e['params'].get(k))}" for k in others) or "all"
        lines.setdefault(name, []).append(e)
    markers = itertools.cycle("osD^v<>")
    for name, entries in lines.items():
        marker = next(markers)
        for ax, (column, _) in zip(axes[0], PANELS, strict=True):
            pts = []
            for e in entries:
                stat = e.get(column)
                if not stat:
                    continue
                x_value = e["params"].get(x_key) if x_key else "-"
                x = _number(x_value) if numeric else xs_raw.index(_label(x_value))
                pts.append((x, stat["median"], stat["spread"] if stat["n"] > 1 else 0.0))
            if pts:
                pts.sort()
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker=marker,
                            capsize=3, label=name)
    values = [_number(e["params"].get(x_key)) for e in summary] if numeric else []
    positive = [v for v in values if v is not None and v > 0]
    log_x = numeric and len(positive) == len(values) and positive and max(positive) / min(positive) >= 10
    for ax, (column, title) in zip(axes[0], PANELS, strict=True):
        ax.set_title(title)
        ax.set_xlabel(x_key or "")
        ax.grid(True, alpha=0.3)
        if numeric:
            if log_x:
                ax.set_xscale("log")
                ax.minorticks_off()
            ticks = sorted({v for v in values if v is not None})
            if len(ticks) <= 12:  # the swept values themselves, not matplotlib's round numbers
                ax.set_xticks(ticks)
                ax.set_xticklabels([_label(t) for t in ticks])
        else:
            ax.set_xticks(range(len(xs_raw)))
            ax.set_xticklabels(xs_raw)
        if column == "env_steps_per_s":
            ax.set_ylim(bottom=0)
    if len(lines) > 1 or others:
        axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    from rlperf.atomic import write_bytes_atomic

    write_bytes_atomic(path, image.getvalue())  # never half a PNG on a full disk
    return path


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _label(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return json.dumps(x) if isinstance(x, (list, dict)) else str(x)
