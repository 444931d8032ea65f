"""What the test files share: running the CLI in-process."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from rlperf import cli


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``rlperf ARGV`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the default kernels into numba's disk cache before any test runs (and, with
    pytest-xdist, before its workers start): on a fresh clone the first compile prints a notice on
    stderr, and whichever test happened to compile first would read lines it does not expect (a
    one-line error, say), depending on the order the tests ran in."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller has done it
        return
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "rlperf", "train", "--config", "smoke", "--steps", "400", "--quiet",
                        "--no-plot", "--set", "run.threads=1", "--set", "run.device=cpu", "--out", out],
                       capture_output=True, timeout=600, check=False)
