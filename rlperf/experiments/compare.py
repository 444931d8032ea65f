"""Side-by-side comparison of runs: records in, a comparison (plain data) out, a table from that.

Modelled on ``torch.utils.benchmark.Compare``: a column keeps its raw samples (one per record) and
its metadata; the comparison is data (``--json`` prints it), and the table is rendered from it.
With repeats a cell shows the median ± half the min–max range; a ratio whose two columns' ranges
overlap is *inside the noise* and is marked so (only with ≥ 3 samples a side, below that a range
says little). Units are picked per row, digits are trimmed to the spread, the best cell is bold.

Arguments of ``rlperf compare`` become :class:`Source` objects (:func:`load_sources`): a run
directory or ``run.json`` (a record), or a config to run now (:func:`run_sources`), optionally
with ``--vs key=value`` variants of one config. Nothing here knows about Typer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from rlperf.config import SEED_MAX, Config, apply_overrides
from rlperf.errors import ConfigError, RlperfError
from rlperf.report.stats import SPREAD_RULE, Summary, is_number, overlaps, summarize
from rlperf.report.tables import safe_table
from rlperf.report.units import MISSING, format_number, pick_unit
from rlperf.run.common import thread_settings_restored
from rlperf.run.files import CHECKPOINT_NAME, RECORD_NAME, check_comparable_record, make_run_dir, read_record
from rlperf.run.signals import RunInterrupted, StopSignal
from rlperf.system import machine_text
from rlperf.score import NOT_REACHED, target_key, time_to, tracked_targets
from rlperf.timers import PHASES

SCHEMA = 1
NOISE_MIN_SAMPLES = 3


def _device(system: Mapping[str, Any]) -> str:
    name = system.get("device_name")
    return f"{system.get('device')} ({name})" if name else str(system.get("device"))


# What records must agree on for their timings to be comparable: (what, how to read it from "system").
COMPARABLE: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("device", _device),
    ("machine", machine_text),
    ("rlperf version", lambda system: str(system.get("rlperf"))),
    ("torch version", lambda system: str(system.get("torch"))),
    ("thread count", lambda system: str(system.get("torch_threads"))),
)


# -- metrics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One row: where the value sits in a record, its kind (units) and which way is better."""

    key: str
    label: str
    path: tuple[str, ...]
    kind: str  # rate | seconds | memory | score
    better: str  # higher | lower
    ratio: str  # speedup | delta | change
    # How to derive the value from a record that predates its field (None: not derivable).
    derive: Callable[[Mapping[str, Any]], float | None] | None = None

    @property
    def group(self) -> str:
        return self.path[0]

    def value(self, record: Mapping[str, Any]) -> float | None:
        node: Any = record
        for part in self.path:
            if not isinstance(node, Mapping):
                node = None
                break
            node = node.get(part)
        if not is_number(node) and self.derive is not None:
            node = self.derive(record)
        return float(node) if is_number(node) else None


def _per_1000_env_steps(record: Mapping[str, Any]) -> float | None:
    rate = (record.get("throughput") or {}).get("env_steps_per_s")
    return 1000.0 / rate if is_number(rate) and rate > 0 else None


def phase_metric(name: str) -> Metric:
    return Metric(f"phase.{name}", name, ("phases", name, "total_s"), "seconds", "lower", "speedup")


THROUGHPUT = (
    Metric("env_steps_per_s", "env steps/s", ("throughput", "env_steps_per_s"), "rate", "higher", "speedup"),
    Metric("updates_per_s", "updates/s", ("throughput", "updates_per_s"), "rate", "higher", "speedup"),
    Metric("s_per_1000_env_steps", "s / 1000 env steps", ("throughput", "s_per_1000_env_steps"), "seconds", "lower",
           "speedup", _per_1000_env_steps),
    Metric("s_per_1000_episodes", "s / 1000 episodes", ("throughput", "s_per_1000_episodes"), "seconds", "lower", "speedup"),
)
SCORE = Metric("mean_score", "mean score (last 100)", ("learning", "mean_score_last_100"), "score", "higher", "delta")
MEMORY = (
    Metric("peak_rss_mb", "peak RSS", ("memory", "peak_rss_mb"), "memory", "lower", "change"),
    Metric("peak_cuda_mb", "peak CUDA memory", ("memory", "peak_cuda_mb"), "memory", "lower", "change"),
)


