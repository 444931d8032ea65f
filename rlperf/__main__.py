"""``python -m rlperf`` and the ``rlperf`` console script: the same command line as :func:`rlperf.cli.main`,
with the stop signal installed before the command line itself is imported, so that a Ctrl-C or a
SIGTERM at any moment of start-up ends in one line, and is ignored once the command is over."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not sys.flags.safe_path and sys.path and sys.path[0] in (os.getcwd(), ""):
    # python -m put the working directory first on sys.path: a file there named like a module of the
    # standard library (profile.py, csv.py) would be imported, and run, for the one rlperf uses. rlperf
    # itself is imported already; its own modules are found through its package.
    del sys.path[0]


def main() -> None:
    """Run the ``rlperf`` command line as this process's command."""
    from rlperf.run.signals import StopSignal, ignore_stop_signals

    stop = StopSignal(starting=True)
    stop.install()  # for the process's lifetime: ignored, not restored, once the command is over
    profiling_a_script = _profiled_a_script(sys.argv)
    try:
        if profiling_a_script:  # the script starts now; the command line, imported and parsed, adopts it
            from rlperf.instruments.script import start_early

            start_early(sys.argv[2:])
        from rlperf.cli import main as cli_main

        cli_main(stop=stop)
    except SystemExit as exc:
        if profiling_a_script:
            _discard_early()
            if exc.code is None or isinstance(exc.code, int):
                _exit_now(exc.code or 0)
        raise
    finally:
        if profiling_a_script:
            _discard_early()
        ignore_stop_signals()


def _discard_early() -> None:
    from rlperf.instruments.script import discard_early

    discard_early()


def _profiled_a_script(argv: list[str]) -> bool:
    """``rlperf profile [OPTIONS] -- python SCRIPT``: the process is done once its command is."""
    return len(argv) > 1 and argv[1] == "profile" and "--" in argv


def _exit_now(code: int) -> None:
    """End the process without the interpreter's teardown (a tenth of a second or more after a
    script's profile: the analysis and matplotlib's modules, garbage-collected one by one; the
    script's own process is gone, every file written and closed); stdout and stderr flushed first."""
    from rlperf.cli.app import flush_streams
    from rlperf.run.signals import ignore_stop_signals

    ignore_stop_signals()
    flush_streams()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
