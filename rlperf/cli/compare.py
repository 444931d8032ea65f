"""``rlperf compare``: runs side by side with ratios and noise marks (library: :mod:`rlperf.experiments.compare`)."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from rlperf.cli.app import command, command_stop, rendering
from rlperf.cli.options import RunArgs, run_options
from rlperf.errors import RlperfError

if TYPE_CHECKING:
    from rlperf.config import Config


@command()
@run_options()
def compare(
    runs: Annotated[list[str] | None, typer.Argument(
        help="Run directories, run.json files or configs (.toml) to run now.", show_default=False)] = None,
    vs: Annotated[list[str] | None, typer.Option(
        "--vs", help="A variant of the one config argument: --vs buffer.push=loop (repeatable).")] = None,
    repeats: Annotated[int, typer.Option(
        "--repeats", help="Runs per config (≥ 3 shows the noise); repeat k uses seed + k.")] = 1,
    *,
    run: RunArgs,
) -> None:
    """Compare runs side by side: phase times, throughput, score, memory, and ratios to the first."""
    from rlperf.experiments.compare import compare as build_comparison
    from rlperf.experiments.compare import load_sources, run_sources
    from rlperf.report.dashboard import RunsProgress

    from rlperf.run.files import check_run_name

    if repeats < 1:
        raise RlperfError(f"--repeats must be at least 1 (got {repeats})")
    check_run_name(run.name)
    args = list(runs or [])
    if run.config is not None:  # --config names the baseline, like the other commands
        args.insert(0, run.config)

    def make_config(path: str) -> Config:
        return run.build_config(path)

    sources = load_sources(args, vs or [], make_config)
    to_run = sum(repeats for s in sources if s.config is not None)
    if not to_run and (repeats > 1 or run.given) and not run.json_:
        print("compare: run options and --repeats apply to configs; these records are shown as recorded", file=sys.stderr)
    progress = None if run.quiet or run.json_ or not to_run else RunsProgress("compare", to_run)

    def on_run(label: str, repeat: int, event: str) -> None:
        assert progress is not None
        if event == "start":
            progress.started_run(f"{label} (repeat {repeat})")
        else:
            progress.finished_run()

    stop = command_stop()
    stop.arm()  # from here a signal stops the run in progress at a step boundary, and no other starts
    with progress or contextlib.nullcontext():
        sides, interrupted = run_sources(sources, repeats, out=run.out, name=run.name, command=sys.argv,
                                         on_run=on_run if progress else None, stop=stop)
    code = stop.exit_code if interrupted else 0
    sides = [s for s in sides if s.records]
    if len(sides) < 2:
        with rendering():
            print("compare: interrupted before two columns had a run", file=sys.stderr)
        raise typer.Exit(code or stop.exit_code)
    comparison = build_comparison(sides)
    with rendering():
        if run.json_:
            sys.stdout.write(json.dumps(comparison, indent=2, default=str) + "\n")
        else:
            from rlperf.experiments.compare import compare_table
            from rlperf.report.tables import print_table

            print_table(compare_table(comparison))
            for warning in comparison["warnings"]:
                print(f"warning: {warning}", file=sys.stderr)
        if interrupted:
            print("compare: interrupted; the table holds the runs that finished", file=sys.stderr)
    raise typer.Exit(code)
