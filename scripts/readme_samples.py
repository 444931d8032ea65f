"""Regenerate (or check) the command samples in README.md.

Every sample block in the README sits between ``<!-- sample: NAME -->`` and ``<!-- /sample -->`` and
shows ``$ COMMAND`` then what that command printed. This script runs each command at the small size
the README shows, from a scratch folder that sees the repository's ``configs/`` and ``tests/`` (so
``runs/`` lands there and the paths read as from the repository root), and rewrites the blocks:

    python scripts/readme_samples.py                 # run every sample, rewrite README.md
    python scripts/readme_samples.py train explain   # only these samples
    python scripts/readme_samples.py --check         # run them, change nothing: exit 1 on drift

``--check`` (and ``tests/test_readme.py``) judge what is stable, not the timings: the command exits
0, and every line part a sample ``shows`` (headings, column names, finding titles) is printed by the
command and present in the README's block, whose command line is the sample's.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WIDTH = 100  # the README's code blocks: wide enough that no table splits a name
BLOCK = re.compile(r"<!-- sample: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /sample -->", re.S)

# Lines a command prints that change from run to run without saying anything about the command:
# live progress (redrawn in place on a terminal, one line now and then off one) and the load note.
VOLATILE = (re.compile(r"^\[[\d,]+/[\d,]+ (episodes|env steps)\] "), re.compile(r"^\w+ ━{10,}"),
            re.compile(r"^rlperf: note: load average"))


@dataclass(frozen=True)
class Sample:
    """One README sample: the command as a user types it, and what of its output is stable."""

    name: str
    command: str
    shows: tuple[str, ...]
    omit: tuple[tuple[str, str], ...] = ()  # (first line, line after) regexes: the lines from one to the other cut to "…"
    trim: tuple[tuple[str, str], ...] = ()  # (kept line, line after) regexes: the lines between them cut to "…"
    head: int | None = None  # keep only the first lines
    codes: tuple[int, ...] = (0,)  # the exit codes the README's text allows for it
    env: dict[str, str] = field(default_factory=dict)


SAMPLES: tuple[Sample, ...] = (
    Sample("train", "rlperf train --config smoke",
           shows=("phases", "┃ phase  ┃ total s ┃  share ┃ calls ┃ mean ms ┃ p50 ms ┃ p95 ms ┃", "│ select ", "│ train ",
                  "summary", "│ status ", "│ env steps/s ", "│ mean score (last 100) ", "completed -> runs/train-"),
           omit=((r"^│ episodes ", r"^│ env steps/s "), (r"^│ updates/s", r"^│ mean score"),
                 (r"^│ best score", r"^└"))),
    Sample("profile", "rlperf profile --config smoke --top 5",
           shows=("measured: 64 vector steps", "instrument overhead", "cProfile:", "profile.prof"),
           omit=((r"^\s+phases\s*$", r"^measured: "),),
           # the measured window's first line, then "…" for its wrapped rest and cProfile's table; the same for
           # the overhead line's rest
           trim=((r"^measured: ", r"^gc: "), (r"^instrument overhead", r"^cProfile: "))),
    Sample("profile-script", "rlperf profile --top 4 -- python tests/foreign/item_push.py",
           shows=("advisor: findings ranked by the time they could save", "1. Per-item host copies in the loop",
                  "in item_push.py:21 (push)", "evidence:", "estimate:",
                  "python tests/foreign/item_push.py: exit code 0"),
           omit=((r"^\s+cProfile: top \d+ functions", r"^cProfile: "),)),
    Sample("sweep", "rlperf sweep --config smoke --train-ratio 1,4",
           shows=("sweep", "train_ratio", "env steps/s", "phases %", "mean score", "status", "sweep: 2 trials ->",
                  "sweep.csv, sweep.json, sweep.png"),
           omit=((r"^trial000 ", r"^\s+sweep\s*$"),)),  # each trial's progress line
    Sample("compare", "rlperf compare smoke --vs buffer.push=loop",
           shows=("compare", "metric", "buffer.push=loop vs smoke", "│ push ", "│ env steps/s ", "compare.png"),
           omit=((r"^│ select ", r"^│ push "), (r"^│ train ", r"^│ env steps/s "), (r"^│ updates/s ", r"^└"),
                 (r"^one run per column", r"^figure: "))),
    Sample("gate", "rlperf compare smoke --candidate smoke --fail-if-slower 5% --repeats 6 --max-repeats 6",
           shows=("compared: baseline", "candidate", "gate: "), codes=(0, 3),  # 3: inconclusive on a noisy machine
           omit=((r"^\s+gate\s*$", r"^compared: "),)),
    Sample("explain", "rlperf explain 3", head=5,
           shows=("## §3 Updates per env step — train.train_ratio", "**Symptom.**")),
)


def select(names: Iterable[str]) -> list[Sample]:
    by_name = {s.name: s for s in SAMPLES}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"readme_samples: unknown sample {', '.join(unknown)} (known: {', '.join(by_name)})")
    return [by_name[n] for n in names] or list(SAMPLES)


def scratch_folder() -> tempfile.TemporaryDirectory[str]:
    """A folder to run in whose ``configs`` and ``tests`` are the repository's."""
    folder = tempfile.TemporaryDirectory(prefix="readme-samples-")
    for name in ("configs", "tests"):
        os.symlink(ROOT / name, Path(folder.name) / name)
    return folder


