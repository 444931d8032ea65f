"""Profiling a training run: the library behind ``rlperf profile`` and scripts/bench_instruments.py.

:class:`Instruments` puts cProfile, a GC monitor and, optionally, torch.profiler around the loop of
:func:`rlperf.run.lifecycle.train_run` (through its hooks) and time-stamps every vector step.
:func:`profile_run` is one profiled run: it writes the artifacts into the run directory and a
``profile`` section, with the advisor's findings, into its ``run.json``. With py-spy the run is a
child process started under ``py-spy record`` (py-spy launches the process it samples, so no
ptrace attach privileges are needed): :func:`profile_under_pyspy`.

Instrument overhead is measured, not guessed (:func:`measure_overhead`): after the run, the first
vector steps are replayed in the same process with the same seed and no instruments (the loop is
deterministic step by step), and the two timings of the very same steps are compared.
"""

from __future__ import annotations

import contextlib
import gc as collector
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from rlperf.config import Config
from rlperf.errors import DiskError, RlperfError
from rlperf.instruments.advisor import VerifyBase, advise, effective_cpus, measured_total, no_finding_reason
from rlperf.instruments.microbench import run_benches
from rlperf.instruments.profilers import (
    PYSPY_HINT,
    CProfiler,
    GcMonitor,
    ProfileOptions,
    TorchProfiler,
    attach_pyspy,
    check_out,
    find_pyspy,
    is_pyspy_error,
    pyspy_command,
    pyspy_env,
    pyspy_failure,
    torch_window,
)
from rlperf.dqn import steps_before_learning
from rlperf.atomic import copy_atomic, write_json_atomic
from rlperf.run.files import pid_alive
from rlperf.run.lifecycle import RunHooks, RunResult, train_run
from rlperf.run.signals import StopSignal

DEFAULT_EPISODES = 100
MIN_MEASURED_STEPS = 64
"""The shortest measured window, in vector steps: a p95 then rests on at least three samples above it."""
OVERHEAD_BUDGET_S = (2.0, 0.1, 30.0)
"""Replay for the overhead measurement: at least 2 s, else 10% of the loop, at most 30 s of profiled steps."""


def _with(cfg: Config, section: str, **values: Any) -> Config:
    part = getattr(cfg, section)
    return cfg.model_copy(update={section: part.model_copy(update=values)})


