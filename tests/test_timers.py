"""PhaseTimer: counts exact, times loose, warm-up apart, disabled free, resumable."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from rlperf.errors import ConfigError
from rlperf.timers import _NULL, PHASES, PhaseTimer, resolve_timing_mode

CPU = torch.device("cpu")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def run_steps(timer: PhaseTimer, steps: int, train_every: int = 1, sleep_s: dict[str, float] | None = None) -> None:
    """A fake loop: every phase once per step, train every ``train_every`` steps, log twice."""
    sleep_s = sleep_s or {}
    for i in range(steps):
        for name in ("select", "step", "push"):
            with timer.phase(name):
                if name in sleep_s:
                    time.sleep(sleep_s[name])
        if i % train_every == 0:
            with timer.phase("train"):
                if "train" in sleep_s:
                    time.sleep(sleep_s["train"])
        for _ in range(2):
            with timer.phase("log"):
                pass
        timer.step_done()


def test_modes_resolve_on_cpu() -> None:
    for mode in ("auto", "sync", "events", "cpu"):
        assert PhaseTimer(CPU, mode=mode).mode == "cpu"
    assert PhaseTimer(CPU, mode="off").mode == "off"
    assert PhaseTimer(CPU, enabled=False).mode == "off"
    with pytest.raises(ConfigError, match="timing mode"):
        PhaseTimer(CPU, mode="fast")


def test_cpu_mode_refused_on_cuda_device() -> None:
    # Resolution only: no CUDA needed to check the rule.
    with pytest.raises(ConfigError, match="launches"):
        resolve_timing_mode(torch.device("cuda"), "cpu")
    assert resolve_timing_mode(torch.device("cuda"), "auto") == "events"
    assert resolve_timing_mode(torch.device("cuda"), "sync") == "sync"


def test_calls_shares_and_order() -> None:
    timer = PhaseTimer(CPU)
    run_steps(timer, 12, train_every=4)
    stats = timer.stats()
    assert list(stats) == list(PHASES)
    assert [stats[p].calls for p in PHASES] == [12, 12, 12, 3, 24]
    assert sum(s.share for s in stats.values()) == pytest.approx(1.0)
    assert timer.shares() == {name: pytest.approx(s.share) for name, s in stats.items()}
    assert timer.steps == timer.measured_steps == 12


def test_unentered_phase_is_listed_with_zero_calls() -> None:
    timer = PhaseTimer(CPU)
    with timer.phase("step"):
        pass
    timer.step_done()
    stats = timer.stats()
    assert stats["train"].calls == 0 and stats["train"].total_s == 0.0 and stats["train"].p95_ms == 0.0
    assert stats["step"].share == 1.0


def test_extra_phase_names_follow_the_loop_phases() -> None:
    timer = PhaseTimer(CPU)
    with timer.phase("sample"):
        pass
    timer.step_done()
    assert list(timer.stats()) == [*PHASES, "sample"]
    assert timer.stats()["sample"].calls == 1


def test_percentiles_are_exact_over_samples() -> None:
    timer = PhaseTimer(CPU)
    run_steps(timer, 20, sleep_s={"step": 0.002, "train": 0.001})
    for name in ("step", "train"):
        samples = timer.samples(name)
        assert samples.shape == (20,)
        s = timer.stats()[name]
        assert s.p50_ms == pytest.approx(np.percentile(samples, 50) * 1e3)
        assert s.p95_ms == pytest.approx(np.percentile(samples, 95) * 1e3)
        assert s.mean_ms == pytest.approx(samples.mean() * 1e3)
        assert s.total_s == pytest.approx(samples.sum())
    stats = timer.stats()
    # Loose on time: sleep never returns early, and a loaded CI box may be much slower.
    assert 2.0 <= stats["step"].p50_ms < 50.0
    assert 1.0 <= stats["train"].p50_ms < 50.0
    assert stats["step"].share > stats["select"].share


def test_samples_grow_past_initial_capacity() -> None:
    timer = PhaseTimer(CPU)
    n = 3000  # > the initial 1024, so the buffer doubles twice
    for _ in range(n):
        with timer.phase("push"):
            pass
        timer.step_done()
    assert timer.stats()["push"].calls == n
    assert np.all(timer.samples("push") >= 0)


def test_warmup_steps_are_excluded() -> None:
    timer = PhaseTimer(CPU, warmup_steps=3)
    run_steps(timer, 3, sleep_s={"step": 0.01})
    assert timer.stats()["step"].calls == 0
    assert timer.wall_s == 0.0
    warm = timer.warmup_s
    assert warm >= 0.03
    run_steps(timer, 5)
    stats = timer.stats()
    assert stats["step"].calls == 5 and stats["log"].calls == 10
    assert stats["step"].total_s < 0.01  # the slow warm-up sleeps are not in here
    assert timer.warmup_s == pytest.approx(warm)
    assert timer.measured_steps == 5 and timer.steps == 8
    d = timer.to_dict()
    assert d["warmup_phases"]["step"]["calls"] == 3
    assert d["phases"]["step"]["calls"] == 5


def test_wall_time_covers_the_measured_steps() -> None:
    timer = PhaseTimer(CPU, warmup_steps=1)
    t0 = time.perf_counter()
    run_steps(timer, 1, sleep_s={"step": 0.02})
    run_steps(timer, 4, sleep_s={"step": 0.003})
    elapsed = time.perf_counter() - t0
    assert 4 * 0.003 <= timer.wall_s <= elapsed - 0.02  # the warm-up step is not in the wall time
    assert timer.wall_s >= sum(s.total_s for s in timer.stats().values()) * 0.99


def test_disabled_timer_is_one_shared_null_context() -> None:
    for timer in (PhaseTimer(CPU, enabled=False), PhaseTimer(CPU, mode="off")):
        contexts = {id(timer.phase(name)) for name in (*PHASES, "anything")}
        assert contexts == {id(_NULL)}
        run_steps(timer, 5)
        assert timer.stats() == {}
        assert timer.warmup_s == 0.0 and timer.wall_s == 0.0
        assert timer.to_dict()["mode"] == "off"


def test_enabled_timer_reuses_its_context_objects() -> None:
    timer = PhaseTimer(CPU)
    assert timer.phase("push") is timer.phase("push")


def test_exception_inside_phase_is_recorded_and_propagates() -> None:
    timer = PhaseTimer(CPU)
    with pytest.raises(ValueError):
        with timer.phase("train"):
            raise ValueError("boom")
    assert timer.stats()["train"].calls == 1


def test_state_dict_round_trip_continues_statistics() -> None:
    timer = PhaseTimer(CPU, warmup_steps=2)
    run_steps(timer, 6, train_every=2, sleep_s={"step": 0.001})
    state = timer.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)

    resumed = PhaseTimer(CPU, warmup_steps=2)
    resumed.load_state_dict(loaded)
    assert resumed.steps == 6
    before = timer.stats()
    after = resumed.stats()
    assert {n: s.calls for n, s in after.items()} == {n: s.calls for n, s in before.items()}
    assert after["step"].total_s == pytest.approx(before["step"].total_s)
    assert resumed.warmup_s == pytest.approx(timer.warmup_s)
    assert resumed.wall_s == pytest.approx(timer.wall_s)
    np.testing.assert_array_equal(resumed.samples("step"), timer.samples("step"))

    # No second warm-up: new steps are measured at once and extend the wall clock.
    run_steps(resumed, 2, sleep_s={"step": 0.001})
    assert resumed.stats()["step"].calls == before["step"].calls + 2
    assert resumed.wall_s > timer.wall_s


def test_state_dict_resumed_mid_warmup_finishes_warmup() -> None:
    timer = PhaseTimer(CPU, warmup_steps=4)
    run_steps(timer, 2)
    resumed = PhaseTimer(CPU, warmup_steps=4)
    resumed.load_state_dict(timer.state_dict())
    run_steps(resumed, 3)
    assert resumed.stats()["step"].calls == 1
    assert resumed.to_dict()["warmup_phases"]["step"]["calls"] == 4


def test_annotate_marks_profiler_ranges() -> None:
    timer = PhaseTimer(CPU, annotate=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with timer.phase("train"):
            torch.ones(8).sum()
        timer.step_done()
    names = {e.name for e in prof.events()}
    assert "phase:train" in names
    assert timer.stats()["train"].calls == 1


def test_to_dict_is_json_ready() -> None:
    import json

    timer = PhaseTimer(CPU)
    run_steps(timer, 3)
    d = json.loads(json.dumps(timer.to_dict()))
    assert d["mode"] == "cpu"
    assert set(d["phases"]["push"]) == {"total_s", "share", "calls", "mean_ms", "p50_ms", "p95_ms"}


# -- CUDA ---------------------------------------------------------------------------------------


def _gpu_loop(timer: PhaseTimer, steps: int) -> None:
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(steps):
        with timer.phase("select"):
            a.sum()
        with timer.phase("train"):
            for _ in range(4):
                a @ a
        timer.step_done()


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("mode", ["sync", "events"])
def test_cuda_modes_count_and_flush(mode: str) -> None:
    timer = PhaseTimer(torch.device("cuda"), mode=mode, warmup_steps=2)
    assert timer.mode == mode
    _gpu_loop(timer, 10)
    if mode == "events":
        assert timer._pending  # nothing resolved on the hot path
        timer.flush()
        assert not timer._pending
    stats = timer.stats()
    assert stats["train"].calls == 8 and stats["select"].calls == 8
    assert stats["train"].share > 0.5
    assert timer.to_dict()["warmup_phases"]["train"]["calls"] == 2


@pytest.mark.cuda
@cuda
def test_cuda_events_agree_with_sync() -> None:
    device = torch.device("cuda")
    _gpu_loop(PhaseTimer(device, mode="sync"), 3)  # warm the kernels
    sync, events = PhaseTimer(device, mode="sync"), PhaseTimer(device, mode="events")
    _gpu_loop(sync, 20)
    _gpu_loop(events, 20)
    torch.cuda.synchronize()
    s, e = sync.stats()["train"].total_s, events.stats()["train"].total_s
    assert e == pytest.approx(s, rel=0.25)


# -- CUDA modes' bookkeeping, checked on any machine with a stand-in for torch.cuda -------------


class _FakeEvent:
    """Stands in for torch.cuda.Event: 'device time' is host time at record()."""

    created = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        _FakeEvent.created += 1
        self.t: float | None = None

    def record(self, stream: object = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1e3


def test_events_mode_bookkeeping_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    _FakeEvent.created = 0
    timer = PhaseTimer(torch.device("cuda"), warmup_steps=2)
    assert timer.mode == "events"
    run_steps(timer, 2, sleep_s={"step": 0.005})  # warm-up
    run_steps(timer, 4, train_every=2, sleep_s={"step": 0.002})
    assert len(timer._pending) == 2 * 6 + 4 * 5 + 2  # resolved only in flush()
    timer.flush()
    assert not timer._pending
    stats = timer.stats()
    assert [stats[p].calls for p in PHASES] == [4, 4, 4, 2, 8]
    assert stats["step"].p50_ms >= 2.0
    assert timer.warmup_s >= 0.01
    assert timer.to_dict()["warmup_phases"]["log"]["calls"] == 4
    # Events are reused after flush(), not created per entry forever.
    created = _FakeEvent.created
    run_steps(timer, 4)
    timer.flush()
    assert _FakeEvent.created == created
    # A resumed timer takes the same state in events mode.
    again = PhaseTimer(torch.device("cuda"))
    again.load_state_dict(timer.state_dict())
    assert again.stats()["log"].calls == 16


def test_sync_mode_synchronizes_at_every_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    timer = PhaseTimer(torch.device("cuda", 0), mode="sync")
    run_steps(timer, 3)
    entries = 3 * 6
    assert len(calls) == 2 * entries
    assert set(map(str, calls)) == {"cuda:0"}
    assert timer.stats()["log"].calls == 6


def test_each_measured_vector_step_is_a_wall_time_sample() -> None:
    timer = PhaseTimer("cpu", warmup_steps=2)
    for i in range(7):
        with timer.phase("step"):
            time.sleep(0.002 if i != 5 else 0.02)
        timer.step_done()
    stats = timer.step_stats()
    assert stats is not None and stats["calls"] == 5  # the 2 warm-up steps are not samples
    assert 2.0 <= stats["p50_ms"] < 10.0 < stats["p95_ms"] and stats["mean_ms"] > stats["p50_ms"]
    assert timer.to_dict()["vector_step"] == stats
    resumed = PhaseTimer("cpu", warmup_steps=2)
    resumed.load_state_dict(timer.state_dict())
    assert resumed.step_stats() == stats
    assert PhaseTimer("cpu", enabled=False).step_stats() is None


def test_a_cpu_timer_does_not_import_torch() -> None:
    code = ("import sys\nfrom rlperf.timers import PhaseTimer\nt = PhaseTimer('cpu')\n"
            "with t.phase('step'):\n    pass\nt.step_done()\nt.to_dict()\nprint('torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


schedstat = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"),
    reason="needs Linux's per-thread schedstat")


def _busy_steps(timer: PhaseTimer, steps: int, every: int = 1, extra: float = 0.0) -> None:
    """Steps of ~0.6 ms of pure Python work; every ``every``-th step ``extra * every`` times that more
    (the mean: ``extra`` more)."""
    def work(n: int) -> int:
        return sum(i * i for i in range(n))

    for i in range(steps):
        with timer.phase("train"):
            work(15000 + (int(15000 * extra * every) if i % every == 0 else 0))
        timer.step_done()


# Run in a fresh process: in the suite's own process threads and pools earlier tests left (not
# pinned with this thread) shared its CPU and hid the planted cost (+2% for +10%, in two CI runs).
_ONE_STEP_IN_FOUR = """
import json, os, subprocess, sys, time
from rlperf.timers import PhaseTimer