def time_to_score_metric(target: float) -> Metric:
    """Wall seconds (warm-up excluded) until the mean score of the last 100 episodes first reached ``target``."""
    key = target_key(target)
    return Metric(f"time_to_{key}", f"time to score {key}", ("time_to_score", key), "seconds", "lower", "speedup",
                  derive=lambda record: (time_to(record, target) or (False, None))[1])


def metrics_for(records: Sequence[Mapping[str, Any]]) -> list[Metric]:
    """The rows for these records: phases in loop order, throughput, score, time to score, memory
    (rows with data; a time-to-score row whenever a record tracks that target, reached or not)."""
    phase_names: list[str] = []
    for r in records:
        for name in r.get("phases") or {}:
            if name not in phase_names:
                phase_names.append(name)
    ordered = [p for p in PHASES if p in phase_names] + [p for p in phase_names if p not in PHASES]
    targets = [time_to_score_metric(t) for t in tracked_targets(records)]
    rows = [phase_metric(p) for p in ordered] + list(THROUGHPUT) + [SCORE] + targets + list(MEMORY)
    return [m for m in rows if m in targets or any(m.value(r) is not None for r in records)]


# -- the comparison -----------------------------------------------------------------------------


@dataclass
class Side:
    """One column: a label, where it came from, and its records (one per repeat)."""

    label: str
    source: str
    records: list[dict[str, Any]] = field(default_factory=list)


def compare(sides: Sequence[Side]) -> dict[str, Any]:
    """The comparison of ``sides`` (first is the baseline) as plain data; see the module docstring."""
    if len(sides) < 2:
        raise RlperfError(
            "compare needs at least two runs", hint="pass two run directories or configs, or a config with --vs key=value"
        )
    for side in sides:
        if not side.records:
            raise RlperfError(f"{side.label} has no run record")
    all_records = [r for s in sides for r in s.records]
    rows = []
    for metric in metrics_for(all_records):
        cells = [summarize([metric.value(r) for r in s.records]) for s in sides]
        row: dict[str, Any] = {
            "metric": metric.key,
            "label": metric.label,
            "group": metric.group,
            "kind": metric.kind,
            "better": metric.better,
            "cells": [c.as_dict() if c else None for c in cells],
            "shares": _shares(metric, sides),
            "ratios": [_ratio(metric, cells[0], c, s.label) for s, c in zip(sides[1:], cells[1:], strict=True)],
            "best": _best(metric, cells),
        }
        if metric.group == "time_to_score":
            # Per column: runs that reached the score of runs that track it (the cell is over the former).
            target = float(metric.key.removeprefix("time_to_"))
            hits = [[time_to(r, target) for r in s.records] for s in sides]
            row["reached"] = [[sum(1 for h in col if h and h[0]), sum(1 for h in col if h)] for col in hits]
        if metric.key == "peak_rss_mb" and not all(_rss_per_run(r) for r in all_records):
            # A process's peak so far says nothing about one run of several: shown, never compared.
            row["label"] = "peak RSS (process so far)"
            row["ratios"] = [None] * (len(sides) - 1)
            row["best"] = None
        rows.append(row)
    return {
        "schema": SCHEMA,
        "kind": "compare",
        "spread": SPREAD_RULE,
        "noise_rule": (f"a difference is inside the noise when the two min–max ranges overlap "
                       f"(≥ {NOISE_MIN_SAMPLES} samples a side)"),
        "baseline": sides[0].label,
        "runs": [
            {
                "label": s.label,
                "source": s.source,
                "n": len(s.records),
                "run_dirs": [r.get("run_dir") for r in s.records],
                "statuses": [r.get("status") for r in s.records],
                "system": (s.records[0].get("system") or {}),
            }
            for s in sides
        ],
        "rows": rows,
        "warnings": comparability_warnings(sides),
    }


