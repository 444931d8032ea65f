"""``rlperf sweep``: a grid over config keys, each trial a normal run (library: :mod:`rlperf.experiments.sweep`)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from rlperf.cli.app import command, command_stop, rendering
from rlperf.cli.options import RunArgs, run_options

if TYPE_CHECKING:
    from collections.abc import Callable

    from rlperf.experiments.sweep import Axis, SweepResult, Trial
    from rlperf.report.dashboard import RunsProgress


@command()
@run_options(exclude=("envs", "train_ratio"))
def sweep(
    train_ratio: Annotated[str | None, typer.Option(
        "--train-ratio", help="Values of train.train_ratio to sweep: 1,4,16,64.")] = None,
    envs: Annotated[str | None, typer.Option("--envs", help="Values of env.num_envs to sweep: 32,64,256.")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", help="Sweep any key: --param buffer.push=loop,batch (repeatable).")] = None,
    repeats: Annotated[int, typer.Option(
        "--repeats", help="Runs per grid point (repeat k uses seed + k); median and spread over them.")] = 1,
    backend: Annotated[str, typer.Option("--backend", help="local (one trial at a time) or ray (Ray Tune trials).")] = "local",
    address: Annotated[str | None, typer.Option(
        "--address", help="Ray cluster to connect to (default: start a local one).")] = None,
    trial_cpus: Annotated[float, typer.Option("--trial-cpus", help="CPUs per Ray trial.")] = 1.0,
    trial_gpus: Annotated[float, typer.Option("--trial-gpus", help="GPUs per Ray trial.")] = 0.0,
    objective: Annotated[str | None, typer.Option(
        "--objective", help="Rank grid points, best first: time_to_S (S in train.score_targets, e.g. time_to_20), "
        "final_score, env_steps_per_s or updates_per_s.")] = None,
    *,
    run: RunArgs,
) -> None:
    """Run a grid of trials over any config keys; prints a table, writes sweep.csv/json/png."""
    from rlperf.experiments.sweep import run_sweep
    from rlperf.report.dashboard import RunsProgress
    from rlperf.run.files import check_run_name

    check_run_name(run.name)
    cfg = run.build_config()
    axes = _axes(train_ratio, envs, param or [])

    total = math.prod(len(a.values) for a in axes) * max(repeats, 0)
    progress = None if run.quiet or run.json_ else RunsProgress("sweep", total)

    stop = command_stop()
    stop.arm()  # from here a signal stops the sweep at the next boundary and its outputs are written
    with progress or contextlib.nullcontext():
        result = run_sweep(cfg, axes, repeats=repeats, out=run.out, name=run.name, backend=backend, address=address,
                           trial_cpus=trial_cpus, trial_gpus=trial_gpus, command=sys.argv, stop=stop, objective=objective,
                           on_trial=_trial_reporter(progress) if progress else None, plot=run.plot)
    with rendering():
        _show_sweep(result, run)
    raise typer.Exit(result.exit_code)


def _axes(train_ratio: str | None, envs: str | None, params: list[str]) -> list[Axis]:
    """The grid's axes: --train-ratio, --envs, then each --param, in that order."""
    from rlperf.experiments.sweep import Axis, parse_param, split_values

    axes: list[Axis] = []
    if train_ratio is not None:
        axes.append(Axis("train.train_ratio", tuple(split_values(train_ratio))))
    if envs is not None:
        axes.append(Axis("env.num_envs", tuple(split_values(envs))))
    return axes + [parse_param(p) for p in params]


def _trial_reporter(progress: RunsProgress) -> Callable[[str, Trial], None]:
    """``on_trial`` for the sweep: each trial's start and its end (status and throughput) in ``progress``."""

    def on_trial(event: str, trial: Trial) -> None:
        what = " ".join(f"{k.split('.', 1)[-1]}={v}" for k, v in trial.params.items()) + f" repeat {trial.repeat}"
        if event == "start":
            progress.started_run(f"{trial.name}: {what}")
            return
        status = trial.status if not trial.error else f"{trial.status}: {trial.error}"
        rate = (trial.record or {}).get("throughput", {}).get("env_steps_per_s")
        figures = f" {rate:,.0f} env steps/s" if rate else ""
        progress.finished_run(f"{trial.name} {what}: {status}{figures}")

    return on_trial


def _show_sweep(result: SweepResult, run: RunArgs) -> None:
    """The sweep's JSON or table, and a line saying how many trials ran (failed, interrupted) and where."""
    data = result.data()
    failed = len(result.failed)
    line = f"sweep: {len(result.trials)} trials"
    if failed:
        line += f", {failed} failed"
    if result.interrupted:
        line += ", interrupted"
    drawn = ", sweep.png" if (result.sweep_dir / "sweep.png").is_file() else ""
    line += f" -> {result.sweep_dir} (sweep.csv, sweep.json{drawn})"
    if run.json_:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    elif run.quiet:  # the one line, with the best point where an objective ranked them
        best = next((e for e in data["summary"] if e.get("rank") == 1), None)
        best_line = "; best: " + ", ".join(f"{k}={v}" for k, v in best["params"].items()) if best is not None else ""
        sys.stdout.write(line + best_line + "\n")
    else:
        from rlperf.experiments.sweep import sweep_table
        from rlperf.report.tables import print_table

        print_table(sweep_table(data))
    if not run.quiet or failed or result.interrupted:  # quiet, as train: a sweep that did not complete says so on stderr
        print(line, file=sys.stderr)