def busy_steps(timer, steps, every=1, extra=0.0):
    def work(n):
        return sum(i * i for i in range(n))

    for i in range(steps):
        with timer.phase("train"):
            work(15000 + (int(15000 * extra * every) if i % every == 0 else 0))
        timer.step_done()


cpus = os.sched_getaffinity(0)
cpu = min(cpus)
os.sched_setaffinity(0, {cpu})
# This VM's speed drifts within a second (the same steps took 0.92 then 1.27 ms, no run-queue wait),
# which no guest-side figure sees: the pair is taken up to three times, one must agree.
for _attempt in range(3):
    quiet, slower = PhaseTimer("cpu"), PhaseTimer("cpu")
    busy_steps(quiet, 500)
    busy_steps(slower, 500, every=4, extra=0.1)  # +40% on one step in four: +10% on the mean
    q, s = quiet.step_stats(), slower.step_stats()
    if 1.04 < s["mean_less_wait_ms"] / q["mean_less_wait_ms"] < 1.25:
        break
# The loaded steps against quiet ones taken just before them, so drift falls on both; as above,
# up to three times, one must agree.
for _attempt in range(3):
    base = PhaseTimer("cpu")
    busy_steps(base, 500)
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\\nwhile True: pass"])
    try:
        time.sleep(0.3)  # the hog is running
        loaded = PhaseTimer("cpu")
        busy_steps(loaded, 500)
    finally:
        hog.kill()
        hog.wait()
    b, lo = base.step_stats(), loaded.step_stats()
    if 0.75 < lo["mean_less_wait_ms"] / b["mean_less_wait_ms"] < 1.3:
        break
