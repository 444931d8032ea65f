"""The benchmark scripts' quick modes run and produce well-formed results (not timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_script(name: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_bench_env_quick() -> None:
    result = run_script("bench_env.py", "--quick", "--json")
    assert {row["flood_fill"] for row in result["tensor"]} == {"off", "tensor", "bfs"}
    assert all(row["median"] > 0 and row["min"] <= row["median"] <= row["max"] for row in result["tensor"])
    assert {row["kind"] for row in result["gym"]} == {"sync", "async"}
    assert all(row["native_ratio"] > 0 for row in result["gym"])


def test_baseline_heuristic_json() -> None:
    result = run_script("baseline_heuristic.py", "--size", "6", "--envs", "32", "--episodes", "50", "--json")
    assert result["episodes"] == 50 and result["mean_score"] > 0


def test_bench_train_quick_knobs() -> None:
    result = run_script("bench_train.py", "--quick", "--part", "knobs", "--json")
    variants = [row["variant"] for row in result["knobs"]]
    assert variants[0] == "fast (all fixes)" and "buffer.push=loop" in variants and "env.flood_fill=bfs" in variants
    assert all(row["env_steps_per_s"] > 0 and row["fast_over_variant"] > 0 for row in result["knobs"])
