"""A grid of training runs over any config keys, each trial a normal run with its own record.

``run_sweep`` takes a validated base config and :class:`Axis` objects (a key and its values),
runs the cartesian product ``repeats`` times, and writes into one sweep directory: a run directory
per trial, ``sweep.json`` (every trial, read back from its record, and the per-point summary),
``sweep.csv`` (one row per trial) and ``sweep.png``. Backends:

- ``local``: one trial at a time in this process, so that no trial's timings are polluted by
  another's.
- ``ray``: trials as Ray Tune trials (a function trainable calling :func:`rlperf.run.lifecycle.train_run`)
  on an existing cluster (``address``) or a local one; Ray is imported only here. A request the
  cluster cannot meet, or a cluster that wants an authentication token this process does not send,
  is refused before anything starts. The trainable takes plain data (each trial's config as TOML)
  and reports its record or its error; the display hears of each trial on the driver, from that.

Every grid point is validated before the first trial (a bad value, a knob that cannot apply,
a run that does not fit: one line, nothing written); a trial that raises is recorded as
``failed`` with its error and the sweep goes on; a sweep that fails as a whole (its Tune run)
leaves no sweep directory. SIGINT or SIGTERM stops the sweep at the next
boundary: the running trial (or, on Ray, every running trial, told through a stop file in the
sweep directory) stops at a step boundary and writes its record as ``interrupted``, trials not
started are ``not run``, and sweep.json/csv/png are written for what finished. A full disk
(DiskError) stops the sweep the same way and is reported after the outputs that could be written.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import io
import itertools
import json
import logging
import math
import os
import shutil
import signal
import statistics
import tomllib
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from rlperf.experiments.compare import variant
from rlperf.report.stats import SPREAD_RULE, summarize
from rlperf.report.units import MISSING, format_number, pick_unit
from rlperf.config import (
    SEED_MAX, Config, apply_overrides, check_override_value, config_to_dict, flat_keys, loads_config, to_toml,
)
from rlperf.errors import ConfigError, DiskError, RlperfError
from rlperf.run.common import thread_settings_restored
from rlperf.atomic import write_json_atomic, write_text_atomic
from rlperf.run.files import check_run_name, make_run_dir, read_record
from rlperf.run.schema import validate_record
from rlperf.run.signals import STOP_SIGNALS, RunInterrupted, StopSignal, in_main_thread
from rlperf.score import NOT_REACHED, target_key, time_to, tracked_targets
from rlperf.timers import PHASES

SCHEMA = 1
BACKENDS = ("local", "ray")
RAY_HINT = "pip install 'rlperf[ray]'"

# The figures a trial contributes, by record path: (column, path, unit kind).
TRIAL_METRICS = (
    ("env_steps_per_s", ("throughput", "env_steps_per_s"), "rate"),
    ("updates_per_s", ("throughput", "updates_per_s"), "rate"),
    ("s_per_1000_env_steps", ("throughput", "s_per_1000_env_steps"), "seconds"),
    ("s_per_1000_episodes", ("throughput", "s_per_1000_episodes"), "seconds"),
    ("mean_episode_length", ("learning", "mean_episode_length"), "score"),
    ("mean_score", ("learning", "mean_score_last_100"), "score"),
    *tuple((f"share_{p}", ("phases", p, "share"), "share") for p in PHASES),
)


# -- the objective ------------------------------------------------------------------------------

OBJECTIVES = {
    "final_score": ("mean score of the last 100 episodes at the end", "higher"),
    "env_steps_per_s": ("env steps per second (warm-up excluded)", "higher"),
    "updates_per_s": ("gradient updates per second (warm-up excluded)", "higher"),
}
"""Objectives besides ``time_to_S`` (seconds until the mean score first reached S, lower is better)."""


@dataclass(frozen=True)
class Objective:
    """What ranks a sweep's grid points: ``time_to_S`` (one of ``train.score_targets``), ``final_score``,
    ``env_steps_per_s`` or ``updates_per_s``. A point's value is the median over its completed repeats;
    for a time to score, a repeat that did not reach S counts as infinitely slow, so a point most of
    whose repeats did not reach it is *not reached* and ranks last."""

    name: str
    better: str  # higher | lower
    target: float | None = None

    @property
    def column(self) -> str:
        return {"final_score": "mean_score"}.get(self.name, self.name)

    def trial_value(self, t: Trial) -> float | None:
        """One completed trial's value (inf: the score was not reached); None: no value."""
        if self.target is not None:
            hit = time_to(t.record or {}, self.target)
            return None if hit is None else (hit[1] if hit[0] and hit[1] is not None else math.inf)
        path = {"final_score": ("learning", "mean_score_last_100")}.get(self.name, ("throughput", self.name))
        return t.value(path)

    def point_value(self, trials: Sequence[Trial]) -> float | None:
        values = [v for v in (self.trial_value(t) for t in trials if t.status == "completed") if v is not None]
        return statistics.median(values) if values else None


