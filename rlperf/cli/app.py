"""The Typer application, the version option and the entry point that turns known errors into one line.

:func:`main` owns what a command line needs from the process: the stop signal every command shares
(:class:`rlperf.run.signals.StopSignal`, which a command :meth:`arms <rlperf.run.signals.StopSignal.arm>`
before it writes anything), output streams that cannot fail a finished
run (closed, unencodable or gone: :func:`guard_streams`, :func:`rendering`), and the one-line
messages with their exit codes: 2 for errors the user can fix (bad input, a full disk), 130 / 143
for a signal.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from rlperf import __version__
from rlperf.errors import RlperfError
from rlperf.report.units import terminal_safe
from rlperf.run.signals import RunInterrupted, StopSignal, ignore_stop_signals


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


class OneLineGroupErrors(TyperGroup):
    """The ``rlperf`` group: an unknown command or a bad global option is one line and exit 2 too."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as exc:
            if getattr(exc, "format_message", None) is None:
                raise
            raise _one_line_usage_error(exc, None) from None

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except typer.TyperException as exc:
            if getattr(exc, "format_message", None) is None:
                raise
            names = ", ".join(self.list_commands(ctx))
            raise RlperfError(" ".join(exc.format_message().split()), hint=f"commands: {names}; see rlperf --help") from None


app = typer.Typer(
    name="rlperf",
    cls=OneLineGroupErrors,
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


_stop: StopSignal | None = None


def command_stop() -> StopSignal:
    """The stop signal of the running command (installed by :func:`main`); a command arms it when it
    starts writing or starting processes, and hands it to the library function it calls."""
    return _stop if _stop is not None else StopSignal()


def main(argv: list[str] | None = None, stop: StopSignal | None = None) -> None:
    """Console entry point: known errors become one line on stderr and exit code 2, a signal before
    the command wrote anything one line and exit code 130 / 143.

    ``stop``: a StopSignal the caller already installed (``python -m rlperf`` installs one before
    the command line is even imported). Without one, main installs its own for the command and
    puts the previous handlers back afterwards; with ``argv`` None (the process's own command line)
    the signals stay ignored once the command is over, through the interpreter's exit.
    """
    global _stop
    own = stop is None
    stop = stop if stop is not None else StopSignal(starting=True)
    previous, _stop = _stop, stop
    handlers = stop.install() if own else {}
    guard_streams()
    try:
        try:
            app(args=argv, standalone_mode=True)
        except SystemExit as exc:
            if exc.code in (0, None) and stop.starting and stop.signum is not None:
                raise RunInterrupted(stop.signum, "it finished") from None  # a command that never armed it
            raise
    except RlperfError as exc:
        if os.environ.get("RLPERF_DEBUG") == "1":
            raise
        say(f"rlperf: error: {exc}")
        sys.exit(exc.exit_code)
    finally:
        _stop = previous
        if own and argv is None:
            ignore_stop_signals()
        else:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        flush_streams()


def say(line: str) -> None:
    """One line on stderr, whatever state stderr is in; control characters from a path or a value
    in it are escaped (they would split the line or drive the terminal)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(terminal_safe(line), file=sys.stderr, flush=True)


# -- output that cannot fail a run ----------------------------------------------------------------


def guard_streams() -> None:
    """Make stdout and stderr safe to write whatever happened to them before rlperf started.

    A closed descriptor (``>&-``) is reopened on /dev/null, so that no file rlperf opens later takes
    its number and receives output meant for the terminal; a text stream that cannot encode what
    rlperf prints (``PYTHONIOENCODING=ascii``, a C locale) replaces those characters instead of
    raising after the run finished.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # a lower descriptor was closed too and took the number first
                os.dup2(opened, fd)
                os.close(opened)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(1 if name == "stdout" else 2, "w", encoding="utf-8", errors="replace",
                                    closefd=False))
        elif isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            with contextlib.suppress(ValueError, OSError, io.UnsupportedOperation):
                stream.reconfigure(errors="replace")


def silence_stdout() -> None:
    """stdout is gone (a closed pipe, a full disk behind a redirection): send what is left to
    /dev/null, so neither this command nor the interpreter's exit fails on it."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


@contextlib.contextmanager
def rendering() -> Iterator[None]:
    """Around what a command prints after its work is done and recorded: a closed pipe or a broken
    terminal ends the output, never the command's exit code."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EBADF, errno.EINVAL):
            raise
        silence_stdout()
    except ValueError as exc:  # I/O on a closed stream
        if "closed file" not in str(exc):
            raise
        silence_stdout()


def flush_streams() -> None:
    """Flush what is buffered for stdout and stderr now, while a failure can still be handled."""
    for stream, is_stdout in ((sys.stdout, True), (sys.stderr, False)):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            if is_stdout:
                silence_stdout()
