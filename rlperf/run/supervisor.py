"""Actor supervision for the async mode: start, health, restart, stall and shutdown of the actor processes.

The learner (:mod:`rlperf.run.learner`) asks its :class:`Supervisor` to :meth:`~Supervisor.check` every
:data:`CHECK_EVERY_S` (and from inside its lock waits): a dead actor ends the run as ``failed`` naming
the actor and its exit code (:class:`ActorFailure`), or is restarted with ``async.restart_actors``; a
live one that has taken no step for ``async.stall_timeout_s`` -- stopped, hung -- is killed and
handled the same way. :meth:`~Supervisor.shutdown` stops them in order: the shared flag, a grace
period, SIGTERM, SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import time
from typing import Any

import numpy as np

from rlperf.config import Config
from rlperf.run.actors import CTRL_STOP, DONE, RUNNING, SLOT, STARTING, STOPPED, Plan, actor_main
from rlperf.run.janitor import Janitor
from rlperf.run.shm import Segment
from rlperf.run.signals import StopSignal

CHECK_EVERY_S = 0.1  # liveness checks: a dead actor is seen within this (+ one update)
START_TIMEOUT_S = 120.0  # an actor that has not taken its first step by then (spawn, imports) is stalled
STOP_GRACE_S = 5.0
MAX_RESTARTS = 10  # per actor; a crash loop ends the run instead of spinning


class ActorFailure(RuntimeError):
    """An actor died and is not (or no longer) restarted."""

    def __init__(self, message: str, detail: dict[str, Any]) -> None:
        super().__init__(message)
        self.detail = detail


class Supervisor:
    """The actor processes of one async run, their health and their restarts.

    ``lock``: the replay lock (``async.buffer=locked``), released for the others when an actor dies
    holding it; ``janitor`` is told every pid, so a killed learner leaves no actor behind.
    """

    def __init__(self, cfg: Config, ctx: Any, plan: Plan, segment: Segment, janitor: Janitor, lock: Any,
                 stop: StopSignal) -> None:
        k = cfg.async_.actors
        self.cfg, self.ctx, self.plan, self.segment, self.janitor, self.lock, self.stop = (
            cfg, ctx, plan, segment, janitor, lock, stop)
        self.slots: np.ndarray = segment.arrays["slots"]
        self.ctrl: np.ndarray = segment.arrays["ctrl"]
        self.procs: list[Any] = [None] * k
        self.pids: list[list[int]] = [[] for _ in range(k)]
        self.restarts = [0] * k
        self.restart_events: list[dict[str, Any]] = []
        self.exit_codes: list[int | None] = [None] * k
        self.progress_seen: list[tuple[float, float]] = [(0.0, time.monotonic())] * k  # (vector steps, since)
        self.stalled: list[float | None] = [None] * k
        self.stepping = [False] * k  # has stepped since it (re)started

    def start_all(self) -> None:
        for i in range(len(self.procs)):
            self.start(i)

    def start(self, index: int) -> None:
        slot = self.slots[index]
        slot[SLOT["state"]] = STARTING
        proc = start_actor(self.ctx, self.plan, index, self.restarts[index])
        self.procs[index] = proc
        self.pids[index].append(proc.pid)
        self.janitor.process(proc.pid)
        self.progress_seen[index] = (float(slot[SLOT["vector_steps"]]), time.monotonic())
        self.stepping[index] = False
        self.stalled[index] = None

    def all_done(self) -> bool:
        return all(int(s) == DONE for s in self.slots[:, SLOT["state"]])

    def all_started(self) -> bool:
        return all(int(s) != STARTING for s in self.slots[:, SLOT["state"]])

    def _check_stalls(self) -> None:
        """An actor alive but taking no step for ``async.stall_timeout_s`` (stopped, hung) is killed
        here; :meth:`check` then handles it like one that died."""
        limit = self.cfg.async_.stall_timeout_s
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if proc is None or proc.exitcode is not None:
                continue
            state = int(self.slots[i, SLOT["state"]])
            steps = float(self.slots[i, SLOT["vector_steps"]])
            seen, since = self.progress_seen[i]
            if steps != seen or state in (DONE, STOPPED):
                self.progress_seen[i] = (steps, now)
                self.stepping[i] = self.stepping[i] or (steps != seen and state == RUNNING)
                continue
            # Until its first step an actor is starting (spawn, imports, the first forward pass).
            allowed = limit if self.stepping[i] else max(START_TIMEOUT_S, 10 * limit)
            if now - since > allowed:
                self.stalled[i] = now - since
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)  # the only signal a stopped process cannot hold back
                proc.join(1.0)

    def check(self) -> None:
        """Liveness: a dead actor is restarted or ends the run (called every CHECK_EVERY_S and in lock waits)."""
        self._check_stalls()
        for i, proc in enumerate(self.procs):
            if proc is None or proc.exitcode is None:
                continue
            state = int(self.slots[i, SLOT["state"]])
            if proc.exitcode == 0 and (state == DONE or (state == STOPPED and self.ctrl[CTRL_STOP])):
                continue
            message, detail = self._ended(i, proc)
            proc.join(0)
            restart = self.cfg.async_.restart_actors
            if not restart or self.restarts[i] >= MAX_RESTARTS or self.stop():
                if restart and self.restarts[i] >= MAX_RESTARTS:
                    message += f" (after {MAX_RESTARTS} restarts)"
                self.exit_codes[i] = proc.exitcode
                self.procs[i] = None
                raise ActorFailure(message, detail)
            if self.lock is not None and self.segment.arrays["holding"][i]:
                # It died inside the replay lock: release it for the others. Its slots were never published.
                self.segment.arrays["holding"][i] = 0
                self.lock.release()
                detail["released_lock"] = True
            self.restarts[i] += 1
            self.restart_events.append({**detail, "message": message})
            self.start(i)

    def _ended(self, i: int, proc: Any) -> tuple[str, dict[str, Any]]:
        """What is known of actor ``i``'s ending: one line, and the detail the record keeps."""
        detected = time.monotonic()
        error = bytes(self.segment.arrays["errors"][i]).split(b"\0", 1)[0].decode(errors="replace")
        stalled = self.stalled[i]
        if stalled is not None:
            limit = self.cfg.async_.stall_timeout_s
            message = (f"actor {i} (pid {proc.pid}) took no step for {stalled:.1f} s (async.stall_timeout_s={limit:g}): "
                       f"stalled, killed")
        else:
            message = describe_exit(i, proc.pid, proc.exitcode, error)
        return message, {
            "actor": i,
            "pid": proc.pid,
            "exit_code": proc.exitcode,
            "error": error or None,
            "stalled_s": stalled,
            "detected_monotonic": detected,
            "env_steps": int(self.slots[:, SLOT["env_steps"]].sum()),
        }

    def shutdown(self) -> None:
        """In order: the shared stop flag, a grace period, then SIGTERM, then SIGKILL."""
        self.ctrl[CTRL_STOP] = 1
        deadline = time.monotonic() + STOP_GRACE_S
        live = [p for p in self.procs if p is not None]
        for proc in live:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in live:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for i, proc in enumerate(self.procs):
            if proc is not None:
                self.exit_codes[i] = proc.exitcode

    def per_actor(self) -> list[dict[str, Any]]:
        """Each actor's pids, exit code, restarts and counters (the record's ``async.per_actor``)."""
        s = self.slots
        return [
            {
                "index": i,
                "pids": self.pids[i],
                "exit_code": self.exit_codes[i],
                "restarts": self.restarts[i],
                "env_steps": int(s[i, SLOT["env_steps"]]),
                "episodes": int(s[i, SLOT["episodes"]]),
                "lock_wait_s": float(s[i, SLOT["lock_wait_s"]]),
            }
            for i in range(len(self.procs))
        ]


def spawn_context() -> Any:
    return mp.get_context("spawn")


def start_actor(ctx: Any, plan: Plan, index: int, incarnation: int) -> Any:
    """Start one actor with SIGINT blocked meanwhile: the child inherits the mask, so a Ctrl-C that
    arrives while it boots cannot reach it, and the learner gets its own copy once unblocked."""
    proc = ctx.Process(target=actor_main, args=(plan, index, incarnation), name=f"rlperf-actor-{index}", daemon=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return proc


def describe_exit(index: int, pid: int, code: int | None, error: str) -> str:
    """``actor 1 (pid 4242) was killed by SIGKILL (exit code -9)``, with the actor's own error if any."""
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            how = f"was killed by signal {-code} (exit code {code})"
    else:
        how = f"exited with code {code}"
    return f"actor {index} (pid {pid}) {how}" + (f": {error}" if error else "")


def register_cleanup(procs: list[Any], segment: Segment) -> Any:
    """atexit safety net (an exception path that skipped the finally): kill live actors, unlink the segment."""

    def cleanup() -> None:
        for proc in procs:
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join(1)
        segment.unlink()

    atexit.register(cleanup)
    return cleanup