def parse_objective(name: str, trials: Sequence[Trial]) -> Objective:
    """The objective named ``name``, checked against every trial's config before anything runs."""
    name = name.strip()
    if name in OBJECTIVES:
        return Objective(name, OBJECTIVES[name][1])
    known = ["time_to_S (S in train.score_targets)", *OBJECTIVES]
    if not name.startswith("time_to_"):
        close = difflib.get_close_matches(name, ["time_to_20", *OBJECTIVES], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"unknown sweep objective {name!r}", hint=f"{hint}use one of: {', '.join(known)}")
    try:
        target = float(name.removeprefix("time_to_"))
    except ValueError:
        raise ConfigError(f"unknown sweep objective {name!r}",
                          hint="write time_to_S with S a score in train.score_targets, e.g. time_to_20") from None
    for t in trials:
        tracked = t.config.train.score_targets if t.config is not None else []
        if target_key(target) not in {target_key(x) for x in tracked}:
            listed = ", ".join(target_key(x) for x in tracked) or "none"
            raise ConfigError(f"objective {name}: score {target_key(target)} is not in train.score_targets "
                              f"({listed})", hint=f"add it: --set 'train.score_targets=[{target_key(target)}]' "
                              "(with the other targets you want)")
    return Objective(f"time_to_{target_key(target)}", "lower", target)


def rank_points(trials: Sequence[Trial], objective: Objective) -> list[tuple[int, float | None]]:
    """Grid points best first, each with its objective value (inf or None: not reached / no value, last)."""
    points: dict[int, list[Trial]] = {}
    for t in trials:
        points.setdefault(t.point, []).append(t)
    valued = {point: objective.point_value(group) for point, group in points.items()}
    # Among points that did not reach the score, those where more repeats reached it come first.
    reached = {point: sum(1 for t in group if t.status == "completed" and (v := objective.trial_value(t)) is not None
                          and math.isfinite(v)) for point, group in points.items()}

    def key(point: int) -> tuple[bool, float, int, int]:
        value = valued[point]
        missing = value is None or math.isinf(value)
        sign = 1.0 if objective.better == "lower" else -1.0
        return missing, 0.0 if missing or value is None else sign * value, -reached[point], point

    return [(point, valued[point]) for point in sorted(valued, key=key)]


# -- the grid -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """One swept key and its values, as written (``"4"``, ``"loop"``, ``"[64,64]"``)."""

    key: str
    values: tuple[str, ...]

    @property
    def short(self) -> str:
        return self.key.split(".", 1)[-1]


def split_values(text: str) -> list[str]:
    """``"1,4,[64,64]"`` → ``["1", "4", "[64,64]"]``: commas inside brackets or quotes do not split."""
    values: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    values.append("".join(current).strip())
    if any(not v for v in values):
        raise ConfigError(f"empty value in {text!r}", hint="separate values with commas: 1,4,16")
    return values


def parse_param(spec: str) -> Axis:
    """``"section.key=v1,v2"`` (one ``--param``) → an Axis."""
    if "=" not in spec:
        raise ConfigError(
            f"--param {spec!r} has no '='", hint="write --param section.key=v1,v2, e.g. --param buffer.push=loop,batch"
        )
    key, values = (part.strip() for part in spec.split("=", 1))
    return Axis(key, tuple(split_values(values)))


def check_axes(base: Config, axes: Sequence[Axis]) -> None:
    """Refuse unknown keys (with a suggestion), repeated keys and an empty grid, before anything runs."""
    if not axes:
        raise ConfigError("nothing to sweep", hint="give --train-ratio 1,4,16, --envs 32,64 or --param section.key=v1,v2")
    known = flat_keys(base)
    seen: set[str] = set()
    for axis in axes:
        if axis.key not in known:
            apply_overrides(base, [f"{axis.key}=0"])  # raises the one-line "unknown key, did you mean"
            raise ConfigError(f"cannot sweep {axis.key!r}")  # pragma: no cover - the line above raises
        if axis.key in seen:
            raise ConfigError(f"{axis.key} is swept twice", hint="give each key once, with all its values")
        seen.add(axis.key)
        for value in axis.values:
            try:
                check_override_value(base, f"{axis.key}={value}")
            except RlperfError as exc:
                raise type(exc)(f"sweep point {axis.short}={value}: {exc.message}", hint=exc.hint) from None


@dataclass
class Trial:
    """One run of one grid point; after the sweep it holds the record read back from disk."""

    index: int
    point: int
    repeat: int
    overrides: list[str]
    params: dict[str, Any]
    status: str = "pending"  # pending | completed | interrupted | diverged | failed | not run
    seed: int | None = None
    name: str = ""
    run_dir: str | None = None
    error: str | None = None
    record: dict[str, Any] | None = field(default=None, repr=False)
    config: Config | None = field(default=None, repr=False)

    def value(self, path: Sequence[str]) -> float | None:
        node: Any = self.record
        for part in path:
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None

    def row(self) -> dict[str, Any]:
        """The trial as one flat row (sweep.csv, sweep.json): figures come from its record as written."""
        row: dict[str, Any] = {"trial": self.index, "point": self.point, "repeat": self.repeat, "seed": self.seed}
        row.update(self.params)
        row["status"] = self.status
        for column, path, _ in TRIAL_METRICS:
            row[column] = self.value(path)
        row["best_score"] = self.value(("learning", "best_score"))
        for target in tracked_targets([self.record] if self.record else []):
            hit = time_to(self.record or {}, target)
            row[f"time_to_{target_key(target)}"] = hit[1] if hit else None
            row[f"reached_{target_key(target)}"] = hit[0] if hit else None
        row["wall_s"] = self.value(("totals", "wall_s"))
        row["run_dir"] = self.run_dir
        row["error"] = self.error
        return row


