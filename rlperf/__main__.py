"""``python -m rlperf`` and the ``rlperf`` console script: the same command line as :func:`rlperf.cli.main`,
with the stop signal installed before the command line itself is imported, so that a Ctrl-C or a
SIGTERM at any moment of start-up ends in one line, and is ignored once the command is over."""

from __future__ import annotations


def main() -> None:
    """Run the ``rlperf`` command line as this process's command."""
    from rlperf.run.signals import StopSignal, ignore_stop_signals

    stop = StopSignal(starting=True)
    stop.install()  # for the process's lifetime: ignored, not restored, once the command is over
    try:
        from rlperf.cli import main as cli_main

        cli_main(stop=stop)
    finally:
        ignore_stop_signals()


if __name__ == "__main__":
    main()
