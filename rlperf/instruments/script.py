"""``rlperf profile -- python SCRIPT [ARGS]``: your own script under the instruments.

The script runs in a child process (:mod:`rlperf.instruments.child`) under cProfile, the GC
monitor and optionally py-spy (which starts it) and torch.profiler; its output and exit code are
its own, Ctrl-C stops it cleanly. This side checks the command, runs the child, and writes the
run directory: ``profile.prof``, the py-spy files, ``trace.json``, and a ``kind: "external"``
record with the script's phase timings (when it used :class:`rlperf.PhaseTimer`), its top
functions with its own code marked, and the advisor's findings (:mod:`rlperf.instruments.foreign`).
Nothing here imports torch: the script pays for its own imports, rlperf does not add one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlperf.errors import RlperfError
from rlperf.instruments.advisor import effective_cpus
from rlperf.instruments.profilers import (
    PYSPY_HINT,
    CallStats,
    ProfileOptions,
    attach_pyspy,
    check_out,
    find_pyspy,
    is_pyspy_error,
    pyspy_command,
    pyspy_env,
    pyspy_failure,
    user_code,
)
from rlperf.run.files import write_json_atomic


@dataclass
class ScriptRun:
    """What a profiled script leaves: its run directory, its record and its exit code."""

    run_dir: Path
    record: dict[str, Any]
    exit_code: int


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?")
_PYTHON_FLAGS = {"-u", "-O", "-OO", "-B", "-s"}
_PYTHON_FLAGS_WITH_VALUE = {"-X", "-W"}


@dataclass
class ScriptTarget:
    """``python [FLAGS] SCRIPT ARGS`` or ``python [FLAGS] -m MODULE ARGS``, checked."""

    python: str
    flags: list[str]
    target: list[str]  # [SCRIPT, ARGS...] or ["-m", MODULE, ARGS...]
    command: list[str]  # as the user wrote it

    @property
    def name(self) -> str:
        return self.target[1] if self.target[0] == "-m" else Path(self.target[0]).stem


def parse_script_command(command: list[str]) -> ScriptTarget:
    """Check what follows ``--``: a Python interpreter, its flags, then a script or ``-m module``."""
    usage = "write: rlperf profile [OPTIONS] -- python SCRIPT [ARGS...] (or -- python -m MODULE [ARGS...])"
    if not command or not _PYTHON.fullmatch(Path(command[0]).name):
        raise RlperfError(f"rlperf profile runs Python scripts, not {command[0] if command else 'nothing'!r}", hint=usage)
    python = shutil.which(command[0]) or (command[0] if Path(command[0]).is_file() else None)
    if python is None:
        raise RlperfError(f"{command[0]} not found", hint="give a python on PATH, or its path")
    flags, rest = [], command[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        flag = rest.pop(0)
        if flag in _PYTHON_FLAGS:
            flags.append(flag)
        elif flag in _PYTHON_FLAGS_WITH_VALUE and rest:
            flags += [flag, rest.pop(0)]
        else:
            raise RlperfError(f"python option {flag} is not supported under rlperf profile", hint=usage)
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        raise RlperfError("nothing to run after python", hint=usage)
    if rest[0] == "-m":
        import importlib.util

        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(rest[1]) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise RlperfError(f"no module named {rest[1]!r}", hint="run from the folder it imports from")
    elif not Path(rest[0]).is_file():
        raise RlperfError(f"no such script: {rest[0]}", hint=usage)
    return ScriptTarget(python, flags, rest, list(command))


def run_script_child(target: ScriptTarget, report: Path, options: ProfileOptions, quiet_stdout: bool,
                     pyspy: tuple[str, Path, bool] | None = None) -> list[str]:
    """Run the script in its child process (under py-spy when ``pyspy`` = (py-spy, recording, native)),
    its output passed through (stdout to our stderr when ``quiet_stdout``: --json owns stdout).
    Ctrl-C reaches the script (same process group), which stops and keeps its profile; a SIGTERM to
    rlperf is passed on as Ctrl-C. Returns py-spy's own output lines."""
    import signal

    child = [target.python, *target.flags, "-m", "rlperf.instruments.child", "--report", str(report)]
    child += ([] if options.cprofile else ["--no-cprofile"]) + (["--torch"] if options.torch else [])
    child += ["--", *target.target]
    root = str(Path(__file__).resolve().parents[2])  # so that the script's python imports this rlperf
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if pyspy is not None:
        child = pyspy_command(pyspy[0], pyspy[1], child, native=pyspy[2])
        env.update(pyspy_env())
    pipe = pyspy is not None  # py-spy talks on stdout: its lines are kept back
    proc = subprocess.Popen(child, env=env, stdout=subprocess.PIPE if pipe else (sys.stderr if quiet_stdout else None))
    spy_lines: list[str] = []
    reader = None
    if pipe:
        reader = threading.Thread(target=_pass_through, args=(proc, sys.stderr if quiet_stdout else sys.stdout, spy_lines),
                                  daemon=True)
        reader.start()
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, lambda s, f: None),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda s, f: proc.send_signal(signal.SIGINT))}
    try:
        proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if reader is not None:
        reader.join(timeout=5)
    return spy_lines