def plan(base: Config, axes: Sequence[Axis], repeats: int, runnable_here: bool = True) -> list[Trial]:
    """Every grid point × repeat, repeats of a point adjacent; every point validated now, before any runs.

    Repeat k runs with ``run.seed + k`` (unless ``run.seed`` is swept), so the score's spread is a
    seed spread. A point whose config is invalid, or (``runnable_here``: the trials run on this
    machine) could not run here -- device, knobs, memory -- raises a one-line error naming the
    point: nothing has run or been written yet. Ray trials run on the cluster's nodes, whose
    devices and memory only they can judge.
    """
    from rlperf.run.common import check_run

    if repeats < 1:
        raise ConfigError(f"--repeats must be at least 1 (got {repeats})")
    check_axes(base, axes)
    seed_swept = any(a.key == "run.seed" for a in axes)
    if not seed_swept and base.run.seed + repeats - 1 > SEED_MAX:
        raise ConfigError(f"run.seed={base.run.seed} with --repeats {repeats} needs seeds up to "
                          f"{base.run.seed + repeats - 1}, above {SEED_MAX}", hint="pass a smaller --seed")
    trials: list[Trial] = []
    for point, combo in enumerate(itertools.product(*(a.values for a in axes))):
        overrides = [f"{a.key}={v}" for a, v in zip(axes, combo, strict=True)]
        for k in range(repeats):
            trial = Trial(len(trials), point, k, overrides, {a.key: _typed(v) for a, v in zip(axes, combo, strict=True)})
            trial.name = f"trial{trial.index:03d}"
            try:
                cfg = variant(base, overrides)
                if not k and runnable_here:
                    check_run(cfg)
                elif not seed_swept:
                    cfg = apply_overrides(cfg, [f"run.seed={cfg.run.seed + k}"])
            except RlperfError as exc:
                point_name = " ".join(f"{a.short}={v}" for a, v in zip(axes, combo, strict=True))
                raise type(exc)(f"sweep point {point_name}: {exc.message}", hint=exc.hint) from None
            trial.config, trial.seed = cfg, cfg.run.seed
            flat = flat_keys(cfg)
            trial.params = {a.key: flat[a.key] for a in axes}
            trials.append(trial)
    return trials