def _rss_per_run(record: Mapping[str, Any]) -> bool:
    """Whether a record's peak RSS is its own run's (reset at the run's start), not its process's."""
    return (record.get("memory") or {}).get("rss_scope") == "run"


def _shares(metric: Metric, sides: Sequence[Side]) -> list[float | None] | None:
    if not metric.key.startswith("phase."):
        return None
    name = metric.path[1]
    out = []
    for s in sides:
        summary = summarize([((r.get("phases") or {}).get(name) or {}).get("share") for r in s.records])
        out.append(summary.median if summary else None)
    return out


def _ratio(metric: Metric, base: Summary | None, other: Summary | None, label: str) -> dict[str, Any]:
    """How ``other`` stands against ``base``: a speed-up (> 1 is faster), a score difference or a
    memory change; ``spread`` carries the two columns' spreads through (to first order) so that
    the ratio's digits can be trimmed like the cells'."""
    noise = None
    if base is not None and other is not None and min(base.n, other.n) >= NOISE_MIN_SAMPLES:
        noise = overlaps(base, other)
    value = spread = None
    if base is not None and other is not None:
        b, o = base.median, other.median
        relative = (base.spread / abs(b) if b else 0.0) + (other.spread / abs(o) if o else 0.0)
        if metric.ratio == "delta":
            value, spread = o - b, base.spread + other.spread
        elif metric.ratio == "change":
            value = (o - b) / b if b else None
            spread = abs(o / b) * relative if b else None
        else:
            value = (o / b if b else None) if metric.better == "higher" else (b / o if o else None)
            spread = value * relative if value is not None else None
    return {"vs": label, "kind": metric.ratio, "value": value, "spread": spread or None, "inside_noise": noise}


def _best(metric: Metric, cells: Sequence[Summary | None]) -> int | None:
    present = [(c.median, i) for i, c in enumerate(cells) if c is not None]
    if len(present) < 2 or len({m for m, _ in present}) == 1:
        return None
    pick = max if metric.better == "higher" else min
    return pick(present)[1]


def comparability_warnings(sides: Sequence[Side]) -> list[str]:
    """One line per way the records differ that makes their timings not strictly comparable."""
    warnings = []
    for what, read in COMPARABLE:
        seen: dict[str, list[str]] = {}
        for s in sides:
            for r in s.records:
                labels = seen.setdefault(read(r.get("system") or {}), [])
                if s.label not in labels:
                    labels.append(s.label)
        if len(seen) > 1:
            parts = "; ".join(f"{value} in {', '.join(labels)}" for value, labels in seen.items())
            warnings.append(f"records differ in {what}: {parts} — compared anyway")
    for s in sides:
        bad = [r.get("status") for r in s.records if r.get("status") != "completed"]
        if bad:
            warnings.append(f"{s.label}: {len(bad)} of {len(s.records)} runs not completed ({', '.join(map(str, bad))})")
    return warnings


# -- rendering ----------------------------------------------------------------------------------


def compare_table(comparison: Mapping[str, Any], title: str | None = "compare") -> Table:
    """The comparison as a rich table: metric, unit, one column per run, one ratio column per non-baseline run."""
    runs = comparison["runs"]
    base = comparison["baseline"]
    ns = sorted({r["n"] for r in runs})
    caption = [
        f"{SPREAD_RULE} over {'/'.join(map(str, ns))} runs" if max(ns) > 1 else "one run per column",
        f"× = speed-up over {base} (> 1 is faster); score as a difference; memory as a change",
    ]
    if max(ns) >= NOISE_MIN_SAMPLES:
        caption.append("(noise) = the two ranges overlap")
    if any(row.get("reached") for row in comparison["rows"]):
        caption.append("time to score: wall time until the mean score of the last 100 episodes first reached it, "
                       "warm-up excluded (median of the runs that reached it)")
    table = Table(title=title, caption="; ".join(caption))
    table.add_column("metric")
    table.add_column("unit")
    for r in runs:
        table.add_column(r["label"], justify="right")
    for r in runs[1:]:
        table.add_column(f"{r['label']} vs {base}", justify="right")
    previous_group = None
    for row in comparison["rows"]:
        group = row["group"]
        if previous_group is not None and group != previous_group:
            table.add_section()
        previous_group = group
        table.add_row(*_render_row(row))
    return safe_table(table)  # run names and phase names come from records


