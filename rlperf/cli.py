"""The ``rlperf`` command line: thin Typer commands over library functions."""

from __future__ import annotations

import os
import sys

import typer

from rlperf import __version__
from rlperf.errors import RlperfError

app = typer.Typer(
    name="rlperf",
    help="Find and fix performance bottlenecks in deep-RL training loops.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlperf {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """Find and fix performance bottlenecks in deep-RL training loops."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: known errors become one line on stderr and exit code 2."""
    try:
        app(args=argv, standalone_mode=True)
    except RlperfError as exc:
        if os.environ.get("RLPERF_DEBUG") == "1":
            raise
        print(f"rlperf: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