def _typed(raw: str) -> Any:
    """A value as the config would read it (a number, a bool, a list), else the string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


# -- running ------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    """Everything a sweep produced; ``data()`` is what sweep.json holds."""

    sweep_dir: Path
    axes: list[Axis]
    repeats: int
    backend: str
    trials: list[Trial]
    base: Config
    interrupted: bool = False
    signum: int | None = None  # the signal that stopped the sweep, if one did
    objective: Objective | None = None

    @property
    def exit_code(self) -> int:
        """130 / 143 when stopped by a signal, 1 with a failed trial, else 0."""
        if self.interrupted:
            return 128 + (self.signum or signal.SIGINT)
        return 1 if self.failed else 0

    @property
    def failed(self) -> list[Trial]:
        return [t for t in self.trials if t.status == "failed"]

    def summary(self) -> list[dict[str, Any]]:
        return summarize_points(self.trials, self.axes, self.objective)

    def data(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kind": "sweep",
            "sweep_dir": str(self.sweep_dir),
            "backend": self.backend,
            "axes": {a.key: [_typed(v) for v in a.values] for a in self.axes},
            "repeats": self.repeats,
            "spread": SPREAD_RULE,
            "interrupted": self.interrupted,
            "base_config": config_to_dict(self.base),
            "trials": [t.row() for t in self.trials],
            "objective": None if self.objective is None else {
                "name": self.objective.name, "better": self.objective.better,
                "rule": "median over completed repeats; a repeat that did not reach the score counts as "
                        "infinitely slow; unreached points rank last",
            },
            "summary": self.summary(),
        }


TrialCallback = Callable[[str, Trial], None]


def run_sweep(
    base: Config,
    axes: Sequence[Axis],
    repeats: int = 1,
    out: str | Path = "runs",
    name: str | None = None,
    backend: str = "local",
    address: str | None = None,
    trial_cpus: float = 1.0,
    trial_gpus: float = 0.0,
    command: list[str] | None = None,
    on_trial: TrialCallback | None = None,
    stop: StopSignal | None = None,
    objective: str | None = None,
    plot: bool = True,
) -> SweepResult:
    """Run the grid and write the sweep directory (``plot``: with sweep.png); ``on_trial(event, trial)``
    hears "start" and "end".

    ``stop``: the caller's stop signal (the command line's); by default the sweep installs its own.
    ``objective`` (see :class:`Objective`) ranks the grid points, best first, in the summary and table.
    Raises RlperfError (nothing written) for a bad axis, value or objective, an unknown backend, a missing Ray
    or a resource request the Ray cluster cannot meet; RunInterrupted for a signal before the sweep
    directory exists; DiskError (one line) after writing what it could when the disk is full.
    """
    if backend not in BACKENDS:
        raise RlperfError(f"unknown sweep backend {backend!r}", hint="use local or ray")
    check_run_name(name)
    trials = plan(base, axes, repeats, runnable_here=backend == "local")
    ranking = parse_objective(objective, trials) if objective is not None else None
    notify = on_trial or (lambda event, trial: None)
    own = stop is None
    stop = stop if stop is not None else StopSignal()
    stop.arm()
    with stop.installed() if own else contextlib.nullcontext():
        ray_session = None
        try:
            ray_session = _RaySession(address, trial_cpus, trial_gpus) if backend == "ray" else None
            if ray_session is not None:
                ray_session.check([t.config for t in trials if t.config is not None])
            stop.raise_if_set("the sweep started")
            sweep_dir = make_run_dir(out, name, prefix="sweep").resolve()
            result = SweepResult(sweep_dir, list(axes), repeats, backend, trials, base, objective=ranking)
            with _removed_on_failure(sweep_dir):
                disk, stopped = _run_trials(ray_session, trials, sweep_dir, command, notify, stop)
            result.interrupted = stop() or stopped
            result.signum = stop.signum
            write_outputs(result, plot)
            if disk is not None:
                raise DiskError(f"{disk.message}; the sweep stopped, {sweep_dir} holds sweep.json/csv/png for "
                                f"the trials before it", hint=disk.hint)
            return result
        finally:
            if ray_session is not None:
                ray_session.close()


@contextlib.contextmanager
def _removed_on_failure(sweep_dir: Path) -> Iterator[None]:
    """A sweep whose trials could not be run or gathered (its Tune run failed, say) leaves nothing
    behind: run directories without sweep.json are no result. (A full disk does not raise here: the
    trials stop, and sweep.json is written for those before it.)"""
    try:
        yield
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        raise


def _run_trials(ray_session: _RaySession | None, trials: Sequence[Trial], sweep_dir: Path, command: list[str] | None,
                notify: TrialCallback, stop: StopSignal) -> tuple[DiskError | None, bool]:
    """Run the trials (with Tune, or here one at a time); returns the full disk that stopped them, if one
    did, and whether any trial did not run to its end."""
    disk: DiskError | None = None
    try:
        if ray_session is not None:
            ray_session.run(trials, sweep_dir, command, notify, stop)
        else:
            _run_local(trials, sweep_dir, command, notify, stop)
    except DiskError as exc:
        disk = exc
    # A trial still pending was never run: the sweep was stopped (a signal, a full disk, Tune).
    stopped = [t for t in trials if t.status in ("pending", "interrupted", "not run")]
    for t in stopped:
        if t.status == "pending":
            t.status = "not run"
    return disk, bool(stopped)


def _run_local(trials: Sequence[Trial], sweep_dir: Path, command: list[str] | None, notify: TrialCallback,
               stop: StopSignal) -> None:
    from rlperf.run.lifecycle import train_run

    for t in trials:
        if stop():  # stopped between two trials: the rest are not run
            return
        assert t.config is not None
        notify("start", t)
        try:
            with thread_settings_restored():
                run = train_run(
                    t.config, out=sweep_dir, name=t.name, command=command, quiet=True, dashboard=False, kind="sweep",
                    stop=stop,
                )
        except RunInterrupted:  # the signal came while the trial was starting: nothing of it was written
            t.status = "not run"
            notify("end", t)
            return
        except DiskError as exc:  # the disk is full: this trial says so, and the sweep stops
            t.status, t.error = "failed", _one_line(exc)
            run_dir = getattr(exc, "run_dir", None)
            if run_dir is not None:
                _take_record(t, run_dir)
            notify("end", t)
            raise
        except Exception as exc:  # a failing trial is data; the sweep goes on
            t.status, t.error = "failed", _one_line(exc)
            notify("end", t)
            continue
        _take_record(t, run.run_dir)
        notify("end", t)
        if t.status == "interrupted" or stop():  # the signal reached the run: stop the sweep here
            return


def _take_record(t: Trial, run_dir: str | Path, reported: dict[str, Any] | None = None) -> None:
    """Read the trial's record back from its run directory (the record is the evidence)."""
    t.run_dir = str(run_dir)
    try:
        t.record = read_record(run_dir)
    except RlperfError:
        if reported is None:
            raise
        # A remote Ray node whose disk this machine cannot see: its report, checked like a file.
        t.record = validate_record(reported, f"{run_dir} (as the Ray trial reported it)")
    t.status = t.record.get("status", "failed")
    t.error = t.record.get("error")


def _one_line(error: BaseException | str) -> str:
    """An exception (or a traceback's text) as one line; a Ray task error is unwrapped to the exception
    the trial raised."""
    if isinstance(error, str):
        return [line.strip() for line in error.splitlines() if line.strip()][-1]
    exc = error
    seen = {id(exc)}
    while isinstance(getattr(exc, "cause", None), BaseException) and id(exc.cause) not in seen:  # type: ignore[attr-defined]
        exc = exc.cause  # type: ignore[attr-defined]
        seen.add(id(exc))
    if isinstance(exc, RlperfError):
        return " ".join(str(exc).split())
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


