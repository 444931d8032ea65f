"""Profile your own loop: the public phase timer and the run record it writes (``kind: "external"``).

Three lines in any training loop::

    timer = rlperf.PhaseTimer("cuda")              # or "cpu"; mode="sync" / "events" on CUDA
    with timer.phase("step"): obs, r, term, trunc, info = envs.step(actions)
    timer.step_done()                              # once per loop iteration (vector step)

and, to keep the result, ``timer.save("runs", num_envs=envs.num_envs)``: a run directory whose
``run.json`` ``rlperf compare`` reads beside rlperf's own runs (and its CI gate,
``--fail-if-slower``). Run the script under ``rlperf profile -- python train.py`` and the phase
table comes with cProfile's top functions and the advisor, without ``save``.

:class:`PhaseTimer` is :class:`rlperf.timers.PhaseTimer` (the timer rlperf's own loop uses: the
same modes, warm-up, free when ``enabled=False``) plus :meth:`PhaseTimer.save`. Importing
``rlperf`` imports none of this; ``rlperf.PhaseTimer`` does, and a CPU timer never imports torch.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import resource
import sys
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlperf import timers

_TIMERS: weakref.WeakSet[PhaseTimer] = weakref.WeakSet()
# Set by ``rlperf profile -- python ...`` (rlperf.instruments.child): called after every step_done().
_on_step: Callable[[PhaseTimer], None] | None = None


class PhaseTimer(timers.PhaseTimer):
    """Times the phases of your loop: ``with timer.phase("name"): ...`` and ``timer.step_done()``.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` or a ``torch.device``: where the timed
            work runs. On CUDA, ``mode="events"`` (the default there: CUDA events, no host sync in
            the loop) or ``"sync"`` (synchronize at each phase edge: exact attribution).
        mode: ``"auto"``, ``"sync"``, ``"events"``, ``"cpu"`` or ``"off"``.
        enabled: ``False`` makes every ``phase()`` one shared null context: free.
        warmup_steps: the first steps, timed apart and left out of the statistics.

    Phases are any names; ``select``, ``step``, ``push``, ``train`` and ``log`` are listed first, in
    that order. Read the statistics with :meth:`stats`, write a record with :meth:`save`.
    """

    def __init__(self, device: Any = "cpu", mode: str = "auto", enabled: bool = True, warmup_steps: int = 0) -> None:
        super().__init__(device, mode=mode, enabled=enabled, warmup_steps=warmup_steps)
        self.started_at = _now()
        _TIMERS.add(self)
        if _on_step is not None and self.enabled:
            hook, timed_step = _on_step, self.step_done

            def step_done() -> None:
                timed_step()
                hook(self)

            self.step_done = step_done  # type: ignore[method-assign]

    def record(self, name: str = "external", num_envs: int = 1, config: Mapping[str, Any] | None = None,
               command: list[str] | None = None) -> dict[str, Any]:
        """The run record of this timer: ``kind: "external"``, its phases, its throughput (``num_envs``
        env transitions per ``step_done()``), the per-step times the CI gate compares, the system."""
        return external_record(self, name=name, num_envs=num_envs, config=config, command=command)

    def save(self, out: str | Path = "runs", name: str = "external", num_envs: int = 1,
             config: Mapping[str, Any] | None = None) -> Path:
        """Write a run directory ``OUT/NAME-<timestamp>/run.json``; returns the directory.

        ``config``: anything that says what ran (hyperparameters); it is stored as the record's config.
        """
        from rlperf.atomic import write_json_atomic
        from rlperf.run.files import RECORD_NAME, make_run_dir

        run_dir = make_run_dir(out, name, prefix="external")
        record = self.record(name=run_dir.name, num_envs=num_envs, config=config)
        record["run_dir"] = str(run_dir)
        write_json_atomic(run_dir / RECORD_NAME, record)
        return run_dir


def timers_in_use() -> list[PhaseTimer]:
    """The public timers alive in this process (what ``rlperf profile -- python ...`` collects)."""
    return [t for t in _TIMERS if t.steps or t.stats()]


def external_record(timer: timers.PhaseTimer, name: str = "external", num_envs: int = 1,
                    config: Mapping[str, Any] | None = None, command: list[str] | None = None,
                    status: str = "completed") -> dict[str, Any]:
    """A run record from a timer, in the layout of rlperf's own records where they overlap."""
    from rlperf.run.files import SCHEMA

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
        "config": dict(config) if config is not None else None,
        "system": light_system_info(timer.device),
        "timing": {"mode": timing["mode"], "warmup_steps": timing["warmup_steps"], "warmup_s": timing["warmup_s"],
                   "fill_steps": 0, "measured_steps": measured, "measured_wall_s": wall, "measured_env_steps": env_steps,
                   "vector_step": timing["vector_step"]},
        "totals": {"vector_steps": timer.steps, "env_steps": timer.steps * num_envs, "num_envs": num_envs,
                   "wall_s": wall + float(timing["warmup_s"]), "warmup_s": timing["warmup_s"]},
        "throughput": {"env_steps_per_s": rate, "steps_per_s": measured / wall if wall > 0 else 0.0,
                       "s_per_1000_env_steps": 1000.0 / rate if rate > 0 else None},
        "phases": {name: stats for name, stats in timing["phases"].items() if stats["calls"]},  # the ones you used
        "memory": {"peak_rss_mb": _peak_rss_mb(), "rss_scope": "process"},
    }


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
