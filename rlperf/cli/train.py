"""``rlperf train``: one training run with a live dashboard (library: :func:`rlperf.run.lifecycle.train_run`)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from rlperf.cli.app import command
from rlperf.cli.options import RunArgs, run_options
from rlperf.errors import RlperfError


@command()
@run_options()
def train(
    tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also write TensorBoard scalars to RUN_DIR/tb.")] = False,
    resume: Annotated[Path | None, typer.Option(
        "--resume", metavar="RUN_DIR",
        help="Continue RUN_DIR from its checkpoint, in place, with its config.toml; --episodes/--steps may extend "
             "the stop condition (other keys that change what the run computes are refused).")] = None,
    *,
    run: RunArgs,
) -> None:
    """Train DQN on the batched Snake with a live per-phase dashboard; writes a run directory."""
    from rlperf.run.lifecycle import resume_config, train_run

    if resume is not None:
        if run.config is not None:
            raise RlperfError("--config cannot be combined with --resume", hint=f"a resume uses {resume}/config.toml")
        if run.name is not None:
            raise RlperfError("--name cannot be combined with --resume", hint="a resume continues in RUN_DIR")
        cfg = resume_config(resume, run.set_, envs=run.envs, episodes=run.episodes, steps=run.steps,
                            train_ratio=run.train_ratio, device=run.device, seed=run.seed)
    else:
        cfg = run.build_config()
    if tensorboard:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"tensorboard": True})})
    # From here a signal either stops the run (train_run's own handler) or arrives while a finished
    # run is being rendered, where it is ignored. After an interruption signals stay ignored for the
    # rest of the process, interpreter exit included: the user asked to stop, and it is stopping.
    previous = ignore_stop_signals()
    interrupted = False
    try:
        result = train_run(cfg, out=run.out, name=run.name, command=sys.argv, quiet=run.quiet or run.json_,
                           dashboard=not run.json_, resume=resume)
        interrupted = result.record["status"] == "interrupted"
        emit(result.record, run.json_, run.quiet)
    finally:
        for signum, handler in previous.items():
            # SIG_IGN, unlike a Python handler, survives the interpreter's finalization.
            signal.signal(signum, signal.SIG_IGN if interrupted else handler)
    raise typer.Exit(result.exit_code)


def ignore_stop_signals() -> dict[int, Any]:
    """Ignore SIGINT/SIGTERM (with a Python handler, so child processes keep the defaults)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, lambda signum, frame: None) for s in (signal.SIGINT, signal.SIGTERM)}


def emit(record: dict[str, Any], as_json: bool, quiet: bool) -> None:
    """Print a finished run: the record as JSON, or the phase table and summary."""
    if as_json:
        sys.stdout.write(json.dumps(record, indent=2, default=str) + "\n")
        return
    from rich.console import Console

    from rlperf.report.tables import episode_growth_line, phase_table, summary_table

    console = Console()
    console.print(phase_table(record["phases"], title="phases", timing_mode=record["timing"]["mode"]))
    console.print(summary_table(record))
    growth = episode_growth_line(record)
    if growth:
        console.print(growth, highlight=False, markup=False)
    status = record["status"]
    line = f"run {record['name']}: {status} -> {record.get('run_dir', '')}"
    if status in ("failed", "diverged"):
        line += f" ({record.get('error', 'see run.json')})"
    resumable = record.get("config", {}).get("run", {}).get("mode") != "async"
    if status == "interrupted" and record.get("checkpoint") and resumable:
        line += f"; continue with: rlperf train --resume {record.get('run_dir', '')}"
    if not quiet or status != "completed":
        print(line, file=sys.stderr)