# -- Ray ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _ray_owns_no_signals() -> Iterator[None]:
    """Around ``ray.init``: the local Ray processes it starts (GCS, raylet, agents) share this
    process group, so a terminal's Ctrl-C would reach them and take the running trials down before
    they could record anything. They start with SIGINT blocked (a signal mask is inherited) and
    stay out of it; the stop reaches the trials through their stop file instead. ``ray.init`` also
    installs its own SIGTERM handler in the driver, which would exit with Ray's messages and no
    outputs: the caller's handlers are put back."""
    if not in_main_thread():
        yield
        return
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)


STOP_FILE = ".stop"
"""In the sweep directory while Ray trials run: written (with the signal's number) when the sweep is
told to stop; each trial's run checks for it at its step boundaries."""


def _count(n: float, unit: str) -> str:
    return f"{n:g} {unit}" + ("" if n == 1 else "s")


def _import_ray() -> Any:
    try:
        import ray
        from ray import tune  # noqa: F401
    except ImportError:
        raise RlperfError("--backend ray needs Ray Tune, which is not installed", hint=RAY_HINT) from None
    return ray


LOCAL_RAY_CONFIG = {"worker_niceness": 0}
"""The local Ray instance a sweep starts. Ray runs its workers at nice 15, below everything else on the
machine: beside two busy processes a three-trial sweep took 245 s against 10-24 s quiet (each trial
got a sliver of a CPU). The trials are the work the user asked for; they run at the driver's priority.
A cluster started elsewhere (``--address``) keeps its own setting."""


class _RaySession:
    """Connects to (or starts) a Ray cluster, checks resources, runs the trials with Tune."""

    def __init__(self, address: str | None, cpus: float, gpus: float) -> None:
        if cpus <= 0 or gpus < 0:
            raise RlperfError(f"--trial-cpus must be > 0 and --trial-gpus ≥ 0 (got {cpus}, {gpus})")
        if address and address.startswith("ray://"):
            # Through Ray Client, Tune itself runs on the cluster: the trials' outcomes, the display and
            # the stop file would all be out of this process's reach.
            raise RlperfError(f"--address {address}: a sweep cannot run through Ray Client",
                              hint="give the head node's address host:port, as `ray start --head` prints it")
        self.ray = _import_ray()
        self.cpus, self.gpus = cpus, gpus
        self.started = False
        if not self.ray.is_initialized():
            if address and "://" not in address and address not in ("auto", "local"):
                _refuse_without_token(address)
            # Keep the driver's terminal for rlperf: workers' output stays in Ray's logs.
            kwargs: dict[str, Any] = dict(
                include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True
            )
            if address in (None, "local"):  # a cluster of its own: its settings are this process's to choose
                kwargs["_system_config"] = LOCAL_RAY_CONFIG
            try:
                with _ray_owns_no_signals():
                    self.ray.init(address=address, **kwargs)
            except Exception as exc:  # ConnectionError, RuntimeError, ...: all one message
                where = f"the Ray cluster at {address}" if address else "a local Ray instance"
                raise RlperfError(
                    f"cannot start or reach {where}: {_one_line(exc)}", hint="check --address (ray status on the head node)"
                ) from None
            self.started = True

    def check(self, configs: Sequence[Config]) -> None:
        """Refuse up front what the cluster cannot give one trial, with the reason."""
        have = self.ray.cluster_resources()
        cpus, gpus = have.get("CPU", 0.0), have.get("GPU", 0.0)
        if self.cpus > cpus:
            raise RlperfError(
                f"each trial asks for {_count(self.cpus, 'CPU')} but the Ray cluster has {cpus:g}",
                hint="lower --trial-cpus or add nodes",
            )
        if self.gpus > gpus:
            raise RlperfError(
                f"each trial asks for {_count(self.gpus, 'GPU')} but the Ray cluster has {gpus:g}",
                hint="drop --trial-gpus, or connect to a cluster with GPUs (--address)",
            )
        if self.gpus == 0 and any(c.run.device.startswith("cuda") for c in configs):
            raise RlperfError(
                "trials use run.device=cuda but ask for no GPU: Ray would hide the GPUs from them",
                hint="add --trial-gpus 1 or use --device cpu",
            )

    def run(self, trials: Sequence[Trial], sweep_dir: Path, command: list[str] | None, notify: TrialCallback,
            stop: StopSignal) -> None:
        """Every trial as a Tune trial; each one's outcome reaches ``trials`` (and ``notify``) as it ends.
        A Tune run that fails as a whole raises RlperfError."""
        pending = {t.index: t for t in trials}  # every grid point was validated by plan()
        stop_file = sweep_dir / STOP_FILE

        def tell_trials(signum: int) -> None:  # in the signal handler: one small write
            with contextlib.suppress(OSError):
                stop_file.write_text(str(signum))

        tuner = self._tuner(pending, sweep_dir, command, stop_file, _TuneEvents(pending, notify, stop))
        # Tune prints its own tables and each failed trial's traceback on stdout (even at verbose=0)
        # and logs them: keep rlperf's stdout clean (--json) and its output to the file. Tune's own
        # SIGINT handler (stop, then kill on a second Ctrl-C) is off: the stop file stops trials in order.
        captured = io.StringIO()
        undo = stop.on_signal(tell_trials)
        saved_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        try:
            with _quiet_logs("ray"), contextlib.redirect_stdout(captured):
                tuner.fit()
        except Exception as exc:  # the cluster went away, Tune itself failed: no trial outcome can be trusted
            raise RlperfError(f"the Ray Tune run failed: {_one_line(exc)}",
                              hint="RLPERF_DEBUG=1 shows Ray's traceback") from exc
        finally:
            undo()
            if saved_env is None:
                os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
            else:
                os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = saved_env
            with contextlib.suppress(OSError):
                stop_file.unlink()
            (sweep_dir / "ray").mkdir(exist_ok=True)
            write_text_atomic(sweep_dir / "ray" / "tune_output.txt", captured.getvalue())

    def _tuner(self, pending: Mapping[int, Trial], sweep_dir: Path, command: list[str] | None, stop_file: Path,
               events: _TuneEvents) -> Any:
        """The Tune run: each trial's config goes as TOML text (plain data) to :func:`ray_trial`."""
        from ray import tune

        specs = {i: (to_toml(t.config), t.name) for i, t in pending.items()}  # type: ignore[arg-type]
        trainable = tune.with_parameters(
            ray_trial, specs=specs, sweep_dir=str(sweep_dir), command=command or [], cwd=os.getcwd(),
            stop_file=str(stop_file),
        )
        trainable = tune.with_resources(trainable, {"cpu": self.cpus, "gpu": self.gpus})
        callback, stopper = _tune_hooks(events)
        return tune.Tuner(
            trainable,
            param_space={"trial": tune.grid_search(sorted(pending))},
            tune_config=tune.TuneConfig(trial_dirname_creator=lambda trial: f"trial{trial.config['trial']:03d}"),
            run_config=tune.RunConfig(
                name="ray",
                storage_path=str(sweep_dir),
                verbose=0,
                stop=stopper,
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                callbacks=[callback],
            ),
        )

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


