"""The run options every command shares, declared once.

``train``, ``profile``, ``sweep`` and ``compare`` all take ``--config``, ``--set``, the common
flags, ``--out``, ``--name``, ``--json``, ``--quiet`` and ``--no-plot``. :func:`run_options` adds them to a
command's signature (Typer reads ``__signature__``) and hands the command one :class:`RunArgs`
instead of twelve parameters, so the options, their help and their order live here only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlperf.flags import RUN_FLAGS

if TYPE_CHECKING:
    from rlperf.config import Config

_OPTIONS: dict[str, tuple[Any, Any]] = {
    # name: (annotation, default); the name is also RunArgs' field.
    "config": (Annotated[str | None, typer.Option(
        "--config", "-c", help="TOML config file, or a packaged name (ci, classic, default, fast, naive, smoke).")], None),
    "set_": (Annotated[list[str] | None, typer.Option(
        "--set", "-s", help="Override any key: --set buffer.push=loop (repeatable).")], None),
    **{f.name: (Annotated[f.type | None, typer.Option(f.option, help=f.help)], None) for f in RUN_FLAGS},
    "out": (Annotated[Path, typer.Option("--out", help="Directory for run directories.")], Path("runs")),
    "name": (Annotated[str | None, typer.Option(
        "--name", help="Run name (the directory gets a timestamp suffix).")], None),
    "json_": (Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")], False),
    "quiet": (Annotated[bool, typer.Option("--quiet", "-q", help="No dashboard or progress output.")], False),
    "plot": (Annotated[bool, typer.Option(
        "--plot/--no-plot", help="Draw run.png, compare.png or sweep.png (a figure that cannot be drawn is a "
        "warning).")], True),
}


@dataclass
class RunArgs:
    """The shared options as given on the command line (None where not given); the six flags'
    fields are :data:`rlperf.flags.RUN_FLAGS`, by name."""

    config: str | None = None
    set_: list[str] | None = None
    envs: int | None = None
    episodes: int | None = None
    steps: int | None = None
    train_ratio: float | None = None
    device: str | None = None
    seed: int | None = None
    out: Path = Path("runs")
    name: str | None = None
    json_: bool = False
    quiet: bool = False
    plot: bool = True

    def build_config(self, config: str | None = None) -> Config:
        """``config`` (default: ``--config``), then ``--set``, then the flags, validated once."""
        from rlperf.config import config_from
        from rlperf.env.plan import refuse_inapplicable

        cfg = config_from(config if config is not None else self.config, self.set_ or [], **self.flags())
        # A key given here is asked for: one that cannot take effect with this env is an error.
        refuse_inapplicable(cfg, (item.split("=", 1)[0].strip() for item in self.set_ or []))
        return cfg

    def run_argv(self) -> list[str]:
        """``--set`` and the flags as arguments, to repeat this run elsewhere (compare lines, children)."""
        args: list[str] = []
        for item in self.set_ or []:
            args += ["--set", item]
        for flag in RUN_FLAGS:
            value = getattr(self, flag.name)
            if value is not None:
                args += [flag.option, f"{value:g}" if isinstance(value, float) else str(value)]
        return args

    def flags(self) -> dict[str, Any]:
        """The six run flags as ``config_from`` keywords (None where not given)."""
        return {flag.name: getattr(self, flag.name) for flag in RUN_FLAGS}

    @property
    def given(self) -> bool:
        """Whether any option that changes what a config runs was given."""
        return bool(self.set_) or any(v is not None for v in self.flags().values())


def run_options(exclude: Iterable[str] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command whose last parameter is ``run: RunArgs``: the shared options replace it.

    ``exclude`` names options the command declares itself (``sweep`` takes ``--envs`` as a list).
    """
    skipped = set(exclude)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "run"]
        shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
                  for name, (annotation, default) in _OPTIONS.items() if name not in skipped]
        names = {p.name for p in shared}

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            run = RunArgs(**{f.name: kwargs.pop(f.name) for f in fields(RunArgs) if f.name in names})
            return command(**kwargs, run=run)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + shared
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