def _render_row(row: Mapping[str, Any]) -> list[Text | str]:
    cells = row["cells"]
    scale, unit = pick_unit(row["kind"], [c["median"] for c in cells if c])
    out: list[Text | str] = [row["label"], unit]
    reached = row.get("reached")
    for i, c in enumerate(cells):
        if c is None:
            out.append(NOT_REACHED if reached and reached[i][1] else MISSING)
            continue
        text = format_number(c["median"], c["spread"] if c["n"] > 1 else None, scale)
        if reached and reached[i][0] < reached[i][1]:
            text += f" ({reached[i][0]}/{reached[i][1]} reached)"
        if row.get("shares") and row["shares"][i] is not None:
            text += f" ({100 * row['shares'][i]:.0f}%)"
        out.append(Text(text, style="bold green" if row["best"] == i else ""))
    for ratio in row["ratios"]:
        out.append(_render_ratio(ratio, row, scale))
    return out


def _render_ratio(ratio: Mapping[str, Any] | None, row: Mapping[str, Any], scale: float) -> Text | str:
    if ratio is None:
        return MISSING
    value, spread = ratio["value"], ratio.get("spread")
    if value is None:
        return MISSING
    if ratio["kind"] == "speedup":
        text = f"{format_number(value, spread, show_spread=False)}×"
    elif ratio["kind"] == "delta":
        text = format_number(value, spread, scale, signed=True, show_spread=False)
    else:
        text = (
            format_number(100 * value, 100 * spread, signed=True, show_spread=False) if spread else f"{100 * value:+.0f}"
        ) + "%"
    if ratio["inside_noise"]:
        return Text(f"{text} (noise)", style="dim")
    return text


# -- sources: records and configs to run --------------------------------------------------------


@dataclass
class Source:
    """One ``rlperf compare`` argument: a record already on disk, or a config to run now."""

    label: str
    origin: str
    record: dict[str, Any] | None = None
    config: Config | None = None
    file: Path | None = None  # the record's file


def variant(cfg: Config, overrides: Sequence[str]) -> Config:
    """``cfg`` with ``key=value`` overrides; setting one stop condition clears the other (as the flags do)."""
    items = list(overrides)
    keys = {item.split("=", 1)[0].strip() for item in items}
    if "train.episodes" in keys and "train.steps" not in keys:
        items.append("train.steps=0")
    elif "train.steps" in keys and "train.episodes" not in keys:
        items.append("train.episodes=0")
    return apply_overrides(cfg, items)


def is_config_argument(arg: str) -> bool:
    """A ``.toml`` path, or the bare name of a packaged config that is not also a path here."""
    from rlperf.config import packaged_configs

    path = Path(arg)
    if path.suffix == ".toml":
        return True
    return not path.exists() and arg in packaged_configs()