@contextlib.contextmanager
def _quiet_logs(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


TOKEN_HINT = ("set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to the cluster's token, or RAY_AUTH_TOKEN_PATH to a "
              "file holding it, default ~/.ray/auth_token; `ray get-auth-token` on the head node prints it")


def _refuse_without_token(address: str) -> None:
    """Refuse at once a cluster that will not take this process's token (or its lack of one).

    Ray 2.60 turns token authentication on for ``ray start`` when a token exists, and ``ray.init``
    with an explicit address sends one only with RAY_AUTH_MODE=token: refused, it retries for ~20 s
    (a line per try) and ends with a generic ConnectionError. One call to the cluster's GCS, with
    the credentials ``ray.init`` would send, tells that case apart; any other outcome is left to
    ``ray.init``."""
    try:
        import grpc
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
        from ray._private.grpc_utils import init_grpc_channel
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray without token authentication: nothing to tell apart
        return
    channel = init_grpc_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=10)  # type: ignore[attr-defined]
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            sent = is_token_auth_enabled() and AuthenticationTokenLoader.instance().has_token()
            what = "refused the authentication token this process sent" if sent else "requires an authentication token"
            raise RlperfError(f"the Ray cluster at {address} {what}", hint=TOKEN_HINT) from None
    finally:
        channel.close()


class _TuneEvents:
    """The driver's side of a Tune run: which trials run, each one's outcome taken from the result it
    reported, the display told of starts and ends, and whether the sweep was told to stop."""

    def __init__(self, pending: Mapping[int, Trial] | None = None, notify: TrialCallback | None = None,
                 stop: StopSignal | None = None) -> None:
        self.pending: Mapping[int, Trial] = pending or {}
        self.notify = notify
        self.stop = stop
        self.running: set[int] = set()

    def __reduce__(self) -> tuple[Any, ...]:
        # Tune pickles its run configuration (this, inside the callback and the stopper) into the
        # experiment's tuner.pkl, for a restore rlperf never does. The display and the stop signal hold
        # locks and a terminal, so the pickled copy is an empty one: it stands for nothing.
        return (_TuneEvents, ())

    def _trial(self, tune_trial: Any) -> Trial | None:
        return self.pending.get((tune_trial.config or {}).get("trial", -1))

    def started(self, tune_trial: Any) -> None:
        t = self._trial(tune_trial)
        if t is not None:
            self.running.add(t.index)
            if self.notify is not None:
                self.notify("start", t)

    def reported(self, tune_trial: Any, result: Mapping[str, Any]) -> None:
        """A trial's result: "not run", or its run directory and record (read back, or as reported)."""
        t = self._trial(tune_trial)
        if t is None:
            return
        if result.get("status") in ("not run", "failed"):
            t.status, t.error = result["status"], result.get("error")
        elif "run_dir" in result:
            try:
                _take_record(t, result["run_dir"], json.loads(result.get("record_json", "null")) or None)
            except RlperfError as exc:  # a record neither on disk here nor valid as reported
                t.status, t.error = "failed", _one_line(exc)

    def failed(self, tune_trial: Any) -> None:
        """A trial that Tune saw fail (its worker died, say; a run's own error comes as its result):
        "failed", with the last line of the error Tune wrote for it."""
        t = self._trial(tune_trial)
        if t is not None and t.status == "pending":
            text = ""
            with contextlib.suppress(OSError, TypeError):  # TypeError: Tune wrote no error file
                text = Path(tune_trial.error_file).read_text()
            t.status, t.error = "failed", _one_line(text if text.strip() else "the Ray trial failed")

    def ended(self, tune_trial: Any) -> None:
        t = self._trial(tune_trial)
        if t is not None:
            self.running.discard(t.index)
            if self.notify is not None:
                self.notify("end", t)

    def stop_all(self) -> bool:
        """Told to stop, and every trial that started has ended (so each wrote its record)."""
        return self.stop is not None and self.stop() and not self.running


