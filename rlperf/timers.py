"""Per-phase timing of the training loop: ``with timer.phase("push"): ...``.

One :class:`PhaseTimer` is passed to the loop (no global registry). Each entry of a phase is one
sample; samples live in growable float64 arrays so p50/p95 are exact, not estimated.

Modes (recorded as ``timer.mode``, printed with every phase table):

- ``cpu``    -- ``time.perf_counter`` at the phase edges. Any mode asked for on a CPU device
  resolves to this one.
- ``sync``   -- CUDA: ``torch.cuda.synchronize`` at each phase edge, then ``perf_counter``. Exact
  attribution of device time to the phase that queued it, at the price of draining the queue four
  times a step (it perturbs what it measures: overlap between phases is lost).
- ``events`` -- CUDA (what ``auto`` picks there): a pair of ``torch.cuda.Event`` per entry,
  recorded on the current stream and resolved in :meth:`PhaseTimer.flush`, which the trainer calls
  in its log phase at every log boundary (the sync loop and the async learner alike; the pending
  cap below is only a safety net). No host sync on the hot path.
- ``off``    -- ``phase()`` returns one shared ``nullcontext``; nothing is allocated or recorded.

The first ``warmup_steps`` vector steps (counted by :meth:`PhaseTimer.step_done`) are warm-up:
their samples go to the warm-up totals, not to the statistics, and ``wall_s`` starts after them.
Each measured vector step's wall time (from one ``step_done()`` to the next) is a sample too: its
low percentiles are what the CI gate compares (``rlperf compare --fail-if-slower``), as other
processes on a shared machine stretch some steps and leave the fastest ones where they were. Their
mean is compared too, less the time the loop's thread waited for a CPU that other processes held
(Linux's per-thread run-queue wait, read every 64 steps: :class:`_CpuWaits`): a cost that lands on
one step in four or ten (an update every fourth step) moves the mean and not the p25.

Importing this module does not import torch, and a CPU timer never does (``device="cpu"``): the
public :class:`PhaseTimer` costs a NumPy import in a script that does not use torch.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import asdict, dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from rlperf.errors import ConfigError
from rlperf.system import open_schedstat, run_queue_s

if TYPE_CHECKING:
    import torch

PHASES = ("select", "step", "push", "train", "log")
"""The loop's phases, in loop order. Tables and records list them in this order."""

MODES = ("auto", "sync", "events", "cpu", "off")

# Shared by every disabled timer: entering it costs one method call and allocates nothing.
_NULL = contextlib.nullcontext()

_INITIAL_CAPACITY = 1024
# Events mode resolves pending event pairs on its own past this many, so a loop that never calls
# flush() cannot grow the pending list without bound (it costs one sync when it happens).
_MAX_PENDING = 65536


@dataclass(frozen=True)
class PhaseStats:
    """Statistics of one phase over the measured (post-warm-up) steps."""

    total_s: float
    share: float  # of the sum of all phase totals
    calls: int
    mean_ms: float
    p50_ms: float
    p95_ms: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _torch() -> Any:
    import torch

    return torch


def _resolve_device(device: Any) -> Any:
    """``device`` as a ``torch.device``; a CPU named by a string stays the string ``"cpu"`` while torch
    is not imported (a timer in a script that does not use torch must not import it)."""
    if isinstance(device, str) and device.strip().lower() == "cpu" and "torch" not in sys.modules:
        return "cpu"
    torch = _torch()
    if isinstance(device, str) and device.strip().lower() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _device_type(device: Any) -> str:
    return device if isinstance(device, str) else str(device.type)


def resolve_timing_mode(device: torch.device | str, mode: str = "auto", enabled: bool = True) -> str:
    """The mode a timer will actually use for ``mode`` on ``device``."""
    name = str(mode).strip().lower()
    if name not in MODES:
        raise ConfigError(f"unknown timing mode {mode!r}", hint="use " + ", ".join(MODES))
    if not enabled or name == "off":
        return "off"
    if _device_type(device) != "cuda":
        return "cpu"
    if name == "cpu":
        raise ConfigError(
            "timing mode 'cpu' on a CUDA device would time kernel launches, not kernels",
            hint="use sync or events",
        )
    return "events" if name == "auto" else name


