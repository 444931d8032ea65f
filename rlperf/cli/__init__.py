"""The ``rlperf`` command line: thin Typer commands over library functions.

Each command parses options, builds a validated config, calls one library function
(:func:`rlperf.run.lifecycle.train_run`, :func:`rlperf.instruments.profiling.profile_run`,
:func:`rlperf.experiments.sweep.run_sweep`, :func:`rlperf.experiments.compare.run_sources`,
:func:`rlperf.report.explain.section_text`) and renders
its result. Known errors become one line on stderr and exit code 2; ``RLPERF_DEBUG=1`` shows the
traceback instead. Importing this package imports Typer and the command modules, nothing heavier:
torch, numpy and rich tables are imported when a command runs.
"""

from __future__ import annotations

# Each module registers its command; help lists them in this order.
from rlperf.cli import train  # noqa: F401
from rlperf.cli import profile  # noqa: F401
from rlperf.cli import sweep  # noqa: F401
from rlperf.cli import compare  # noqa: F401
from rlperf.cli import explain  # noqa: F401
from rlperf.cli.app import app, main

__all__ = ["app", "main"]
