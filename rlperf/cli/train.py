"""``rlperf train``: one training run with a live dashboard (library: :func:`rlperf.run.lifecycle.train_run`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from rlperf.cli.app import command, command_stop, rendering
from rlperf.cli.options import RunArgs, run_options
from rlperf.errors import RlperfError


@command()
@run_options()
def train(
    ctx: typer.Context,
    tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also write TensorBoard scalars to RUN_DIR/tb.")] = False,
    resume: Annotated[Path | None, typer.Option(
        "--resume", metavar="RUN_DIR",
        help="Continue RUN_DIR from its checkpoint, in place, with its config.toml; --episodes/--steps may extend "
             "the stop condition (other keys that change what the run computes are refused).")] = None,
    *,
    run: RunArgs,
) -> None:
    """Train DQN on the batched Snake with a live per-phase dashboard; writes a run directory."""
    from rlperf.run.files import check_run_name
    from rlperf.run.lifecycle import resume_config, train_run

    check_run_name(run.name)
    if resume is not None:
        if run.config is not None:
            raise RlperfError("--config cannot be combined with --resume", hint=f"a resume uses {resume}/config.toml")
        if run.name is not None:
            raise RlperfError("--name cannot be combined with --resume", hint="a resume continues in RUN_DIR")
        cfg = resume_config(resume, run.set_, **run.flags())
        # Refused, not ignored: a resume writes into RUN_DIR itself, and an --out that silently wrote
        # nothing there would leave the user looking for a run that went elsewhere.
        source = ctx.get_parameter_source("out")
        if source is not None and source.name != "DEFAULT":
            raise RlperfError("--out cannot be combined with --resume",
                              hint=f"a resume continues in {resume} itself; to continue a copy elsewhere, copy the "
                                   "directory there and resume the copy")
    else:
        cfg = run.build_config()
    if tensorboard:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"tensorboard": True})})
    # From here a signal stops the run at a step boundary (train_run arms the command's stop signal),
    # or arrives while a finished run is being rendered, where it changes nothing.
    result = train_run(cfg, out=run.out, name=run.name, command=sys.argv, quiet=run.quiet or run.json_,
                       dashboard=not run.json_, resume=resume, stop=command_stop())
    with rendering():
        emit(result.record, run.json_, run.quiet)
        if run.plot:
            from rlperf.cli.figures import draw_run

            draw_run(result.record, quiet=run.quiet)
    raise typer.Exit(result.exit_code)


def emit(record: dict[str, Any], as_json: bool, quiet: bool) -> None:
    """Print a finished run: the record as JSON, the phase table and summary, or (``quiet``) one line."""
    if as_json:
        sys.stdout.write(json.dumps(record, indent=2, default=str) + "\n")
        return
    from rlperf.report.tables import episode_growth_line, phase_table, quiet_line, stdout_console, summary_table

    untrained = no_training_line(record)
    if quiet:
        sys.stdout.write(quiet_line(record) + "\n")
        if untrained:
            print(untrained, file=sys.stderr)
        line = status_line(record, quiet)
        if line:
            print(line, file=sys.stderr)
        return
    console = stdout_console()
    if record["timing"].get("measured_steps"):
        console.print(phase_table(record["phases"], title="phases", timing_mode=record["timing"]["mode"]))
    console.print(summary_table(record))
    if untrained:
        print(untrained, file=sys.stderr)
    growth = episode_growth_line(record)
    if growth:
        console.print(growth, highlight=False, markup=False)
    line = status_line(record, quiet)
    if line:
        print(line, file=sys.stderr)


def no_training_line(record: dict[str, Any]) -> str | None:
    """Why a run made no gradient update (it stopped while filling the replay), or None if it made some."""
    totals = record.get("totals") or {}
    if totals.get("updates") or record.get("status") not in ("completed", "interrupted"):
        return None
    config = record.get("config") or {}
    train, envs = config.get("train") or {}, (config.get("env") or {}).get("num_envs")
    starts = max(int(train.get("learning_starts") or 0), int((config.get("buffer") or {}).get("batch_size") or 0))
    if record["status"] == "interrupted":
        why = "it was interrupted"
    elif train.get("episodes"):
        why = (f"it reached --episodes {train['episodes']:,} (finished episodes summed over all {envs:,} boards, "
               "not per board)")
    else:
        why = f"it reached --steps {train.get('steps', 0):,} (env transitions over all boards)"
    return (f"no training happened: {why} after {totals.get('env_steps', 0):,} env steps, before the replay held "
            f"the {starts:,} transitions training starts at (train.learning_starts); every step filled the replay, "
            "so the loss is nan and no phase was measured; run longer (--episodes, --steps) or lower "
            "train.learning_starts")


def status_line(record: dict[str, Any], quiet: bool) -> str | None:
    """``run NAME: STATUS -> DIR`` with the error, and how to continue an interrupted run that can be
    continued (a sync run on the tensor backend with a checkpoint); None when quiet and completed."""
    status = record["status"]
    line = f"run {record['name']}: {status} -> {record.get('run_dir', '')}"
    if status in ("failed", "diverged"):
        line += f" ({record.get('error', 'see run.json')})"
    from rlperf.env.registration import ENV_ID

    config = record.get("config", {})
    env = config.get("env", {})
    resumable = (config.get("run", {}).get("mode") != "async" and env.get("backend", "tensor") == "tensor"
                 and env.get("id", ENV_ID) == ENV_ID)
    if status == "interrupted" and record.get("checkpoint") and resumable:
        line += f"; continue with: rlperf train --resume {record.get('run_dir', '')}"
    if record.get("recovered"):
        line += " (record recovered from checkpoint.pt)"
    return line if not quiet or status != "completed" else None
