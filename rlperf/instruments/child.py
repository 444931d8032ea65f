"""The process ``rlperf profile -- python SCRIPT [ARGS]`` starts: your script under cProfile.

    python -m rlperf.instruments.child --report FILE [--no-cprofile] [--torch] [--parent PID] [--done-fd FD] [--plain]
        [--apply FIX]
        -- (SCRIPT | -m MODULE) [ARGS...]

It runs the script as ``python SCRIPT ARGS`` would (``__main__``, ``sys.argv``, the script's folder
first on ``sys.path``; ``-m`` as ``python -m`` does, with the working directory first), under
cProfile and the GC monitor (the installed packages the script imports at its top are imported
first, outside the profile: import time is not the loop's), and writes FILE: what the parent reads
(the exit code, the GC figures, the thread settings, the phase timers the script created with
:class:`rlperf.PhaseTimer`) and ``FILE.prof`` beside it. The script's output is its own: stdout
and stderr are inherited.

The script's evidence survives however it ends:

- every timer the script makes is kept (a strong reference), so a timer inside ``main()``, a class
  or a thread is still there when the script's frames are gone;
- FILE is written when the script starts (``status: "running"``) and refreshed by a thread of the
  child every :data:`SNAPSHOT_S` seconds or more, so a script killed outright
  (SIGKILL, a segfault) leaves the phase timings it had; the parent reads the exit signal itself;
- the end -- a normal return (after the script's non-daemon threads), ``sys.exit``, an exception,
  Ctrl-C, SIGTERM (the parent's second stop signal), ``os._exit`` -- writes FILE and ``FILE.prof``
  once, from the process that started the script: a fork of it writes nothing;
- when rlperf (``--parent``) is killed outright, the script and what it started are stopped as on
  SIGTERM, and nothing is written.

With ``--torch``, torch.profiler records a window of steps counted by the script's
``timer.step_done()`` calls; a script without the phase API gets no trace (the report says so).
Nothing here imports torch unless ``--torch`` asks for it or the script imports it.
"""

from __future__ import annotations

import os
import sys

# python -m put the working directory first on sys.path: a file of yours there named like a module of
# the standard library (profile.py, csv.py) would be imported for the one rlperf uses. python SCRIPT
# puts no such entry; the script's own (its folder, or the working directory for -m) is put first
# just before it starts, once rlperf has imported what it needs (see _own_modules_first).
if not sys.flags.safe_path and sys.path and sys.path[0] in (os.getcwd(), ""):
    del sys.path[0]

import argparse
import contextlib
import faulthandler
import gc
import json
import platform
import runpy
import signal
import stat
import threading
import time
import traceback
from pathlib import Path
from time import perf_counter
from typing import Any

from rlperf import script_registry
from rlperf.instruments import evidence
from rlperf.instruments.profilers import dump_table
from rlperf.instruments.windows import WHOLE_S

TORCH_WINDOW = (10, 1, 5)
"""torch.profiler schedule over the script's steps: skip 10, warm up 1, record 5."""

SNAPSHOT_S = 5.0
"""Least seconds between two snapshots of the script's timers in FILE (each costs a percentile pass
over the samples; the gap grows to 50 times the last snapshot's CPU time)."""
FIRST_SNAPSHOTS_S = 0.5
"""The gap between snapshots for the first :data:`SNAPSHOT_S` seconds of the script: a short run killed
early keeps its phases too, however long the child took to start it (seconds under load)."""


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python -m rlperf.instruments.child --report FILE [options] -- SCRIPT [ARGS...]")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="rlperf.instruments.child")
    parser.add_argument("--report", required=True)
    parser.add_argument("--no-cprofile", dest="cprofile", action="store_false")
    parser.add_argument("--torch", action="store_true")
    parser.add_argument("--cprofile-whole", type=float, default=WHOLE_S,
                        help="seconds profiled whole before cProfile runs in windows (rlperf.instruments.windows)")
    parser.add_argument("--parent", type=int, help="rlperf's pid: when it is gone, the script stops")
    parser.add_argument("--done-fd", type=int, help="a pipe to rlperf: one byte once FILE is written (the process "
                        "may take a while yet to end: rlperf reads FILE meanwhile)")
    parser.add_argument("--plain", action="store_true", help="no instruments: time the script alone (--verify)")
    parser.add_argument("--apply", action="append", default=[], metavar="FIX",
                        help="a fix of rlperf.instruments.fixes, applied before the script runs")
    return parser.parse_args(argv[:cut]), argv[cut + 1:]


