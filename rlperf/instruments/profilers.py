"""The instruments ``rlperf profile`` wraps a run in, and their tables.

- :class:`CProfiler` -- ``cProfile`` around the training loop; top-N functions, ``profile.prof``.
- :class:`CallStats` -- the cProfile entries indexed by function, for the advisor's rules.
- :class:`GcMonitor` -- counts garbage collections and the time spent in them (``gc.callbacks``).
- :class:`TorchProfiler` -- ``torch.profiler`` on a wait/warmup/active schedule of vector steps,
  top ops by self time, a Chrome/Perfetto ``trace.json`` with the ``phase:<name>`` ranges.
- py-spy: :func:`find_pyspy`, :func:`pyspy_command`, and :func:`speedscope_to_svg`, which turns
  the one speedscope recording into a flamegraph SVG (py-spy writes one format per run).

Everything here is measurement plumbing; what to *do* about the numbers is :mod:`rlperf.instruments.advisor`.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import html
import json
import math
import os
import pstats
import re
import shutil
import sys
import sysconfig
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter, thread_time
from typing import Any


from rlperf.errors import RlperfError
from rlperf.instruments.windows import WHOLE_S

SORT_KEYS = ("cumtime", "tottime", "ncalls")

_RLPERF_DIR = str(Path(__file__).resolve().parent.parent)
_SITE_DIRS = sorted(
    {p for p in (sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")) if p}, key=len, reverse=True
)
_STDLIB_DIR = sysconfig.get_paths().get("stdlib", "")


def check_sort(sort: str) -> str:
    """The ``--sort`` key, or a one-line error naming the allowed ones."""
    key = sort.strip().lower()
    if key not in SORT_KEYS:
        raise RlperfError(f"unknown --sort key {sort!r}", hint=f"use one of {', '.join(SORT_KEYS)}")
    return key


def short_path(file: str) -> str:
    """``rlperf/dqn.py``, ``torch/nn/modules/module.py``, ``contextlib.py``: what a reader needs."""
    if file.startswith(_RLPERF_DIR):
        return "rlperf" + file[len(_RLPERF_DIR) :]
    for site in _SITE_DIRS:
        if file.startswith(site + os.sep):
            return file[len(site) + 1 :]
    if _STDLIB_DIR and file.startswith(_STDLIB_DIR + os.sep):
        return file[len(_STDLIB_DIR) + 1 :]
    cwd = os.getcwd() + os.sep
    return file[len(cwd):] if file.startswith(cwd) else file


def is_own(file: str) -> bool:
    """Whether a source file is part of rlperf itself."""
    return file.startswith(_RLPERF_DIR)


def user_code(roots: Sequence[str | Path]) -> Callable[[str], bool]:
    """A test for "your code" in a profile of your script: a file under one of ``roots`` (the
    script's folder, the working directory) that is not an installed package (a virtualenv inside
    the project), the standard library or rlperf."""
    folders = [str(Path(r).resolve()) + os.sep for r in roots]
    installed = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

    known: dict[str, bool] = {}  # asked once per file: the forward hooks ask at every module call

    def own(file: str) -> bool:
        found = known.get(file)
        if found is None:
            found = known[file] = _own(file)
        return found

    def _own(file: str) -> bool:
        if not file or file.startswith(("~", "<")) or is_own(file) or any(p in file for p in installed):
            return False
        path = str(Path(file).resolve()) if not os.path.isabs(file) else file
        return any(path.startswith(f) for f in folders)

    return own


@dataclass
class ProfileOptions:
    """What to wrap the run in (the command's flags)."""

    top: int = 20
    sort: str = "cumtime"
    cprofile: bool = True
    # a script's seconds profiled whole before cProfile runs in windows (rlperf.instruments.windows)
    cprofile_whole: float = WHOLE_S
    torch: bool = False
    overhead: bool = True  # replay the first steps without instruments to measure their cost
    microbench: bool = True  # time each slow form the run has against its fast form (the advisor's savings)
    # The run the compare lines repeat (default: the default config): an rlperf.instruments.advisor.VerifyBase,
    # typed loosely because the advisor imports this module.
    verify: Any = None

    def check(self) -> None:
        """Refuse, with one line, an option that cannot apply."""
        if self.top < 1:
            raise RlperfError(f"--top must be at least 1, got {self.top}")
        self.sort = check_sort(self.sort)
        if not self.cprofile_whole >= 0:  # NaN too
            raise RlperfError(f"--cprofile-whole must be 0 or more seconds, got {self.cprofile_whole}")


def check_out(out: Path) -> None:
    """Refuse an unusable --out before starting a child process (the in-process run checks it itself)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RlperfError(f"cannot create output directory {out}: {e.strerror or e}", hint="pass a writable --out") from None


# -- cProfile ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionRow:
    """One function in a cProfile table."""

    function: str  # "rlperf/dqn.py:212(run_loop)" or "{method 'item' of ...}"
    ncalls: int
    primitive_calls: int
    tottime: float
    cumtime: float
    own: bool  # defined in rlperf (or, profiling a script, in the script's own files)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(key: tuple[str, int, str]) -> str:
    file, line, name = key
    if file == "~" and line == 0:
        return name  # a builtin: "<method 'item' of 'torch._C.TensorBase' objects>"
    return f"{short_path(file)}:{line}({name})"


class CallStats:
    """cProfile entries by function, summed over every definition that matches.

    ``calls.get("_push_one", "rlperf/buffer.py")`` -> (ncalls, tottime, cumtime). Builtins are
    matched by a substring of their name: ``calls.get("'item' of", builtin=True)``.
    """

    def __init__(self, stats: pstats.Stats, own: Callable[[str], bool] = is_own) -> None:
        self._raw: dict[tuple[str, int, str], tuple] = stats.stats  # type: ignore[attr-defined]
        self.own = own  # which files the tables mark: rlperf's, or the profiled script's
        self.total_calls = int(getattr(stats, "total_calls", 0))
        self.primitive_calls = int(getattr(stats, "prim_calls", 0))
        self.total_s = float(getattr(stats, "total_tt", 0.0))

    @property
    def entries(self) -> Mapping[tuple[str, int, str], tuple]:
        """The raw cProfile table: (file, line, function) -> (primitive calls, calls, tottime, cumtime, callers)."""
        return self._raw

    def get(self, name: str, file: str | None = None, builtin: bool = False) -> tuple[int, float, float]:
        """(calls, own seconds, cumulative seconds) of the functions called ``name`` in ``file``.

        Cumulative seconds of a recursive function count its outermost calls only (as cProfile does).
        """
        calls, tot, cum = 0, 0.0, 0.0
        for (f, _line, func), (_cc, nc, tt, ct, _callers) in self._raw.items():
            if builtin:
                hit = f == "~" and name in func
            else:
                hit = func == name and (file is None or f.replace(os.sep, "/").endswith(file))
            if hit:
                calls += nc
                tot += tt
                cum += ct
        return calls, tot, cum

    def count(self, name: str, file: str | None = None, builtin: bool = False) -> int:
        return self.get(name, file, builtin)[0]

    def cumtime(self, name: str, file: str | None = None, builtin: bool = False) -> float:
        return self.get(name, file, builtin)[2]

    def builtin_calls_from(self, *files: str) -> int:
        """Calls of builtins (torch operators among them) made directly by functions in ``files``."""
        total = 0
        for (f, _line, _func), (_cc, _nc, _tt, _ct, callers) in self._raw.items():
            if f != "~":
                continue
            for (caller_file, _l, _fn), stats in callers.items():
                if caller_file.replace(os.sep, "/").endswith(files):
                    total += int(stats[1] if isinstance(stats, tuple) else stats)
        return total

    def rows(self) -> list[FunctionRow]:
        return [
            FunctionRow(_label(key), int(nc), int(cc), float(tt), float(ct), self.own(key[0]))
            for key, (cc, nc, tt, ct, _callers) in self._raw.items()
        ]

    def top(self, n: int, sort: str = "cumtime", skip: Callable[[str], bool] | None = None) -> list[FunctionRow]:
        """The ``n`` functions with the most ``sort`` (cumtime, tottime or ncalls), leaving out those
        whose label ``skip`` matches."""
        key = check_sort(sort)
        rows = [r for r in self.rows() if skip is None or not skip(r.function)]
        return sorted(rows, key=lambda r: (getattr(r, key), r.cumtime), reverse=True)[:n]


class CProfiler:
    """cProfile around the loop only (not imports, env construction or the record write)."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.profile.enable()
        try:
            yield
        finally:
            self.profile.disable()

    def stats(self) -> CallStats:
        return CallStats(pstats.Stats(self.profile))

    def dump(self, path: str | Path) -> None:
        """Write ``profile.prof`` (``pstats.Stats(path)``, ``snakeviz path``) atomically: what
        ``Profile.dump_stats`` writes, never half a file."""
        self.profile.create_stats()
        dump_table(self.profile.stats, path)


def dump_table(table: Mapping[Any, tuple], path: str | Path) -> None:
    """A cProfile table as ``profile.prof`` (``pstats.Stats(path)``, ``snakeviz path``), atomically."""
    import marshal

    from rlperf.atomic import write_bytes_atomic

    write_bytes_atomic(path, marshal.dumps(dict(table)))


# -- garbage collector -------------------------------------------------------------------------


def _importing() -> bool:
    """Whether a module is being imported in this process (CPython keeps a lock per module while it is)."""
    import importlib._bootstrap as bootstrap

    return bool(getattr(bootstrap, "_module_locks", None))


def _instrument_frame(file: str) -> bool:
    """Whether ``file`` is a profiler's own code: torch.profiler's (its trace stop and the parsing of
    its events) or this module's."""
    path = file.replace("\\", "/")
    return "/torch/profiler/" in path or "/torch/autograd/profiler" in path or file == __file__


class GcMonitor:
    """Collections per generation and seconds spent in them (the collecting thread's CPU time),
    via ``gc.callbacks`` (cheap).

    Collections that run while a module is being imported (a lazy ``import torch._dynamo`` inside
    the first optimizer, say) are one-time start-up costs: they are counted apart, in
    ``during_imports``, and left out of the other figures. So are those a profiler's own code
    starts (torch.profiler parsing its events makes many objects): ``during_instruments``. An
    instrument's cost is never the loop's.

    A collection starts on an allocation, so the Python frames running when it starts are the code
    that churns objects: ``triggers`` keeps the innermost few frames of each collection (file,
    line, function), with the count and seconds of the collections they triggered.
    """

    TRIGGER_FRAMES = 8

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.collected = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self.wall_s = 0.0
        self.importing = [0, 0.0]  # collections and seconds while importing
        self.instruments = [0, 0.0]  # collections and seconds a profiler's own code started
        self.triggers: dict[tuple[tuple[str, int, str], ...], list[float]] = {}
        self._t0 = 0.0
        self._stack: tuple[tuple[str, int, str], ...] = ()

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            frames: list[tuple[str, int, str]] = []
            frame: Any = sys._getframe(1)
            while frame is not None and len(frames) < self.TRIGGER_FRAMES:
                frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
                frame = frame.f_back
            self._stack = tuple(frames)
            self._t0 = thread_time()
            return
        # The collecting thread's CPU time: a neighbour that takes the CPU mid-collection does not
        # lengthen the pause that the fix would save.
        seconds = thread_time() - self._t0
        if any(_instrument_frame(frame[0]) for frame in self._stack):
            self.instruments[0] += 1
            self.instruments[1] += seconds
            return
        trigger = self.triggers.setdefault(self._stack, [0, 0.0])
        trigger[0] += 1
        trigger[1] += seconds
        if _importing():
            self.importing[0] += 1
            self.importing[1] += seconds
            return
        generation = min(info.get("generation", 0), 2)
        self.collections[generation] += 1
        self.seconds[generation] += seconds
        self.collected += info.get("collected", 0)
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        gc.callbacks.append(self._callback)
        started = perf_counter()
        try:
            yield
        finally:
            self.wall_s = perf_counter() - started
            with contextlib.suppress(ValueError):  # taken out already in a fork of the script (rlperf.instruments.child)
                gc.callbacks.remove(self._callback)

    def to_dict(self) -> dict[str, Any]:
        # A snapshot taken while the script runs: a collection during the sort would add to the triggers.
        enabled = gc.isenabled()
        gc.disable()
        try:
            triggers = sorted(self.triggers.items(), key=lambda kv: -kv[1][1])[:20]
        finally:
            if enabled:
                gc.enable()
        return {
            "collections": {f"gen{i}": n for i, n in enumerate(self.collections)},
            "seconds": {f"gen{i}": s for i, s in enumerate(self.seconds)},
            "total_collections": sum(self.collections),
            "objects_collected": self.collected,
            "total_s": self.total_s,
            "max_pause_ms": self.max_s * 1e3,
            "loop_wall_s": self.wall_s,
            "share_of_loop": self.total_s / self.wall_s if self.wall_s > 0 else 0.0,
            "during_imports": {"collections": self.importing[0], "total_s": self.importing[1]},
            "during_instruments": {"collections": self.instruments[0], "total_s": self.instruments[1]},
            "triggers": [{"frames": [list(f) for f in stack], "collections": int(n), "total_s": t}
                         for stack, (n, t) in triggers],
        }


# -- torch.profiler ----------------------------------------------------------------------------

# Lines kineto writes straight to fd 2 when a trace starts and stops (not Python warnings).
_KINETO_NOISE = re.compile(
    rb"^(USDT:|STAGE:|\[W\d*\s|.*(ActivityProfilerController|SyncActivityProfilerHandler|CuptiActivityProfiler|kineto))"
)


@contextlib.contextmanager
def quiet_native_stderr(noise: re.Pattern[bytes] = _KINETO_NOISE) -> Iterator[None]:
    """Catch what native code writes to fd 2 meanwhile; pass on every line but kineto's chatter."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (embedded interpreters): nothing to quiet
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True) if line.strip() and not noise.match(line)]
            if kept:
                os.write(2, b"".join(kept))


@dataclass(frozen=True)
class TorchWindow:
    """Which vector steps torch.profiler records: ``wait`` skipped, ``warmup`` discarded, ``active`` kept."""

    wait: int
    warmup: int
    active: int

    @property
    def first(self) -> int:
        return self.wait + self.warmup

    @property
    def last(self) -> int:
        return self.first + self.active - 1


def torch_window(
    warmup_steps: int,
    num_envs: int,
    learning_starts: int,
    batch_size: int,
    total_steps: int | None,
    train_ratio: float = 1.0,
    warmup: int = 1,
    max_updates: int = 40,
) -> TorchWindow:
    """Put the recorded steps just after the phase-timer warm-up and the first gradient update.

    Up to 5 active steps, fewer when each step holds many updates (about ``max_updates`` in the
    window) so that the trace stays small. ``total_steps`` (vector steps, when the run stops on
    env steps) pulls the window back so that a short run still gets one; a run that stops on
    episodes may end before it (reported then).
    """
    active = max(1, min(5, math.floor(max_updates / max(train_ratio, 1.0))))
    first_training = max(0, math.ceil(max(learning_starts, batch_size) / num_envs) - 1)
    first = max(warmup_steps, first_training, warmup)
    if total_steps is not None and first + active > total_steps:
        first = max(warmup, total_steps - active)
        active = min(active, max(1, total_steps - first))
    return TorchWindow(wait=first - warmup, warmup=warmup, active=active)


class TorchProfiler:
    """torch.profiler over a window of vector steps; ``step()`` is called once per vector step."""

    def __init__(self, device_type: str, window: TorchWindow, trace_path: str | Path) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self.window = window
        self.device_type = device_type
        self.trace_path = Path(trace_path)
        activities = [ProfilerActivity.CPU]
        if device_type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=window.wait, warmup=window.warmup, active=window.active, repeat=1),
            on_trace_ready=self._ready,
        )
        self.steps = 0
        self.recorded = False
        self.ops: list[dict[str, Any]] = []

    def _ready(self, prof: Any) -> None:
        # Only noted here, inside the loop; the trace is written by finish(), after the loop, so
        # that its export (a large JSON file) is not timed as part of a vector step.
        self.recorded = True

    def finish(self) -> None:
        """Write ``trace.json`` and tabulate the ops (after the loop)."""
        if self.recorded:
            with quiet_native_stderr():
                self._prof.export_chrome_trace(str(self.trace_path))
            self.ops = _op_rows(self._prof.key_averages(), self.device_type == "cuda")

    def _near_transition(self) -> bool:
        # kineto prints when tracing starts and stops; elsewhere step() only counts.
        w = self.window
        return w.wait - 1 <= self.steps <= w.last + 1

    def step(self) -> None:
        if self._near_transition():
            with quiet_native_stderr():
                self._prof.step()
        else:
            self._prof.step()
        self.steps += 1

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with quiet_native_stderr():
            self._prof.__enter__()
        try:
            yield
        finally:
            with quiet_native_stderr():
                self._prof.__exit__(None, None, None)
            self.finish()

    def to_dict(self, top: int) -> dict[str, Any]:
        w = self.window
        section: dict[str, Any] = {
            "schedule": {"wait": w.wait, "warmup": w.warmup, "active": w.active},
            "steps": [w.first, w.last],
            "recorded": self.recorded,
            "top_ops": sorted(self.ops, key=lambda r: r["self_cpu_ms"], reverse=True)[:top],
        }
        if self.device_type == "cuda":
            section["top_device_ops"] = sorted(self.ops, key=lambda r: r["self_device_ms"], reverse=True)[:top]
        if not self.recorded:
            section["note"] = (
                f"the run ended after {self.steps} vector steps, before the recorded window "
                f"(steps {w.first}-{w.last}); run longer (--steps) to get a trace"
            )
        return section


def _op_rows(averages: Any, cuda: bool) -> list[dict[str, Any]]:
    rows = []
    for e in averages:
        if e.key.startswith(("phase:", "ProfilerStep")):
            continue  # ranges, not ops: they are in the trace
        row = {
            "op": e.key,
            "calls": int(e.count),
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "cpu_total_ms": e.cpu_time_total / 1e3,
        }
        if cuda:
            row["self_device_ms"] = getattr(e, "self_device_time_total", 0.0) / 1e3
        rows.append(row)
    return rows


# -- py-spy ------------------------------------------------------------------------------------

PYSPY_HINT = "pip install py-spy"
PTRACE_HINT = (
    "it needs ptrace permission: run the container with --cap-add SYS_PTRACE, "
    "or as root set /proc/sys/kernel/yama/ptrace_scope to 0"
)


def find_pyspy() -> str | None:
    """The py-spy executable on PATH, or None."""
    return shutil.which("py-spy")


def pyspy_command(pyspy: str, output: str | Path, child: Sequence[str], native: bool = False, rate: int = 100) -> list[str]:
    """``py-spy record`` starting ``child`` itself (no attach to a running process, no extra privileges)."""
    cmd = [pyspy, "record", "--format", "speedscope", "--output", str(output), "--rate", str(rate)]
    if native:
        cmd.append("--native")
    return [*cmd, "--", *child]


def pyspy_env() -> dict[str, str]:
    """py-spy's environment: no Rust backtraces in its error messages."""
    return {**os.environ, "RUST_BACKTRACE": "0"}


def pyspy_failure(output_lines: Sequence[str]) -> str:
    """Why py-spy produced nothing, and how to fix it, in one line."""
    text = " ".join(line.strip() for line in output_lines if line.strip()).lower()
    error = _last_error(output_lines)
    if any(word in text for word in ("permission", "ptrace", "operation not permitted", "eperm")):
        return f"refused ({error}); {PTRACE_HINT}"
    return f"failed ({error or 'it wrote no recording'}); try `py-spy record -- python -c 1` to see why"


def _last_error(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        line = line.strip()
        if line and not line.startswith("py-spy> "):
            return line[:200]
    return ""


@dataclass
class _Node:
    name: str
    count: float = 0.0
    own: bool = False

    def __post_init__(self) -> None:
        self.children: dict[str, _Node] = {}


def speedscope_stacks(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[list[int], float]]]:
    """The frames and (root-first stack, weight) samples of a speedscope document, all threads."""
    frames = data["shared"]["frames"]
    samples: list[tuple[list[int], float]] = []
    for prof in data.get("profiles", []):
        if prof.get("type") != "sampled":
            continue
        weights = prof.get("weights") or [1.0] * len(prof["samples"])
        samples.extend(zip(prof["samples"], weights, strict=True))
    return frames, samples


def speedscope_to_svg(speedscope: str | Path, svg: str | Path, title: str = "py-spy flamegraph") -> int:
    """Render a py-spy speedscope recording as a flamegraph SVG; returns the number of samples.

    Frames merge by function (file + name, not line), root at the bottom, width = share of
    samples; rlperf's own functions are drawn in blue, everything else in warm colours.
    """
    data = json.loads(Path(speedscope).read_text(encoding="utf-8"))
    frames, samples = speedscope_stacks(data)
    labels = [f"{f['name']} ({short_path(f.get('file') or '?')})" for f in frames]
    own = [is_own(f.get("file") or "") for f in frames]
    root = _Node("all")
    for stack, weight in samples:
        root.count += weight
        node = root
        for i in stack:
            child = node.children.get(labels[i])
            if child is None:
                child = node.children[labels[i]] = _Node(labels[i], own=own[i])
            child.count += weight
            node = child
    from rlperf.atomic import write_text_atomic

    write_text_atomic(svg, _flame_svg(root, title, len(samples)))
    return len(samples)


def _flame_svg(root: _Node, title: str, n_samples: int, width: int = 1200, row: int = 16) -> str:
    rects: list[tuple[int, float, float, _Node]] = []  # depth, x, w, node
    min_w = 0.3

    def walk(node: _Node, depth: int, x: float) -> None:
        w = node.count / root.count * (width - 20) if root.count else 0.0
        if w < min_w:
            return
        rects.append((depth, x, w, node))
        for child in sorted(node.children.values(), key=lambda c: c.name):
            walk(child, depth + 1, x)
            x += child.count / root.count * (width - 20)

    walk(root, 0, 10.0)
    depth = max((d for d, *_ in rects), default=0) + 1
    height = depth * row + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="Verdana, sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="#f8f8f8"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15">{html.escape(title)}</text>',
        f'<text x="10" y="38" fill="#555">{n_samples:,} samples; width = share of samples; blue = rlperf</text>',
    ]
    for d, x, w, node in rects:
        y = height - (d + 1) * row - 4
        share = node.count / root.count * 100 if root.count else 0.0
        tip = html.escape(f"{node.name}: {node.count:.3g} s sampled, {share:.1f}%")
        out.append(
            f'<g><title>{tip}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 1}" '
            f'rx="2" fill="{_colour(node)}"/>'
        )
        chars = int((w - 6) / 6.5)
        if chars >= 3:
            label = node.name if len(node.name) <= chars else node.name[: chars - 2] + ".."
            out.append(f'<text x="{x + 3:.2f}" y="{y + row - 4}">{html.escape(label)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _colour(node: _Node) -> str:
    h = zlib.crc32(node.name.encode()) % 60
    if node.own:
        return f"hsl({190 + h // 2}, 65%, {62 + h % 15}%)"
    return f"hsl({h // 2 + 5}, 85%, {58 + h % 17}%)"


def is_pyspy_error(line: str) -> bool:
    """A line py-spy writes when it cannot sample (kept back from the profiled program's output)."""
    lowered = line.lower()
    return lowered.startswith(("error:", "failed to", "permission denied")) or "ptrace" in lowered


def attach_pyspy(record: dict[str, Any], recording: Path, native: bool) -> None:
    """Copy py-spy's recording into the run directory, draw its flamegraph, and note both in the record."""
    from rlperf.atomic import copy_atomic

    run_dir = Path(record["run_dir"])
    speedscope = run_dir / "pyspy.speedscope.json"
    copy_atomic(recording, speedscope)  # a full disk leaves no half-written file
    samples = speedscope_to_svg(speedscope, run_dir / "pyspy.svg", title=f"py-spy: {record['name']}")
    record["profile"]["py_spy"] = {
        "svg": "pyspy.svg",
        "speedscope": "pyspy.speedscope.json",
        "samples": samples,
        "native": native,
        "rate_hz": 100,
    }
    record["profile"]["artifacts"].update(pyspy_svg="pyspy.svg", pyspy_speedscope="pyspy.speedscope.json")
    record["files"].update(profile_pyspy_svg="pyspy.svg", profile_pyspy_speedscope="pyspy.speedscope.json")
