"""Async mode robustness (DESIGN §6, §7) with real processes and real signals.

Each scenario starts ``rlperf train`` in async mode as a separate process (its own session, so a
"Ctrl-C" can be sent to its whole process group like a terminal does), waits until the actors are
stepping, then kills an actor or signals the learner. Every ending must leave no process and no
``/dev/shm`` segment behind, and a record that says what happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from rlperf.run.actors import RUNNING, SLOT
from rlperf.run.shm import SHM_DIR, cleanup_stale

START_TIMEOUT_S = 180  # two cold torch imports on a busy 2-core CI box


class Run:
    """One ``rlperf train`` process in async mode."""

    def __init__(self, tmp_path: Path, name: str, *overrides: str, actors: int = 2) -> None:
        self.out, self.name, self.actors = tmp_path, name, actors
        sets = ["run.mode=async", f"async.actors={actors}", "async.envs_per_actor=8", "train.log_every=5", *overrides]
        cmd = [sys.executable, "-c", "from rlperf.cli import main; main()", "train", "--config", "smoke", "--quiet",
               "--steps", "1000000000", "--out", str(tmp_path), "--name", name]
        for item in sets:
            cmd += ["--set", item]
        self.sets = sets
        self.log = open(tmp_path / f"{name}.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)
        self.seen: set[int] = set()  # every descendant ever seen: none may outlive the run

    def descendants(self) -> None:
        try:
            self.seen.update(child.pid for child in self.ps.children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def slots(self) -> np.ndarray | None:
        """The actors' status slots, read from the run's segment (read-only, like any observer)."""
        from rlperf.run.actors import layout_for
        from rlperf.config import config_from
        from rlperf.dqn import QNetwork
        from rlperf.env.vector import observation_shape

        found = list(Path(SHM_DIR).glob(f"rlperf_{self.proc.pid}_*_run"))
        if not found:
            return None
        cfg = config_from("smoke", self.sets)
        shape = observation_shape(cfg.env.size, cfg.env.obs, cfg.env.flood_fill)
        n = sum(p.numel() for p in QNetwork(shape, 3, list(cfg.agent.hidden)).parameters())
        layout = layout_for(cfg, shape, n)[0]
        try:
            mapped = np.memmap(found[0], dtype=np.uint8, mode="r", shape=(layout.nbytes,))
        except (FileNotFoundError, ValueError):
            return None
        return layout.views(mapped)["slots"].copy()

    def wait_stepping(self) -> list[int]:
        """Until every actor runs and has stepped since the call; returns their pids by actor index."""
        deadline = time.monotonic() + START_TIMEOUT_S
        before = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            self.descendants()
            slots = self.slots()
            if slots is not None:
                steps = slots[:, SLOT["vector_steps"]]
                before = steps.copy() if before is None else before
                if ((slots[:, SLOT["state"]] == RUNNING) & (steps >= before + 3)).all():
                    return [int(p) for p in slots[:, SLOT["pid"]]]
            time.sleep(0.1)
        raise AssertionError(f"actors not stepping after {START_TIMEOUT_S} s:\n{self.output()}")

    def run_dir(self) -> Path | None:
        found = sorted(self.out.glob(f"{self.name}-*/"))
        return found[0] if found else None

    def finish(self, timeout: float = 60) -> tuple[int, dict]:
        self.descendants()
        code = self.proc.wait(timeout)
        self.log.close()
        d = self.run_dir()
        assert d is not None and (d / "run.json").exists(), self.output()
        return code, json.loads((d / "run.json").read_text())

    def assert_nothing_left(self, record: dict | None = None) -> None:
        """No descendant process alive (zombies awaiting a reaper do not run), no segment of this run."""
        pids = set(self.seen)
        if record is not None:
            pids |= {pid for a in record["async"]["per_actor"] for pid in a["pids"]}
        deadline = time.monotonic() + 10  # the resource tracker exits once its last user is gone
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.1)
        assert not [p for p in pids if _running(p)], f"processes left behind: {[p for p in pids if _running(p)]}"
        assert not list(Path(SHM_DIR).glob(f"rlperf_{self.proc.pid}_*"))

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.out / f"{self.name}.log").read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in self.seen:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_an_actor(run: Run) -> dict[str, Any]:
    victim = run.wait_stepping()[1]
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code, record = run.finish()
    return {"victim": victim, "killed_at": killed_at, "code": code, "record": record}


def _restart_then_ctrl_c(run: Run) -> dict[str, Any]:
    first = run.wait_stepping()
    os.kill(first[0], signal.SIGKILL)
    replaced = run.wait_stepping()  # the replacement steps
    os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group gets it
    code, record = run.finish()
    return {"first": first, "replaced": replaced, "code": code, "record": record}


def _sigterm_the_learner(run: Run) -> dict[str, Any]:
    run.wait_stepping()
    run.proc.send_signal(signal.SIGTERM)
    code, record = run.finish()
    return {"code": code, "record": record}


def _kill_the_learner(run: Run) -> dict[str, Any]:
    actor = run.wait_stepping()[0]
    run.proc.send_signal(signal.SIGKILL)  # no chance to clean up
    run.proc.wait(10)
    deadline = time.monotonic() + 10
    while _running(actor) and time.monotonic() < deadline:  # the actor notices its parent is gone
        time.sleep(0.05)
    return {"actor": actor}


SCENARIOS: dict[str, tuple[tuple[str, ...], int, Callable[[Run], dict[str, Any]]]] = {
    "crash": ((), 2, _kill_an_actor),
    "restart": (("async.restart_actors=true", "async.buffer=locked"), 1, _restart_then_ctrl_c),
    "term": (("async.wait=sleep",), 1, _sigterm_the_learner),
    "orphan": ((), 1, _kill_the_learner),
}
# Each scenario is mostly two or three cold starts of a torch process, one after the other: run side by
# side, they use both cores. The killed actor, whose detection is timed (under a second), runs alone.
PHASES = (("crash",), ("restart", "term", "orphan"))


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Run, Any]]]:
    """Every scenario's run and what it saw; any run still going at the end is killed."""
    from concurrent.futures import ThreadPoolExecutor

    base = tmp_path_factory.mktemp("async")
    runs: dict[str, Run] = {}
    outcomes: dict[str, Any] = {}
    try:
        for phase in PHASES:
            for name in phase:
                sets, actors, _ = SCENARIOS[name]
                runs[name] = Run(base, name, *sets, actors=actors)
            with ThreadPoolExecutor(max_workers=len(phase)) as pool:
                futures = {name: pool.submit(SCENARIOS[name][2], runs[name]) for name in phase}
            outcomes.update((name, f) for name, f in futures.items())
        yield {name: (runs[name], outcomes[name]) for name in runs}
    finally:
        for run in runs.values():
            run.kill()


