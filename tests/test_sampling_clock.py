"""The line sampler's CPU clock: the kernel's task-clock event where the system opens it, a POSIX CPU-clock
timer where it does not, and CPU samples that stay fair beside busy processes."""

from __future__ import annotations

import runpy
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from rlperf.instruments import evidence
from rlperf.instruments.profilers import user_code


def _task_clock() -> evidence._TaskClock | None:
    try:
        return evidence._TaskClock(evidence.CPU_SAMPLE_S, signal.SIGVTALRM)
    except (OSError, AttributeError):
        return None


needs_task_clock = pytest.mark.skipif(_task_clock() is None, reason="perf_event_open is not allowed here")


def _spin(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def _count_signals(timer: evidence._ThreadTimer, cpu_s: float) -> tuple[int, float]:
    """Signals the timer sent while the thread spun ``cpu_s`` of CPU, and its expiries' seconds in all."""
    fired = [0, 0.0]

    def tick(signum: int, frame: object) -> None:
        fired[0] += 1
        fired[1] += timer.expired()

    previous = signal.signal(signal.SIGVTALRM, tick)
    try:
        timer.start()
        _spin(cpu_s)
        timer.stop()
        fired[1] += timer.expired()  # the CPU since the last signal
        timer.close()
    finally:
        signal.signal(signal.SIGVTALRM, previous)
    return int(fired[0]), float(fired[1])


@needs_task_clock
def test_the_task_clock_signals_once_per_interval_of_the_thread_s_cpu() -> None:
    timer = _task_clock()
    assert timer is not None
    signals, seconds = _count_signals(timer, 0.3)
    expected = 0.3 / evidence.CPU_SAMPLE_S
    assert 0.9 * expected <= signals <= 1.05 * expected, signals
    assert 0.3 - 2 * evidence.CPU_SAMPLE_S <= seconds <= 0.3 + 2 * evidence.CPU_SAMPLE_S, seconds


def test_without_perf_events_the_cpu_clock_is_a_posix_timer_at_the_tick(monkeypatch) -> None:
    def refused(interval_s: float, signo: int) -> None:
        raise OSError(13, "perf_event_open")

    monkeypatch.setattr(evidence, "_TaskClock", refused)
    timer = evidence.cpu_timer(evidence.CPU_SAMPLE_S, signal.SIGVTALRM)
    assert type(timer) is evidence._ThreadTimer and timer.interval_s == evidence.TICK_S
    signals, seconds = _count_signals(timer, 0.3)
    # beside busy processes a tick-checked timer's signals come late and merge (35 of 75 once): its
    # expiries still add up to the CPU
    assert signals >= 0.25 * 0.3 / evidence.TICK_S and 0.25 <= seconds <= 0.31, (signals, seconds)


MIXED = """\
import random
import time
import torch

x = torch.randn(256, 256)
spent = [0.0]
rng = random.Random(0)

def step():
    torch.mm(x, x)
    t = time.thread_time()
    s = 0
    for i in range(rng.randrange(10000, 30000)):
        s += i
    spent[0] += time.thread_time() - t
    torch.mm(x, x)

"""
"""A pure-Python loop (lines 13 and 14) between two torch calls, which let go of the GIL; ``spent``: its CPU."""


def _sample_mixed(tmp_path: Path, tail: str) -> tuple[dict[int, tuple[float, float]], float]:
    """Run MIXED + ``tail`` under the line sampler (one torch thread): each line's (CPU, wall) samples of
    ``step`` and the script's, and the loop's measured CPU."""
    script = tmp_path / "mixed.py"
    script.write_text(MIXED + textwrap.dedent(tail))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sampler = evidence.LineSampler(user_code([tmp_path]), threading.get_ident())
    try:
        sampler.start()
        spent = runpy.run_path(str(script))["spent"][0]
    finally:
        sampler.stop()
        torch.set_num_threads(threads)
    rows = {line: (cpu, wall) for f, line, fn, cpu, _, wall, _ in sampler.to_dict()["lines"] if fn in ("step", "<module>")}
    return rows, spent


def _loop_cpu(rows: dict[int, tuple[float, float]]) -> float:
    return sum(rows.get(line, (0.0, 0.0))[0] for line in (13, 14)) * evidence.SAMPLE_S


def test_the_line_sampler_weighs_each_line_by_cpu_and_by_wall(tmp_path: Path) -> None:
    """A line that sleeps holds wall time and no CPU; a pure-Python loop between two torch calls holds the CPU
    it took: the sample is taken in the script's thread, where it is, not where it lets go (a sampling thread
    gave such a loop no samples), and a CPU sample is charged where the CPU clock ticked (a wall tick weighted
    by the CPU since the last one read such a loop at 0.5-0.9x beside two busy processes)."""
    rows, spent = _sample_mixed(tmp_path, """\
        end = time.perf_counter() + 1.5
        while time.perf_counter() < end:
            step()
        time.sleep(0.4)
        """)
    sleep_cpu, sleep_wall = rows.get(21, (0, 0))
    assert sleep_wall >= 0.7 * 0.4 / evidence.SAMPLE_S and sleep_cpu <= 0.1 * sleep_wall, rows
    # where only a POSIX CPU-clock timer is at hand, a step of a fixed length can alias with the tick
    assert 0.5 * spent <= _loop_cpu(rows) <= 2 * spent and spent > 0.1, (rows, spent)


@needs_task_clock
def test_beside_two_busy_processes_a_python_loop_between_torch_calls_holds_its_cpu_in_samples(tmp_path: Path) -> None:
    """A POSIX CPU-clock timer is checked at the kernel's tick while the thread holds the CPU: beside two busy
    processes such a loop read 0.50-1.35x of its CPU from it (0.03-0.5x where the loop was short); the task
    clock 0.93-1.04x alone, 0.78x once with the suite's other worker busy too."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        rows, spent = _sample_mixed(tmp_path, """\
            for _ in range(700):
                step()
            """)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert 0.7 * spent <= _loop_cpu(rows) <= 1.4 * spent and spent > 0.15, (rows, spent)


SPIN = """
import queue, sys, threading, time
from rlperf.instruments import evidence
from rlperf.instruments.profilers import user_code

sampler = evidence.LineSampler(user_code([sys.argv[1]]), threading.get_ident())
sampler.start()
q = queue.Queue(64)
def actor():
    for t in range(200):
        time.sleep(0.001)
        q.put(t)
    q.put(None)
threading.Thread(target=actor, daemon=True).start()
while True:
    while q.empty():
        pass
    if q.get() is None:
        break
sampler.stop()
print(type(sampler).__name__, "done")
"""


@needs_task_clock
def test_a_thread_waiting_for_the_gil_gets_it_while_the_sampled_thread_spins(tmp_path: Path) -> None:
    """The handler reads the task clock's count without letting go of the GIL: os.read let it go and took it
    back every millisecond, and a thread waiting for it (an actor after its sleep) never got it."""
    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    try:
        proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the actor thread never got the GIL")
    assert proc.returncode == 0 and "LineSampler done" in proc.stdout, proc.stderr[-2000:]
