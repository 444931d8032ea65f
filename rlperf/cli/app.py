"""The Typer application, the version option and the entry point that turns known errors into one line."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from rlperf import __version__
from rlperf.errors import RlperfError


def _one_line_usage_error(exc: typer.TyperException, info_name: str | None) -> RlperfError:
    message = getattr(exc, "format_message", None)
    text = " ".join(message().split()) if message is not None else str(exc)
    return RlperfError(text, hint=f"see rlperf {info_name or ''} --help".replace("  ", " "))


class OneLineUsageErrors(TyperCommand):
    """A command whose option-parsing errors (bad value, unknown option) are one line and exit 2,
    like every other bad input, instead of click's usage block."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # Whether a command line was given after "--" (rlperf profile -- python train.py): click drops the "--".
        ctx.meta["rlperf.after_dashdash"] = args[args.index("--") + 1:] if "--" in args else None
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as exc:
            if getattr(exc, "format_message", None) is None:
                raise
            raise _one_line_usage_error(exc, ctx.info_name) from None


app = typer.Typer(
    name="rlperf",
    help="Find and fix performance bottlenecks in deep-RL training loops.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlperf {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """Find and fix performance bottlenecks in deep-RL training loops."""


def command(**kwargs: Any) -> Any:
    """``app.command`` with one-line usage errors."""
    return app.command(cls=OneLineUsageErrors, **kwargs)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: known errors become one line on stderr and exit code 2."""
    try:
        app(args=argv, standalone_mode=True)
    except RlperfError as exc:
        if os.environ.get("RLPERF_DEBUG") == "1":
            raise
        print(f"rlperf: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)