class _Phase:
    """Times one phase with ``perf_counter``; owns that phase's samples.

    A timer keeps two of these per phase name, one for warm-up and one for the measured steps,
    and hands out the right one from ``phase()``: the hot path never asks whether it is warm.
    """

    __slots__ = ("_buf", "_n", "_sum", "_sum_n", "_t0", "_timer", "name")

    def __init__(self, name: str, timer: PhaseTimer) -> None:
        self.name = name
        self._timer = timer
        self._t0 = 0.0
        self._buf = np.empty(_INITIAL_CAPACITY, dtype=np.float64)
        self._n = 0
        self._sum, self._sum_n = 0.0, 0  # total() so far, over the first _sum_n samples

    def __enter__(self) -> _Phase:
        self._t0 = perf_counter()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        seconds = perf_counter() - self._t0
        # _add() inlined: this is the hot path, and a Python call costs as much as the rest.
        n = self._n
        try:
            self._buf[n] = seconds
        except IndexError:
            self._grow()
            self._buf[n] = seconds
        self._n = n + 1

    def _grow(self) -> None:
        """Double the capacity (amortised O(1) per sample)."""
        self._buf = np.concatenate((self._buf, np.empty_like(self._buf)))

    def _add(self, seconds: float) -> None:
        n = self._n
        try:
            self._buf[n] = seconds
        except IndexError:
            self._grow()
            self._buf[n] = seconds
        self._n = n + 1

    @property
    def samples(self) -> np.ndarray:
        """The recorded durations in seconds (a view; copy before keeping it)."""
        return self._buf[: self._n]

    def total(self) -> float:
        """The sum of the samples, adding only those recorded since the last call (read at every log
        row, so it must not cost O(samples))."""
        n = self._n
        if n != self._sum_n:
            self._sum += float(self._buf[self._sum_n:n].sum())
            self._sum_n = n
        return self._sum

    def _load(self, samples: np.ndarray) -> None:
        n = samples.shape[0]
        self._buf = np.empty(max(_INITIAL_CAPACITY, 1 << max(n - 1, 0).bit_length()), dtype=np.float64)
        self._buf[:n] = samples
        self._n = n
        self._sum, self._sum_n = 0.0, 0


class _SyncPhase(_Phase):
    """CUDA ``sync`` mode: drain the device queue at both edges so the phase owns its kernels."""

    __slots__ = ()

    def __enter__(self) -> _SyncPhase:
        self._timer._cuda.synchronize(self._timer.device)
        self._t0 = perf_counter()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._timer._cuda.synchronize(self._timer.device)
        self._add(perf_counter() - self._t0)


class _EventPhase(_Phase):
    """CUDA ``events`` mode: record an event pair per entry; durations are read in ``flush()``."""

    __slots__ = ("_start",)

    def __enter__(self) -> _EventPhase:
        timer = self._timer
        self._start = timer._event()
        self._start.record(timer._cuda.current_stream(timer.device))
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        timer = self._timer
        end = timer._event()
        end.record(timer._cuda.current_stream(timer.device))
        timer._pending.append((self, self._start, end))
        if len(timer._pending) >= _MAX_PENDING:
            timer.flush()


class _Annotated:
    """Wraps a phase in ``torch.profiler.record_function("phase:<name>")`` for profiler traces."""

    __slots__ = ("_label", "_range", "inner")

    def __init__(self, inner: _Phase) -> None:
        self.inner = inner
        self._label = f"phase:{inner.name}"
        self._range: Any = None

    def __enter__(self) -> _Annotated:
        self._range = _torch().profiler.record_function(self._label)
        self._range.__enter__()
        self.inner.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.inner.__exit__(exc_type, exc, tb)
        finally:
            self._range.__exit__(exc_type, exc, tb)
            self._range = None


_PHASE_CLASS = {"cpu": _Phase, "sync": _SyncPhase, "events": _EventPhase}


