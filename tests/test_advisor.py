"""The advisor's rules on synthetic evidence: each fires on its evidence only, says which, and ranks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rlperf.instruments import advisor
from rlperf.instruments.advisor import RULES, Finding, VerifyBase, advise, no_finding_reason
from rlperf.instruments.catalogue import CATALOGUE, reference
from rlperf.report.profile import render_findings
from rlperf.config import config_from, config_to_dict
from rlperf.instruments.profilers import CallStats
from rlperf.report.tables import render_to_str

RLPERF = advisor.__file__.rsplit("/", 2)[0]


def phases(**seconds: float) -> dict[str, dict[str, Any]]:
    total = sum(seconds.values())
    return {name: {"total_s": s, "share": s / total, "calls": 100, "mean_ms": 10 * s, "p50_ms": 9 * s, "p95_ms": 20 * s}
            for name, s in seconds.items()}


# Micro-benchmarks as a profiled run stores them (profile.microbench): seconds per call of each form.
MICRO = {
    "push": {"what": "push of 32 transitions", "slow": "buffer.push=loop", "fast": "buffer.push=batch",
             "slow_s": 1e-3, "fast_s": 5e-5, "repeats": 7},
    "storage_sample": {"what": "sample of 256 transitions", "slow": "buffer.storage=list", "fast": "buffer.storage=tensor",
                       "slow_s": 5e-4, "fast_s": 2e-5, "repeats": 7},
    "flood_fill": {"what": "env step of 32 boards", "slow": "env.flood_fill=bfs", "fast": "env.flood_fill=tensor",
                   "slow_s": 0.06, "fast_s": 0.002, "repeats": 7},
    "target": {"what": "target update", "slow": "a hard state-dict copy", "fast": "a soft foreach lerp",
               "slow_s": 8e-5, "fast_s": 1.3e-5, "repeats": 7},
    "inference": {"what": "action selection for 32 boards", "slow": "agent.inference=grad",
                  "fast": "agent.inference=no_grad", "slow_s": 1e-3, "fast_s": 6e-4, "repeats": 7},
    "backend": {"what": "env step of 32 boards", "slow": "env.backend=gym-sync", "fast": "env.backend=tensor",
                "slow_s": 0.02, "fast_s": 0.0005, "repeats": 7},
    "kernel": {"what": "env step of 32 boards", "slow": "env.kernel=ops", "fast": "env.kernel=fused",
               "slow_s": 1e-3, "fast_s": 3e-5, "repeats": 7},
    "threads": {"what": "gradient update", "slow": "8 threads per pool", "fast": "1 thread per pool",
                "slow_s": 0.03, "fast_s": 0.01, "repeats": 25},
    "amp": {"what": "gradient update", "slow": "train.amp=off", "fast": "train.amp=bf16", "slow_s": 1e-3, "fast_s": 7e-4,
            "repeats": 7},
    "batch": {"what": "gradient update", "slow": "buffer.batch_size=256", "fast": "4× the batch", "slow_s": 9e-4,
              "fast_s": 1.1e-3, "repeats": 7},
}


def record(config: str = "naive", sets: tuple[str, ...] = (), device: str = "cpu", threads: int = 1,
           vector_steps: int = 110, micro: dict[str, Any] | None = None, **seconds: float) -> dict[str, Any]:
    cfg = config_from(config, list(sets), envs=32, steps=3200)
    return {
        "config": config_to_dict(cfg),
        "phases": phases(**(seconds or {"select": 1.0, "step": 10.0, "push": 3.0, "train": 40.0, "log": 1.0})),
        "timing": {
            "mode": "cpu",
            "warmup_steps": 10,
            "warmup_s": 1.0,
            "measured_steps": vector_steps - 10,
            "measured_wall_s": 55.0,
            "measured_updates": 800,
        },
        "totals": {"vector_steps": vector_steps, "updates": 800, "env_steps": 32 * vector_steps},
        "throughput": {"replay_ratio": 64.0, "updates_per_s": 14.5},
        "system": {"device": device, "device_name": "NVIDIA H100" if device == "cuda" else "cpu", "torch_threads": threads},
        "profile": {"microbench": MICRO if micro is None else micro},
    }


def calls(entries: dict[tuple[str, str], tuple[int, float, float]]) -> CallStats:
    """A CallStats over made-up cProfile entries: (file under rlperf or '~', function) -> (calls, tottime, cumtime)."""
    raw = {}
    for i, ((file, func), (n, tt, ct)) in enumerate(entries.items()):
        path = "~" if file == "~" else (file if file.startswith("torch/") else f"{RLPERF}/{file}")
        raw[(path, 0 if file == "~" else i + 1, func)] = (n, n, tt, ct, {})
    return CallStats(SimpleNamespace(stats=raw, total_calls=0, prim_calls=0, total_tt=0.0))


NAIVE_CALLS = calls(
    {
        ("buffer.py", "write_one"): (3520, 2.0, 3.0),
        ("~", "<method 'item' of 'torch._C.TensorBase' objects>"): (10560, 0.5, 0.5),
        ("dqn.py", "update"): (800, 1.0, 40.0),
        ("buffer.py", "sample"): (800, 6.0, 12.0),
        ("env/vector.py", "step"): (110, 0.1, 10.0),
        ("env/floodfill.py", "reachable_bfs"): (110, 0.1, 9.0),
        ("env/floodfill.py", "bfs_count"): (10560, 8.5, 8.8),
        ("dqn.py", "_hard_update"): (800, 0.01, 2.5),
        ("torch/nn/modules/module.py", "load_state_dict"): (8, 0.1, 2.4),
        ("run/lifecycle.py", "on_log"): (110, 0.1, 0.9),
    }
)

KNOBS_NAIVE = {"buffer.push=batch", "train.train_ratio=4", "env.flood_fill=tensor"}


def knobs(findings: list[Finding]) -> set[str]:
    return {f.knob for f in findings}


def test_naive_evidence_names_push_ratio_and_bfs_ranked_by_measured_saving() -> None:
    findings = advise(record(), NAIVE_CALLS, {"share_of_loop": 0.0}, VerifyBase("configs/naive.toml", ("--steps", "3200")))
    assert KNOBS_NAIVE <= knobs(findings)
    assert {"buffer.storage=tensor", "train.log_every=100"} <= knobs(findings)
    savings = [f.est_saving_s for f in findings if f.est_saving_s is not None]
    assert savings == sorted(savings, reverse=True)
    assert findings[0].knob == "train.train_ratio=4"  # 40 s of train at ratio 64 outweighs the rest
    for f in findings:
        assert f.command == f"rlperf compare configs/naive.toml --vs {f.knob} --steps 3200"
        assert f.reference.startswith("docs/bottlenecks.md §") and f.expected_gain and f.evidence and f.fix
    ratio = findings[0]
    assert ratio.est_saving_s == pytest.approx(40.0 * (1 - 4 / 64))
    assert "50 ms per update measured in this run" in ratio.estimate
    push = next(f for f in findings if f.knob == "buffer.push=batch")
    assert "push is" in push.evidence and "write_one called 3,520 times (32 per vector step)" in push.evidence
    assert "2–5×" in push.expected_gain and push.reference == "docs/bottlenecks.md §1 (rlperf explain 1)"
    # The saving is the run's push time scaled by what the batch push keeps of it, both forms timed here.
    assert push.est_saving_s == pytest.approx(3.0 * (1 - 5e-5 / 1e-3))
    assert "50 µs / 1 ms per push of 32 transitions" in push.estimate and "micro-benchmarked here" in push.estimate
    bfs = next(f for f in findings if f.knob == "env.flood_fill=tensor")
    assert "bfs_count called 10,560 times" in bfs.evidence and "90% of the env step" in bfs.evidence
    assert bfs.est_saving_s == pytest.approx(10.0 * (1 - 0.002 / 0.06))
    # 8 copies at 80 µs against a lerp on each of 800 updates at 13 µs: the soft form costs more than
    # the copies it replaces, so there is nothing to save (its point is the p95, §7).
    assert "agent.target_update=soft" not in knobs(findings)
    every_update = calls({("dqn.py", "_hard_update"): (800, 0.01, 2.5),
                          ("torch/nn/modules/module.py", "load_state_dict"): (800, 0.1, 2.4)})
    target = next(f for f in advise(record(), every_update, None) if f.knob == "agent.target_update=soft")
    assert "800 lerps" in target.estimate and "800 copies" in target.estimate
    assert target.est_saving_s == pytest.approx(2.5 * 55 / 56 * (1 - 1.3e-5 / 8e-5))


def test_a_fix_that_the_micro_benchmark_shows_no_faster_is_not_advised() -> None:
    micro = {**MICRO, "inference": {**MICRO["inference"], "fast_s": 1.1e-3}}  # inference mode no faster here
    assert "agent.inference=no_grad" not in knobs(advise(record(micro=micro), NAIVE_CALLS, None))
    assert "agent.inference=no_grad" in knobs(advise(record(), NAIVE_CALLS, None))


def test_without_a_micro_benchmark_the_saving_is_not_measured_and_ranks_last() -> None:
    findings = advise(record(micro={}), NAIVE_CALLS, None)
    push = next(f for f in findings if f.knob == "buffer.push=batch")
    assert push.est_saving_s is None and push.estimate.startswith("not measured")
    measured = [f.est_saving_s is not None for f in findings]
    assert measured == sorted(measured, reverse=True)  # measured first, then the rest
    assert findings[0].knob == "train.train_ratio=4"  # its saving is counted, not micro-benchmarked
    failed = {"push": {"what": "push", "slow": "a", "fast": "b", "error": "RuntimeError: boom"}}
    push = next(f for f in advise(record(micro=failed), NAIVE_CALLS, None) if f.knob == "buffer.push=batch")
    assert "RuntimeError: boom" in push.estimate


def test_fast_config_names_none_of_the_naive_bottlenecks() -> None:
    fast = record("fast")
    fast_calls = calls(
        {
            ("dqn.py", "update"): (800, 1.0, 40.0),
            ("buffer.py", "sample"): (800, 0.5, 1.0),
            ("env/vector.py", "step"): (110, 0.1, 10.0),
        }
    )
    found = knobs(advise(fast, fast_calls, {"share_of_loop": 0.001}))
    assert not found & KNOBS_NAIVE
    assert not found & {"buffer.storage=tensor", "agent.target_update=soft", "train.log_every=100", "train.gc=freeze"}


def test_fast_config_at_the_naive_train_ratio_is_told_about_it() -> None:
    # fast.toml at --train-ratio 64 (to compare the other fixes at naive's ratio): the evidence still says so.
    assert "train.train_ratio=4" in knobs(advise(record("fast", ("train.train_ratio=64",)), None, None))


def test_rules_fire_only_on_their_evidence() -> None:
    # Slow knobs with no time measured in their phases: nothing to gain, no finding.
    idle = record(select=0.0, step=0.0, push=0.0, train=50.0, log=0.0, sets=("train.train_ratio=4", "train.update=fused"))
    assert knobs(advise(idle, None, None)) == set()
    # A push loop that costs under the floor (0.25% of the phase time) is not worth a line.
    cheap = record(select=1.0, step=10.0, push=0.2, train=200.0, log=0.1, sets=("train.train_ratio=4",))
    assert "buffer.push=batch" not in knobs(advise(cheap, None, None))


def test_without_cprofile_the_cprofile_only_rules_stay_quiet() -> None:
    findings = advise(record(), None, None)
    bfs = next(f for f in findings if f.knob == "env.flood_fill=tensor")
    assert "bfs_count" not in bfs.evidence and bfs.est_saving_s == pytest.approx(10.0 * (1 - 0.002 / 0.06))
    assert not knobs(findings) & {"buffer.storage=tensor", "agent.target_update=soft"}


def test_gc_rule_reads_gc_counts_and_respects_the_knob() -> None:
    gc = {
        "share_of_loop": 0.08,
        "total_s": 4.0,
        "total_collections": 900,
        "max_pause_ms": 120.0,
        "collections": {"gen0": 880, "gen1": 15, "gen2": 5},
    }
    found = advise(record(), None, gc)
    f = next(f for f in found if (f.knob or "").startswith("train.gc="))
    assert f.knob == "train.gc=off"  # a list buffer's tuples are born in the loop: freeze would not cover them
    assert "900 collections" in f.evidence and "gen2 5" in f.evidence and "gc.callbacks" in f.evidence
    assert f.est_saving_s == pytest.approx(4.0 * 55 / 56)  # the collector's time, scaled to the measured window
    assert "train.gc=freeze" in knobs(advise(record("default"), None, gc))
    assert not any(k.startswith("train.gc") for k in knobs(advise(record("fast"), None, gc)))  # fast: gc=freeze


def test_gpu_rules_need_a_cuda_run() -> None:
    cfg = ("train.train_ratio=1",)
    gpu = record("classic", cfg, device="cuda", select=1.0, step=2.0, push=0.5, train=10.0, log=0.2)
    gpu["timing"]["measured_updates"] = 11_000  # 0.9 ms each: launch-bound
    found = advise(gpu, None, None)
    assert {"train.amp=bf16", "train.compile=reduce-overhead", "buffer.batch_size=1024"} <= knobs(found)
    cpu = record("classic", cfg, select=1.0, step=2.0, push=0.5, train=10.0, log=0.2)
    assert not knobs(advise(cpu, None, None)) & {"train.amp=bf16", "train.compile=reduce-overhead", "buffer.batch_size=1024"}
    amp = next(f for f in found if f.knob == "train.amp=bf16")
    assert "30–40%" in amp.expected_gain and "NVIDIA H100" in amp.evidence
    assert amp.est_saving_s == pytest.approx(10.0 * (1 - 7e-4 / 1e-3))
    batch = next(f for f in found if f.knob == "buffer.batch_size=1024")
    assert batch.est_saving_s == pytest.approx(10.0 * (1 - 1.1e-3 / (4 * 9e-4)))
    compiled = next(f for f in found if f.knob == "train.compile=reduce-overhead")
    assert compiled.est_saving_s is None and found[-1] is compiled  # not measured: listed last
    gpu["timing"]["measured_updates"] = 800  # 12 ms per update: compute-bound, a bigger batch would not be free
    assert "buffer.batch_size=1024" not in knobs(advise(gpu, None, None))
    gpu["update"] = {"form": "graph", "reason": "auto: a CUDA device"}  # AMP or compile would give the graph up
    assert not knobs(advise(gpu, None, None)) & {"train.amp=bf16", "train.compile=reduce-overhead"}


def test_thread_oversubscription(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advisor, "effective_cpus", lambda: 2.0)
    found = advise(record("default", ("train.train_ratio=1",), threads=8), None, None)
    f = next(f for f in found if f.id == "threads")
    assert f.knob == "run.threads=1" and "1 process(es) × 8 threads = 8 on 2 usable CPUs" in f.evidence
    assert f.reference == reference("threads")
    assert f.est_saving_s == pytest.approx((1.0 + 40.0) * (1 - 0.01 / 0.03))
    # Without the micro-benchmark, the count that fits the CPUs, not measured.
    unmeasured = record("default", threads=8, micro={})
    f = next(f for f in advise(unmeasured, None, None) if f.id == "threads")
    assert f.knob == "run.threads=2" and f.est_saving_s is None
    # Two threads on two CPUs: the update timed with one thread decides.
    busy = record("default", threads=2)
    busy["profile"]["load"] = {"loadavg_1m": 7.5, "cpus": 2.0}
    f = next(f for f in advise(busy, None, None) if f.id == "threads")
    assert f.knob == "run.threads=1" and "(load average 7.5 on 2 CPUs)" in f.evidence
    # ...and when one thread was no faster, there is nothing to say.
    busy["profile"]["microbench"] = {**MICRO, "threads": {**MICRO["threads"], "fast_s": 0.04}}
    assert not any(f.id == "threads" for f in advise(busy, None, None))


def test_gym_backend_rule() -> None:
    gym = record("default", ("env.backend=gym-sync",), select=1.0, step=30.0, push=1.0, train=10.0, log=0.2)
    f = next(
        f for f in advise(gym, calls({("env/single.py", "step"): (3520, 5.0, 25.0)}), None) if f.knob == "env.backend=tensor"
    )
    assert "SnakeEnv.step called 3,520 times (32 per vector step" in f.evidence and f.reference == reference("env_backend")
    assert f.est_saving_s == pytest.approx(30.0 * (1 - 0.0005 / 0.02))
    # gym-async: the run's own step time is the slow figure.
    asynced = record("default", ("env.backend=gym-async",), select=1.0, step=30.0, push=1.0, train=10.0, log=0.2,
                     micro={"backend": {**MICRO["backend"], "slow_s": None}})
    f = next(f for f in advise(asynced, None, None) if f.knob == "env.backend=tensor")
    assert f.est_saving_s == pytest.approx(30.0 - 100 * 0.0005)


def test_episode_growth_rule_says_which_factor_grew() -> None:
    rows, wall, steps = [], 0.0, 0
    for length in [14] * 6 + [30, 50, 70, 70, 70, 70]:
        steps += 3200
        wall += 3200 * 40e-6
        rows.append({"env_steps": steps, "wall_s": wall, "episodes": round(3200 / length), "mean_episode_length": length})
    longer = record("default")
    longer["intervals"] = rows
    f = next(f for f in advise(longer, None, None) if f.reference == "docs/bottlenecks.md §19 (rlperf explain 19)")
    assert f.evidence.startswith("episodes get longer, not the loop slower") and f.knob is None and f.command is None
    assert f.est_saving_s is None and "--steps" in f.fix and "steps per episode ×" in f.evidence
    assert not any(f.id == "episode_growth" for f in advise(record("default"), None, None))


def test_ops_kernel_rule() -> None:
    vector = f"{RLPERF}/env/vector.py"
    where = ("~", 0, "<built-in method where of type object at 0x1>")
    raw = {where: (1540, 1540, 1.0, 1.0, {(vector, 300, "_step_ops"): (1540, 1540, 1.0, 1.0)}),
           (vector, 300, "_step_ops"): (110, 110, 1.0, 20.0, {})}
    stats = CallStats(SimpleNamespace(stats=raw, total_calls=0, prim_calls=0, total_tt=0.0))
    seconds = dict(select=1.0, step=20.0, push=1.0, train=10.0, log=0.2)
    ops = record("default", ("env.kernel=ops",), **seconds)
    f = next(f for f in advise(ops, stats, None) if f.knob == "env.kernel=fused")
    assert "with env.kernel=ops" in f.evidence and "14 torch calls per vector step from the env" in f.evidence
    assert f.id == "env_kernel" and f.title == "Env step is operator dispatch"
    assert f.est_saving_s == pytest.approx(20.0 * (1 - 0.03))
    assert "env.kernel=fused against env.kernel=ops, micro-benchmarked here" in f.estimate
    assert f.reference == "docs/bottlenecks.md §6 (rlperf explain 6)" and f.fix and f.command
    assert "seed" not in f.expected_gain and "DESIGN" not in f.expected_gain + f.evidence
    # auto fell back to ops (the record says so): the same finding, without cProfile evidence.
    fallback = record("default", (), **seconds)
    fallback["env"] = {"kernel": "ops", "reason": "auto: numba cannot be imported"}
    assert "env.kernel=fused" in knobs(advise(fallback, None, None))
    # Nothing to say when fused ran, on a GPU, with the Python BFS, or with a Gymnasium backend.
    ran_fused = record("default", ("env.kernel=ops",), **seconds)
    ran_fused["env"] = {"kernel": "fused", "reason": "env.kernel=fused"}
    for rec in (ran_fused, record("default", ("env.kernel=fused",), **seconds),
                record("default", ("env.kernel=ops",), device="cuda", **seconds),
                record("default", ("env.kernel=ops", "env.flood_fill=bfs"), **seconds),
                record("default", ("env.backend=gym-sync",), **seconds)):
        assert "env.kernel=fused" not in knobs(advise(rec, stats, None))


def test_no_measured_steps_means_no_finding_and_says_why() -> None:
    short = record(vector_steps=5)
    short["timing"]["measured_steps"] = 0
    assert advise(short, NAIVE_CALLS, None) == []
    assert "warm-up" in no_finding_reason(short)
    quiet = record("fast")
    assert "no finding" in no_finding_reason(quiet)


def test_every_rule_is_a_function_of_the_four_evidence_sources() -> None:
    rec, cfg = record(), config_from("naive", [], envs=32, steps=3200)
    for rule in RULES:
        result = rule(rec, cfg, NAIVE_CALLS, {"share_of_loop": 0.0})
        assert result is None or isinstance(result, Finding)


def test_compare_lines_measure_what_the_profile_measured() -> None:
    base = VerifyBase("naive", ("--set", "run.threads=1", "--episodes", "100", "--repeats=2"))
    window = base.for_window(20_736)
    assert window.command("buffer.push=batch") == (
        "rlperf compare naive --vs buffer.push=batch --set run.threads=1 --steps 20736 --repeats 3")


def test_render_findings_and_the_empty_case() -> None:
    findings = [f.as_dict() for f in advise(record(), NAIVE_CALLS, None, VerifyBase("configs/naive.toml"))]
    findings[0]["verified"] = {"speedup": 2.9, "spread": 0.2, "repeats": 3, "inside_noise": False}
    text = render_to_str(render_findings(findings, 55.0), width=200)
    assert "1. " in text and "could save ~" in text and "verify: rlperf compare configs/naive.toml --vs" in text
    assert "estimate: train phase 40.00 s × (1 − 4/64)" in text and "fix: " in text
    assert "measured: 2.90× ± 0.20 env steps/s over 3 interleaved repeats; estimated 3.14× of the measured phase time" in text
    assert "no finding: nothing" in render_to_str(render_findings([], 1.0, "no finding: nothing"))


def test_threads_starved_during_the_run_are_seen_from_the_run_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advisor, "effective_cpus", lambda: 2.0)
    # 2 threads on 2 CPUs and a quiet load average at the end, but 50 ms per update in the run
    # against 5 ms for the same update right after it: the threads waited for CPUs while it ran.
    starved = record("default", ("train.train_ratio=1",), threads=2,
                     micro={"threads": {**MICRO["threads"], "slow": "2 threads per pool", "fast": "1 thread per pool",
                                        "slow_s": 0.005, "fast_s": 0.006}})
    f = next(f for f in advise(starved, None, None) if f.id == "threads")
    assert f.knob == "run.threads=1" and "threads were starved while it ran" in f.estimate
    assert f.est_saving_s == pytest.approx(40.0 - 800 * 0.006) and "50 ms in the run itself" in f.evidence
    # The run's updates as fast as the benchmark's: nothing to say.
    calm = record("default", ("train.train_ratio=1",), threads=2,
                  micro={"threads": {**MICRO["threads"], "slow_s": 0.045, "fast_s": 0.06}})
    assert not any(f.id == "threads" for f in advise(calm, None, None))


def test_threads_ranked_by_the_measured_saving(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threads finding carries the micro-benchmark's figure and takes its place by it: first
    when one thread saves more than any other fix (an update 30× dearer on the run's two threads)."""
    monkeypatch.setattr(advisor, "effective_cpus", lambda: 2.0)
    micro = {**MICRO, "threads": {**MICRO["threads"], "slow_s": 0.15, "fast_s": 0.005}}
    found = advise(record("naive", threads=2, micro=micro), NAIVE_CALLS, {"share_of_loop": 0.0})
    assert found[0].id == "threads" and found[0].est_saving_s == pytest.approx((1.0 + 40.0) * (1 - 0.005 / 0.15))
    # A small figure ranks where it belongs: below the fixes that save more.
    micro["threads"] = {**MICRO["threads"], "slow_s": 0.05, "fast_s": 0.0495}
    found = advise(record("naive", threads=2, micro=micro), NAIVE_CALLS, {"share_of_loop": 0.0})
    ids = [f.id for f in found]
    assert "threads" in ids and ids.index("threads") > 3
    savings = [f.est_saving_s for f in found if f.est_saving_s is not None]
    assert savings == sorted(savings, reverse=True)


