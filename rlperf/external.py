"""Profile your own loop: the public phase timer and the run record it writes (``kind: "external"``).

Three lines in any training loop::

    timer = rlperf.PhaseTimer("cuda")              # or "cpu"; mode="sync" / "events" on CUDA
    with timer.phase("step"): obs, r, term, trunc, info = envs.step(actions)
    timer.step_done()                              # once per loop iteration (vector step)

with ``timer.episodes(info)`` after each step (Gymnasium's ``RecordEpisodeStatistics``, single or
vector) or ``timer.episode(return_, length)`` for the returns, and, to keep the result,
``timer.save("runs", num_envs=envs.num_envs)``: a run directory whose
``run.json`` ``rlperf compare`` reads beside rlperf's own runs (and its CI gate,
``--fail-if-slower``). Run the script under ``rlperf profile -- python train.py`` and the phase
table comes with cProfile's top functions and the advisor, without ``save``.

:class:`PhaseTimer` is :class:`rlperf.timers.PhaseTimer` (the timer rlperf's own loop uses: the
same modes, warm-up, free when ``enabled=False``) plus what a script written by anyone needs:
nested phases (timed as self time), threads (each entry timed on its own thread), per-interval
phase series in the record, and :meth:`PhaseTimer.save`. Importing
``rlperf`` imports none of this; ``rlperf.PhaseTimer`` does, and a CPU timer never imports torch.
"""

from __future__ import annotations

import datetime as dt
import math
import numbers
import os
import platform
import resource
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

from rlperf import script_registry, timers
from rlperf.script_registry import SUBPROCESS_TIMERS_ENV
from rlperf.errors import ConfigError, DeviceError, RlperfError

MAX_NUM_ENVS = 1 << 30
"""The most envs one ``step_done()`` may stand for in a record (a billion boards is past any machine)."""

MAX_INTERVALS = 128
"""Rows a record's ``intervals`` keeps: :data:`rlperf.run.record.MAX_INTERVALS` (that module imports
torch; a test keeps the two equal)."""


_process_timers: tuple[int, list[PhaseTimer]] | None = None  # (pid, timers) of such a process
_process_written = (0, 0.0, 0.0)  # (pid, perf_counter of its first timer, of its last write)
WRITE_S = 0.5
"""Seconds between two writes of a process's timers at most (a tenth of its timers' age, 0.05 s at the
least): a process ended by SIGTERM (a Pool's terminate()) keeps what was written before."""


def _keep(timer: PhaseTimer) -> None:
    """Keep a new timer for ``rlperf profile``: the script's own, or one of a process it started."""
    global _process_timers
    pid = os.getpid()
    registry = script_registry.current  # rlperf profile -- python: the script's own timers
    if registry is not None and pid == registry.pid:
        registry.timers.append(timer)
        return
    folder = os.environ.get(SUBPROCESS_TIMERS_ENV)
    if not folder:
        return
    if _process_timers is None or _process_timers[0] != pid:
        _process_timers = (pid, [])
        write = lambda: _write_process_timers(folder, pid)  # noqa: E731
        import atexit

        atexit.register(write)
        if "multiprocessing" in sys.modules:  # a multiprocessing.Process ends with os._exit: its finalizers run
            from multiprocessing import util

            util.Finalize(None, write, exitpriority=0)
    else:
        _write_process_timers(folder, pid)  # a new timer: the ones before it may be done (a Pool's last task)
    _process_timers[1].append(timer)


def _written_by_now() -> None:
    """After a step of a timer in a process the script started: its timers written when they are due
    (:data:`WRITE_S`). No SIGTERM handler writes them: a Python handler runs between two bytecodes, and
    a Pool worker that SIGTERM reached just before it blocked on the task queue's lock (the parent holds
    it while it terminates them) waited there for ever, and the profile with it."""
    folder = os.environ.get(SUBPROCESS_TIMERS_ENV)
    if not folder or _process_timers is None or _process_timers[0] != os.getpid():
        return
    pid, first, last = _process_written
    now = perf_counter()
    if pid != os.getpid():
        first = last = now - 1.0  # the first step: written at once
    if now - last >= min(WRITE_S, max(0.05, 0.1 * (now - first))):
        _write_process_timers(folder, os.getpid())


