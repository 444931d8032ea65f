"""The ``rlperf`` command line: thin Typer commands over library functions.

Each command parses options, builds a validated config, calls a plain library function
(:func:`rlperf.runner.train_run`, ...) and renders its result. Known errors become one line on
stderr and exit code 2; ``RLPERF_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

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


@app.command()
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
) -> None:
    """Train DQN on the batched Snake with a live per-phase dashboard; writes a run directory."""
    from rlperf.runner import train_run

    cfg = build_config(config, set_, envs, episodes, steps, train_ratio, device, seed)
    if tensorboard:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"tensorboard": True})})
    result = train_run(cfg, out=out, name=name, command=sys.argv, quiet=quiet or json_, dashboard=not json_)
    emit(result.record, json_, quiet)
    raise typer.Exit(result.exit_code)


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
    if status != "completed":
        line += f" ({record.get('error', 'see run.json')})" if status == "failed" else ""
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