def _outcome(played: dict[str, tuple[Run, Any]], name: str) -> tuple[Run, dict[str, Any]]:
    """A scenario's run and outcome; its exception (an assertion in the scenario), raised here."""
    run, future = played[name]
    return run, future.result()


def test_killed_actor_fails_the_run_within_a_second(played: dict[str, tuple[Run, Any]]) -> None:
    run, o = _outcome(played, "crash")
    code, record, victim = o["code"], o["record"], o["victim"]
    assert code == 1 and record["status"] == "failed"
    index = next(a["index"] for a in record["async"]["per_actor"] if victim in a["pids"])
    assert f"actor {index} (pid {victim}) was killed by SIGKILL (exit code -9)" in record["error"]
    failure = record["async"]["failure"]
    assert failure["pid"] == victim and failure["exit_code"] == -9
    assert failure["detected_monotonic"] - o["killed_at"] < 1.0  # CLOCK_MONOTONIC is system-wide on Linux
    other = record["async"]["per_actor"][1 - index]
    assert other["exit_code"] == 0  # stopped in order through the shared flag
    run.assert_nothing_left(record)


def test_restarted_actor_then_ctrl_c(played: dict[str, tuple[Run, Any]]) -> None:
    run, o = _outcome(played, "restart")
    code, record, first, replaced = o["code"], o["record"], o["first"], o["replaced"]
    assert replaced[0] != first[0]
    assert code == 130 and record["status"] == "interrupted", run.output()
    a = record["async"]
    assert a["restarts"] == 1 and a["restart_events"][0]["pid"] == first[0] and a["restart_events"][0]["exit_code"] == -9
    index = a["restart_events"][0]["actor"]
    assert index == 0 and a["per_actor"][0]["pids"] == [first[0], replaced[0]]
    # Actors ignore SIGINT: the replacement stopped on the learner's flag, cleanly.
    assert a["per_actor"][0]["exit_code"] == 0
    assert "KeyboardInterrupt" not in run.output()
    run.assert_nothing_left(record)


def test_sigterm_to_the_learner_interrupts_cleanly(played: dict[str, tuple[Run, Any]]) -> None:
    run, o = _outcome(played, "term")
    code, record = o["code"], o["record"]
    assert code == 143 and record["status"] == "interrupted"
    assert record["async"]["per_actor"][0]["exit_code"] == 0
    assert (run.run_dir() / "checkpoint.pt").exists()
    run.assert_nothing_left(record)


def test_killed_learner_leaves_no_actor_and_its_segment_is_cleaned(played: dict[str, tuple[Run, Any]]) -> None:
    run, o = _outcome(played, "orphan")
    assert not _running(o["actor"])
    cleanup_stale()  # what the next run does first (the resource tracker may have been quicker)
    run.assert_nothing_left()
