"""The benchmark scripts' quick modes run and produce well-formed results (not timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_script(name: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


# The quick runs the tests below read, by test, longest first. {tmp}: the run's own folder (for plots).
QUICK_RUNS: dict[str, tuple[str, ...]] = {
    "test_bench_scaling_quick": ("bench_scaling.py", "--quick", "--json", "--plot", "{tmp}/scaling.png"),
    "test_bench_peers_quick": ("bench_peers.py", "--quick", "--json", "--plot", "{tmp}/curves.png"),
    "test_bench_train_quick_knobs": ("bench_train.py", "--quick", "--part", "knobs", "--json"),
    "test_bench_gate_quick": ("bench_gate.py", "--quick", "--json"),
    "test_bench_replay_quick": ("bench_replay.py", "--quick", "--json"),
    "test_bench_limits_quick": ("bench_limits.py", "--quick", "--json"),
    "test_bench_env_quick": ("bench_env.py", "--quick", "--overheads", "--json"),
    "test_baseline_heuristic_json": ("baseline_heuristic.py", "--size", "6", "--envs", "32", "--episodes", "50", "--json"),
}


@pytest.fixture(scope="module")
def quick(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[tuple[dict, Path]]]:
    """Every quick run a selected, not skipped test of this module reads, two at a time, longest first:
    each is one or a few cold torch processes in a row, one core busy; side by side they use both.
    A test gets its run's (JSON result, folder); the run's failure is raised in that test."""
    wanted = {item.name for item in request.session.items
              if item.module is request.module and item.get_closest_marker("skip") is None}
    futures: dict[str, Future[tuple[dict, Path]]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        if "test_bench_gpu_pipeline_on_cpu" in wanted:  # four parts in a row: among the longest
            folder = tmp_path_factory.mktemp("gpu")
            futures["test_bench_gpu_pipeline_on_cpu"] = pool.submit(lambda f: (run_gpu_parts(f), f), folder)
        for test, (script, *args) in QUICK_RUNS.items():
            if test in wanted:
                folder = tmp_path_factory.mktemp(test)
                futures[test] = pool.submit(lambda s, a, f: (run_script(s, *a), f), script,
                                            [arg.format(tmp=folder) for arg in args], folder)
    return futures


def test_bench_env_quick(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, _ = quick["test_bench_env_quick"].result()
    assert result["kernels"] == ["fused", "ops"]
    (overheads,) = result["overheads"]  # at the largest quick N
    for kernel in ("fused", "ops"):
        o = overheads[kernel]
        assert o["step_us"]["median"] > 0 and o["copy_ratio"] > 0 and 0 < o["check_us"] and 0 < o["check_share"] < 1
    rows = {(row["kernel"], row["flood_fill"]) for row in result["tensor"]}
    assert rows == {("fused", "off"), ("fused", "tensor"), ("ops", "off"), ("ops", "tensor"), ("ops", "bfs")}
    assert all(row["median"] > 0 and row["min"] <= row["median"] <= row["max"] for row in result["tensor"])
    pairs = {(f, n) for f in ("off", "tensor") for n in (16, 64)}
    assert {(r["flood_fill"], r["n"]) for r in result["fused_over_ops"]} == pairs
    assert all(r["ratio"] > 0 for r in result["fused_over_ops"]) and result["best_fused"]["n"] in (16, 64)
    assert {"sync", "async"} <= {row["kind"] for row in result["gym"]} <= {"sync", "async", "sb3-dummy"}
    assert all(row["fused_ratio"] > 0 and row["ops_ratio"] > 0 for row in result["gym"])


def test_baseline_heuristic_json(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, _ = quick["test_baseline_heuristic_json"].result()
    assert result["episodes"] == 50 and result["mean_score"] > 0


def test_bench_train_quick_knobs(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, _ = quick["test_bench_train_quick_knobs"].result()
    variants = [row["variant"] for row in result["knobs"]]
    assert variants[0] == "fast (all fixes)" and "buffer.push=loop" in variants and "env.flood_fill=bfs" in variants
    assert all(row["env_steps_per_s"] > 0 and row["fast_over_variant"] > 0 for row in result["knobs"])


def needs(module: str) -> pytest.MarkDecorator:
    """Skip unless the peer library is installed (the ``bench`` extra)."""
    try:
        __import__(module)
    except ImportError:
        return pytest.mark.skip(reason=f"needs {module} (pip install -e '.[bench]')")
    return pytest.mark.skipif(False, reason="")


@needs("stable_baselines3")
@needs("torchrl")
def test_bench_replay_quick(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, _ = quick["test_bench_replay_quick"].result()
    libraries = {row["library"]: row for row in result["libraries"]}
    assert set(libraries) == {"rlperf", "sb3", "torchrl"} and result["missing"] == []
    for row in libraries.values():
        for key in ("push_us", "sample_us"):
            assert 0 < row[key]["min"] <= row[key]["median"] <= row[key]["max"]
        assert row["rlperf_speedup"]["push_plus_sample"] > 0
    assert libraries["rlperf"]["rlperf_speedup"]["push"] == 1.0
    assert result["machine"]["versions"]["stable-baselines3"] and result["machine"]["versions"]["torchrl"]


@needs("stable_baselines3")
def test_bench_peers_quick(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, folder = quick["test_bench_peers_quick"].result()
    plot = folder / "curves.png"
    kinds = [(entry["kind"], entry["n_envs"]) for entry in result["entries"]]
    assert kinds == [("rlperf", 16), ("sb3", 1), ("sb3", 4)]
    steps = result["env_steps"]
    updates = {entry["summary"]["updates"] for entry in result["entries"]}
    for entry in result["entries"]:
        summary = entry["summary"]
        # The same env-step budget (SB3 may overshoot by less than one vector step).
        assert steps <= summary["env_steps"] < steps + entry["n_envs"]
        assert summary["wall_s"]["median"] > 0 and summary["curve"]
        assert set(summary["time_to_score"]) == {str(t) for t in result["targets"]}
    # Comparable update counts: SB3 is configured to the rlperf config's updates per env step.
    assert max(updates) <= 1.1 * min(updates), updates
    sb3 = result["entries"][1]["settings"]
    assert sb3["net_arch"] == [32, 32] and sb3["batch_size"] == 32 and sb3["buffer_size"] == 5000
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_bench_scaling_quick(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, folder = quick["test_bench_scaling_quick"].result()
    plot = folder / "scaling.png"
    runs = result["runs"]
    assert [r["episodes_asked"] for r in runs] == [20, 60]
    for r in runs:
        assert r["wall_s"]["median"] > 0 and r["us_per_env_step"]["median"] > 0
        assert r["peak_rss_mib"]["median"] > 10
        assert r["example"]["memory"] and all(m["rss_mib"] > 0 for m in r["example"]["memory"])
        assert r["example"]["windows"]
    assert result["ratios"]["episodes"] == 3 and result["ratios"]["wall"] > 0
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_bench_limits_quick(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, _ = quick["test_bench_limits_quick"].result()
    assert result["bandwidth_bytes_per_s"]["median"] > 1e8  # any machine copies faster than 100 MB/s
    assert 0 < result["op_overhead_s"]["median"] < 1e-3
    rows = {(r["kernel"], r["flood_fill"], r["n"]): r for r in result["rows"]}
    assert set(rows) == {(k, f, n) for k in ("ops", "fused") for f in ("off", "tensor") for n in (16, 256)}
    for r in rows.values():
        assert r["bytes_per_env_step"] > 0 and r["env_steps_per_s"] > 0
        assert r["bound_by"] in ("overhead", "bandwidth") and r["fraction_of_limit"] > 0
        assert r["ops_per_step"] > 10 if r["kernel"] == "ops" else r["ops_per_step"] == 0 and r["bandwidth_share"] > 0
    # Flood fill adds operators and bytes to every step.
    assert rows[("ops", "tensor", 256)]["ops_per_step"] > rows[("ops", "off", 256)]["ops_per_step"]
    assert 0 < result["fused_fixed_cost_s"]["median"] < 1e-3


GPU_PARTS = {"env", "limits", "replay", "train_knobs", "timers_sync", "timers_events", "default_run"}
# limits, replay and train_knobs run bench_limits.py, bench_replay.py and bench_train.py --part knobs, whose quick
# modes the tests above run (23 s of the suite): the pipeline is checked on the other parts.
CHEAP_GPU_PARTS = ("env", "timers_sync", "timers_events", "default_run")


def run_gpu_parts(folder: Path) -> dict:
    """bench_gpu.sh's list, then its cheap parts into ``folder``, on the CPU with tiny sizes."""
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "PYTHON": sys.executable}
    listed = subprocess.run(["bash", str(SCRIPTS / "bench_gpu.sh"), "list"], capture_output=True, text=True, env=env)
    for name in CHEAP_GPU_PARTS:
        proc = subprocess.run(["bash", str(SCRIPTS / "bench_gpu.sh"), name, str(folder)], capture_output=True,
                              text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {"listed": listed.stdout}


def test_bench_gpu_pipeline_on_cpu(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    """The GPU script's parts, on the CPU with tiny sizes: one well-formed file per part."""
    ran, tmp_path = quick["test_bench_gpu_pipeline_on_cpu"].result()
    assert GPU_PARTS <= {line.split()[0] for line in ran["listed"].splitlines() if line.strip()}
    parts = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert set(parts) == set(CHEAP_GPU_PARTS)
    assert all(part["exit_code"] == 0 and part["device"] == "cpu" and part["gpu"] is None for part in parts.values())
    assert parts["env"]["results"]["tensor"]
    assert "ns/phase" in parts["timers_sync"]["text"]
    assert parts["default_run"]["results"]["status"] == "completed"
    assert not list(tmp_path.glob(".*.tmp"))


SHIM = """#!/usr/bin/env bash
# A python that fails the way a part can fail: {when} -> exit {code}; everything else runs for real.
for arg in "$@"; do
    if [[ "$arg" == {when} ]]; then {action}; fi
done
exec {python} "$@"
"""


@pytest.mark.parametrize(("part", "when", "action", "code"), [
    ("replay", "*bench_replay.py", "echo boom >&2; exit 3", 3),  # a benchmark that crashes
    ("tests_cuda", "pytest", "echo '1 failed, 2 passed'; exit 1", 1),  # a failing CUDA test fails the part
    ("tests_cuda", "pytest", "echo '27 skipped in 1.0s'; exit 0", 5),  # all skipped: nothing checked, a failure
])
def test_bench_gpu_part_fails_with_its_exit_code(tmp_path: Path, part: str, when: str, action: str, code: int) -> None:
    shim = tmp_path / "python"
    shim.write_text(SHIM.format(when=when, action=action, code=code, python=sys.executable))
    shim.chmod(0o755)
    env = {**os.environ, "DEVICE": "cpu", "QUICK": "1", "PYTHON": str(shim)}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPTS / "bench_gpu.sh"), part, str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == code, proc.stderr[-2000:]
    entry = json.loads((out / f"{part}.json").read_text())
    assert entry["exit_code"] == code and entry["part"] == part


def test_bench_gpu_refuses_an_unknown_part(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPTS / "bench_gpu.sh"), "nope", str(tmp_path / "o")], capture_output=True,
                          text=True, env={**os.environ, "DEVICE": "cpu", "PYTHON": sys.executable}, timeout=60)
    assert proc.returncode == 2 and "unknown part 'nope'" in proc.stderr and not (tmp_path / "o").exists()


def test_bench_gpu_refuses_without_cuda(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPTS / "bench_gpu.sh"), "env", str(tmp_path / "r")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_bench_gate_quick(quick: dict[str, Future[tuple[dict, Path]]]) -> None:
    result, _ = quick["test_bench_gate_quick"].result()
    for kind in ("identical", "push:0.15"):
        r = result["kinds"][kind]
        assert r["trials"] == 2 == r["pass"] + r["fail"] + r["inconclusive"] and r["wall_s_per_verdict"] > 0
        assert 0 <= r["fail_rate_ci95"][0] <= r["fail_rate"] <= r["fail_rate_ci95"][1] <= 1 and len(r["detectable"]) == 2
        assert all(3 <= n <= 4 for n in r["runs_a_side"])  # 3 first, a pair more while inconclusive
    assert 0 <= result["kinds"]["push:0.15"]["predicted_fail_rate"] <= 1 and "signed-rank" in result["test"]