def run(sample: Sample, cwd: str | Path, timeout: float = 600) -> tuple[int, str]:
    """Run the sample's command (``rlperf`` and ``python`` as this interpreter): (exit code, output).
    stdout and stderr are one stream, in the order a terminal would show them."""
    argv = shlex.split(sample.command)
    argv = [sys.executable, "-m", "rlperf", *argv[1:]] if argv[0] == "rlperf" else argv
    # `python` in a command is this interpreter, found on PATH as a user's shell would find it
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "COLUMNS": str(WIDTH), "LINES": "50", "PYTHONUNBUFFERED": "1",
           "MPLBACKEND": "Agg", **sample.env}
    env.pop("RLPERF_DEBUG", None)
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout


def shown(sample: Sample, output: str, scratch: str | Path = "") -> str:
    """The part of ``output`` the README shows: volatile lines dropped, omitted parts cut to "…", paths
    in the scratch folder relative to it (as from the repository root)."""
    if scratch:
        output = output.replace(f"{scratch}{os.sep}", "")
    lines = [line.rstrip() for line in output.splitlines() if not any(v.search(line) for v in VOLATILE)]
    for first, after in sample.omit:
        lines = cut(lines, first, after, keep_first=False)
    for kept, after in sample.trim:
        lines = cut(lines, kept, after, keep_first=True)
    if sample.head is not None and len(lines) > sample.head:
        lines = [*lines[:sample.head], "…"]
    return "\n".join(lines)


def cut(lines: list[str], first: str, after: str, keep_first: bool) -> list[str]:
    """``lines`` with the lines from the first match of ``first`` (or from the line after it, when kept) up to
    the next match of ``after`` cut to one "…"; unchanged when ``first`` matches no line or nothing lies between."""
    start = next((i for i, line in enumerate(lines) if re.search(first, line)), None)
    if start is None:
        return lines
    end = next((i for i in range(start + 1, len(lines)) if re.search(after, lines[i])), start + 1)
    start = start + 1 if keep_first else start
    return [*lines[:start], "…", *lines[end:]] if end > start else lines


def block(sample: Sample, output: str, scratch: str | Path = "") -> str:
    return f"```text\n$ {sample.command}\n{shown(sample, output, scratch)}\n```\n"


def readme_blocks(text: str) -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def replace_block(text: str, name: str, body: str) -> str:
    def swap(match: re.Match[str]) -> str:
        return f"<!-- sample: {name} -->\n{body}<!-- /sample -->" if match["name"] == name else match[0]

    return BLOCK.sub(swap, text)


def problems(sample: Sample, code: int, output: str, readme_block: str | None) -> list[str]:
    """What does not match between the sample, its fresh output and the README's block."""
    found = []
    if code not in sample.codes:
        found.append(f"{sample.name}: `{sample.command}` exited {code}, not {sample.codes}:\n{output[-2000:]}")
    for part in sample.shows:
        if part not in output:
            found.append(f"{sample.name}: the command no longer prints {part!r}")
    if readme_block is None:
        found.append(f"{sample.name}: README.md has no <!-- sample: {sample.name} --> block")
    else:
        if not readme_block.startswith(f"```text\n$ {sample.command}\n"):
            found.append(f"{sample.name}: the README block does not start with `$ {sample.command}`")
        for part in sample.shows:
            if part not in readme_block:
                found.append(f"{sample.name}: the README block does not show {part!r}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"samples to run (default: all: {', '.join(s.name for s in SAMPLES)})")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a sample drifted")
    parser.add_argument("--readme", type=Path, default=README, help="the file whose blocks to rewrite or check")
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    blocks = readme_blocks(text)
    found: list[str] = []
    with scratch_folder() as folder:
        for sample in select(args.names):
            print(f"readme_samples: {sample.command}", file=sys.stderr)
            code, output = run(sample, folder)
            if not args.check and code in sample.codes and sample.name in blocks:
                blocks[sample.name] = block(sample, output, folder)
                text = replace_block(text, sample.name, blocks[sample.name])
            found += problems(sample, code, output, blocks.get(sample.name))
    if not args.check:
        args.readme.write_text(text, encoding="utf-8")
    for line in found:
        print(f"readme_samples: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