def _tune_hooks(events: _TuneEvents) -> tuple[Any, Any]:
    """Tune's callback and stopper for ``events`` (Tune's base classes need Ray, imported only here)."""
    from ray import tune

    class Events(tune.Callback):
        def __init__(self, events: _TuneEvents) -> None:
            self.events = events

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.events.started(trial)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self.events.reported(trial, result)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.events.ended(trial)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.events.failed(trial)
            self.events.ended(trial)

    class StopWhenSignalled(tune.Stopper):
        """Trials not started when the sweep is told to stop are never started."""

        def __init__(self, events: _TuneEvents) -> None:
            self.events = events

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            return False

        def stop_all(self) -> bool:
            return self.events.stop_all()

    return Events(events), StopWhenSignalled(events)


def ray_trial(config: dict[str, Any], specs: dict[int, tuple[str, str]], sweep_dir: str, command: list[str], cwd: str,
              stop_file: str = "") -> None:
    """The Ray Tune function trainable: one normal run, its record (or its error) reported back to the driver.

    The run stops at a step boundary, as on a signal, once the driver writes ``stop_file``; a trial
    that starts after that reports ``not run`` without running.
    """
    from ray import tune

    from rlperf.run.lifecycle import train_run

    def stop_requested() -> int | None:
        try:
            text = Path(stop_file).read_text().strip() if stop_file else ""
        except OSError:
            return None
        return int(text) if text.isdigit() else (signal.SIGINT if stop_file and Path(stop_file).exists() else None)

    os.chdir(cwd)  # Tune starts trials in their own directory; runs record the user's (git revision, paths)
    stop = StopSignal(poll=stop_requested)
    toml_text, name = specs[config["trial"]]
    try:
        stop.raise_if_set()
        run = train_run(
            loads_config(toml_text), out=sweep_dir, name=name, command=command or None, quiet=True, dashboard=False,
            kind="sweep", stop=stop,
        )
    except RunInterrupted:
        tune.report({"status": "not run"})
        return
    except Exception as exc:  # a failing trial is data: its error goes back as its result, in one line
        traceback.print_exc()  # the whole of it stays in the worker's log on its node
        tune.report({"status": "failed", "error": _one_line(exc)})
        return
    record = run.record
    tune.report(
        {
            "run_dir": str(run.run_dir),
            "status": record["status"],
            "env_steps_per_s": record["throughput"]["env_steps_per_s"],
            "updates_per_s": record["throughput"]["updates_per_s"],
            "record_json": json.dumps(record, default=str),
        }
    )


# -- summary, files, table ----------------------------------------------------------------------


def summarize_points(trials: Sequence[Trial], axes: Sequence[Axis],
                     objective: Objective | None = None) -> list[dict[str, Any]]:
    """One entry per grid point: its values, trial statuses, and median/spread of each figure over
    its completed repeats (the numbers are the records', gathered, not recomputed). A time to score
    is summarized over the repeats that reached it, with ``reached_S``: [reached, tracked]. With an
    ``objective`` the entries come best first, each with its ``rank`` and ``objective`` value."""
    targets = tracked_targets(t.record for t in trials if t.record)
    points: dict[int, list[Trial]] = {}
    for t in trials:
        points.setdefault(t.point, []).append(t)
    out = []
    for point, group in points.items():
        done = [t for t in group if t.status == "completed"]
        entry: dict[str, Any] = {
            "point": point,
            "params": dict(group[0].params),
            "n": len(group),
            "completed": len(done),
            "statuses": [t.status for t in group],
            "errors": sorted({t.error for t in group if t.error}),
        }
        for column, path, _ in TRIAL_METRICS:
            s = summarize([t.value(path) for t in done])
            entry[column] = s.as_dict() if s else None
        for target in targets:
            hits = [h for h in (time_to(t.record or {}, target) for t in done) if h is not None]
            s = summarize([value for reached, value in hits if reached])
            entry[f"time_to_{target_key(target)}"] = s.as_dict() if s else None
            entry[f"reached_{target_key(target)}"] = [sum(1 for reached, _ in hits if reached), len(hits)]
        out.append(entry)
    if objective is None:
        return out
    ranked = rank_points(trials, objective)
    by_point = {e["point"]: e for e in out}
    for rank, (point, value) in enumerate(ranked, 1):
        by_point[point]["rank"] = rank
        by_point[point]["objective"] = None if value is None or math.isinf(value) else value
    return [by_point[point] for point, _ in ranked]