def test_a_loop_mostly_waiting_for_a_cpu_hears_it_first() -> None:
    waiting = record("naive", threads=1)
    waiting["timing"]["vector_step"] = {"cpu_wait_share": 0.72}
    waiting["threads"] = {"count": 1, "contention": {"loadavg_1m_end": 4.1, "cpus": 2.0, "wait_share": 0.7}}
    found = advise(waiting, NAIVE_CALLS, {"share_of_loop": 0.0})
    assert found[0].id == "threads" and "waited for a CPU 72% of its measured time" in found[0].evidence
    assert "load average 4.1 on 2 CPUs" in found[0].evidence and not found[0].knob and not found[0].command
    assert len(found) > 1  # the other findings stay, after it
    # Below the share that matters, a one-thread loop gets no threads finding at all.
    waiting["timing"]["vector_step"] = {"cpu_wait_share": 0.2}
    assert not any(f.id == "threads" for f in advise(waiting, NAIVE_CALLS, {"share_of_loop": 0.0}))


def test_every_own_loop_finding_reads_as_the_catalogue_says() -> None:
    """rlperf's own loop and a foreign script share the catalogue: a finding's title, gain and
    reference are its entry's, whatever evidence produced it."""
    found = advise(record("naive"), None, None) + advise(record("default", threads=2), None, None)
    assert found
    for f in found:
        entry = CATALOGUE[f.id]
        assert f.title == entry.title and f.expected_gain == entry.expected_gain and f.reference == reference(f.id)
        assert f.fix.startswith(entry.fix)
