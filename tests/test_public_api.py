"""The public API: ``import rlperf`` stays cheap, ``rlperf.PhaseTimer`` is the phase timer, free when
disabled, and writes a ``kind: "external"`` record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_import_rlperf_is_cheap_and_phase_timer_is_the_public_timer() -> None:
    code = ("import sys, rlperf\nheavy = [m for m in ('torch', 'numpy', 'gymnasium', 'rlperf.external') if m in sys.modules]\n"
            "t = rlperf.PhaseTimer('cpu')\nwith t.phase('step'):\n    pass\nt.step_done()\n"
            "print(','.join(heavy) + '|' + str('torch' in sys.modules) + '|' + type(t).__module__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "|False|rlperf.external"
    with pytest.raises(AttributeError):
        import rlperf

        rlperf.NoSuchThing  # noqa: B018


def test_the_public_timer_writes_an_external_record(tmp_path: Path) -> None:
    import rlperf

    timer = rlperf.PhaseTimer("cpu", warmup_steps=2)
    for _ in range(12):
        with timer.phase("step"):
            sum(range(2000))
        with timer.phase("learn"):
            sum(range(4000))
        timer.step_done()
    run_dir = timer.save(tmp_path, name="mine", num_envs=8, config={"lr": 3e-4})
    record = json.loads((run_dir / "run.json").read_text())
    assert record["kind"] == "external" and record["name"].startswith("mine-") and record["config"] == {"lr": 3e-4}
    assert record["totals"] == {"vector_steps": 12, "env_steps": 96, "num_envs": 8, "wall_s": pytest.approx(
        record["totals"]["wall_s"]), "warmup_s": pytest.approx(record["totals"]["warmup_s"])}
    assert list(record["phases"]) == ["step", "learn"] and record["phases"]["learn"]["calls"] == 10
    assert record["throughput"]["env_steps_per_s"] > 0 and record["timing"]["vector_step"]["calls"] == 10
    disabled = rlperf.PhaseTimer(enabled=False)
    assert disabled.phase("step") is disabled.phase("train")  # one shared null context: free