def write_outputs(result: SweepResult, plot: bool = True) -> None:
    """sweep.json, sweep.csv and (``plot``) sweep.png in the sweep directory (each written atomically;
    a figure that cannot be drawn is a warning)."""
    from rlperf.report.plots import draw, sweep_figure

    data = result.data()
    write_json_atomic(result.sweep_dir / "sweep.json", data)
    rows = data["trials"]
    buffer = io.StringIO()
    # A failed trial has no record, so no time-to-score columns: the header is every row's keys, in order.
    fieldnames = list(dict.fromkeys(k for row in rows for k in row)) or ["trial"]
    writer = csv.DictWriter(buffer, fieldnames=fieldnames, lineterminator="\n", restval="")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})
    write_text_atomic(result.sweep_dir / "sweep.csv", buffer.getvalue())
    if plot:
        draw(lambda: sweep_figure(data["summary"], [a.key for a in result.axes], data), result.sweep_dir / "sweep.png")


def sweep_table(data: dict[str, Any], title: str | None = "sweep") -> Table:
    """The sweep as a table: swept values, throughput, phase shares, score and status per grid point."""
    summary = data["summary"]
    keys = list(data["axes"])
    shorts = [k.split(".", 1)[-1] for k in keys]
    if len(set(shorts)) < len(shorts):
        shorts = keys
    caption = [f"phases: % of loop time in {'/'.join(PHASES)}"]
    if data["repeats"] > 1:
        caption.append(f"{SPREAD_RULE} over {data['repeats']} repeats")
    if data.get("interrupted"):
        caption.append("interrupted: partial results")
    targets = sorted({float(k.removeprefix("reached_")) for e in summary for k in e if k.startswith("reached_")})
    if targets:
        caption.append("t→S: seconds until the mean score of the last 100 episodes first reached S "
                       "(warm-up excluded; median of the repeats that reached it)")
    objective = data.get("objective")
    if objective:
        caption.append(f"ranked by {objective['name']} ({objective['better']} is better), best first")
    table = Table(title=title, caption="; ".join(caption))
    if objective:
        table.add_column("#", justify="right")
    for short in shorts:
        table.add_column(short, justify="right")
    numeric = [
        ("env_steps_per_s", "env steps/s", "rate"),
        ("updates_per_s", "updates/s", "rate"),
        ("s_per_1000_env_steps", "s/1k env steps", "seconds"),
        ("s_per_1000_episodes", "s/1k episodes", "seconds"),
    ]
    units = {}
    for column, label, kind in numeric:
        units[column] = pick_unit(kind, [e[column]["median"] for e in summary if e[column]])
        unit = units[column][1]
        header = label if unit in ("/s", "s") else f"{label} ({unit})"
        table.add_column(header, justify="right")
    table.add_column("phases %", justify="right")
    table.add_column("mean score", justify="right")
    for target in targets:
        table.add_column(f"t→{target_key(target)} (s)", justify="right")
    table.add_column("status", max_width=60)
    for e in summary:
        cells: list[Text | str] = [str(e["rank"])] if objective else []
        cells += [_show(e["params"].get(k)) for k in keys]
        for column, _, _ in numeric:
            cells.append(_cell(e[column], units[column][0]))
        shares = [e[f"share_{p}"] for p in PHASES]
        cells.append("/".join(f"{100 * s['median']:.0f}" if s else MISSING for s in shares) if any(shares) else MISSING)
        cells.append(_cell(e["mean_score"], 1.0))
        cells += [_time_cell(e, target) for target in targets]
        cells.append(_status(e))
        table.add_row(*cells)
    return table


def _cell(stat: dict[str, Any] | None, scale: float) -> str:
    if not stat:
        return MISSING
    return format_number(stat["median"], stat["spread"] if stat["n"] > 1 else None, scale, compact=True)


def _time_cell(entry: dict[str, Any], target: float) -> str:
    """Seconds to ``target`` over the repeats that reached it, ``not reached``, or ``2/3 reached``."""
    reached, tracked = entry.get(f"reached_{target_key(target)}") or [0, 0]
    if not tracked:
        return MISSING
    if not reached:
        return NOT_REACHED
    text = _cell(entry.get(f"time_to_{target_key(target)}"), 1.0)
    return text if reached == tracked else f"{text} ({reached}/{tracked})"


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _status(entry: dict[str, Any]) -> Text:
    n, done = entry["n"], entry["completed"]
    if done == n:
        return Text("ok" if n == 1 else f"{done}/{n} ok", style="green")
    others = sorted({s for s in entry["statuses"] if s != "completed"})
    text = ", ".join(others) if n == 1 else f"{done}/{n} ok, {', '.join(others)}"
    if entry["errors"]:
        text += f": {entry['errors'][0]}"
    return Text(text, style="red" if "failed" in others else "yellow")
