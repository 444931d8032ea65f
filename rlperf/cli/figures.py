"""The figures the commands draw when they are done: ``run.png`` (train, profile), ``compare.png``
(compare, the gate). Figures are built by :mod:`rlperf.report.plots` from the records (and
``metrics.csv``) already on disk.

Kept out of every timed window: each command draws only after its runs returned, when every
record is final (the timers stopped, ``run.json`` written), so drawing never enters a figure it
draws. A figure that cannot be drawn is one warning line on stderr; the command's exit code is
the run's.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RUN_FIGURE = "run.png"
COMPARE_FIGURE = "compare.png"


def draw_run(record: Mapping[str, Any], quiet: bool = False) -> Path | None:
    """``run.png`` in the record's run directory; none (and nothing said) when every panel would be
    empty: a script profiled without a PhaseTimer has no intervals, scores or phase series."""
    from rlperf.report.plots import draw, run_figure, run_series
    from rlperf.run.files import METRICS_NAME

    run_dir = record.get("run_dir")
    if not run_dir:
        return None
    rows = run_series(record, Path(run_dir) / METRICS_NAME)
    if not rows:
        return None
    path = draw(lambda: run_figure(record, rows), Path(run_dir) / RUN_FIGURE)
    announce(path, quiet)
    return path


def announce(path: Path | None, quiet: bool = False) -> None:
    """The line that says where a figure was drawn (none when it was not, or ``quiet``)."""
    if path is not None and not quiet:
        print(f"figure: {path}", file=sys.stderr)


def draw_comparison(sides: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], ran: Sequence[Mapping[str, Any]],
                    out: str | Path, name: str | None, prefix: str = "compare", quiet: bool = False,
                    gate: Mapping[str, Any] | None = None,
                    gate_samples: tuple[Sequence[float], Sequence[float]] | None = None) -> Path | None:
    """``compare.png`` beside the runs this command ran (``ran``: their records), or, for records that
    were only read, in a new ``OUT/{name or prefix}-<timestamp>`` directory."""
    from rlperf.report.plots import compare_figure, draw
    from rlperf.run.files import make_run_dir

    try:
        folder = Path(ran[0]["run_dir"]).parent if ran else make_run_dir(out, name, prefix=prefix)
    except Exception as exc:  # an --out that cannot be written: the comparison stands without its figure
        print(f"rlperf: warning: {COMPARE_FIGURE} not drawn: {' '.join(str(exc).split())}", file=sys.stderr)
        return None
    path = draw(lambda: compare_figure(sides, gate, gate_samples), folder / COMPARE_FIGURE)
    if path is None and not ran:
        folder.rmdir()  # made for the figure alone: nothing is left of a figure that was not drawn
    else:
        announce(path, quiet)
    return path