class Instruments:
    """cProfile (with the GC monitor) and torch.profiler around a run's loop, and a time stamp per
    vector step: :meth:`hooks` gives them to :func:`rlperf.run.lifecycle.train_run`.

    cProfile starts last and stops first, so it sees the loop and not the instruments' own set-up.
    ``stamps`` holds the loop's start and the end of every vector step (``perf_counter`` seconds).
    """

    def __init__(self, cfg: Config, cprofile: bool = True, gc: bool = True, torch: bool = False,
                 trace_path: Path | None = None) -> None:
        self.gc = GcMonitor() if gc else None
        self.cprofile = CProfiler() if cprofile else None
        self.torch: TorchProfiler | None = None
        if torch:
            if trace_path is None:
                raise ValueError("torch.profiler needs a trace_path")
            t = cfg.train
            warm = steps_before_learning(cfg) + t.warmup_steps
            total = warm + max(MIN_MEASURED_STEPS, math.ceil(t.steps / cfg.env.num_envs)) if t.steps > 0 else None
            window = torch_window(warm, cfg.env.num_envs, t.learning_starts, cfg.buffer.batch_size, total,
                                  t.train_ratio)
            self.torch = TorchProfiler(_device_type(cfg), window, trace_path)
        self.stamps: list[float] = []

    @property
    def names(self) -> list[str]:
        """The in-process instruments besides the phase timers, as the overhead line names them."""
        return [n for n, on in (("cProfile", self.cprofile is not None), ("torch.profiler", self.torch is not None)) if on]

    @contextlib.contextmanager
    def around_loop(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.gc is not None:
                # The full collection start-up owes (torch's and numba's objects from their imports)
                # would land in the first updates, 0.1-0.15 s charged to the loop: it is paid here.
                collector.collect()
                stack.enter_context(self.gc.running())
            if self.torch is not None:
                stack.enter_context(self.torch.running())
            self.stamps.append(perf_counter())
            if self.cprofile is not None:
                stack.enter_context(self.cprofile.running())
            yield

    def on_step(self) -> None:
        self.stamps.append(perf_counter())
        if self.torch is not None:
            self.torch.step()

    def hooks(self, window: bool = False) -> RunHooks:
        """The hooks for ``train_run``; ``window``: measure as ``rlperf profile`` does (after the fill and
        warm-up, at least :data:`MIN_MEASURED_STEPS`), not as ``train`` does."""
        return RunHooks(around_loop=self.around_loop, on_step=self.on_step, annotate_phases=self.torch is not None,
                        measure_after_fill=window, min_measured_steps=MIN_MEASURED_STEPS if window else 0)

    def step_durations(self) -> list[float]:
        """Wall seconds of each vector step, in order."""
        return [b - a for a, b in itertools.pairwise(self.stamps)]


def profile_run(cfg: Config, out: str | Path = "runs", name: str | None = None, command: list[str] | None = None,
                quiet: bool = False, dashboard: bool = True, options: ProfileOptions | None = None,
                stop: StopSignal | None = None) -> RunResult:
    """Train with ``cfg`` under the instruments; the record gains a ``profile`` section.

    What is measured is the training loop: the replay is first filled to ``train.learning_starts``
    and ``train.warmup_steps`` more vector steps run (both timed apart), then ``train.episodes``
    episodes or ``train.steps`` env steps are measured, over at least :data:`MIN_MEASURED_STEPS`
    vector steps (the record's ``profile.window`` says what was measured and why).

    ``stop`` as for :func:`rlperf.run.lifecycle.train_run`. A signal during the overhead replay
    (after the run) skips the replay: the record is written, the exit code is 130 / 143. An artifact
    the filesystem refuses ends the run as ``failed`` with the reason (DiskError, one line).
    """
    options = options or ProfileOptions()
    options.check()
    if cfg.run.mode == "async":
        raise RlperfError("rlperf profile instruments the single-process loop; run.mode=async is not supported",
                          hint="profile with --set run.mode=sync, or run async under py-spy record --subprocesses")
    stop = stop if stop is not None else StopSignal()
    stop.arm()
    tidy_scratch()
    with scratch_dir("profile") as scratch:
        inst = Instruments(cfg, cprofile=options.cprofile, torch=options.torch, trace_path=scratch / "trace.json")
        result = train_run(cfg, out=out, name=name, command=command, quiet=quiet, dashboard=dashboard,
                           kind="profile", hooks=inst.hooks(window=True), stop=stop)
        record, run_dir = result.record, result.run_dir
        section: dict[str, Any] = {
            "options": {"top": options.top, "sort": options.sort, "cprofile": options.cprofile, "torch": options.torch,
                        "py_spy": False},
            "timing_mode": record["timing"]["mode"],
            "artifacts": {},
        }
        try:
            calls = _save_artifacts(inst, run_dir, section, options)
        except DiskError as exc:
            raise failed_artifact(record, run_dir, exc) from None
    assert inst.gc is not None
    section["window"] = window_section(cfg, record, inst.step_durations())
    section["gc"] = inst.gc.to_dict()
    section["load"] = {"loadavg_1m": os.getloadavg()[0], "cpus": effective_cpus()}
    section["overhead"] = _overhead_section(cfg, inst, options, record, stop)
    record["profile"] = section
    if options.microbench and record["status"] == "completed":
        section["microbench"] = run_benches(cfg, _device(cfg), record)
    section["advisor"] = _advisor_section(record, calls, section["gc"], options)
    record["files"].update({f"profile_{k}": v for k, v in section["artifacts"].items()})
    write_profiled_record(record, run_dir)
    code = result.exit_code
    if code == 0 and stop():  # the run completed; the signal cut the overhead replay short
        code = stop.exit_code
    return RunResult(run_dir, record, code)


def _overhead_section(cfg: Config, inst: Instruments, options: ProfileOptions, record: dict[str, Any],
                      stop: StopSignal) -> dict[str, Any]:
    """The profile's ``overhead``: the instruments' cost by replay (:func:`measure_overhead`), or why not."""
    if not inst.names:
        return {"skipped": "no in-process instrument besides the phase timers"}
    if not options.overhead:
        return {"skipped": "not measured (overhead replay off)"}
    if record["status"] != "completed":
        return {"skipped": f"not measured: the run is {record['status']}"}
    return measure_overhead(cfg, inst.step_durations(), inst.names, record["timing"]["warmup_steps"], stop)


def _advisor_section(record: dict[str, Any], calls: Any, gc: dict[str, Any], options: ProfileOptions) -> dict[str, Any]:
    """The profile's ``advisor``: the findings on the record (the profile section written so far), or why none."""
    verify = (options.verify or VerifyBase()).for_window(record["totals"]["env_steps"])
    findings = advise(record, calls, gc, verify)
    return {
        "findings": [f.as_dict() for f in findings],
        "none": None if findings else no_finding_reason(record),
        "measured_phase_s": measured_total(record),
    }


def _save_artifacts(inst: Instruments, run_dir: Path, section: dict[str, Any], options: ProfileOptions) -> Any:
    """profile.prof and trace.json into the run directory (atomically); returns cProfile's statistics."""
    calls = None
    if inst.cprofile is not None:
        inst.cprofile.dump(run_dir / "profile.prof")
        calls = inst.cprofile.stats()
        section["cprofile"] = {
            "file": "profile.prof", "sort": options.sort, "total_calls": calls.total_calls,
            "primitive_calls": calls.primitive_calls, "total_s": calls.total_s,
            "top": [row.as_dict() for row in calls.top(options.top, options.sort)],
        }
        section["artifacts"]["cprofile"] = "profile.prof"
    if inst.torch is not None:
        section["torch"] = inst.torch.to_dict(options.top)
        if inst.torch.recorded:
            copy_atomic(inst.torch.trace_path, run_dir / "trace.json")
            section["torch"]["file"] = "trace.json"
            section["artifacts"]["torch_trace"] = "trace.json"
    return calls


def failed_artifact(record: dict[str, Any], run_dir: Path, exc: DiskError) -> DiskError:
    """An artifact the filesystem refused: the record says ``failed`` with the reason (if it can
    still be written; else the run's own record stays), and the one-line error to raise."""
    failed = {**record, "status": "failed", "error": str(exc)}
    try:
        write_json_atomic(run_dir / "run.json", failed)
    except DiskError:
        return DiskError(f"{exc.message}; run.json keeps the run's record, without its profile", hint=exc.hint)
    record.update(failed)
    return DiskError(f"{exc.message}; run.json says failed", hint=exc.hint)


def write_profiled_record(record: dict[str, Any], run_dir: Path) -> None:
    """The record with its profile section; if the disk refuses, the run's own record stays."""
    try:
        write_json_atomic(run_dir / "run.json", record)
    except DiskError as exc:
        raise DiskError(f"{exc.message}; run.json keeps the run's record, without its profile", hint=exc.hint) from None


# -- scratch folders -----------------------------------------------------------------------------

_SCRATCH = re.compile(r"^rlperf-(?:profile|pyspy|replay)-(\d+)-")


@contextlib.contextmanager
def scratch_dir(what: str) -> Iterator[Path]:
    """A temporary folder named after this process (``rlperf-WHAT-PID-...``), removed when done; one
    that a killed process left behind is removed by :func:`tidy_scratch`."""
    with tempfile.TemporaryDirectory(prefix=f"rlperf-{what}-{os.getpid()}-") as folder:
        yield Path(folder)


def tidy_scratch() -> list[str]:
    """Remove the scratch folders of rlperf processes that are gone (killed before they could)."""
    removed: list[str] = []
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        m = _SCRATCH.match(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed


def window_section(cfg: Config, record: dict[str, Any], durations: list[float]) -> dict[str, Any]:
    """What the profile measured: the fill and warm-up before the window, the window, and whether the
    window was extended to :data:`MIN_MEASURED_STEPS` because the asked episodes or steps took fewer."""
    timing, t = record["timing"], cfg.train
    fill, warm = timing["fill_steps"], timing["warmup_steps"]
    asked = {"episodes": t.episodes} if t.episodes > 0 else {"env_steps": t.steps}
    asked_steps = timing.get("asked_window_steps")
    return {
        "asked": asked,
        "fill_steps": fill,
        "fill_s": sum(durations[:fill]),
        "learning_starts": max(t.learning_starts, cfg.buffer.batch_size),
        "warmup_steps": warm - fill,
        "warmup_s": sum(durations[fill:warm]),
        "measured_steps": timing["measured_steps"],
        "measured_s": timing["measured_wall_s"],
        "measured_env_steps": timing["measured_env_steps"],
        "measured_episodes": timing["measured_episodes"],
        "measured_updates": timing["measured_updates"],
        "min_steps": MIN_MEASURED_STEPS,
        "asked_steps": asked_steps,
        "extended": asked_steps is not None and asked_steps < MIN_MEASURED_STEPS,
    }


def _device(cfg: Config) -> Any:
    from rlperf.device import resolve_device

    return resolve_device(cfg.run.device)


def _device_type(cfg: Config) -> str:
    return str(_device(cfg).type)


def measure_overhead(cfg: Config, durations: list[float], instruments: list[str], warmup_steps: int,
                     stop: StopSignal | None = None) -> dict[str, Any]:
    """Replay the run's first vector steps without instruments (same seed, same process) and compare.

    The loop is deterministic step by step for a seed, so step i of the replay does exactly the
    work step i of the profiled run did: the ratio of their times is the instruments' cost. The
    replay reaches a few steps past the first gradient update (instruments cost differently in
    Python-heavy env steps and in torch-heavy updates) and then as many steps as fit in
    OVERHEAD_BUDGET_S. Warm-up steps (lazy initialisation, paid by whichever run comes first) and
    the first update's step and the last step (the final log) are left out; the whole run's figure
    weights the two regimes,
    before and after learning starts, by the profiled run's time in each.
    """
    n = len(durations)
    if n < 4:
        return {"skipped": f"only {n} vector steps: too few to compare"}
    first_train = steps_before_learning(cfg)
    k = _replay_length(durations, first_train)
    plain = _replay(cfg, k, stop if stop is not None else StopSignal())
    if isinstance(plain, str):
        return {"skipped": plain}
    if len(plain) < k:
        return {"skipped": f"the replay stopped after {len(plain)} of {k} steps"}
    t = cfg.train
    start = t.warmup_steps if k - 1 - t.warmup_steps >= 3 else 1
    # The first update pays one-off costs (optimizer state, autograd threads) in whichever run comes first.
    regimes = {"before_learning": range(start, min(first_train, k - 1)),
               "training": range(max(start, first_train + 1), k - 1)}
    ratios: dict[str, float] = {}
    for regime, steps in regimes.items():
        plain_s = sum(plain[i] for i in steps)
        if len(steps) and plain_s > 0:
            ratios[regime] = sum(durations[i] for i in steps) / plain_s
    if not ratios:
        return {"skipped": "no step to compare"}
    # The whole run after warm-up, each step deflated by its regime's ratio.
    fallback = next(iter(ratios.values()))
    profiled_s = plain_s = 0.0
    for i in range(min(warmup_steps, n - 1), n):
        regime = "training" if i >= first_train else "before_learning"
        profiled_s += durations[i]
        plain_s += durations[i] / ratios.get(regime, fallback)
    compared = [i for steps in regimes.values() for i in steps]
    return {
        "instruments": instruments,
        "ratio": profiled_s / plain_s if plain_s > 0 else None,
        "by_regime": ratios,
        "steps": [min(compared), max(compared)],
        "replayed_profiled_s": sum(durations[i] for i in compared),
        "replayed_plain_s": sum(plain[i] for i in compared),
        "method": "the first vector steps replayed with the same seed in the same process, without instruments",
    }


def _replay_length(durations: list[float], first_train: int) -> int:
    """How many of the run's first vector steps to replay: a few past the first gradient update, then
    as many as fit in OVERHEAD_BUDGET_S (at least 4)."""
    low, share, high = OVERHEAD_BUDGET_S
    budget = max(low, min(share * sum(durations), high))
    needed = min(len(durations), max(4, first_train + 5))
    elapsed, k = 0.0, 0
    for d in durations:
        if (k >= needed and elapsed + d > budget) or elapsed + d > high:
            break
        elapsed += d
        k += 1
    return max(k, 4)


def _replay(cfg: Config, k: int, stop: StopSignal) -> list[float] | str:
    """The wall seconds of each of the first ``k`` vector steps of ``cfg`` run without instruments,
    or why they were not measured."""
    # Only the stop condition changes: the replay writes its checkpoint at the same log boundary.
    replay_cfg = _with(cfg, "train", steps=k * cfg.env.num_envs, episodes=0)
    replay: list[float] = []

    @contextlib.contextmanager
    def mark() -> Iterator[None]:
        replay.append(perf_counter())
        yield

    if stop():
        return "not measured: interrupted"
    try:
        with scratch_dir("replay") as tmp:
            ran = train_run(replay_cfg, out=tmp, quiet=True, dashboard=False, kind="replay", stop=stop,
                            hooks=RunHooks(around_loop=mark, on_step=lambda: replay.append(perf_counter())))
    except DiskError as exc:
        return f"not measured: the replay could not be written ({exc.message})"
    if ran.record["status"] == "interrupted":
        return "not measured: interrupted"
    return [b - a for a, b in itertools.pairwise(replay)]




# -- py-spy ------------------------------------------------------------------------------------


@dataclass
class PyspyRun:
    """What ``rlperf profile --py-spy``'s child left: its record (None when it did not finish), the
    recording's path, py-spy's own output lines, and the exit code of a child that failed on its own
    (its one-line error was already passed on)."""

    record: dict[str, Any] | None
    recording: Path
    lines: list[str]
    child_exit: int | None = None


CHILD_PARENT_ENV = "RLPERF_PYSPY_PARENT"
"""The parent's pid, for the py-spy child: it stops (as on SIGTERM) when the parent is gone."""


def run_under_pyspy(pyspy: str, child_args: list[str], native: bool, scratch: Path, stop: StopSignal) -> PyspyRun:
    """Run ``rlperf profile <child_args>`` under py-spy as the child that writes its record to a file.

    py-spy and the child run in a session of their own, so a terminal's Ctrl-C reaches only this
    process (py-spy would stop recording and leave the child running): SIGINT and SIGTERM are passed
    on to the child alone, which stops at a step boundary and writes its interrupted record; py-spy
    then writes its recording and exits. py-spy's chatter ("py-spy> ..." on stdout) is kept back;
    the child's output lines are passed on to stderr, except its line about being interrupted
    before the run started (the caller says that once).
    """
    recording = scratch / "pyspy.speedscope.json"
    record_file = scratch / "record.json"
    child = [sys.executable, "-m", "rlperf", "profile", *child_args, "--pyspy-child", str(record_file)]
    proc = subprocess.Popen(
        pyspy_command(pyspy, recording, child, native=native),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**pyspy_env(), CHILD_PARENT_ENV: str(os.getpid())},
        text=True,
        errors="replace",
        start_new_session=True,
    )
    pyspy_lines: list[str] = []

    def forward_output() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("py-spy> ") or not line.strip() or is_pyspy_error(line):
                pyspy_lines.append(line.rstrip("\n"))
            elif not _INTERRUPTED_LINE.match(line):
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(line)
                    sys.stderr.flush()

    def forward_stop() -> None:
        sent = False
        while proc.poll() is None:
            if not sent and stop():
                target = _pyspy_child(proc.pid)
                if target is not None:
                    with contextlib.suppress(OSError):
                        os.kill(target, stop.signum or signal.SIGINT)
                    sent = True
            time.sleep(0.02)

    threads = [threading.Thread(target=forward_output, daemon=True), threading.Thread(target=forward_stop, daemon=True)]
    for thread in threads:
        thread.start()
    proc.wait()  # a signal meanwhile runs the handler (the flag) and the wait goes on
    for thread in threads:
        thread.join(timeout=5)
    record = child_exit = None
    if record_file.is_file():
        with contextlib.suppress(json.JSONDecodeError, OSError):
            record = json.loads(record_file.read_text(encoding="utf-8"))
    failure = record_file.with_name(record_file.name + ".exit")
    if record is None and failure.is_file():
        with contextlib.suppress(ValueError, OSError):
            child_exit = int(failure.read_text().strip())
    return PyspyRun(record, recording, pyspy_lines, child_exit)


_INTERRUPTED_LINE = re.compile(r"^rlperf: (error: )?interrupted by SIG\w+ (before|during) ")


def _pyspy_child(pyspy_pid: int) -> int | None:
    """The pid of the process py-spy started (None until it has)."""
    import psutil

    try:
        children = psutil.Process(pyspy_pid).children()
    except psutil.Error:
        return None
    return children[0].pid if children else None


def child_failed(record_file: str | Path, code: int) -> None:
    """The py-spy child's side: it ended with ``code`` before writing its record (its error is on stderr)."""
    with contextlib.suppress(OSError):
        Path(f"{record_file}.exit").write_text(str(code))


def stop_with_parent() -> None:
    """The py-spy child's side: when the ``rlperf profile`` that started it is gone (killed), stop
    the run as on SIGTERM rather than train on for nobody."""
    parent = os.environ.get(CHILD_PARENT_ENV, "")
    if not parent.isdigit():
        return

    def watch() -> None:
        while pid_alive(int(parent)):
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rlperf-parent-watch", daemon=True).start()


# -- the command -------------------------------------------------------------------------------


def profile_under_pyspy(
    child_args: list[str], out: Path, native: bool, stop: StopSignal
) -> tuple[PyspyRun | None, str | None]:
    """The child's run with the flamegraph attached to its record, and why py-spy was skipped (or None).

    No record and no ``child_exit`` means py-spy did not run it to the end: the caller runs
    in-process instead -- unless ``stop`` is set, when the caller stops. A signal before the child's
    run started raises RunInterrupted (one line).
    """
    pyspy = find_pyspy()
    if pyspy is None:
        return None, f"not found on PATH ({PYSPY_HINT})"
    check_out(out)
    tidy_scratch()
    with scratch_dir("pyspy") as scratch:
        ran = run_under_pyspy(pyspy, child_args, native, scratch, stop)
        if ran.record is None:
            stop.raise_if_set()
            return ran, None if ran.child_exit is not None else pyspy_failure(ran.lines)
        if not ran.recording.is_file() or ran.recording.stat().st_size == 0:
            return ran, pyspy_failure(ran.lines)
        try:
            attach_pyspy(ran.record, ran.recording, native)
        except DiskError as exc:
            raise DiskError(f"{exc.message}; run.json keeps the run's record, without its py-spy recording",
                            hint=exc.hint) from None
        return ran, None


def check_runnable(cfg: Config) -> None:
    """Refuse, before a child process starts, the knobs the child would refuse."""
    from rlperf.device import resolve_device
    from rlperf.dqn import check_knobs

    check_knobs(cfg, resolve_device(cfg.run.device))


# -- --verify: the top findings' compare lines, run -----------------------------------------------

VERIFY_REPEATS = 3


def verify_findings(record: dict[str, Any], cfg: Config, k: int, out: str | Path = "runs",
                    on_run: Callable[[str, int, str], None] | None = None,
                    stop: StopSignal | None = None) -> dict[str, Any]:
    """Run the compare lines of the top ``k`` findings that have a knob: the profiled config and each
    variant, :data:`VERIFY_REPEATS` interleaved repeats each (one shared baseline), measuring what the
    profile measured (its env steps, its fill and warm-up left out of the rates). Each finding gains
    ``verified``: the measured speed-up of env steps/s (median ratio), its spread and whether it is
    inside the noise. Returns the ``profile.verify`` section (what ran, where)."""
    from rlperf.experiments.compare import Source, compare, run_sources, variant

    findings = [f for f in record["profile"]["advisor"]["findings"] if f.get("knob")][:k]
    if not findings:
        return {"ran": 0, "note": "no finding with a knob to verify"}
    base = variant(cfg, [f"train.steps={record['totals']['env_steps']}"])
    sources = [Source("profiled", "the profiled config", config=base)]
    for f in findings:
        sources.append(Source(f["knob"], f["command"], config=variant(base, [f["knob"]])))
    sides, interrupted = run_sources(sources, VERIFY_REPEATS, out=out, name="verify", command=list(sys.argv),
                                     on_run=on_run, stop=stop)
    sides = [s for s in sides if s.records]
    if len(sides) < 2:
        return {"ran": 0, "interrupted": interrupted}
    comparison = compare(sides)
    rate = next(r for r in comparison["rows"] if r["metric"] == "env_steps_per_s")
    by_label = {s.label: i for i, s in enumerate(sides)}
    for f in findings:
        i = by_label.get(f["knob"])
        if i is None or i == 0:
            f["verified"] = {"error": "interrupted before it ran"}
            continue
        ratio, cell = rate["ratios"][i - 1], rate["cells"][i]
        f["verified"] = {"speedup": ratio["value"], "spread": ratio["spread"], "inside_noise": ratio["inside_noise"],
                         "repeats": cell["n"] if cell else 0, "env_steps_per_s": cell, "baseline_env_steps_per_s":
                         rate["cells"][0], "run_dirs": comparison["runs"][i]["run_dirs"]}
    return {"ran": len(findings), "repeats": VERIFY_REPEATS, "interrupted": interrupted,
            "compare_dir": str(Path(comparison["runs"][0]["run_dirs"][0]).parent), "warnings": comparison["warnings"]}