def _prepare_target(target: list[str]) -> tuple[str, str, str]:
    """Set ``sys.argv`` as ``python`` would; returns (kind, name, folder): ("script", path) or ("module",
    name), and the folder ``python`` puts first on ``sys.path`` (see :func:`_own_modules_first`)."""
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]  # runpy.run_module(alter_sys=True) puts the module's path in argv[0]
        return "module", target[1], os.getcwd()
    script = target[0]
    sys.argv = [script, *target[1:]]
    return "script", script, os.path.dirname(os.path.abspath(script))


def _own_modules_first(args: argparse.Namespace) -> None:
    """Import what rlperf uses from here to the end before the script's folder is first on ``sys.path``:
    a file of the script's named like one of them (profile.py, csv.py) is the script's, not rlperf's,
    as it would be under ``python SCRIPT`` (which imports none of them)."""
    import ast  # noqa: F401  (the sources of your code, read at the end)
    import importlib.util  # noqa: F401
    import pkgutil  # noqa: F401  (runpy imports it to start the script: a pause of cProfile for nothing)

    from rlperf.instruments import profilers, sources, windows  # noqa: F401
    if args.apply:
        from rlperf.instruments import fixes  # noqa: F401


class _TorchWindow:
    """torch.profiler stepped by the script's PhaseTimer.step_done() calls."""

    def __init__(self, trace: Path) -> None:
        from rlperf.instruments.profilers import TorchProfiler, TorchWindow

        import torch

        wait, warm, active = TORCH_WINDOW
        self.profiler = TorchProfiler("cuda" if torch.cuda.is_available() else "cpu",
                                      TorchWindow(wait=wait, warmup=warm, active=active), trace)
        self.stepped: Any = None

    def on_step(self, timer: Any) -> None:
        if self.stepped is None:
            self.stepped = timer
        if timer is self.stepped:  # one timer drives the schedule
            self.profiler.step()


class _Terminated(BaseException):
    """SIGTERM while the script runs (rlperf's second stop signal): it ends like Ctrl-C, profile kept."""


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminated


def preimport(kind: str, name: str) -> list[str]:
    """Import, before profiling starts, the installed packages the script imports at its top level
    before any other statement (torch, numpy, gymnasium...): their import time is not the script's
    loop, and under cProfile importing torch alone can take seconds. The script's own modules are
    left to the script."""
    import ast
    import importlib.util

    try:
        if kind == "module":
            spec = importlib.util.find_spec(name)
            source = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
        else:
            source = Path(name).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, ImportError):
        return []
    roots = []
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
        getattr(tree.body[0], "value", None), ast.Constant) else tree.body  # the docstring
    for node in body:
        # Only the imports before the script's first other statement: that statement may set what an
        # import reads (OMP_NUM_THREADS in os.environ before numpy or torch sizes its thread pool).
        if isinstance(node, ast.Import):
            roots += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                roots.append(node.module.split(".")[0])
        else:
            break
    mine = {os.path.abspath(sys.path[0])}
    done = []
    for root in dict.fromkeys(roots):
        try:
            spec = importlib.util.find_spec(root)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec is not None else None
        if origin in (None, "built-in", "frozen") or os.path.dirname(os.path.abspath(origin)) in mine:
            continue
        try:
            __import__(root)
        except Exception:  # the script will raise it itself, where it belongs
            continue
        done.append(root)
    return done