def load_sources(args: Sequence[str], vs: Sequence[str], make_config: Callable[[str], Config]) -> list[Source]:
    """Turn command arguments into sources. ``make_config(path)`` applies the shared run options.

    Raises RlperfError (one line) for a path that does not exist, a directory without a record,
    ``--vs`` without exactly one config argument, or fewer than two columns.
    """
    if vs and (len(args) != 1 or not is_config_argument(args[0])):
        raise RlperfError(
            "--vs needs exactly one config argument", hint="e.g. rlperf compare configs/fast.toml --vs buffer.push=loop"
        )
    sources: list[Source] = []
    for arg in args:
        source = source_from(arg, make_config)
        source.label = _unique(source.label, sources)
        sources.append(source)
    for item in vs:
        if "=" not in item:
            raise RlperfError(f"--vs {item!r} has no '='", hint="write --vs section.key=value, e.g. --vs train.train_ratio=4")
        base = sources[0]
        assert base.config is not None
        cfg = variant(base.config, [item])
        sources.append(Source(_unique(item.strip(), sources), f"{base.origin} --vs {item.strip()}", config=cfg))
    if len(sources) < 2:
        raise RlperfError(
            "compare needs at least two runs", hint="pass two run directories or configs, or a config with --vs key=value"
        )
    # Run directories are named NAME-YYYYmmdd-HHMMSS: show NAME where that alone tells them apart.
    short = [_RUN_STAMP.sub("", s.label) if s.record is not None else s.label for s in sources]
    if len(set(short)) == len(short):
        for s, label in zip(sources, short, strict=True):
            s.label = label
    return sources


def source_from(arg: str, make_config: Callable[[str], Config]) -> Source:
    """One argument as a source: a config to run (``make_config`` applies the run options), or the
    record of a run directory or ``run.json``; a one-line error for anything else."""
    path = Path(arg)
    if is_config_argument(arg):
        return Source(path.stem, arg, config=make_config(arg))
    if not path.exists():
        raise RlperfError(f"no such run, record or config: {arg}", hint="pass a run directory, a run.json or a .toml config")
    if path.is_dir() and not (path / RECORD_NAME).exists():  # one that is not a file: read_record says what it is
        if (path / CHECKPOINT_NAME).is_file():  # killed between its final checkpoint and its record
            raise RlperfError(f"{arg} has no {RECORD_NAME} yet",
                              hint=f"a run killed before its record was written gets it from rlperf train --resume {arg}")
        inside = runs_in(path)
        raise RlperfError(
            f"{arg} is not a run directory (no {RECORD_NAME})" + (f"; it holds {len(inside)} runs" if inside else ""),
            hint=(f"pass them ({Path(arg) / '*'}/), or the folder itself as a side of the gate (--fail-if-slower)"
                  if inside else "pass a directory written by rlperf train, or a .toml config"),
        )
    file = path / RECORD_NAME if path.is_dir() else path
    record = read_record(file)
    check_comparable_record(record, file)
    return Source(str(record.get("name") or (path.name if path.is_dir() else path.parent.name)), arg, record=record,
                  file=file)


def runs_in(folder: Path) -> list[Path]:
    """The runs directly inside ``folder`` (a ``runs/`` folder, a CI artifact of runs), sorted: run
    directories with a record, those killed before it (which say so when read), and records saved
    as ``.json`` files of their own (``json.dump(timer.record(), ...)``; each is checked when read)."""
    with contextlib.suppress(OSError):
        return sorted(p for p in folder.iterdir()
                      if (p.is_dir() and ((p / RECORD_NAME).is_file() or (p / CHECKPOINT_NAME).is_file()))
                      or (p.suffix == ".json" and p.is_file()))
    return []


_RUN_STAMP = re.compile(r"-\d{8}-\d{6}(-\d+)?$")


def _unique(label: str, sources: Sequence[Source]) -> str:
    taken = {s.label for s in sources}
    if label not in taken:
        return label
    k = 2
    while f"{label}#{k}" in taken:
        k += 1
    return f"{label}#{k}"


def check_sources(sources: Sequence[Source]) -> None:
    """Refuse, before anything runs, a config or variant that could not run (its device, a knob that
    cannot apply there, a run that does not fit in memory), naming the column."""
    from rlperf.run.common import check_run

    for s in sources:
        if s.config is not None:
            try:
                check_run(s.config)
            except RlperfError as exc:
                raise type(exc)(f"{s.label}: {exc.message}", hint=exc.hint) from None


