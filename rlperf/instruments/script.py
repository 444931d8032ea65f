"""``rlperf profile -- python SCRIPT [ARGS]``: your own script under the instruments.

The script runs in a child process (:mod:`rlperf.instruments.child`) under cProfile, the GC
monitor and optionally py-spy (which starts it) and torch.profiler, in its own process group that
holds the terminal; its output and exit code are its own (128 + N when signal N killed it), and
rlperf's SIGINT/SIGTERM reach it (:class:`_Stopper`). This side checks the command, runs the child, and writes the
run directory: ``profile.prof``, the py-spy files, ``trace.json``, and a ``kind: "external"``
record with the script's phase timings (when it used :class:`rlperf.PhaseTimer`), its top
functions with its own code marked, and the advisor's findings (:mod:`rlperf.instruments.foreign`).
Nothing here imports torch: the script pays for its own imports, rlperf does not add one.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlperf.errors import RlperfError
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
from rlperf.atomic import write_json_atomic
from rlperf.run.signals import signal_name
from rlperf.system import effective_cpus

if TYPE_CHECKING:
    from rlperf.instruments.foreign import ScriptProfile


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


GRACE_S = 5.0
"""Seconds a stopping script gets before the next, harder signal (after a SIGTERM to rlperf, or a
second stop signal)."""

_LADDER = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


class _Stopper:
    """rlperf's stop signals, passed on to the script's process group (the script and whatever it
    started) one rung harder each time: Ctrl-C (the script stops and keeps its profile), SIGTERM
    (the child ends a script that ignores Ctrl-C the same way), SIGKILL. After a SIGTERM to rlperf,
    or a second signal, the next rung follows by itself :data:`GRACE_S` seconds later."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.received: list[int] = []
        self.sent = 0
        self.next_at: float | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        self._escalate()
        if signum == signal.SIGTERM or len(self.received) > 1:
            self.next_at = time.monotonic() + GRACE_S

    def _escalate(self) -> None:
        rung = _LADDER[min(self.sent, len(_LADDER) - 1)]
        self.sent += 1
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, rung)

    def wait(self, done: int | None = None, on_done: Callable[[], None] | None = None) -> int:
        """Wait for the child's end, escalating as signals ask. ``on_done`` is called once the child
        says (a byte on the pipe ``done``) that its report is written: its process may still be
        ending (torch's teardown alone takes half a second), and rlperf reads meanwhile."""
        while True:
            if done is not None:
                ready, _, _ = select.select([done], [], [], 0.25)
                if ready:
                    said = os.read(done, 1)
                    done = None  # once: a byte, or the pipe's end (the child died without a word)
                    if said and on_done is not None:
                        on_done()
                code = self.proc.poll()
            else:
                try:
                    code = self.proc.wait(timeout=0.25)
                except subprocess.TimeoutExpired:
                    code = None
            if code is not None:
                return code
            if self.next_at is not None and time.monotonic() >= self.next_at:
                self._escalate()
                self.next_at = time.monotonic() + GRACE_S

    @property
    def signum(self) -> int | None:
        """The first stop signal rlperf received (None: none)."""
        return self.received[0] if self.received else None


@contextlib.contextmanager
def _terminal_to(pgid: int) -> Iterator[None]:
    """Hand the terminal to the script's process group while it runs, as a shell does for a job: its
    Ctrl-C goes to the script, and the script may read the terminal (a script started before the
    command line was parsed, :func:`start_early`, that read it meanwhile was stopped by SIGTTIN: it is
    continued, as ``fg`` does). Nothing to do without one."""
    try:
        fd = sys.stdin.fileno()
        ours = os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        yield
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may then set the terminal
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgid)
            os.killpg(pgid, signal.SIGCONT)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)


@dataclass
class ChildEnd:
    """How the child process ended: its return code (negative: killed by that signal), the stop
    signal rlperf received (None: none) and py-spy's own output lines."""

    returncode: int
    signum: int | None
    spy_lines: list[str]