class _CpuWaits:
    """The measured steps' wall time and the part of it the loop's thread spent waiting for a CPU.

    Read at marks (the 1st, 2nd, 4th, ... 64th measured step, then every 64th: a file read of ~2 µs
    each, nothing on the other steps): between two marks, the steps' summed wall time and the
    thread's run-queue wait over the same span. A wait is only known on Linux, and only while the
    steps come from the thread that started the span (another thread, or a forked child, starts a new one).
    """

    __slots__ = ("file", "known", "prev", "seconds", "since", "steps", "tid", "waited")

    def __init__(self) -> None:
        self.file: Any = None
        self.tid: int | None = None
        self.prev: float | None = None  # the run-queue wait at the last mark; None: no span open
        self.since = 0  # the step sample the open span starts at
        self.steps, self.seconds, self.waited = 0, 0.0, 0.0
        self.known = True  # every span so far had its wait read

    def start(self, n: int) -> None:
        """Open a span at step sample ``n`` (the measured window starts, or resumes)."""
        tid = threading.get_native_id()
        if self.file is None or self.tid != tid:
            if self.file is not None:
                self.file.close()
            self.file, self.tid = open_schedstat(), tid
        self.prev, self.since = run_queue_s(self.file), n
        if self.prev is None:
            self.known = False

    def mark(self, samples: _Phase) -> None:
        """Close the open span at the latest step sample and open the next."""
        n = samples._n
        if self.tid != threading.get_native_id():
            self.start(n)
            return
        now = run_queue_s(self.file)
        if now is None or self.prev is None:
            self.known = False
        else:
            self.waited += max(now - self.prev, 0.0)
        self.seconds += float(samples._buf[self.since:n].sum())
        self.steps += n - self.since
        self.prev, self.since = now, n

    def figures(self) -> dict[str, float | None]:
        """The mean step less its wait (ms) and the share of the steps' time spent waiting; None unknown."""
        if not (self.known and self.steps and self.seconds > 0):
            return {"mean_less_wait_ms": None, "cpu_wait_share": None}
        waited = min(self.waited, self.seconds)
        return {"mean_less_wait_ms": (self.seconds - waited) / self.steps * 1e3, "cpu_wait_share": waited / self.seconds}