def _write_process_timers(folder: str, pid: int) -> None:
    """This process's timers that timed something, into ``folder`` (after steps, a new timer, atexit,
    multiprocessing's end): the last write has them all."""
    global _process_written
    if _process_timers is None or _process_timers[0] != pid or os.getpid() != pid:
        return
    first = _process_written[1] if _process_written[0] == pid else perf_counter()
    _process_written = (pid, first, perf_counter())
    records = [dict(external_record(t), process=pid) for t in list(_process_timers[1])
               if t.steps or any(s.calls for s in t.stats().values())]
    if records:
        import contextlib

        from rlperf.atomic import write_json_atomic

        with contextlib.suppress(OSError, RlperfError):  # rlperf gone, its folder with it: nobody to read them
            write_json_atomic(Path(folder) / f"timers-{pid}.json", records)


def subprocess_timers(folder: Path) -> list[dict[str, Any]]:
    """The records the script's subprocesses wrote into ``folder`` (see :data:`SUBPROCESS_TIMERS_ENV`)."""
    import contextlib
    import json

    out: list[dict[str, Any]] = []
    for file in sorted(folder.glob("timers-*.json")):
        with contextlib.suppress(OSError, ValueError):
            out += [r for r in json.loads(file.read_text(encoding="utf-8")) if isinstance(r, dict)]
    return out


class _ThreadPhase:
    """A phase of the public timer: its start times are per thread (two threads in the same phase both
    count), and a phase entered inside another counts as the outer phase's *self* time (its time
    without the inner's), so the phases' totals add up to the measured time once.

    Each thread keeps a stack of its open entries, ``[name, start, seconds nested in it]`` (start:
    ``perf_counter`` seconds, or a CUDA event in events mode)."""

    __slots__ = ("_mode", "_timer", "inner", "name")

    def __init__(self, inner: timers._Phase, timer: PhaseTimer) -> None:
        self.inner = inner  # owns the samples
        self.name = inner.name
        self._timer = timer
        self._mode = timer.mode

    def __enter__(self) -> _ThreadPhase:
        timer = self._timer
        try:
            entries = timer._local.entries
        except AttributeError:
            entries = timer._local.entries = []
        if self._mode == "cpu":
            entries.append([self.name, perf_counter(), 0.0])
        elif self._mode == "sync":
            timer._cuda.synchronize(timer.device)
            entries.append([self.name, perf_counter(), 0.0])
        else:
            if entries:
                raise ConfigError(f"phase {self.name!r} inside phase {entries[-1][0]!r}: CUDA events cannot "
                                  "time nested phases", hint='use PhaseTimer(device, mode="sync") to nest phases')
            start = timer._event()
            start.record(timer._cuda.current_stream(timer.device))
            entries.append([self.name, start, 0.0])
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        timer = self._timer
        entries = timer._local.entries
        _, start, nested = entries.pop()
        if self._mode == "events":
            end = timer._event()
            end.record(timer._cuda.current_stream(timer.device))
            with timer._lock:
                timer._pending.append((self.inner, start, end))
            if len(timer._pending) >= timers._MAX_PENDING:
                timer.flush()
            return
        if self._mode == "sync":
            timer._cuda.synchronize(timer.device)
        seconds = perf_counter() - start
        with timer._lock:
            self.inner._add(seconds - nested)
        if entries:
            outer = entries[-1]
            outer[2] += seconds
            if self.name not in timer.nested:
                timer.nested[self.name] = outer[0]


