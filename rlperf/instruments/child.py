"""The process ``rlperf profile -- python SCRIPT [ARGS]`` starts: your script under cProfile.

    python -m rlperf.instruments.child --report FILE [--no-cprofile] [--torch] -- (SCRIPT | -m MODULE) [ARGS...]

It runs the script as ``python SCRIPT ARGS`` would (``__main__``, ``sys.argv``, the script's folder
first on ``sys.path``; ``-m`` as ``python -m`` does, with the working directory first), under
cProfile and the GC monitor (the installed packages the script imports at its top are imported
first, outside the profile: import time is not the loop's), and when it ends -- normally, by
``sys.exit``, an exception or Ctrl-C -- writes FILE (what the parent reads: the exit code, the GC
figures, the thread settings, the phase timers the script created with :class:`rlperf.PhaseTimer`)
and ``FILE.prof`` beside it, then exits with the script's code. The script's output is its own:
stdout and stderr are inherited.

With ``--torch``, torch.profiler records a window of steps counted by the script's
``timer.step_done()`` calls; a script without the phase API gets no trace (the report says so).
Nothing here imports torch unless ``--torch`` asks for it or the script imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from time import perf_counter
from typing import Any

from rlperf.instruments import evidence

TORCH_WINDOW = (10, 1, 5)
"""torch.profiler schedule over the script's steps: skip 10, warm up 1, record 5."""


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python -m rlperf.instruments.child --report FILE [options] -- SCRIPT [ARGS...]")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="rlperf.instruments.child")
    parser.add_argument("--report", required=True)
    parser.add_argument("--no-cprofile", dest="cprofile", action="store_false")
    parser.add_argument("--torch", action="store_true")
    return parser.parse_args(argv[:cut]), argv[cut + 1:]


def _prepare_target(target: list[str]) -> tuple[str, str]:
    """Set ``sys.argv`` and ``sys.path`` as ``python`` would; returns (kind, name): ("script", path) or ("module", name)."""
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]  # runpy.run_module(alter_sys=True) puts the module's path in argv[0]
        sys.path.insert(0, os.getcwd())
        return "module", target[1]
    script = target[0]
    sys.argv = [script, *target[1:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    return "script", script


class _TorchWindow:
    """torch.profiler stepped by the script's PhaseTimer.step_done() calls."""

    def __init__(self, trace: Path) -> None:
        from rlperf import external
        from rlperf.instruments.profilers import TorchProfiler, TorchWindow

        import torch

        wait, warm, active = TORCH_WINDOW
        self.profiler = TorchProfiler("cuda" if torch.cuda.is_available() else "cpu",
                                      TorchWindow(wait=wait, warmup=warm, active=active), trace)
        self.stepped: Any = None

        def on_step(timer: Any) -> None:
            if self.stepped is None:
                self.stepped = timer
            if timer is self.stepped:  # one timer drives the schedule
                self.profiler.step()

        external._on_step = on_step


def preimport(kind: str, name: str) -> list[str]:
    """Import, before profiling starts, the installed packages the script imports at its top level
    (torch, numpy, gymnasium...): their import time is not the script's loop, and under cProfile
    importing torch alone can take seconds. The script's own modules are left to the script."""
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
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.append(node.module.split(".")[0])
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


def main(argv: list[str] | None = None) -> None:
    args, target = parse(list(sys.argv[1:] if argv is None else argv))
    report = Path(args.report)
    kind, name = _prepare_target(target)
    preimported = preimport(kind, name)
    evidence.install(kind, name)
    from rlperf.instruments.profilers import CProfiler, GcMonitor

    profiler = CProfiler() if args.cprofile else None
    gc_monitor = GcMonitor()
    window = _TorchWindow(report.with_suffix(".trace.json")) if args.torch else None
    code: int = 0
    ended = "completed"
    started = perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(gc_monitor.running())
        if window is not None:
            stack.enter_context(window.profiler.running())
        if profiler is not None:
            stack.enter_context(profiler.running())
        try:
            if kind == "module":
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(name, run_name="__main__")
        except SystemExit as exc:
            code = _exit_code(exc.code)
            ended = "completed" if code == 0 else "failed"
        except KeyboardInterrupt:
            code, ended = 130, "interrupted"
            print("KeyboardInterrupt", file=sys.stderr)
        except BaseException:  # the script's own error: shown as python shows it, and the profile is kept
            traceback.print_exc()
            code, ended = 1, "failed"
    wall = perf_counter() - started
    if profiler is not None:
        profiler.dump(report.with_suffix(".prof"))
    _write_report(report, code, ended, wall, gc_monitor, window, preimported)
    sys.stdout.flush()
    sys.exit(code)


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)  # sys.exit("message"): python prints it and exits 1
    return 1


def _write_report(report: Path, code: int, ended: str, wall: float, gc_monitor: Any, window: Any,
                  preimported: list[str]) -> None:
    from rlperf.external import external_record, light_system_info, timers_in_use

    torch = sys.modules.get("torch")
    timers = timers_in_use()
    data: dict[str, Any] = {
        "exit_code": code,
        "status": ended,
        "wall_s": wall,
        "argv": sys.argv,
        "gc": gc_monitor.to_dict(),
        "system": light_system_info(timers[0].device if timers else "cpu"),
        "torch_imported": torch is not None,
        "timers": [external_record(t, status=ended) for t in timers],
        "loadavg_1m": os.getloadavg()[0],
        "preimported": preimported,
        "evidence": evidence.collect(),
    }
    if window is not None:
        if window.profiler.recorded:
            data["torch"] = window.profiler.to_dict(20)
        else:
            data["torch"] = {"recorded": False, "note": (
                "torch.profiler counts steps with timer.step_done() (rlperf.PhaseTimer); this script "
                "made none" if window.stepped is None else
                f"the script made {window.profiler.steps} steps, fewer than the window needs "
                f"(steps {window.profiler.window.first}–{window.profiler.window.last})")}
    tmp = report.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    tmp.replace(report)


if __name__ == "__main__":
    main()