def run_script_child(target: ScriptTarget, report: Path, options: ProfileOptions, quiet_stdout: bool,
                     pyspy: tuple[str, Path, bool] | None = None, child_args: Sequence[str] = (),
                     silent: bool = False, started: Callable[[], None] | None = None,
                     reported: Callable[[], None] | None = None,
                     spawned: tuple[subprocess.Popen[bytes], int | None] | None = None) -> ChildEnd:
    """Run the script in its child process (under py-spy when ``pyspy`` = (py-spy, recording, native)),
    its output passed through (stdout to our stderr when ``quiet_stdout``: --json owns stdout; none
    when ``silent``), with ``child_args`` for :mod:`rlperf.instruments.child`; ``started`` is called
    once the child is started (what rlperf can prepare while the script runs), ``reported`` once
    its report is written, while its process may still be ending; ``spawned``: the child and its
    pipe, started already for this very command (:func:`start_early`).
    The child runs in its own process group, which holds the terminal while it runs; SIGINT and
    SIGTERM to rlperf reach that group (see :class:`_Stopper`)."""
    proc, read_end = spawned or _spawn(target, report, options, quiet_stdout, pyspy, child_args, silent,
                                       pipe=reported is not None)
    stopper = _Stopper(proc)
    if started is not None:
        started()
    spy_lines: list[str] = []
    reader = None
    if pyspy is not None:  # py-spy talks on stdout: its lines are kept back
        reader = threading.Thread(target=_pass_through, args=(proc, sys.stderr if quiet_stdout else sys.stdout, spy_lines),
                                  daemon=True)
        reader.start()
    previous = {signum: signal.signal(signum, stopper) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _terminal_to(proc.pid):
            returncode = stopper.wait(read_end, reported)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if read_end is not None:
            os.close(read_end)
    if reader is not None:
        reader.join(timeout=5)
    return ChildEnd(returncode, stopper.signum, spy_lines)


def _spawn(target: ScriptTarget, report: Path, options: ProfileOptions, quiet_stdout: bool,
           pyspy: tuple[str, Path, bool] | None, child_args: Sequence[str], silent: bool,
           pipe: bool) -> tuple[subprocess.Popen[bytes], int | None]:
    """Start the script's child (see :func:`run_script_child`); returns it and the read end of its
    pipe (``pipe``: the child says on it when its report is written)."""
    child = [target.python, *target.flags, "-m", "rlperf.instruments.child", "--report", str(report),
             "--parent", str(os.getpid())]
    child += ([] if options.cprofile else ["--no-cprofile"]) + (["--torch"] if options.torch else [])
    child += ["--cprofile-whole", repr(options.cprofile_whole)]
    read_end, write_end = os.pipe() if pipe else (None, None)
    child += ["--done-fd", str(write_end)] if write_end is not None else []
    child += [*child_args, "--", *target.target]
    root = str(Path(__file__).resolve().parents[2])  # so that the script's python imports this rlperf
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if pyspy is not None:
        child = pyspy_command(pyspy[0], pyspy[1], child, native=pyspy[2])
        env.update(pyspy_env())
    output = (subprocess.PIPE if pyspy is not None else subprocess.DEVNULL if silent else sys.stderr if quiet_stdout
              else None)  # py-spy talks on stdout: its lines are kept back
    try:
        proc = subprocess.Popen(child, env=env, stdout=output, stderr=subprocess.DEVNULL if silent else None,
                                process_group=0, pass_fds=() if write_end is None else (write_end,))
    except BaseException:
        if read_end is not None:
            os.close(read_end)
        raise
    finally:
        if write_end is not None:
            os.close(write_end)  # the child's now: its end (or its death) ends the pipe
    return proc, read_end


@dataclass
class _Early:
    """A script's child started before the command line was parsed (:func:`start_early`)."""

    key: tuple[Any, ...]
    scratch: tempfile.TemporaryDirectory[str]
    proc: subprocess.Popen[bytes]
    read_end: int | None


_EARLY: _Early | None = None
_EARLY_FLAGS = {"--json", "--quiet", "-q", "--plot", "--no-plot"}


def start_early(args: Sequence[str]) -> None:
    """``rlperf profile [--out DIR] [--json] [--quiet] [--no-plot] -- python SCRIPT [ARGS]`` (the
    command's arguments, ``args``): start the script's child now, before the command line is imported
    and parsed (Typer's imports and its parse take a tenth of a second), with what the command will
    start it with, after the same checks (a script that is not there, an ``--out`` that cannot be
    written: nothing starts, and the command says why). Any other option, and the command starts the
    child itself. The command adopts this one (:func:`_profile_into`); one it did not adopt is stopped
    (:func:`discard_early`)."""
    global _EARLY
    if "--" not in args:
        return
    cut = list(args).index("--")
    options, command = list(args[:cut]), list(args[cut + 1:])
    out, json_ = "runs", False
    while options:
        flag = options.pop(0)
        if flag == "--out" and options and not options[0].startswith("-"):
            out = options.pop(0)
        elif flag.startswith("--out=") and len(flag) > len("--out="):
            out = flag[len("--out="):]
        elif flag in _EARLY_FLAGS:
            json_ = json_ or flag == "--json"
        else:
            return
    try:
        target = parse_script_command(command)
        check_out(Path(out))
    except (RlperfError, OSError):
        return
    scratch = tempfile.TemporaryDirectory(prefix="rlperf-script-")
    try:
        proc, read_end = _spawn(target, Path(scratch.name) / "child.json", ProfileOptions(), json_, None, (), False,
                                pipe=True)
    except OSError:  # the command starts it again, and says why it cannot
        scratch.cleanup()
        return
    except BaseException:
        scratch.cleanup()
        raise
    _EARLY = _Early(_early_key(target, ProfileOptions(), json_, None), scratch, proc, read_end)


def _early_key(target: ScriptTarget, options: ProfileOptions, quiet_stdout: bool, pyspy_path: str | None) -> tuple:
    return (target.python, tuple(target.flags), tuple(target.target), options.cprofile, options.torch,
            options.cprofile_whole, quiet_stdout, pyspy_path)


def _adopt_early(target: ScriptTarget, options: ProfileOptions, quiet_stdout: bool,
                 pyspy_path: str | None) -> _Early | None:
    """The child :func:`start_early` started, when it is this command's."""
    global _EARLY
    early = _EARLY
    if early is None or early.key != _early_key(target, options, quiet_stdout, pyspy_path):
        return None
    _EARLY = None
    return early


def discard_early() -> None:
    """Stop a child :func:`start_early` started that no command adopted (the command failed before
    it ran the script): as a second stop signal would, then for good after :data:`GRACE_S`."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is None:
        return
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(early.proc.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            early.proc.wait(timeout=GRACE_S)
            break
    if early.read_end is not None:
        os.close(early.read_end)
    early.scratch.cleanup()


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
                   quiet_stdout: bool = False, command: list[str] | None = None,
                   meanwhile: Callable[[], None] | None = None,
                   ready: Callable[[dict[str, Any]], None] | None = None) -> ScriptRun:
    """Profile a Python script (``rlperf profile -- python SCRIPT``): run it in a child process under
    cProfile (and py-spy, torch.profiler), then write a run directory with ``profile.prof``, the
    py-spy files and a ``kind: "external"`` record holding the script's phase timings (when it used
    :class:`rlperf.PhaseTimer`), its top functions with its own code marked, and the advisor's
    findings on them. The exit code is the script's: 128 + N when it was killed by signal N, 130 / 143
    when a SIGINT / SIGTERM to rlperf stopped it. However the script ends, its run directory holds a
    record saying so; a child that could not start leaves nothing.

    ``meanwhile`` is called once the script runs; ``ready`` with the record, built while the
    script's process is still ending (torch's teardown alone takes half a second) from the report
    its child wrote once the script was over: what the caller draws from it is off the critical
    path. When the process then ends otherwise than its report said (a signal, py-spy's files), the
    record is built again, and the returned one is not the one ``ready`` saw."""
    from rlperf.run.files import make_run_dir

    options = options or ProfileOptions()
    options.check()
    out = Path(out)
    check_out(out)
    pyspy_path = find_pyspy() if py_spy else None
    skipped = f"not found on PATH ({PYSPY_HINT})" if py_spy and pyspy_path is None else None
    run_dir = make_run_dir(out, name or target.name, prefix="profile")
    try:
        record = _profile_into(run_dir, target, options, quiet_stdout, command, pyspy_path, native, skipped, meanwhile,
                               ready)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # made here, and holds no record: nothing half-written stays
        raise
    write_json_atomic(run_dir / "run.json", record)
    return ScriptRun(run_dir, record, record["exit_code"])


def _profile_into(run_dir: Path, target: ScriptTarget, options: ProfileOptions, quiet_stdout: bool,
                  command: list[str] | None, pyspy_path: str | None, native: bool,
                  skipped: str | None, meanwhile: Callable[[], None] | None = None,
                  ready: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the script's child and build its record in ``run_dir`` (the files the run left, the advisor's
    findings): once its report is written (speculatively: the end its report says), again after the
    process ended if it ended otherwise."""
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

    def prepare() -> None:  # the analysis's imports, on a free CPU while the script runs
        import_meanwhile("rlperf.instruments.foreign")
        if meanwhile is not None:
            meanwhile()

    built: dict[str, Any] = {}

    def reported() -> None:  # the report is written; the script's process may take a while yet to end
        with contextlib.suppress(Exception):  # built again below, where an error belongs
            said = json.loads(report.read_text(encoding="utf-8"))
            if said["status"] == "running" or pyspy_path is not None:  # py-spy's files come at the end
                return
            built["end"] = ChildEnd(int(said["exit_code"]) & 0xFF, None, [])
            built["record"] = _build_record(report, built["end"], run_dir, target, options, started, command)
            if ready is not None:
                ready(built["record"])

    early = _adopt_early(target, options, quiet_stdout, pyspy_path)
    with early.scratch if early is not None else tempfile.TemporaryDirectory(prefix="rlperf-script-") as scratch:
        report = Path(scratch) / "child.json"
        recording = Path(scratch) / "pyspy.speedscope.json"
        end = run_script_child(target, report, options, quiet_stdout,
                               (pyspy_path, recording, native) if pyspy_path else None, started=prepare,
                               reported=reported, spawned=(early.proc, early.read_end) if early else None)
        if not report.is_file():
            raise RlperfError(f"{target.command[0]} could not start the profiled child (exit code "
                              f"{_exit_code(end.returncode)}; is rlperf importable by it?)",
                              hint="run with the python rlperf is installed for")
        if built.get("end") == end:  # ended as its report said: the record stands
            return built["record"]
        return _build_record(report, end, run_dir, target, options, started, command, skipped,
                             recording=recording if pyspy_path else None, native=native)


def _build_record(report: Path, end: ChildEnd, run_dir: Path, target: ScriptTarget, options: ProfileOptions,
                  started: str, command: list[str] | None, skipped: str | None = None,
                  recording: Path | None = None, native: bool = False) -> dict[str, Any]:
    """The record from the child's report and how its process ended (the files it left moved into
    ``run_dir``; py-spy's ``recording`` attached): the script's profile and the advisor's findings."""
    from rlperf.instruments.foreign import ScriptProfile, advise_script, alone_factor, script_steps

    child = _child_end(json.loads(report.read_text(encoding="utf-8")), end)
    prof, trace = report.with_suffix(".prof"), report.with_suffix(".trace.json")
    if prof.is_file():
        shutil.move(str(prof), run_dir / "profile.prof")
    if trace.is_file():
        shutil.move(str(trace), run_dir / "trace.json")
    record = _script_record(child, target, run_dir, started, command)
    calls = _script_calls(run_dir / "profile.prof", target) if (run_dir / "profile.prof").is_file() else None
    section = record["profile"] = _script_profile_section(child, record, options, calls, run_dir)
    if recording is not None:
        if recording.is_file() and recording.stat().st_size > 0:
            attach_pyspy(record, recording, native)
        else:
            skipped = pyspy_failure(end.spy_lines)
    if skipped:
        section["py_spy"] = {"skipped": skipped}
    steps = script_steps(record, calls) or (loop_iterations(ScriptProfile(calls)) if calls is not None else None)
    record["script"]["steps"] = {"count": steps[0], "basis": steps[1]} if steps else None
    section["evidence"] = child.get("evidence") or {}  # the forward hooks' figures and cProfile's cost per call
    findings = advise_script(record, calls, child["gc"], steps, section["evidence"])
    # Savings are shares of the script's own work: its profiled time without imports.
    worked = (ScriptProfile(calls).total * alone_factor(record, calls, section["evidence"]) if calls is not None
              else child["wall_s"])
    section["advisor"] = {"findings": [f.as_dict() for f in findings],
                          "none": None if findings else "no finding: none of the checklist's bottlenecks showed in "
                          "this script's profile",
                          "measured_phase_s": worked}
    record["files"].update({f"profile_{k}": v for k, v in section["artifacts"].items()})
    return record


def import_meanwhile(*modules: str) -> None:
    """Import ``modules`` in a thread while the script runs, where a second CPU is free for it: rlperf
    only waits then, and the script pays nothing for what rlperf reads after it."""
    def load() -> None:
        for module in modules:
            with contextlib.suppress(Exception):  # imported again where it is needed, and fails there
                importlib.import_module(module)

    if effective_cpus() >= 2:
        threading.Thread(target=load, name="rlperf-import-meanwhile", daemon=True).start()


LOOP_COUNT_SPREAD = 0.1
"""How far apart the call counts of one loop's body may be and still count as the same iteration
count: in a table scaled from cProfile's windows (rlperf.instruments.windows) they are estimates, a
few percent apart, never equal."""


def loop_iterations(p: ScriptProfile) -> tuple[int, str] | None:
    """The iterations of the script's loop, where nothing counts steps (no timer, an env written as
    functions without a ``step`` method): in your function that holds the loop (else one that runs
    once and holds most of the script's time), the call count most of its callees share, within
    :data:`LOOP_COUNT_SPREAD` (a loop body calls its parts once per iteration), the larger on a tie.
    The callees its source calls by name count first: a table stitched from cProfile's windows also
    gives a function calls made deep below it (torch.compile's tracing, a lazy import's work), a
    few each, that would outnumber the loop's own. None when no two callees share a count."""
    from rlperf.instruments.foreign import callee_name

    holder = p.loop_holder()  # the function with the loop (main under <module>), then the others
    for fn in sorted((k for k in p.raw if p.is_user(k) and p.calls(k) == 1),
                     key=lambda k: (k == holder, p.cumtime(k)), reverse=True):
        if p.cumtime(fn) < 0.5 * p.total:
            break
        callees = [(k, n) for k, n, _ in p.callees.get(fn, []) if n >= 2]
        named = sorted(n for k, n in callees if p.sources.calls_by_name(fn, callee_name(k)))
        # First the calls the loop makes on every iteration (not in an if: a print every 2,000 steps
        # with its time() and clear() outnumbered queue.get() and buffer.add(): "52 steps" of 50,706)
        body = p.sources.loop_body_calls(fn)
        every = sorted(n for k, n in callees if callee_name(k) in body)
        shared = None
        for counts in (every, named, sorted(n for _, n in callees)):
            shared = max(((sum(1 for n in counts if c <= n <= c * (1 + LOOP_COUNT_SPREAD)), c) for c in counts),
                         default=None)
            if shared is not None and shared[0] >= 2:
                break
        if shared is None or shared[0] < 2:
            continue
        members = [n for n in counts if shared[1] <= n <= shared[1] * (1 + LOOP_COUNT_SPREAD)]
        count = int(statistics.median(members))
        each = "" if min(members) == max(members) else "about "
        return count, (f"iterations of the loop in {p.where(fn)} ({len(members)} functions it calls ran {each}{count:,} "
                       "times each)")
    return None


def _exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _child_end(child: dict[str, Any], end: ChildEnd) -> dict[str, Any]:
    """The child's report with how it really ended. A report still ``running`` is from a child that
    ended without a word (SIGKILL, a segfault, a C-level exit): its exit code and signal are the
    process's own, and the phase timings are its last snapshot. A stop signal to rlperf makes the
    exit code 128 + that signal (130, 143), unless the script failed with a code of its own. A process
    that ended otherwise than its report said (an atexit handler's ``os._exit(3)``, a crash in the
    interpreter's teardown) exits with the process's own code, and the record says so."""
    child = dict(child)
    killed_by = signal_name(-end.returncode) if end.returncode < 0 else None
    how = f"killed by {killed_by}" if killed_by else f"ended with exit code {end.returncode}"
    if child["status"] == "running":
        child["exit_code"] = _exit_code(end.returncode)
        child["status"] = ("interrupted" if end.signum is not None else
                           "completed" if end.returncode == 0 else "failed")
        child["ended"] = how + " before it could write its profile; " + (
            "the phase timings are its last snapshot" if child.get("timers") else
            "its last snapshot held no phase timer")
        child["from_snapshot"] = True
    elif end.signum is None and end.returncode != int(child["exit_code"]) & 0xFF:
        said = child["exit_code"]
        child["exit_code"] = _exit_code(end.returncode)
        child["status"] = "completed" if end.returncode == 0 else "failed"
        child["ended"] = (f"{how} after its profile was written (the script had ended with exit code {said}; "
                          "an atexit handler or the interpreter's teardown)")
    if end.signum is not None and (child["status"] != "failed" or killed_by):
        child["exit_code"], child["status"] = 128 + end.signum, "interrupted"
    child["signal"] = killed_by
    return child


def _script_record(child: dict[str, Any], target: ScriptTarget, run_dir: Path, started: str,
                   command: list[str] | None) -> dict[str, Any]:
    """The record of a profiled script: its phase timer's record when it used one, else the run's outline."""
    timers = child["timers"]
    main_timer = max(timers, key=lambda t: t["totals"]["vector_steps"]) if timers else None
    record: dict[str, Any] = dict(main_timer) if main_timer else {
        "schema": 1, "kind": "external", "config": None, "phases": {},
        "totals": {"wall_s": child["wall_s"]}, "memory": {},
    }
    process = record.pop("process", None)  # the timer of a process the script started (rlperf.external)
    record.update(name=run_dir.name, run_dir=str(run_dir), status=child["status"], exit_code=child["exit_code"],
                  command=list(command or sys.argv), started_at=started, system=child["system"],
                  script={"command": target.command, "argv": child["argv"], "cwd": os.getcwd(), "wall_s": child["wall_s"],
                          "phase_timers": len(timers), "phase_timer_process": process, "signal": child["signal"],
                          "ended": child.get("ended"), "from_snapshot": bool(child.get("from_snapshot"))},
                  files={"record": "run.json"})
    return record


def _script_profile_section(child: dict[str, Any], record: dict[str, Any], options: ProfileOptions,
                            calls: CallStats | None, run_dir: Path) -> dict[str, Any]:
    section: dict[str, Any] = {
        "options": {"top": options.top, "sort": options.sort, "cprofile": options.cprofile, "torch": options.torch},
        "timing_mode": (record.get("timing") or {}).get("mode"),
        "artifacts": {},
        "gc": child["gc"],
        "load": {"loadavg_1m": child["loadavg_1m"], "cpus": effective_cpus()},
        "cpu_wait": child.get("cpu_wait") or {},  # what the script's thread waited for a CPU (the advisor's margin)
        "threads": child.get("threads") or {},  # the thread pools it ended with, and the threads it kept busy
        "own": "your code",
    }
    if calls is not None:
        section["cprofile"] = {"file": "profile.prof", "sort": options.sort, "total_calls": calls.total_calls,
                               "primitive_calls": calls.primitive_calls, "total_s": calls.total_s,
                               "top": [row.as_dict() for row in calls.top(options.top, options.sort, skip=_launcher)],
                               "windows": child.get("cprofile")}
        section["artifacts"]["cprofile"] = "profile.prof"
    if "torch" in child:
        section["torch"] = child["torch"]
        if (run_dir / "trace.json").is_file():
            section["torch"]["file"] = "trace.json"
            section["artifacts"]["torch_trace"] = "trace.json"
    return section


def _launcher(label: str) -> bool:
    """Frames that are not the script's work: the child's and runpy's and exec above all of it, the
    forward hooks' wrapper of ``nn.Module.__call__`` (the module's own call is listed), and imports
    (a lazy import inside the loop is start-up, counted apart by the advisor too)."""
    label = label.replace(os.sep, "/")
    return (label.startswith(("<frozen runpy>", "<frozen importlib")) or label == "<built-in method builtins.exec>"
            or "rlperf/instruments/child.py:" in label or "rlperf/instruments/evidence.py:" in label)


def _script_calls(prof: Path, target: ScriptTarget) -> CallStats:
    """The script's cProfile table (``prof``), your code marked."""
    import pstats

    script_dir = Path(target.target[0]).resolve().parent if target.target[0] != "-m" else Path.cwd()
    return CallStats(pstats.Stats(str(prof)), own=user_code([script_dir, Path.cwd()]))