class PhaseTimer(timers.PhaseTimer):
    """Times the phases of your loop: ``with timer.phase("name"): ...`` and ``timer.step_done()``.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` or a ``torch.device``: where the timed
            work runs. On CUDA, ``mode="events"`` (the default there: CUDA events, no host sync in
            the loop) or ``"sync"`` (synchronize at each phase edge: exact attribution). A CUDA
            device this machine does not have is refused here, not at the first phase.
        mode: ``"auto"``, ``"sync"``, ``"events"``, ``"cpu"`` or ``"off"``.
        enabled: ``False`` makes every ``phase()`` one shared null context: free.
        warmup_steps: the first steps, timed apart and left out of the statistics.
        interval_s: the record's ``intervals`` close a row at the first ``step_done()`` this many
            seconds after the last one (at most :data:`MAX_INTERVALS` rows, merged evenly).
        score_targets: mean returns (over the last 100 episodes) whose first crossing the record's
            ``time_to_score`` times, as ``train.score_targets`` does for rlperf's own runs.

    Phases are any names; ``select``, ``step``, ``push``, ``train`` and ``log`` are listed first, in
    that order. A phase may be entered inside another (its time is then the outer phase's self time,
    and :attr:`nested` maps it to the outer one; CUDA ``events`` mode refuses nesting) and from
    several threads at once (each entry is timed on its own thread). Finished episodes come in with
    :meth:`episode` or :meth:`episodes`, called before the ``step_done()`` of the step they ended in:
    the record then has the learning figures, the learning curve and the time to score that
    rlperf's own runs have. Read the statistics with :meth:`stats`, write a record with :meth:`save`.
    """

    _lock: threading.Lock
    _local: threading.local
    _id: tuple[int, str]
    interval_s: float
    _born: float
    _interval_end: float
    _last_step: float
    _closed: int
    _stride: int
    num_envs: int
    score_targets: tuple[float, ...]
    _episodes: list[tuple[int, float, float, float, float]]

    def __init__(self, device: Any = "cpu", mode: str = "auto", enabled: bool = True, warmup_steps: int = 0,
                 interval_s: float = 1.0, score_targets: Sequence[float] = ()) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, numbers.Real) or not (
                math.isfinite(interval_s) and interval_s > 0):
            raise ConfigError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        if isinstance(score_targets, (str, bytes)) or not all(_finite(t) for t in score_targets):
            raise ConfigError(f"score_targets must be finite numbers, got {score_targets!r}",
                              hint="the mean returns over 100 episodes to time, e.g. score_targets=(100, 200)")
        self.score_targets = tuple(float(t) for t in score_targets)
        # One row per finished episode: (the vector step it ended in, the measured wall seconds and
        # the seconds since the timer was made at that moment, its return, its length or NaN).
        self._episodes = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self.nested: dict[str, str] = {}
        """Each phase entered inside another: the phase it was (first) entered in."""
        super().__init__(device, mode=mode, enabled=enabled, warmup_steps=warmup_steps)
        if self.mode in ("sync", "events"):
            _check_cuda(self.device, device)
        self.started_at = _now()
        self._id = (os.getpid(), uuid.uuid4().hex)
        self.interval_s = float(interval_s)
        self._born = self._interval_end = perf_counter()
        self._last_step = self._born
        # Cumulative [steps, seconds since the timer was made, {phase: seconds}] at every _stride-th
        # closed interval; past 2 x MAX_INTERVALS rows every other one goes and the stride doubles, so
        # the rows stay evenly spaced and differences between rows are exact interval figures.
        self._intervals: list[tuple[int, float, dict[str, float]]] = []
        self._closed = 0
        self._stride = 1
        self.num_envs = 1
        """The envs one ``step_done()`` steps, as last given to :meth:`record` or :meth:`save`."""
        self._summed: dict[str, list[float]] = {}  # phase -> [measured samples summed, warm-up ones, seconds]
        _keep(self)

    def _add_phase(self, name: str) -> None:
        super()._add_phase(name)
        for stage in (self._measured, self._warmup):
            stage[name] = _ThreadPhase(stage[name], self)

    def step_done(self) -> None:
        """Mark the end of one vector step (one iteration of your loop; from one thread)."""
        super().step_done()
        now = self._last_step = perf_counter()
        if now - self._interval_end >= self.interval_s:
            self._close_interval(now)
        registry = script_registry.current
        if registry is not None and registry.pid == os.getpid():  # a fork inherits the script's registry
            if registry.on_step is not None:
                registry.on_step(self)
        elif _process_timers is not None:
            _written_by_now()

    def episode(self, return_: float, length: int | None = None) -> None:
        """Note one finished episode: its return (its score) and, if known, its length in env steps."""
        if not _finite(return_):
            raise ConfigError(f"an episode's return must be a finite number, got {return_!r}")
        if length is not None and not _finite(length):
            raise ConfigError(f"an episode's length must be a finite number of steps, got {length!r}")
        self._episodes.append((self.steps + 1, self.measured_wall_now(), perf_counter() - self._born,
                               float(return_), float(length) if length is not None else math.nan))

    def episodes(self, info: Mapping[str, Any]) -> int:
        """Note the episodes a step's ``info`` reports finished; returns how many. Reads Gymnasium's
        ``RecordEpisodeStatistics``: ``info["episode"]`` with ``"r"`` and ``"l"`` (one env), the same
        as arrays with the ``info["_episode"]`` mask (its vector form), or a ``final_info`` list of
        such dicts (Gymnasium before 1.0). An info without finished episodes is 0."""
        if not isinstance(info, Mapping):
            raise ConfigError(f"episodes() takes a step's info dict, got {type(info).__name__}",
                              hint="timer.episode(return_, length) notes one episode by hand")
        taken = 0
        episode = info.get("episode")
        if isinstance(episode, Mapping) and "r" in episode:
            returns, lengths = _flat(episode["r"]), _flat(episode.get("l"))
            mask = _flat(info["_episode"]) if "_episode" in info else [True] * len(returns)
            for i, done in enumerate(mask):
                if done and i < len(returns):
                    self.episode(returns[i], lengths[i] if i < len(lengths) else None)
                    taken += 1
        elif isinstance(info.get("final_info"), (list, tuple)):
            for item in info["final_info"]:
                if isinstance(item, Mapping):
                    taken += self.episodes(item)
        return taken

    def _close_interval(self, now: float) -> None:
        with self._lock:
            self._interval_end = now
            self._closed += 1
            if self._closed % self._stride == 0:
                self._intervals.append((self.steps, now - self._born, self._phase_seconds()))
                if len(self._intervals) > 2 * MAX_INTERVALS:  # keep every other row, and note every other one from now on
                    self._intervals = self._intervals[1::2]
                    self._stride *= 2

    def _phase_seconds(self) -> dict[str, float]:
        """Each phase's seconds so far, warm-up included (summing only the samples new since the last call)."""
        self.flush()
        measured, warm = self._timed(self._measured), self._timed(self._warmup)
        out = {}
        for name, phase in measured.items():
            summed = self._summed.setdefault(name, [0, 0, 0.0])
            for i, samples in enumerate((phase.samples, warm[name].samples)):
                summed[2] += float(samples[int(summed[i]):].sum())
                summed[i] = samples.shape[0]
            out[name] = summed[2]
        return out

    def interval_rows(self, num_envs: int = 1) -> list[dict[str, Any]]:
        """The record's ``intervals``: per interval (or evenly merged ones past :data:`MAX_INTERVALS`),
        where it ended (env steps, wall seconds since the timer was made), its seconds per 1000 env
        steps and each phase's seconds in it. ``episodes`` and ``mean_episode_length`` are None: a
        timer does not see episodes."""
        with self._lock:
            rows = list(self._intervals)
            if not rows or rows[-1][0] < self.steps:  # the steps since the last closed interval
                rows.append((self.steps, self._last_step - self._born, self._phase_seconds()))
        if len(rows) > MAX_INTERVALS:
            step = len(rows) / MAX_INTERVALS
            rows = [rows[min(len(rows) - 1, round((i + 1) * step) - 1)] for i in range(MAX_INTERVALS)]
        used = [name for name, total in rows[-1][2].items() if total > 0] if rows else []
        episodes = sorted(self._episodes, key=lambda e: e[0])  # threads may note them out of order
        out = []
        previous: tuple[int, float, dict[str, float]] = (0, 0.0, {})
        read = 0
        for k, (steps, wall, phases) in enumerate(rows):
            env_steps = (steps - previous[0]) * num_envs
            seconds = wall - previous[1]
            # The last row takes every episode left (one noted after the last step_done()).
            end = len(episodes) if k == len(rows) - 1 else next(
                (i for i in range(read, len(episodes)) if episodes[i][0] > steps), len(episodes))
            row: dict[str, Any] = {
                "env_steps": steps * num_envs, "wall_s": round(wall, 6),
                "episodes": end - read if episodes else None,
                "mean_episode_length": _mean([e[4] for e in episodes[read:end] if e[4] == e[4]]),
                "s_per_1000_env_steps": 1000 * seconds / env_steps if env_steps > 0 and seconds > 0 else None,
                "phase_s": {name: phases.get(name, 0.0) - previous[2].get(name, 0.0) for name in used}}
            if episodes:  # as rlperf's own rows: the mean score of the last 100 episodes so far
                row["mean_score_100"] = _mean([e[3] for e in episodes[max(0, end - 100):end]])
            out.append(row)
            previous, read = (steps, wall, phases), end
        return out

    @property
    def timer_id(self) -> str:
        """This timer's id in its records: two records with one id are one run's (the CI gate counts it
        once). A forked process's copy of the timer times that process's steps: another id."""
        pid, made = self._id
        return made if pid == os.getpid() else uuid.uuid5(uuid.UUID(made), str(os.getpid())).hex

    def record(self, name: str = "external", num_envs: int = 1, config: Mapping[str, Any] | None = None,
               command: list[str] | None = None) -> dict[str, Any]:
        """The run record of this timer: ``kind: "external"``, its phases, its throughput (``num_envs``
        env transitions per ``step_done()``), the per-step times the CI gate compares, the system."""
        return external_record(self, name=name, num_envs=check_num_envs(num_envs), config=config, command=command)

    def save(self, out: str | Path = "runs", name: str = "external", num_envs: int = 1,
             config: Mapping[str, Any] | None = None) -> Path:
        """Write a run directory ``OUT/NAME-<timestamp>/run.json``; returns the directory.

        ``config``: anything that says what ran (hyperparameters: a nested dict, or a flat ``vars(args)``);
        it is stored as the record's config, as JSON (NaN as ``"nan"``, a path as its string). The CI gate
        compares it within each side, except the keys that name a run (seed, exp_name, run_name, out...).
        """
        from rlperf.atomic import write_json_atomic
        from rlperf.run.files import RECORD_NAME, discard_run_dir, make_run_dir

        # Before the run directory exists: a refused save writes nothing.
        check_num_envs(num_envs)
        checked = config_json(config)
        run_dir = make_run_dir(out, name, prefix="external")
        try:
            record = self.record(name=run_dir.name, num_envs=num_envs)
            record["config"], record["run_dir"] = checked, str(run_dir)
            write_json_atomic(run_dir / RECORD_NAME, record)
        except BaseException:
            discard_run_dir(run_dir)
            raise
        return run_dir


