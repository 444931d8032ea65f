"""``rlperf profile``: a training run wrapped in instruments, and the advisor's reading of it.

:func:`profile_run` is the library function (tests and other code call it): it runs
:func:`rlperf.runner.train_run` with hooks that put cProfile, a GC monitor and, with ``--torch``,
torch.profiler around the loop, then writes the artifacts into the run directory and a
``profile`` section into its ``run.json``. With ``--py-spy`` the command starts itself again as
a child under ``py-spy record`` (py-spy launches the process it samples, so no ptrace attach
privileges are needed) and adds the flamegraph to the child's run directory.

Instrument overhead is measured, not guessed: after the run, the first vector steps are replayed
in the same process with the same seed and no instruments (the loop is deterministic step by
step), and the two timings of the very same steps are compared.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Annotated, Any

import typer

from rlperf.advisor import VerifyBase, advise, effective_cpus, measured_total, no_finding_reason, render_findings
from rlperf.cli import (
    ConfigOpt, DeviceOpt, EnvsOpt, EpisodesOpt, JsonOpt, NameOpt, OutOpt, QuietOpt, RatioOpt, SeedOpt, SetOpt,
    StepsOpt, app, build_config, emit,
)
from rlperf.config import Config
from rlperf.errors import RlperfError
from rlperf.profilers import (
    CProfiler, GcMonitor, TorchProfiler, check_sort, cprofile_table, find_pyspy, pyspy_command, pyspy_env,
    pyspy_failure, speedscope_to_svg, torch_ops_table, torch_window, PYSPY_HINT,
)
from rlperf.records import write_json_atomic
from rlperf.runner import EXIT_CODES, RunHooks, RunResult, train_run

DEFAULT_EPISODES = 100
OVERHEAD_BUDGET_S = (2.0, 0.1, 30.0)
"""Replay for the overhead measurement: at least 2 s, else 10% of the loop, at most 30 s of profiled steps."""


@dataclass
class ProfileOptions:
    """What to wrap the run in (the command's flags)."""

    top: int = 20
    sort: str = "cumtime"
    cprofile: bool = True
    torch: bool = False
    overhead: bool = True  # replay the first steps without instruments to measure their cost
    verify: VerifyBase = field(default_factory=VerifyBase)

    def check(self) -> None:
        if self.top < 1:
            raise RlperfError(f"--top must be at least 1, got {self.top}")
        self.sort = check_sort(self.sort)


def _with(cfg: Config, section: str, **values: Any) -> Config:
    part = getattr(cfg, section)
    return cfg.model_copy(update={section: part.model_copy(update=values)})


def profile_run(cfg: Config, out: str | Path = "runs", name: str | None = None, command: list[str] | None = None,
                quiet: bool = False, dashboard: bool = True, options: ProfileOptions | None = None) -> RunResult:
    """Train with ``cfg`` under the instruments; the record gains a ``profile`` section."""
    options = options or ProfileOptions()
    options.check()
    if cfg.run.mode == "async":
        raise RlperfError("rlperf profile instruments the single-process loop; run.mode=async is not supported",
                          hint="profile with --set run.mode=sync, or run async under py-spy record --subprocesses")
    gc_monitor = GcMonitor()
    cprof = CProfiler() if options.cprofile else None
    scratch = tempfile.TemporaryDirectory(prefix="rlperf-profile-")
    torch_prof: TorchProfiler | None = None
    if options.torch:
        t = cfg.train
        total = math.ceil(t.steps / cfg.env.num_envs) if t.steps > 0 and t.episodes == 0 else None
        window = torch_window(t.warmup_steps, cfg.env.num_envs, t.learning_starts, cfg.buffer.batch_size, total,
                              t.train_ratio)
        device_type = "cuda" if _device_type(cfg) == "cuda" else "cpu"
        torch_prof = TorchProfiler(device_type, window, Path(scratch.name) / "trace.json")
    stamps: list[float] = []

    @contextlib.contextmanager
    def around_loop() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(gc_monitor.running())
            if torch_prof is not None:
                stack.enter_context(torch_prof.running())
            stamps.append(perf_counter())  # cProfile starts last and stops first: it sees only the loop
            if cprof is not None:
                stack.enter_context(cprof.running())
            yield

    def on_step() -> None:
        stamps.append(perf_counter())
        if torch_prof is not None:
            torch_prof.step()

    hooks = RunHooks(around_loop=around_loop, on_step=on_step, annotate_phases=options.torch)
    try:
        result = train_run(cfg, out=out, name=name, command=command, quiet=quiet, dashboard=dashboard,
                           kind="profile", hooks=hooks)
        record, run_dir = result.record, result.run_dir
        section: dict[str, Any] = {
            "options": {"top": options.top, "sort": options.sort, "cprofile": options.cprofile, "torch": options.torch,
                        "py_spy": False},
            "timing_mode": record["timing"]["mode"],
            "artifacts": {},
        }
        calls = None
        if cprof is not None:
            cprof.dump(run_dir / "profile.prof")
            calls = cprof.stats()
            section["cprofile"] = {
                "file": "profile.prof", "sort": options.sort, "total_calls": calls.total_calls,
                "primitive_calls": calls.primitive_calls, "total_s": calls.total_s,
                "top": [row.as_dict() for row in calls.top(options.top, options.sort)],
            }
            section["artifacts"]["cprofile"] = "profile.prof"
        if torch_prof is not None:
            section["torch"] = torch_prof.to_dict(options.top)
            if torch_prof.recorded:
                shutil.move(str(torch_prof.trace_path), run_dir / "trace.json")
                section["torch"]["file"] = "trace.json"
                section["artifacts"]["torch_trace"] = "trace.json"
        section["gc"] = gc_monitor.to_dict()
        section["load"] = {"loadavg_1m": os.getloadavg()[0], "cpus": effective_cpus()}
        instruments = [n for n, on in (("cProfile", cprof is not None), ("torch.profiler", torch_prof is not None)) if on]
        if not instruments:
            section["overhead"] = {"skipped": "no in-process instrument besides the phase timers"}
        elif not options.overhead:
            section["overhead"] = {"skipped": "not measured (overhead replay off)"}
        elif record["status"] != "completed":
            section["overhead"] = {"skipped": f"not measured: the run is {record['status']}"}
        else:
            section["overhead"] = measure_overhead(cfg, stamps, instruments)
        record["profile"] = section
        findings = advise(record, calls, section["gc"], options.verify)
        section["advisor"] = {
            "findings": [f.as_dict() for f in findings],
            "none": None if findings else no_finding_reason(record),
            "measured_phase_s": measured_total(record),
        }
        record["files"].update({f"profile_{k}": v for k, v in section["artifacts"].items()})
        write_json_atomic(run_dir / "run.json", record)
        return RunResult(run_dir, record, result.exit_code)
    finally:
        scratch.cleanup()


def _device_type(cfg: Config) -> str:
    from rlperf.device import resolve_device

    return resolve_device(cfg.run.device).type


def measure_overhead(cfg: Config, stamps: list[float], instruments: list[str]) -> dict[str, Any]:
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
    durations = [b - a for a, b in zip(stamps, stamps[1:])]
    n = len(durations)
    if n < 4:
        return {"skipped": f"only {n} vector steps: too few to compare"}
    t = cfg.train
    first_train = max(0, math.ceil(max(t.learning_starts, cfg.buffer.batch_size) / cfg.env.num_envs) - 1)
    low, share, high = OVERHEAD_BUDGET_S
    budget = max(low, min(share * sum(durations), high))
    needed = min(n, max(4, first_train + 5))
    elapsed, k = 0.0, 0
    for d in durations:
        if (k >= needed and elapsed + d > budget) or elapsed + d > high:
            break
        elapsed += d
        k += 1
    k = max(k, 4)
    # Only the stop condition changes: the replay writes its checkpoint at the same log boundary.
    replay_cfg = _with(cfg, "train", steps=k * cfg.env.num_envs, episodes=0)
    replay: list[float] = []

    @contextlib.contextmanager
    def mark() -> Iterator[None]:
        replay.append(perf_counter())
        yield

    with tempfile.TemporaryDirectory(prefix="rlperf-replay-") as tmp:
        train_run(replay_cfg, out=tmp, quiet=True, dashboard=False, kind="replay",
                  hooks=RunHooks(around_loop=mark, on_step=lambda: replay.append(perf_counter())))
    plain = [b - a for a, b in zip(replay, replay[1:])]
    if len(plain) < k:
        return {"skipped": f"the replay stopped after {len(plain)} of {k} steps"}
    warm = t.warmup_steps
    start = warm if k - 1 - warm >= 3 else 1
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
    for i in range(min(warm, n - 1), n):
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


# -- rendering ---------------------------------------------------------------------------------


def overhead_line(section: dict[str, Any]) -> str:
    o = section.get("overhead") or {}
    if "ratio" not in o or o["ratio"] is None:
        return f"instrument overhead: {o.get('skipped', 'not measured')}"
    names = {"before_learning": "before learning starts", "training": "while training"}
    parts = ", ".join(f"×{r:.2f} {names[k]}" for k, r in o["by_regime"].items())
    line = (f"instrument overhead: {' + '.join(o['instruments'])} ×{o['ratio']:.2f} over the run ({parts}): vector "
            f"steps {o['steps'][0]}–{o['steps'][1]} took {o['replayed_profiled_s']:.2f} s profiled vs "
            f"{o['replayed_plain_s']:.2f} s replayed without instruments (same seed, same process)")
    if o["ratio"] < 1:
        line += "; below 1, so noise exceeded the instruments' cost on this run"
    return line


def render_profile(record: dict[str, Any], quiet: bool = False) -> None:
    """Print a profiled run: phases, summary, cProfile, torch ops, GC, overhead, artifacts, advisor."""
    from rich.console import Console

    from rlperf.report import phase_table, summary_table

    console = Console()
    p = record["profile"]
    o = p.get("overhead") or {}
    mode = record["timing"]["mode"]
    if o.get("ratio"):
        mode += f"; measured under {' + '.join(o['instruments'])} (×{o['ratio']:.2f} overhead)"
    console.print(phase_table(record["phases"], title="phases", timing_mode=mode))
    console.print(summary_table(record))
    if p.get("cprofile"):
        console.print(cprofile_table(p["cprofile"], title=f"cProfile: top {len(p['cprofile']['top'])} functions"))
    t = p.get("torch")
    if t:
        if t.get("recorded"):
            console.print(torch_ops_table(t))
            if t.get("top_device_ops"):
                console.print(torch_ops_table(t, "top_device_ops", "torch.profiler: top ops by self device time"))
        else:
            console.print(f"torch.profiler: {t.get('note')}", markup=False)
    spy = p.get("py_spy")
    if spy and spy.get("skipped"):
        console.print(f"py-spy skipped: {spy['skipped']}", highlight=False, soft_wrap=True, markup=False)
    gc = p["gc"]
    n = gc["collections"]
    console.print(f"gc: {gc['total_collections']:,} collections (gen0 {n['gen0']:,}, gen1 {n['gen1']:,}, gen2 {n['gen2']:,}) "
                  f"took {gc['total_s']:.3f} s, {100 * gc['share_of_loop']:.1f}% of the loop; longest pause "
                  f"{gc['max_pause_ms']:.1f} ms", highlight=False, markup=False)
    console.print(overhead_line(p), highlight=False, markup=False)
    run_dir = Path(record["run_dir"])
    for label, key in (("cProfile", "cprofile"), ("torch trace (Perfetto / chrome://tracing)", "torch_trace"),
                       ("py-spy flamegraph", "pyspy_svg"), ("py-spy speedscope", "pyspy_speedscope")):
        if key in p["artifacts"]:
            console.print(f"{label}: {run_dir / p['artifacts'][key]}", highlight=False, soft_wrap=True, markup=False)
    adv = p["advisor"]
    console.print(render_findings(adv["findings"], adv["measured_phase_s"], adv["none"]), soft_wrap=True)
    status = record["status"]
    if not quiet or status != "completed":
        line = f"run {record['name']}: {status} -> {record['run_dir']}"
        if status == "failed":
            line += f" ({record.get('error', 'see run.json')})"
        print(line, file=sys.stderr)


def _notes(record: dict[str, Any]) -> list[str]:
    """Caveats about the evidence: a run too short to profile, a machine too busy to time."""
    notes = []
    short = _short_run_note(record)
    if short:
        notes.append(short)
    load = record["profile"].get("load") or {}
    if load.get("loadavg_1m", 0.0) > load.get("cpus", 1.0) + 0.5:
        notes.append(f"note: load average {load['loadavg_1m']:.1f} on {load['cpus']:g} CPUs at the end of the run: "
                     f"other processes competed for the CPUs, so timings and the overhead ratio are noisy")
    return notes


def _short_run_note(record: dict[str, Any]) -> str | None:
    timing, totals = record["timing"], record["totals"]
    if timing["measured_steps"] == 0:
        return (f"note: the run was {totals['vector_steps']} vector steps, all of them warm-up "
                f"({timing['warmup_steps']}); the profile shows start-up, not the loop: run longer (--steps 50000)")
    if totals["updates"] == 0:
        return "note: the run ended before the first gradient update (train.learning_starts); train is not profiled"
    return None


# -- py-spy ------------------------------------------------------------------------------------


def run_under_pyspy(pyspy: str, child_args: list[str], native: bool, scratch: Path) -> tuple[dict[str, Any] | None, Path, list[str]]:
    """Run ``rlperf profile <child_args>`` under py-spy as the child that writes its record to a file.

    Returns the child's record (None when it did not finish), the recording's path and py-spy's
    own output lines. py-spy's chatter ("py-spy> ..." on stdout) is kept back; the child's
    output lines are passed on to stderr.
    """
    recording = scratch / "pyspy.speedscope.json"
    record_file = scratch / "record.json"
    child = [sys.executable, "-m", "rlperf", "profile", *child_args, "--pyspy-child", str(record_file)]
    proc = subprocess.Popen(pyspy_command(pyspy, recording, child, native=native), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=pyspy_env(), text=True, errors="replace")
    pyspy_lines: list[str] = []

    def forward() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("py-spy> ") or not line.strip() or _is_pyspy_error(line):
                pyspy_lines.append(line.rstrip("\n"))
            else:
                sys.stderr.write(line)
                sys.stderr.flush()

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    while True:
        try:
            proc.wait()
            break
        except KeyboardInterrupt:  # the child got the signal too and is saving its run: wait for it
            continue
    reader.join(timeout=5)
    record = None
    if record_file.is_file():
        with contextlib.suppress(json.JSONDecodeError, OSError):
            record = json.loads(record_file.read_text(encoding="utf-8"))
    return record, recording, pyspy_lines


def _is_pyspy_error(line: str) -> bool:
    lowered = line.lower()
    return lowered.startswith(("error:", "failed to", "permission denied")) or "ptrace" in lowered


def _attach_pyspy(record: dict[str, Any], recording: Path, native: bool) -> None:
    run_dir = Path(record["run_dir"])
    speedscope = run_dir / "pyspy.speedscope.json"
    shutil.move(str(recording), speedscope)
    samples = speedscope_to_svg(speedscope, run_dir / "pyspy.svg", title=f"py-spy: {record['name']}")
    record["profile"]["py_spy"] = {"svg": "pyspy.svg", "speedscope": "pyspy.speedscope.json", "samples": samples,
                                   "native": native, "rate_hz": 100}
    record["profile"]["artifacts"].update(pyspy_svg="pyspy.svg", pyspy_speedscope="pyspy.speedscope.json")
    record["files"].update(profile_pyspy_svg="pyspy.svg", profile_pyspy_speedscope="pyspy.speedscope.json")


# -- the command -------------------------------------------------------------------------------


def _run_args(set_: list[str] | None, envs: int | None, episodes: int | None, steps: int | None,
              train_ratio: float | None, device: str | None, seed: int | None) -> list[str]:
    """The run options as command-line arguments (for the compare lines and the py-spy child)."""
    args: list[str] = []
    for item in set_ or []:
        args += ["--set", item]
    for flag, value in (("--envs", envs), ("--episodes", episodes), ("--steps", steps), ("--train-ratio", train_ratio),
                        ("--device", device), ("--seed", seed)):
        if value is not None:
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return args


@app.command()
def profile(
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
    top: Annotated[int, typer.Option("--top", help="Functions and ops to list.")] = 20,
    sort: Annotated[str, typer.Option("--sort", help="cProfile order: cumtime, tottime or ncalls.")] = "cumtime",
    cprofile: Annotated[bool, typer.Option("--cprofile/--no-cprofile", help="cProfile the loop; saves profile.prof.")] = True,
    torch_: Annotated[bool, typer.Option("--torch", help="torch.profiler over a window of steps; saves trace.json.")] = False,
    py_spy: Annotated[bool, typer.Option("--py-spy", help="Run under py-spy record; saves pyspy.svg and pyspy.speedscope.json.")] = False,
    native: Annotated[bool, typer.Option("--native", help="With --py-spy: also sample native (C/C++) frames.")] = False,
    pyspy_child: Annotated[str | None, typer.Option("--pyspy-child", hidden=True, help="Internal: run as the py-spy child, write the record here.")] = None,
) -> None:
    """Where does the time go, and what to do about it: a train run (100 episodes unless --episodes or
    --steps) under cProfile and optionally torch.profiler and py-spy, with the advisor's findings."""
    options = ProfileOptions(top=top, sort=sort, cprofile=cprofile, torch=torch_)
    options.check()
    if native and not py_spy:
        raise RlperfError("--native applies to --py-spy", hint="add --py-spy")
    if episodes is None and steps is None:
        episodes = DEFAULT_EPISODES
    cfg = build_config(config, set_, envs, episodes, steps, train_ratio, device, seed)
    if tensorboard:
        cfg = _with(cfg, "train", tensorboard=True)
    if cfg.run.mode == "async":
        raise RlperfError("rlperf profile instruments the single-process loop; run.mode=async is not supported",
                          hint="profile with --set run.mode=sync")
    run_args = _run_args(set_, envs, episodes, steps, train_ratio, device, seed)
    options.verify = VerifyBase(config or "default", tuple(run_args))
    command = list(sys.argv)

    if pyspy_child:  # the py-spy child: run, and hand the record to the parent in a file
        result = profile_run(cfg, out=out, name=name, command=command, quiet=quiet, dashboard=not quiet, options=options)
        write_json_atomic(pyspy_child, result.record)
        raise typer.Exit(result.exit_code)

    record: dict[str, Any] | None = None
    skipped: str | None = None
    if py_spy:
        _check_runnable(cfg)  # what the child would refuse, refused once, here
        child_args = ([] if config is None else ["--config", config]) + run_args + [
            "--out", str(out), "--top", str(top), "--sort", options.sort]
        child_args += (["--name", name] if name else []) + ([] if cprofile else ["--no-cprofile"])
        child_args += (["--torch"] if torch_ else []) + (["--tensorboard"] if tensorboard else [])
        child_args += ["--quiet"] if (quiet or json_) else []
        record, skipped = _profile_under_pyspy(child_args, out, native)
        if skipped:
            print(f"rlperf: py-spy skipped: {skipped}", file=sys.stderr)
    if record is None:
        result = profile_run(cfg, out=out, name=name, command=command, quiet=quiet or json_, dashboard=not json_,
                             options=options)
        record, code = result.record, result.exit_code
    else:
        code = EXIT_CODES.get(record.get("status", "failed"), 1)
    record["command"] = command
    record["profile"]["options"].update(py_spy=py_spy, native=native)
    if py_spy and skipped:
        record["profile"]["py_spy"] = {"skipped": skipped}
    write_json_atomic(Path(record["run_dir"]) / "run.json", record)

    if json_:
        emit(record, True, quiet)
    else:
        render_profile(record, quiet)
    for note in _notes(record):
        print(f"rlperf: {note}", file=sys.stderr)
    raise typer.Exit(code)


def _profile_under_pyspy(child_args: list[str], out: Path, native: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The child's record with the flamegraph attached, and why py-spy was skipped (or None).

    No record means the child did not run to the end: the caller runs in-process instead.
    """
    pyspy = find_pyspy()
    if pyspy is None:
        return None, f"not found on PATH ({PYSPY_HINT})"
    _check_out(out)
    with tempfile.TemporaryDirectory(prefix="rlperf-pyspy-") as scratch:
        record, recording, lines = run_under_pyspy(pyspy, child_args, native, Path(scratch))
        if record is None or not recording.is_file() or recording.stat().st_size == 0:
            return record, pyspy_failure(lines)
        _attach_pyspy(record, recording, native)
        return record, None


def _check_runnable(cfg: Config) -> None:
    from rlperf.device import resolve_device
    from rlperf.dqn import check_knobs

    check_knobs(cfg, resolve_device(cfg.run.device))


def _check_out(out: Path) -> None:
    """Refuse an unusable --out before starting a child process (the in-process run checks it itself)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RlperfError(f"cannot create output directory {out}: {e.strerror or e}", hint="pass a writable --out") from None