def _pass_through(proc: subprocess.Popen[bytes], out: Any, spy_lines: list[str]) -> None:
    """Forward the child's stdout, keeping back py-spy's lines (and the blank lines it wraps them in)."""
    assert proc.stdout is not None
    held_blank = False
    after_spy = False
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        if line.startswith("py-spy> ") or is_pyspy_error(line):
            spy_lines.append(line.rstrip("\n"))
            held_blank, after_spy = False, line.startswith("py-spy> Sampling")
            continue
        if not line.strip() and (after_spy or not held_blank):
            if after_spy:  # the blank line py-spy prints after its first line
                after_spy = False
                continue
            held_blank = True  # maybe the one before "py-spy> Stopped": wait and see
            continue
        if held_blank:
            out.write("\n")
            held_blank = False
        after_spy = False
        out.write(line)
        out.flush()
    if held_blank:
        out.write("\n")
    out.flush()


def profile_script(target: ScriptTarget, out: str | Path = "runs", name: str | None = None,
                   options: ProfileOptions | None = None, py_spy: bool = False, native: bool = False,
                   quiet_stdout: bool = False, command: list[str] | None = None) -> ScriptRun:
    """Profile a Python script (``rlperf profile -- python SCRIPT``): run it in a child process under
    cProfile (and py-spy, torch.profiler), then write a run directory with ``profile.prof``, the
    py-spy files and a ``kind: "external"`` record holding the script's phase timings (when it used
    :class:`rlperf.PhaseTimer`), its top functions with its own code marked, and the advisor's
    findings on them. The exit code is the script's."""
    from rlperf.external import _now as now
    from rlperf.instruments.foreign import ScriptProfile, advise_script, alone_factor, script_steps
    from rlperf.run.files import make_run_dir

    options = options or ProfileOptions()
    options.check()
    out = Path(out)
    check_out(out)
    pyspy_path = find_pyspy() if py_spy else None
    skipped = f"not found on PATH ({PYSPY_HINT})" if py_spy and pyspy_path is None else None
    run_dir = make_run_dir(out, name or target.name, prefix="profile")
    started = now()
    with tempfile.TemporaryDirectory(prefix="rlperf-script-") as scratch:
        report = Path(scratch) / "child.json"
        recording = Path(scratch) / "pyspy.speedscope.json"
        spy_lines = run_script_child(target, report, options, quiet_stdout,
                                     (pyspy_path, recording, native) if pyspy_path else None)
        if not report.is_file():
            raise RlperfError(f"{target.command[0]} could not start the profiled child (is rlperf importable by it?)",
                              hint="run with the python rlperf is installed for")
        child = json.loads(report.read_text(encoding="utf-8"))
        prof, trace = report.with_suffix(".prof"), report.with_suffix(".trace.json")
        if prof.is_file():
            shutil.move(str(prof), run_dir / "profile.prof")
        if trace.is_file():
            shutil.move(str(trace), run_dir / "trace.json")
        record = _script_record(child, target, run_dir, started, command)
        section = record["profile"] = _script_profile_section(child, record, options, run_dir, target)
        if pyspy_path is not None:
            if recording.is_file() and recording.stat().st_size > 0:
                attach_pyspy(record, recording, native)
            else:
                skipped = pyspy_failure(spy_lines)
    if skipped:
        section["py_spy"] = {"skipped": skipped}
    calls = _script_calls(run_dir, target) if options.cprofile else None
    section["evidence"] = child.get("evidence") or {}  # the forward hooks' figures and cProfile's cost per call
    findings = advise_script(record, calls, child["gc"], script_steps(record, calls), section["evidence"])
    # Savings are shares of the script's own work: its profiled time without imports, less cProfile's cost.
    worked = (ScriptProfile(calls).total * alone_factor(record, calls, section["evidence"]) if calls is not None
              else child["wall_s"])
    section["advisor"] = {"findings": [f.as_dict() for f in findings],
                          "none": None if findings else "no finding: none of the checklist's bottlenecks showed in "
                          "this script's profile",
                          "measured_phase_s": worked}
    record["files"].update({f"profile_{k}": v for k, v in section["artifacts"].items()})
    write_json_atomic(run_dir / "run.json", record)
    return ScriptRun(run_dir, record, int(child["exit_code"]))