def timers_in_use() -> list[PhaseTimer]:
    """The public timers the script made that timed something (what ``rlperf profile -- python ...`` collects)."""
    registry = script_registry.current
    return [t for t in (registry.timers if registry is not None else ()) if t.steps or any(
        s.calls for s in t.stats().values())]


def check_num_envs(num_envs: Any) -> int:
    """``num_envs`` as the envs one ``step_done()`` steps: a whole number from 1 to :data:`MAX_NUM_ENVS`."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or not 1 <= int(num_envs) <= MAX_NUM_ENVS:
        raise ConfigError(f"num_envs must be a whole number from 1 to {MAX_NUM_ENVS:,}, got {num_envs!r}",
                          hint="the envs one step_done() steps, e.g. envs.num_envs")
    return int(num_envs)


def config_json(config: Any) -> dict[str, Any] | None:
    """``config`` as the record stores it (:func:`json_safe`), or a ConfigError: not a mapping, or a
    value whose ``str`` fails."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a mapping of what ran, got {type(config).__name__}",
                          hint="a dict of hyperparameters, e.g. vars(args)")
    try:
        return json_safe(dict(config))
    except Exception as exc:  # a user's object whose __str__ (or keys) fail: any exception
        raise ConfigError(f"config cannot be stored in the record: {type(exc).__name__}: {exc}",
                          hint="give plain values (numbers, strings, lists, dicts)") from None