print(json.dumps({"q": q, "s": s, "b": b, "lo": lo}))
"""


@schedstat
def test_the_mean_step_less_cpu_waits_sees_a_cost_on_one_step_in_four_and_not_a_busy_cpu() -> None:
    """The gate's second figure: a cost on one step in four moves it (not the p25); a process that
    holds this thread's only CPU half the time stretches the mean ~2x and leaves it where it was."""
    proc = subprocess.run([sys.executable, "-c", _ONE_STEP_IN_FOUR], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    q, s, b, lo = stats["q"], stats["s"], stats["b"], stats["lo"]
    assert q is not None and s is not None and b is not None and lo is not None
    assert q["mean_less_wait_ms"] > 0 and 0 <= q["cpu_wait_share"] < 1
    assert 1.04 < s["mean_less_wait_ms"] / q["mean_less_wait_ms"] < 1.25, (q, s)
    assert lo["cpu_wait_share"] > 0.25 and lo["mean_ms"] / b["mean_less_wait_ms"] > 1.4, (b, lo)
    assert 0.75 < lo["mean_less_wait_ms"] / b["mean_less_wait_ms"] < 1.3, (b, lo)


def test_the_cpu_wait_figures_survive_a_resume() -> None:
    timer = PhaseTimer(CPU)
    _busy_steps(timer, 200)
    before = timer.step_stats()
    resumed = PhaseTimer(CPU)
    resumed.load_state_dict(timer.state_dict())
    after = resumed.step_stats()
    assert before is not None and after is not None
    assert after["mean_less_wait_ms"] == before["mean_less_wait_ms"]
    _busy_steps(resumed, 200)
    later = resumed.step_stats()
    assert later is not None and later["calls"] == 400
    if before["mean_less_wait_ms"] is not None:  # Linux
        assert later["mean_less_wait_ms"] is not None and later["mean_less_wait_ms"] > 0
    # A checkpoint from before the figures: unknown, not made up.
    state = timer.state_dict()
    del state["cpu_waits"]
    old = PhaseTimer(CPU)
    old.load_state_dict(state)
    _busy_steps(old, 100)
    figures = old.step_stats()
    assert figures is not None and figures["mean_less_wait_ms"] is None and figures["cpu_wait_share"] is None