class _Session:
    """What the child gathers while the script runs, and FILE written from it (see the module docstring)."""

    def __init__(self, report: Path) -> None:
        from rlperf.instruments.profilers import GcMonitor

        self.report = report
        self.preimported: list[str] = []
        self.pid = os.getpid()  # a fork of the script is not it: it writes nothing
        self.started = perf_counter()
        self.lock = threading.Lock()
        self.finished = False
        self.orphaned = False  # rlperf is gone: nobody reads FILE, its folder may be gone too
        self.profiler: Any = None
        self.gc_monitor = GcMonitor()
        self.loop_started: float | None = None
        self.loop_s: float | None = None
        self.plain = False  # no instruments: the script alone (--verify's runs)
        self.window: _TorchWindow | None = None
        self.timers: list[Any] = []
        self.roots: list[str] = []  # where your code lives
        self.done_fd: int | None = None  # rlperf's pipe: a byte once FILE is written
        self.next_snapshot = self.started + FIRST_SNAPSHOTS_S
        self.subprocess_timers: Path | None = None
        self.cpu_wait = evidence.CpuWait()  # the script's thread: what it lost to other processes
        self.census: evidence.ThreadCensus | None = None  # the threads its processes kept busy
        # The timers the script makes (rlperf.PhaseTimer imports numpy: not before the script does, so the
        # script's own OMP_NUM_THREADS and the like still size numpy's pools)
        self.timers = script_registry.open_registry(self.pid, self.on_step).timers
        self.subprocess_timers = report.parent / "subprocess-timers"  # the timers of processes the script starts
        with contextlib.suppress(OSError):
            self.subprocess_timers.mkdir(exist_ok=True)
            os.environ[script_registry.SUBPROCESS_TIMERS_ENV] = str(self.subprocess_timers)

    def forked(self) -> None:
        """In a process the script forks: its instruments off (they measure the script's process)."""
        if os.getpid() == self.pid:
            return
        # A lock another thread held at the fork (a snapshot being written) stays held here for good:
        # the fork's os._exit would wait on ours, its timers on theirs.
        self.lock = threading.Lock()
        for timer in self.timers:
            if hasattr(timer, "_lock"):
                timer._lock = threading.Lock()
        if self.profiler is not None:
            self.profiler.forked()
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self.gc_monitor._callback)
        with contextlib.suppress(ValueError):  # SIGTERM ends a fork as python's default would (a Pool's
            if signal.getsignal(signal.SIGTERM) is _terminate:  # terminate() ends its workers so), not
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # with rlperf's stop and a traceback
        if not self.plain:
            evidence.sample_worker()

    def on_step(self, timer: Any) -> None:
        """After each of the script's ``step_done()`` calls: the torch window."""
        if self.window is not None:
            self.window.on_step(timer)

    def snapshots(self) -> None:
        """Write FILE now and then while the script runs, from a thread of its own: cProfile watches
        the script's thread only, so the snapshots stay out of the profile without pausing it (a
        profiler disabled and enabled again mid-loop loses the callers of every later call)."""

        def loop() -> None:
            while True:
                time.sleep(max(0.0, self.next_snapshot - perf_counter()))
                if self.finished or os.getpid() != self.pid:
                    return
                cpu = time.thread_time()  # its cost to the script: on a busy machine the wall time is mostly waiting
                with self.lock:
                    if self.finished:
                        return
                    with contextlib.suppress(Exception):  # best effort: the script's thread may be changing a timer
                        self.write(None, "running")
                now = perf_counter()
                early = self.loop_started is None or now - self.loop_started < SNAPSHOT_S
                self.next_snapshot = now + max(FIRST_SNAPSHOTS_S if early else SNAPSHOT_S, 50 * (time.thread_time() - cpu))

        threading.Thread(target=loop, name="rlperf-snapshots", daemon=True).start()

    def finish(self, code: int, ended: str) -> None:
        """The end, however it came: ``profile.prof`` and FILE, once, from the script's own process."""
        if os.getpid() != self.pid:  # a fork's os._exit: nothing to write, and not a lock to wait on
            evidence.worker_ends()  # but its samples (multiprocessing drops the finalizers a fork had)
            return
        with self.lock:
            if self.finished or self.orphaned:
                return
            self.finished = True
            with contextlib.suppress(ValueError):  # a signal now would cut the files short (rlperf ends with SIGKILL)
                for signum in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(signum, signal.SIG_IGN)
            if self.profiler is not None:
                self.profiler.stop()
            data = self.gather(code, ended)
            if self.profiler is not None:
                cost = float(((data.get("evidence") or {}).get("profiler_cost") or {}).get("per_call_s") or 0.0)
                data["cprofile"] = self.profiler.summary(cost)
                by_name = _calls_by_name(self.roots) if self.profiler.stitched else None  # no parsing else
                dump_table(self.profiler.table(cost, by_name), self.report.with_suffix(".prof"))
            _write_json(self.report, data)
            if self.done_fd is not None:
                with contextlib.suppress(OSError):  # rlperf gone: nobody to tell
                    os.write(self.done_fd, b"1")
                    os.close(self.done_fd)
                self.done_fd = None

    def watch_parent(self, parent: int) -> None:
        """When rlperf is gone (killed outright: it could pass nothing on), stop the script and what it
        started -- the child's process group -- as on SIGTERM, rather than run on for nobody."""
        from rlperf.run.files import pid_alive

        def watch() -> None:
            while pid_alive(parent):
                time.sleep(0.5)
            self.orphaned = True
            os.killpg(os.getpgrp(), signal.SIGTERM)

        threading.Thread(target=watch, name="rlperf-parent-watch", daemon=True).start()

    def write(self, code: int | None, ended: str) -> None:
        """FILE, atomically: the exit code (None while running), the status and what was gathered."""
        _write_json(self.report, self.gather(code, ended))

    def gather(self, code: int | None, ended: str) -> dict[str, Any]:
        """What FILE holds: the exit code (None while running), the status and what was gathered."""
        torch = sys.modules.get("torch")
        external = sys.modules.get("rlperf.external")  # imported by the script's first timer
        if external is None and ended != "running":
            with contextlib.suppress(ImportError):  # the script is over: what it reads may be imported now
                from rlperf import external
        timers = external.timers_in_use() if external is not None else []
        wall = perf_counter() - self.started
        gc = self.gc_monitor.to_dict()
        if not self.gc_monitor.wall_s:  # still running (a snapshot, os._exit): the loop so far
            loop = perf_counter() - self.loop_started if self.loop_started is not None else 0.0
            gc.update(loop_wall_s=loop, share_of_loop=self.gc_monitor.total_s / loop if loop > 0 else 0.0)
        data: dict[str, Any] = {
            "exit_code": code,
            "status": ended,
            "wall_s": wall,
            "argv": sys.argv,
            "gc": gc,
            "system": (external.light_system_info(timers[0].device if timers else "cpu") if external is not None
                       else {"python": platform.python_version(), "platform": platform.platform(), "device": "cpu"}),
            "torch_imported": torch is not None,
            "timers": ([external.external_record(t, status=ended) for t in timers] if external is not None else [])
            + (external.subprocess_timers(self.subprocess_timers)
               if external is not None and self.subprocess_timers is not None and ended != "running" else []),
            "loadavg_1m": os.getloadavg()[0],
            "preimported": self.preimported,
        }
        if ended != "running" and not self.plain:  # collecting removes the hooks and runs micro-benchmarks: at the end
            data["cpu_wait"] = self.cpu_wait.to_dict()  # before the micro-benchmarks: the script's own
            if self.census is not None:
                self.census.stop()
                data["threads"] = evidence.thread_pools() | {"census": self.census.to_dict()}
            data["evidence"] = evidence.collect()
        if self.loop_s is not None:
            data["loop_s"] = self.loop_s  # the script from its first line to its end (what --verify times)
        window = self.window
        if window is not None:
            if window.profiler.recorded:
                data["torch"] = window.profiler.to_dict(20)
            else:
                data["torch"] = {"recorded": False, "note": (
                    "torch.profiler counts steps with timer.step_done() (rlperf.PhaseTimer); this script "
                    "made none" if window.stepped is None else
                    f"the script made {window.profiler.steps} steps, fewer than the window needs "
                    f"(steps {window.profiler.window.first}–{window.profiler.window.last})")}
        return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    tmp.replace(path)