def _finite(x: Any) -> bool:
    """A finite real number (a NumPy or torch scalar included), not a bool."""
    if isinstance(x, (bool, str, bytes)):
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def _flat(values: Any) -> list[Any]:
    """A scalar, list, NumPy array or tensor as a flat list (empty for None)."""
    if values is None:
        return []
    tolist = getattr(values, "tolist", None)
    values = tolist() if callable(tolist) else values
    if isinstance(values, (list, tuple)):
        return [v for item in values for v in _flat(item)] if any(isinstance(v, (list, tuple)) for v in values) \
            else list(values)
    return [values]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _check_cuda(device: Any, asked: Any) -> None:
    """Refuse a CUDA timer where that device does not exist (CUDA events would fail at the first phase)."""
    torch = sys.modules["torch"]  # a CUDA device was resolved with it
    if not torch.cuda.is_available():
        raise DeviceError(f"PhaseTimer({asked!r}): CUDA is not available on this machine",
                          hint='time on "cpu", or "auto" (CUDA where there is one)')
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceError(f"PhaseTimer({asked!r}): this machine has {torch.cuda.device_count()} CUDA device(s)",
                          hint="use cuda:0 to cuda:" + str(torch.cuda.device_count() - 1))


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON a record can hold: NaN and infinities as the strings ``"nan"``, ``"inf"``
    (a record's numbers are finite), NumPy scalars as numbers, tuples and sets as lists, mapping keys
    as strings, anything else (a path, a class, a device) as its ``str``; nested past 32 levels as ``str``."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > 32:
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, depth + 1) for v in value]
    item = getattr(value, "item", None)  # a NumPy or torch scalar
    if callable(item) and getattr(value, "shape", None) == ():
        try:
            return json_safe(item(), depth + 1)
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def external_record(timer: PhaseTimer, name: str = "external", num_envs: int | None = None,
                    config: Mapping[str, Any] | None = None, command: list[str] | None = None,
                    status: str = "completed") -> dict[str, Any]:
    """A run record from a timer, in the layout of rlperf's own records where they overlap (``num_envs``
    None: the timer's own, as the script last gave it)."""
    from rlperf.run.files import SCHEMA

    # Unsaid (rlperf profile reading the script's timer): what the script last gave record() or save().
    num_envs = timer.num_envs = check_num_envs(timer.num_envs if num_envs is None else num_envs)
    timing = timer.to_dict()
    wall = float(timing["wall_s"])
    measured = int(timing["measured_steps"])
    env_steps = measured * num_envs
    rate = env_steps / wall if wall > 0 else 0.0
    return {
        "schema": SCHEMA,
        "kind": "external",
        "name": name,
        "run_dir": None,
        "status": status,
        "command": list(command if command is not None else sys.argv),
        "started_at": getattr(timer, "started_at", None),
        "config": config_json(config),
        "system": light_system_info(timer.device),
        "timing": {"mode": timing["mode"], "warmup_steps": timing["warmup_steps"], "warmup_s": timing["warmup_s"],
                   "fill_steps": 0, "measured_steps": measured, "measured_wall_s": wall, "measured_env_steps": env_steps,
                   "vector_step": timing["vector_step"], "nested": dict(timer.nested), "timer_id": timer.timer_id},
        "totals": {"vector_steps": timer.steps, "env_steps": timer.steps * num_envs, "num_envs": num_envs,
                   "wall_s": wall + float(timing["warmup_s"]), "warmup_s": timing["warmup_s"],
                   **({"episodes": len(timer._episodes)} if timer._episodes else {})},
        "throughput": {"env_steps_per_s": rate, "steps_per_s": measured / wall if wall > 0 else 0.0,
                       "s_per_1000_env_steps": 1000.0 / rate if rate > 0 else None},
        "phases": {name: stats for name, stats in timing["phases"].items() if stats["calls"]},  # the ones you used
        "memory": {"peak_rss_mb": _peak_rss_mb(), "rss_scope": "process"},
        "intervals": timer.interval_rows(num_envs),
        **_learning(timer, num_envs),
    }


