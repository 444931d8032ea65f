"""``rlperf compare``: runs side by side with ratios and noise marks (library: :mod:`rlperf.compare`)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from rlperf.cli import (ConfigOpt, DeviceOpt, EnvsOpt, EpisodesOpt, JsonOpt, NameOpt, OutOpt, QuietOpt, RatioOpt,
                        SeedOpt, SetOpt, StepsOpt, app, build_config)
from rlperf.dashboard import RunsProgress
from rlperf.errors import RlperfError


@app.command()
def compare(
    runs: Annotated[Optional[list[str]], typer.Argument(help="Run directories, run.json files or configs (.toml) to run now.", show_default=False)] = None,
    vs: Annotated[Optional[list[str]], typer.Option("--vs", help="A variant of the one config argument: --vs buffer.push=loop (repeatable).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Runs per config (≥ 3 shows the noise); repeat k uses seed + k.")] = 1,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    envs: EnvsOpt = None,
    episodes: EpisodesOpt = None,
    steps: StepsOpt = None,
    train_ratio: RatioOpt = None,
    device: DeviceOpt = None,
    seed: SeedOpt = None,
    out: OutOpt = Path("runs"),
    name: NameOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Compare runs side by side: phase times, throughput, score, memory, and ratios to the first."""
    from rlperf.compare import compare as build_comparison
    from rlperf.compare import load_sources, run_sources

    if repeats < 1:
        raise RlperfError(f"--repeats must be at least 1 (got {repeats})")
    args = list(runs or [])
    if config is not None:  # --config names the baseline, like the other commands
        args.insert(0, config)

    def make_config(path: str):
        return build_config(path, set_, envs, episodes, steps, train_ratio, device, seed)

    sources = load_sources(args, vs or [], make_config)
    to_run = sum(repeats for s in sources if s.config is not None)
    run_options = (set_, envs, episodes, steps, train_ratio, device, seed)
    if not to_run and (repeats > 1 or any(o not in (None, []) for o in run_options)) and not json_:
        print("compare: run options and --repeats apply to configs; these records are shown as recorded", file=sys.stderr)
    progress = None if quiet or json_ or not to_run else _RunProgress(to_run)
    with progress or contextlib.nullcontext():
        sides, interrupted = run_sources(sources, repeats, out=out, name=name, command=sys.argv,
                                         on_run=progress.on_run if progress else None)
    sides = [s for s in sides if s.records]
    if len(sides) < 2:
        print("compare: interrupted before two columns had a run", file=sys.stderr)
        raise typer.Exit(130)
    comparison = build_comparison(sides)
    if json_:
        sys.stdout.write(json.dumps(comparison, indent=2, default=str) + "\n")
    else:
        from rlperf.compare import compare_table, print_table

        print_table(compare_table(comparison))
        for warning in comparison["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
    if interrupted:
        print("compare: interrupted; the table holds the runs that finished", file=sys.stderr)
    raise typer.Exit(130 if interrupted else 0)


class _RunProgress(RunsProgress):
    """compare's runs: one bar step per run."""

    def __init__(self, total: int) -> None:
        super().__init__("compare", total)

    def on_run(self, label: str, repeat: int, event: str) -> None:
        if event == "start":
            self.started_run(f"{label} (repeat {repeat})")
        else:
            self.finished_run()