def _calls_by_name(roots: list[str]) -> Any:
    """Whether a frame is of your code and calls a function by a name (its source says so; any name
    for ""): the windows' calls without a caller go to it (rlperf.instruments.windows)."""
    from rlperf.instruments.sources import Sources
    from rlperf.instruments.profilers import user_code

    own, sources = user_code(roots), Sources()
    return lambda key, name: own(key[0]) and (not name or sources.calls_by_name(key, name))


def main(argv: list[str] | None = None) -> None:
    args, target = parse(list(sys.argv[1:] if argv is None else argv))
    kind, name, folder = _prepare_target(target)
    session = _Session(Path(args.report))
    if args.done_fd is not None:
        with contextlib.suppress(OSError):  # not passed down to us (a wrapper closed it): rlperf waits for the exit
            if stat.S_ISFIFO(os.fstat(args.done_fd).st_mode):  # rlperf's pipe, not a file that took its number
                os.set_inheritable(args.done_fd, False)  # the script's own subprocesses do not hold it
                session.done_fd = args.done_fd
    session.write(None, "running")  # the script starts: from here on how it exits is its own
    session.snapshots()
    if args.parent is not None:
        session.watch_parent(args.parent)
    session.window = _TorchWindow(session.report.with_suffix(".trace.json")) if args.torch else None  # imports torch
    _own_modules_first(args)
    sys.path.insert(0, folder)
    session.preimported = preimport(kind, name)
    if args.apply:
        from rlperf.instruments.fixes import apply

        apply(args.apply)
    session.plain = args.plain
    if not args.plain:
        evidence.install(kind, name)
        evidence.sample_lines(kind, name, session.report.parent / "worker-samples")
        session.census = evidence.ThreadCensus(evidence.usable_cpus())
        session.census.start()
    from rlperf.instruments.windows import WindowedProfiler

    session.roots = evidence.script_roots(kind, name)
    if args.cprofile and not args.plain:
        from rlperf.instruments.profilers import user_code

        session.profiler = WindowedProfiler(whole_s=args.cprofile_whole, own=user_code(session.roots))
    os.register_at_fork(after_in_child=session.forked)
    faulthandler.enable()  # a segfault shows where it happened, as python -X faulthandler does
    exit_now = os._exit

    def _exit(status: int) -> None:  # os._exit skips every finally: the profile is written first
        session.finish(status, "completed" if status == 0 else "failed")
        exit_now(status)

    os._exit = _exit  # type: ignore[assignment]
    signal.signal(signal.SIGTERM, _terminate)
    with contextlib.ExitStack() as stack:
        if not args.plain:
            stack.enter_context(session.gc_monitor.running())
        if session.window is not None:
            stack.enter_context(session.window.profiler.running())
        if session.profiler is not None:
            stack.enter_context(session.profiler.running())
        session.loop_started = perf_counter()
        session.cpu_wait.start()
        code, ended = _run(kind, name, session.pid)
        session.loop_s = perf_counter() - session.loop_started
    session.finish(code, ended)
    with contextlib.suppress(ValueError, OSError):  # the script may have closed stdout (python -m json.tool does)
        sys.stdout.flush()
    sys.exit(code)


def _run(kind: str, name: str, pid: int) -> tuple[int, str]:
    """Run the script as python would, and wait for its non-daemon threads (and, in the script's own
    process ``pid``, not a fork of it, its multiprocessing children) as python does at exit; returns
    its exit code and status (completed, failed, interrupted)."""
    try:
        if kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        if "multiprocessing" in sys.modules and os.getpid() == pid:  # python joins them at exit too
            for process in sys.modules["multiprocessing"].active_children():  # (multiprocessing's atexit):
                if not process.daemon:  # their timers are written by then
                    process.join()
    except SystemExit as exc:
        code = _exit_code(exc.code)
        return code, "completed" if code == 0 else "failed"
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        return 130, "interrupted"
    except _Terminated:
        print("Terminated", file=sys.stderr)
        return 143, "interrupted"
    except BaseException:  # the script's own error: shown as python shows it, and the profile is kept
        traceback.print_exc()
        return 1, "failed"
    return 0, "completed"


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)  # sys.exit("message"): python prints it and exits 1
    return 1


if __name__ == "__main__":
    main()
