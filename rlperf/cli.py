"""The ``rlperf`` command line: thin Typer commands over library functions.

Each command parses options, builds a validated config, calls a plain library function
(:func:`rlperf.runner.train_run`, ...) and renders its result. Known errors become one line on
stderr and exit code 2; ``RLPERF_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperCommand

from rlperf import __version__
from rlperf.errors import RlperfError

app = typer.Typer(
    name="rlperf",
    help="Find and fix performance bottlenecks in deep-RL training loops.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Run options shared by every command that runs training (train, profile, sweep, compare).
ConfigOpt = Annotated[Optional[str], typer.Option("--config", "-c", help="TOML config file, or a packaged name (default, fast, naive, smoke).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override any key: --set buffer.push=loop (repeatable).")]
EnvsOpt = Annotated[Optional[int], typer.Option("--envs", help="Boards stepped at once (env.num_envs).")]
EpisodesOpt = Annotated[Optional[int], typer.Option("--episodes", help="Stop after N finished episodes across all boards.")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", help="Stop after N env transitions.")]
RatioOpt = Annotated[Optional[float], typer.Option("--train-ratio", help="Gradient updates per vector step (0.25 = one every 4).")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed (run.seed).")]
OutOpt = Annotated[Path, typer.Option("--out", help="Directory for run directories.")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Run name (the directory gets a timestamp suffix).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No dashboard or progress output.")]


def build_config(config: str | None, overrides: list[str] | None, envs: int | None, episodes: int | None,
                 steps: int | None, train_ratio: float | None, device: str | None, seed: int | None):
    """Config file, then ``--set`` overrides, then flags, validated once."""
    from rlperf.config import config_from

    return config_from(config, overrides or [], envs=envs, episodes=episodes, steps=steps,
                       train_ratio=train_ratio, device=device, seed=seed)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlperf {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")] = False,
) -> None:
    """Find and fix performance bottlenecks in deep-RL training loops."""


class OneLineUsageErrors(TyperCommand):
    """A command whose option-parsing errors (bad value, unknown option) are one line and exit 2,
    like every other bad input, instead of click's usage block."""

    def parse_args(self, ctx, args):  # type: ignore[no-untyped-def]
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as exc:
            message = getattr(exc, "format_message", None)
            if message is None:
                raise
            raise RlperfError(" ".join(message().split()), hint=f"see rlperf {ctx.info_name} --help") from None


@app.command(cls=OneLineUsageErrors)
def train(
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
    tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also write TensorBoard scalars to RUN_DIR/tb.")] = False,
    resume: Annotated[Optional[Path], typer.Option(
        "--resume", metavar="RUN_DIR",
        help="Continue RUN_DIR from its checkpoint, in place, with its config.toml; --episodes/--steps may extend "
             "the stop condition (other keys that change what the run computes are refused).")] = None,
) -> None:
    """Train DQN on the batched Snake with a live per-phase dashboard; writes a run directory."""
    from rlperf.runner import resume_config, train_run

    if resume is not None:
        if config is not None:
            raise RlperfError("--config cannot be combined with --resume", hint=f"a resume uses {resume}/config.toml")
        if name is not None:
            raise RlperfError("--name cannot be combined with --resume", hint="a resume continues in RUN_DIR")
        cfg = resume_config(resume, set_, envs=envs, episodes=episodes, steps=steps, train_ratio=train_ratio,
                            device=device, seed=seed)
    else:
        cfg = build_config(config, set_, envs, episodes, steps, train_ratio, device, seed)
    if tensorboard:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"tensorboard": True})})
    # From here a signal either stops the run (train_run's own handler) or arrives while a finished
    # run is being rendered, where it is ignored. After an interruption signals stay ignored for the
    # rest of the process, interpreter exit included: the user asked to stop, and it is stopping.
    previous = _ignore_stop_signals()
    interrupted = False
    try:
        result = train_run(cfg, out=out, name=name, command=sys.argv, quiet=quiet or json_, dashboard=not json_, resume=resume)
        interrupted = result.record["status"] == "interrupted"
        emit(result.record, json_, quiet)
    finally:
        for signum, handler in previous.items():
            # SIG_IGN, unlike a Python handler, survives the interpreter's finalization.
            signal.signal(signum, signal.SIG_IGN if interrupted else handler)
    raise typer.Exit(result.exit_code)


def _ignore_stop_signals() -> dict[int, Any]:
    """Ignore SIGINT/SIGTERM (with a Python handler, so child processes keep the defaults)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, lambda signum, frame: None) for s in (signal.SIGINT, signal.SIGTERM)}


def emit(record: dict, as_json: bool, quiet: bool) -> None:
    """Print a finished run: the record as JSON, or the phase table and summary."""
    if as_json:
        sys.stdout.write(json.dumps(record, indent=2, default=str) + "\n")
        return
    from rich.console import Console

    from rlperf.report import phase_table, summary_table

    console = Console()
    console.print(phase_table(record["phases"], title="phases", timing_mode=record["timing"]["mode"]))
    console.print(summary_table(record))
    status = record["status"]
    line = f"run {record['name']}: {status} -> {record.get('run_dir', '')}"
    if status in ("failed", "diverged"):
        line += f" ({record.get('error', 'see run.json')})"
    resumable = record.get("config", {}).get("run", {}).get("mode") != "async"
    if status == "interrupted" and record.get("checkpoint") and resumable:
        line += f"; continue with: rlperf train --resume {record.get('run_dir', '')}"
    if not quiet or status != "completed":
        print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: known errors become one line on stderr and exit code 2."""
    try:
        app(args=argv, standalone_mode=True)
    except RlperfError as exc:
        if os.environ.get("RLPERF_DEBUG") == "1":
            raise
        print(f"rlperf: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
from rlperf import cmd_sweep  # noqa: E402,F401  (registers "sweep")
from rlperf import cmd_compare  # noqa: E402,F401  (registers "compare")
from rlperf import cmd_profile  # noqa: E402,F401  (registers "profile")