def run_sources(
    sources: Sequence[Source],
    repeats: int,
    out: str | Path = "runs",
    name: str | None = None,
    command: list[str] | None = None,
    on_run: Callable[[str, int, str], None] | None = None,
    stop: StopSignal | None = None,
    runner: Callable[..., Any] | None = None,
    prefix: str = "compare",
    vary_seed: bool = True,
    into: Path | None = None,
    alternate_from: int | None = None,
) -> tuple[list[Side], bool]:
    """Run the config sources ``repeats`` times each and gather every source's records into a side.

    Repeats are interleaved (A B A B ...) so slow drift in the machine spreads over all columns;
    repeat k uses ``run.seed + k`` (``vary_seed=False``: every repeat the same seed, the same work).
    Runs go under one ``{prefix}-*`` directory in ``out`` (``into``: an existing one, where more
    repeats join those already run). ``alternate_from``: repeat k runs in reverse order when
    ``alternate_from + k`` is odd (the gate's pairs: a step in the machine's speed lands on either
    side alike). ``on_run(label, repeat, event)`` is told "start" and "done". ``stop``: the caller's
    stop signal (by default its own): a signal stops the run in progress at a step boundary and no
    other run starts. ``runner(label, cfg, **train_run keywords)`` replaces ``train_run`` (bench_gate.py
    plants a slowdown with it). Returns (sides, interrupted): after a signal, the runs that finished.
    """
    runner = runner or _train
    if repeats < 1:
        raise RlperfError(f"--repeats must be at least 1 (got {repeats})")
    sides = [Side(s.label, s.origin, [s.record] if s.record is not None else []) for s in sources]
    to_run = [(i, s) for i, s in enumerate(sources) if s.config is not None]
    if not to_run:
        return sides, False
    check_sources(sources)
    _check_seeds([s for _, s in to_run], repeats)
    own, stop = stop is None, stop if stop is not None else StopSignal()
    stop.arm()
    with stop.installed() if own else contextlib.nullcontext():
        stop.raise_if_set("the comparison started")
        folder = into if into is not None else make_run_dir(out, name, prefix=prefix)
        for k in range(repeats):
            for i, s in reversed(to_run) if alternate_from is not None and (alternate_from + k) % 2 else to_run:
                assert s.config is not None
                if stop():
                    return sides, True
                cfg = apply_overrides(s.config, [f"run.seed={s.config.run.seed + k}"]) if k and vary_seed else s.config
                if on_run:
                    on_run(s.label, k, "start")
                try:
                    with thread_settings_restored():
                        result = runner(s.label, cfg, out=folder, name=_dir_name(s.label), command=command, quiet=True,
                                        dashboard=False, kind="compare", stop=stop)
                except RunInterrupted:  # the signal came while this run was starting: nothing of it was written
                    return sides, True
                sides[i].records.append(read_record(result.run_dir))
                if on_run:
                    on_run(s.label, k, "done")
                if result.record["status"] == "interrupted" or stop():
                    return sides, True
    return sides, False


def _train(label: str, cfg: Config, **kwargs: Any) -> Any:
    """The default runner of :func:`run_sources`: :func:`~rlperf.run.lifecycle.train_run` (the label is not needed)."""
    from rlperf.run.lifecycle import train_run

    return train_run(cfg, **kwargs)


def _check_seeds(sources: Sequence[Source], repeats: int) -> None:
    """Refuse repeats whose seeds (``run.seed + k``) would pass SEED_MAX, naming the column."""
    for s in sources:
        assert s.config is not None
        if s.config.run.seed + repeats - 1 > SEED_MAX:
            raise ConfigError(f"{s.label}: run.seed={s.config.run.seed} with --repeats {repeats} needs seeds above {SEED_MAX}",
                              hint="pass a smaller --seed")


def _dir_name(label: str) -> str:
    return (re.sub(r"[^A-Za-z0-9._=,+-]+", "_", label).strip("._") or "run")[:100]
