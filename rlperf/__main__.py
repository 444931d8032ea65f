"""``python -m rlperf``: the same command line as the ``rlperf`` console script."""

from rlperf.cli import main

if __name__ == "__main__":
    main()