def _learning(timer: PhaseTimer, num_envs: int) -> dict[str, Any]:
    """The record's ``learning`` and ``time_to_score`` from the episodes the timer was given, in the
    fields rlperf's own records use (a script's score is its return); nothing without episodes."""
    if not timer._episodes:
        return {}
    from rlperf.score import first_reached_each, record_section, target_key

    episodes = sorted(timer._episodes, key=lambda e: e[0])
    returns = [e[3] for e in episodes]
    last = returns[-100:]
    best = max(returns)
    learning = {"mean_score_last_100": sum(last) / len(last), "mean_return_last_100": sum(last) / len(last),
                "best_score": int(best) if best.is_integer() else best,
                "mean_episode_length": _mean([e[4] for e in episodes if e[4] == e[4]]), "episodes": len(returns)}
    reached = {}
    for target, index in zip(timer.score_targets, first_reached_each([], returns, timer.score_targets), strict=True):
        if index is not None:
            steps, wall, run_wall = episodes[index][:3]
            reached[target_key(target)] = {"wall_s": wall, "run_wall_s": run_wall, "env_steps": steps * num_envs,
                                           "updates": None, "episodes": index + 1}
    return {"learning": learning,
            "time_to_score": record_section(timer.score_targets, reached, "every episode (PhaseTimer.episode)")}


def light_system_info(device: Any = "cpu") -> dict[str, Any]:
    """What a timing depends on, without importing torch when the script did not."""
    from rlperf import __version__
    from rlperf.system import cpu_model

    torch = sys.modules.get("torch")
    device_type = device if isinstance(device, str) else device.type
    cuda = device_type == "cuda" and torch is not None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {
        "rlperf": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": getattr(torch, "__version__", None),
        "cuda": torch.version.cuda if torch is not None else None,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda and torch is not None else cpu_model(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "hostname": platform.node(),
    }


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