def _script_record(child: dict[str, Any], target: ScriptTarget, run_dir: Path, started: str,
                   command: list[str] | None) -> dict[str, Any]:
    """The record of a profiled script: its phase timer's record when it used one, else the run's outline."""
    timers = child["timers"]
    main_timer = max(timers, key=lambda t: t["totals"]["vector_steps"]) if timers else None
    record: dict[str, Any] = dict(main_timer) if main_timer else {
        "schema": 1, "kind": "external", "config": None, "phases": {},
        "totals": {"wall_s": child["wall_s"]}, "memory": {},
    }
    record.update(name=run_dir.name, run_dir=str(run_dir), status=child["status"], exit_code=child["exit_code"],
                  command=list(command or sys.argv), started_at=started, system=child["system"],
                  script={"command": target.command, "argv": child["argv"], "cwd": os.getcwd(), "wall_s": child["wall_s"],
                          "phase_timers": len(timers)},
                  files={"record": "run.json"})
    return record


def _script_profile_section(child: dict[str, Any], record: dict[str, Any], options: ProfileOptions, run_dir: Path,
                            target: ScriptTarget) -> dict[str, Any]:
    section: dict[str, Any] = {
        "options": {"top": options.top, "sort": options.sort, "cprofile": options.cprofile, "torch": options.torch},
        "timing_mode": (record.get("timing") or {}).get("mode"),
        "artifacts": {},
        "gc": child["gc"],
        "load": {"loadavg_1m": child["loadavg_1m"], "cpus": effective_cpus()},
        "own": "your code",
    }
    if (run_dir / "profile.prof").is_file():
        calls = _script_calls(run_dir, target)
        section["cprofile"] = {"file": "profile.prof", "sort": options.sort, "total_calls": calls.total_calls,
                               "primitive_calls": calls.primitive_calls, "total_s": calls.total_s,
                               "top": [row.as_dict() for row in calls.top(options.top, options.sort, skip=_launcher)]}
        section["artifacts"]["cprofile"] = "profile.prof"
    if "torch" in child:
        section["torch"] = child["torch"]
        if (run_dir / "trace.json").is_file():
            section["torch"]["file"] = "trace.json"
            section["artifacts"]["torch_trace"] = "trace.json"
    return section


def _launcher(label: str) -> bool:
    """Frames that are not the script's work: runpy and exec above all of it, and imports (a lazy
    import inside the loop is start-up, counted apart by the advisor too)."""
    return label.startswith(("<frozen runpy>", "<frozen importlib")) or label == "<built-in method builtins.exec>"


def _script_calls(run_dir: Path, target: ScriptTarget) -> CallStats:
    import pstats

    script_dir = Path(target.target[0]).resolve().parent if target.target[0] != "-m" else Path.cwd()
    return CallStats(pstats.Stats(str(run_dir / "profile.prof")), own=user_code([script_dir, Path.cwd()]))
