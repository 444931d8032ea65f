"""The live training dashboard on stderr: progress with ETA, rates, learning and phase shares.

Redrawn in place on a terminal and throttled (at most ``refresh_s``), so it costs nothing the
phase table can see; on a pipe or in CI it prints one plain line every ``plain_every_s`` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from rlperf.timers import PHASES


class Dashboard:
    """Shows a run's progress; ``update`` is cheap to call often (it throttles itself)."""

    def __init__(
        self, total: int, unit: str, enabled: bool = True, refresh_s: float = 0.5, plain_every_s: float = 10.0,
        heading: str | None = None,
    ) -> None:
        self.total, self.unit, self.enabled = total, unit, enabled
        self.heading = heading  # shown once above the bar: which forms of the knobs this run took, and why
        self.console = Console(stderr=True)
        self.live_mode = enabled and self.console.is_terminal
        self.refresh_s = refresh_s if self.live_mode else plain_every_s
        # Never drawn: the first update always draws (time.monotonic() can be small after a boot).
        self._last = float("-inf")
        self._bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn(f"{{task.completed:,}}/{{task.total:,}} {unit}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self._task = self._bar.add_task("train", total=total)
        self._stats = Text("")
        self._live: Live | None = None
        self._plain_lines = 0

    def __enter__(self) -> Dashboard:
        if self.live_mode:
            parts: list[Any] = ([Text(self.heading, style="dim")] if self.heading else []) + [self._bar, self._stats]
            self._live = Live(Group(*parts), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    @property
    def drawn(self) -> bool:
        """Whether a line was drawn yet."""
        return self._last != float("-inf")

    def update(
        self,
        done: int,
        snapshot: dict[str, Any],
        shares: Callable[[], dict[str, float]] | None = None,
        force: bool = False,
        extra: Callable[[], str] | None = None,
    ) -> None:
        """Show ``done`` out of ``total`` and the snapshot's figures (if the throttle allows).

        ``shares`` (and ``extra``, a further line of figures) are called only when the dashboard
        actually redraws: reading the phase shares walks every timing sample, which must not
        happen on every log of a ``log_every=1`` run.
        """
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.refresh_s:
            return
        self._last = now
        line = (
            f"episodes {snapshot['episodes']:,}  env steps/s {snapshot['env_steps_per_s']:,.0f}  "
            f"updates/s {snapshot['updates_per_s']:,.1f}  score(100) {snapshot['mean_score']:.2f}  "
            f"eps {snapshot['epsilon']:.3f}  loss {snapshot['loss']:.4f}"
        )
        if shares is not None:
            current = shares()
            line += "  |  " + " ".join(f"{p} {current.get(p, 0.0) * 100:.0f}%" for p in PHASES)
        if extra is not None:
            line += "  |  " + extra()
        if self.live_mode:
            self._bar.update(self._task, completed=min(done, self.total))
            self._stats.plain = line
        else:
            if self.heading and self._plain_lines == 0:
                self.console.print(self.heading, highlight=False, markup=False, soft_wrap=True)
            self._plain_lines += 1
            self.console.print(
                f"[{min(done, self.total):,}/{self.total:,} {self.unit}] {line}", highlight=False, soft_wrap=True
            )


class RunsProgress:
    """A progress bar over the runs a command starts (sweep trials, compare runs), on stderr.

    The bar appears with the first run, so input refused up front prints only its error line.
    """

    def __init__(self, label: str, total: int) -> None:
        from rich.progress import MofNCompleteColumn

        self.bar = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=Console(stderr=True),
        )
        self.task = self.bar.add_task("", total=total)
        self.started = False

    def __enter__(self) -> RunsProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            self.bar.__exit__(*exc)

    def started_run(self, description: str) -> None:
        self._start()
        self.bar.update(self.task, description=description)

    def finished_run(self, line: str | None = None) -> None:
        self._start()
        self.bar.advance(self.task)
        if line:
            self.bar.console.print(line, highlight=False, markup=False)

    def on_run(self, label: str, repeat: int, event: str) -> None:
        """The ``on_run(label, repeat, event)`` callback the experiments call: "start", then "done"."""
        if event == "start":
            self.started_run(f"{label} (repeat {repeat})")
        else:
            self.finished_run()

    def _start(self) -> None:
        if not self.started:
            self.started = True
            self.bar.__enter__()