class PhaseTimer:
    """Times the loop's phases; see the module docstring for the modes.

    Usage::

        timer = PhaseTimer(device, mode="auto", warmup_steps=10)
        for _ in range(steps):
            with timer.phase("select"): ...
            with timer.phase("step"): ...
            timer.step_done()
        timer.stats()["push"].p95_ms

    A phase may be entered any number of times per step (``train`` with ``train_ratio`` 0.25 runs
    every fourth step); each entry is one call. A phase does not nest in itself (the public
    :class:`rlperf.PhaseTimer` times nested phases and threads; this one is the loop's, one thread,
    flat phases, the least work per entry). Names other than
    :data:`PHASES` are accepted and listed after them. ``annotate=True`` also marks each entry as
    a ``phase:<name>`` range for ``torch.profiler``.
    """

    def __init__(
        self,
        device: torch.device | str,
        mode: str = "auto",
        enabled: bool = True,
        warmup_steps: int = 0,
        annotate: bool = False,
    ) -> None:
        if warmup_steps < 0:
            raise ConfigError(f"warm-up steps must be >= 0, got {warmup_steps}")
        self.device = _resolve_device(device)
        self.mode = resolve_timing_mode(self.device, mode, enabled)
        self._cuda: Any = _torch().cuda if self.mode in ("sync", "events") else None
        self.enabled = self.mode != "off"
        self.warmup_steps = int(warmup_steps)
        self.annotate = bool(annotate) and self.enabled
        self.steps = 0
        # name -> the object phase() returns (a _Phase, or an _Annotated around one)
        self._measured: dict[str, Any] = {}
        self._warmup: dict[str, Any] = {}
        self._pending: list[tuple[_Phase, Any, Any]] = []
        self._spare_events: list[Any] = []
        self._wall_done = 0.0  # measured wall seconds before the current stretch (resume)
        self._wall_start: float | None = None
        self._wall_last: float | None = None
        self._not_started: dict[str, Any] = {}  # stays empty; see _enter_stage()
        self._steps = _Phase("vector step", self)  # wall seconds of each measured vector step
        self._waits = _CpuWaits()  # and the time the loop's thread waited for a CPU in them
        self._enter_stage()
        if not self.enabled:
            self.phase = _null_phase  # type: ignore[method-assign]
            self.step_done = self._count_step  # type: ignore[method-assign]
        else:
            for name in PHASES:
                self._add_phase(name)

    def _enter_stage(self) -> None:
        """Point phase() at the warm-up or the measured phases, by the step counter."""
        if self.steps < self.warmup_steps:
            self._phases = self._warmup
        else:
            # The measured wall clock starts at the step_done() that ends the warm-up, or, with
            # no warm-up left, at the first phase entry: this empty dict makes that first lookup
            # miss, so the hot path carries no "started yet?" test.
            self._phases = self._not_started

    # -- hot path ---------------------------------------------------------------------------

    def phase(self, name: str) -> Any:
        """The context manager timing one entry of phase ``name`` (reused, not allocated)."""
        try:
            return self._phases[name]
        except KeyError:
            return self._missed(name)

    def step_done(self) -> None:
        """Mark the end of one vector step (the unit of warm-up)."""
        self.steps += 1
        now = perf_counter()
        if self._phases is self._warmup and self.steps >= self.warmup_steps:
            self._phases = self._measured
            self._wall_start = now
            self._waits.start(self._steps._n)
            return
        start, last = self._wall_start, self._wall_last
        if start is not None and self._phases is self._measured:
            steps = self._steps
            steps._add(now - (last if last is not None and last > start else start))
            n = steps._n
            if not (n & 63 and n & (n - 1)):  # 1, 2, 4, ..., 64, then every 64th
                self._waits.mark(steps)
        self._wall_last = now

    def _count_step(self) -> None:
        """step_done() of a disabled timer: it only counts."""
        self.steps += 1

    # -- off the hot path -------------------------------------------------------------------

    def flush(self) -> None:
        """Resolve pending CUDA event pairs into samples (waits for them; events mode only)."""
        pending = self._pending
        if not pending:
            return
        spare = self._spare_events
        for phase, start, end in pending:
            end.synchronize()  # returns at once for all but the latest (unless streams differ)
            phase._add(start.elapsed_time(end) / 1000.0)
            spare.append(start)
            spare.append(end)
        pending.clear()

    def _missed(self, name: str) -> Any:
        """phase() slow path: the first measured entry, or a phase name not seen before."""
        if self._phases is self._not_started:
            self._phases = self._measured
            self._waits.start(self._steps._n)
            self._wall_start = perf_counter()
        if name not in self._phases:
            self._add_phase(name)
        return self._phases[name]

    def _event(self) -> Any:
        spare = self._spare_events
        return spare.pop() if spare else self._cuda.Event(enable_timing=True)

    def _add_phase(self, name: str) -> None:
        cls = _PHASE_CLASS[self.mode]
        for stage in (self._measured, self._warmup):
            phase = cls(name, self)
            stage[name] = _Annotated(phase) if self.annotate else phase

    @staticmethod
    def _timed(stage: dict[str, Any]) -> dict[str, _Phase]:
        """The phases that own the samples, under any wrapper (an :class:`_Annotated`, the public timer's)."""
        return {name: getattr(p, "inner", p) for name, p in stage.items()}

    @property
    def measured_steps(self) -> int:
        """Vector steps after warm-up."""
        return max(0, self.steps - self.warmup_steps)

    @property
    def warmup_s(self) -> float:
        """Total time spent in phases during warm-up."""
        self.flush()
        return float(sum(p.samples.sum() for p in self._timed(self._warmup).values()))

    @property
    def wall_s(self) -> float:
        """Wall seconds from the start of the first measured step to the last ``step_done()``.

        Host time: in events mode the device may still be working when it is read; synchronize
        before the final read if the last step's kernels must be counted.
        """
        if self._wall_start is None or self._wall_last is None or self._wall_last < self._wall_start:
            return self._wall_done
        return self._wall_done + (self._wall_last - self._wall_start)

    def measured_wall_now(self) -> float:
        """Like :attr:`wall_s`, but up to now (mid-step), for rates shown while the run goes on."""
        if self._wall_start is None:
            return self._wall_done
        return self._wall_done + (perf_counter() - self._wall_start)

    def samples(self, name: str) -> np.ndarray:
        """A copy of phase ``name``'s measured durations, in seconds."""
        self.flush()
        phase = self._timed(self._measured).get(name)
        return np.empty(0) if phase is None else phase.samples.copy()

    def shares(self) -> dict[str, float]:
        """Each phase's share of the phase total: what a live dashboard needs, without the
        percentiles that make :meth:`stats` cost O(samples log samples)."""
        self.flush()
        totals = {name: float(p.samples.sum()) for name, p in self._timed(self._measured).items()}
        grand = sum(totals.values())
        return {name: (t / grand if grand > 0 else 0.0) for name, t in totals.items()}

    def totals(self) -> dict[str, float]:
        """Seconds spent in each phase since the run started, warm-up included, in loop order: the
        cumulative figures whose differences between two log rows are that interval's phase times.
        Costs only the samples recorded since the last call."""
        self.flush()
        warm = self._timed(self._warmup)
        return {name: p.total() + warm[name].total() for name, p in self._timed(self._measured).items()}

    def stats(self) -> dict[str, PhaseStats]:
        """Per-phase statistics excluding warm-up, in loop order (empty when disabled)."""
        self.flush()
        timed = self._timed(self._measured)
        totals = {name: float(p.samples.sum()) for name, p in timed.items()}
        grand = sum(totals.values())
        out: dict[str, PhaseStats] = {}
        for name, phase in timed.items():
            s = phase.samples
            if s.shape[0]:
                p50, p95 = np.percentile(s, (50.0, 95.0))
                mean = totals[name] / s.shape[0]
            else:
                p50 = p95 = mean = 0.0
            out[name] = PhaseStats(
                total_s=totals[name],
                share=totals[name] / grand if grand > 0 else 0.0,
                calls=int(s.shape[0]),
                mean_ms=float(mean) * 1e3,
                p50_ms=float(p50) * 1e3,
                p95_ms=float(p95) * 1e3,
            )
        return out

    def step_stats(self) -> dict[str, float | int | None] | None:
        """Wall time per measured vector step: calls, mean, p25, p50 and p95 in ms, and the mean less
        the time the loop's thread waited for a CPU with that wait's share (None unknown); None before any step."""
        s = self._steps.samples
        if not s.shape[0]:
            return None
        p25, p50, p95 = np.percentile(s, (25.0, 50.0, 95.0))
        return {"calls": int(s.shape[0]), "mean_ms": float(s.mean()) * 1e3, "p25_ms": float(p25) * 1e3,
                "p50_ms": float(p50) * 1e3, "p95_ms": float(p95) * 1e3, **self._waits.figures()}

    def to_dict(self) -> dict[str, Any]:
        """The timing section of a run record; its ``phases`` is the record's per-phase table."""
        stats = self.stats()
        return {
            "vector_step": self.step_stats(),
            "mode": self.mode,
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "measured_steps": self.measured_steps,
            "warmup_s": self.warmup_s,
            "wall_s": self.wall_s,
            "phases": {name: s.as_dict() for name, s in stats.items()},
            "warmup_phases": {
                name: {"total_s": float(p.samples.sum()), "calls": int(p.samples.shape[0])}
                for name, p in self._timed(self._warmup).items()
            },
        }

    def state_dict(self) -> dict[str, Any]:
        """Samples and counters, loadable with ``torch.load(weights_only=True)``."""
        torch = _torch()
        self.flush()
        warm = self._timed(self._warmup)
        return {
            "version": 1,
            "step_samples": torch.from_numpy(self._steps.samples.copy()),
            "cpu_waits": [self._waits.steps, self._waits.seconds, self._waits.waited, self._waits.known],
            "mode": self.mode,
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "wall_s": self.wall_s,
            "phases": {
                name: {
                    "samples": torch.from_numpy(p.samples.copy()),
                    "warmup_samples": torch.from_numpy(warm[name].samples.copy()),
                }
                for name, p in self._timed(self._measured).items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the statistics go on accumulating from where they were.

        The warm-up is not repeated when the saved run was past it (its count is restored).
        """
        self.steps = int(state["steps"])
        self._pending.clear()
        self._wall_done = float(state["wall_s"])
        self._wall_start = self._wall_last = None
        if self.enabled:
            for name, saved in state["phases"].items():
                if name not in self._measured:
                    self._add_phase(name)
                for stage, key in ((self._measured, "samples"), (self._warmup, "warmup_samples")):
                    self._timed(stage)[name]._load(_as_float64(saved[key]))
            if "step_samples" in state:  # checkpoints from before per-step samples have none
                self._steps._load(_as_float64(state["step_samples"]))
            waits = self._waits = _CpuWaits()
            if "cpu_waits" in state:  # the steps before the checkpoint (the first resumed step starts a new span)
                waits.steps, waits.seconds, waits.waited, waits.known = (
                    int(state["cpu_waits"][0]), float(state["cpu_waits"][1]), float(state["cpu_waits"][2]),
                    bool(state["cpu_waits"][3]))
            else:
                waits.known = False
        self._enter_stage()


def _as_float64(samples: Any) -> np.ndarray:
    if hasattr(samples, "detach"):  # a torch tensor (from a checkpoint)
        samples = samples.detach().cpu().numpy()
    return np.asarray(samples, dtype=np.float64).reshape(-1)


def _null_phase(name: str) -> contextlib.nullcontext[None]:
    return _NULL
