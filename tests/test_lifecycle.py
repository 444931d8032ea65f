"""A run survives Ctrl-C, SIGTERM, SIGKILL, a diverging learner and an out-of-memory.

The signal tests use real subprocesses and real signals; the resume tests compare an interrupted
and resumed run with an uninterrupted one, row by row and weight by weight (exact on the CPU).
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlperf import cli
from rlperf.run import checkpoint as checkpoint_mod
from rlperf.run import core as core_mod
from rlperf.run import lifecycle as runner
from rlperf.config import config_from
from rlperf.errors import RlperfError
from rlperf.run.files import read_record
from rlperf.run.lifecycle import RunHooks, train_run
from rlperf.run.record import PHASE_COLUMNS

# A smoke-sized run long enough to be interrupted mid-learning (with the fused update 250 vector steps
# could end before a signal sent after the k-th log row lands): 1,000 vector steps, a log row every 10.
STEPS = 16000
RUN_ARGS = ["-c", "smoke", "--steps", str(STEPS), "--quiet", "--set", "train.log_every=10",
            "--set", "run.threads=1", "--set", "run.device=cpu"]
WALL_CLOCK_COLUMNS = ("wall_s", "env_steps_per_s", *PHASE_COLUMNS)


def cli_main(argv: list[str]) -> int:
    try:
        cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def spawn(args: list[str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "RLPERF_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-m", "rlperf", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str] | None = None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended (rc {proc.returncode}) before the condition: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.003)


def only_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def metrics_rows(run_dir: Path) -> int:
    path = run_dir / "metrics.csv"
    return path.read_bytes().count(b"\n") - 1 if path.exists() else 0


def learning_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in WALL_CLOCK_COLUMNS} for row in csv.DictReader(f)]


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)


def assert_same_run(a: Path, b: Path) -> None:
    """Same learning curve, counters, learning summary and final state (except wall-clock values)."""
    assert learning_rows(a) == learning_rows(b)
    ra, rb = read_record(a), read_record(b)
    for key in ("episodes", "env_steps", "vector_steps", "updates"):
        assert ra["totals"][key] == rb["totals"][key], key
    assert ra["learning"] == rb["learning"]
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    for part in ("q", "target"):
        for name, tensor in ca["agent"][part].items():
            assert torch.equal(tensor, cb["agent"][part][name]), (part, name)
    for name in ("obs", "actions", "rewards", "next_obs", "dones"):
        assert torch.equal(ca["buffer"][name], cb["buffer"][name]), name
    assert ca["buffer"]["cursor"] == cb["buffer"]["cursor"]
    assert torch.equal(ca["env"]["_occ"], cb["env"]["_occ"])
    assert ca["progress"]["scores"] == cb["progress"]["scores"]
    assert torch.equal(ca["rng"]["torch"], cb["rng"]["torch"])


def no_temp_files(run_dir: Path) -> bool:
    return not list(run_dir.glob(".*.tmp"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every resumed run must reproduce."""
    out = tmp_path_factory.mktemp("baseline")
    assert cli_main(["train", *RUN_ARGS, "--out", str(out), "--name", "base"]) == 0
    return only_dir(out)


def test_sigint_then_resume_reproduces_the_uninterrupted_run(tmp_path: Path, baseline: Path) -> None:
    rng = random.Random()
    k = rng.randint(2, 10)  # interrupt after k of 100 log rows, at whatever step the signal lands on
    proc = spawn(["train", *RUN_ARGS, "--out", str(tmp_path), "--name", "cut"])
    wait_for(lambda: any(metrics_rows(d) >= k for d in tmp_path.iterdir()), proc)
    time.sleep(rng.uniform(0, 0.05))
    proc.send_signal(signal.SIGINT)
    # Keep pressing Ctrl-C until it exits: the later ones land during the final write, which must finish.
    while proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.002)
    _, err = proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    run_dir = only_dir(tmp_path)
    record = read_record(run_dir)
    assert record["status"] == "interrupted"
    stopped_at = record["totals"]["env_steps"]
    assert 0 < stopped_at < STEPS, f"the signal landed after the run ended (k={k})"
    assert record["checkpoint"]["env_steps"] == stopped_at
    assert load_checkpoint(run_dir)["progress"]["env_steps"] == stopped_at
    assert no_temp_files(run_dir)

    assert cli_main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    resumed = read_record(run_dir)
    assert resumed["status"] == "completed"
    assert [r["from_env_steps"] for r in resumed["resumed"]] == [stopped_at]
    assert resumed["started_at"] == record["started_at"]
    assert_same_run(baseline, run_dir)


@pytest.fixture(scope="module")
def terminated_and_killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """Two runs side by side (to halve the start-up cost): one gets SIGTERM after 2 log rows, the
    other SIGKILL after its first periodic checkpoint and 3 log rows. Returns (rc, stderr, run dir)."""
    wanted = {
        "term": (signal.SIGTERM, lambda d: metrics_rows(d) >= 2),
        "kill": (signal.SIGKILL, lambda d: (d / "checkpoint.pt").exists() and metrics_rows(d) >= 3),
    }
    outs = {name: tmp_path_factory.mktemp(name) for name in wanted}
    procs = {name: spawn(["train", *RUN_ARGS, "--out", str(outs[name])]) for name in wanted}
    pending = set(wanted)
    deadline = time.monotonic() + 120
    while pending:
        for name in list(pending):
            signum, ready = wanted[name]
            if any(ready(d) for d in outs[name].iterdir()):
                procs[name].send_signal(signum)
                pending.discard(name)
            elif procs[name].poll() is not None:
                raise AssertionError(
                    f"{name}: ended (rc {procs[name].returncode}) before its signal: {procs[name].stderr.read()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.003)
    results = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        results[name] = (proc.returncode, err, only_dir(outs[name]))
    return results


def test_sigterm_stops_with_a_checkpoint_and_exit_143(terminated_and_killed: dict[str, tuple[int, str, Path]]) -> None:
    code, err, run_dir = terminated_and_killed["term"]
    assert code == 143, err
    record = read_record(run_dir)
    assert record["status"] == "interrupted"
    assert load_checkpoint(run_dir)["progress"]["env_steps"] == record["totals"]["env_steps"]


def test_sigkill_run_resumes_from_its_last_periodic_checkpoint(
    terminated_and_killed: dict[str, tuple[int, str, Path]], baseline: Path
) -> None:
    """A killed run (OOM killer, power loss) keeps its first periodic checkpoint (at the first log
    boundary); a resume drops the metrics rows written after it and reproduces the baseline."""
    code, _, run_dir = terminated_and_killed["kill"]
    assert code == -signal.SIGKILL
    assert not (run_dir / "run.json").exists()
    saved_at = load_checkpoint(run_dir)["progress"]["vector_steps"]
    assert metrics_rows(run_dir) > saved_at // 10

    assert cli_main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    assert read_record(run_dir)["resumed"][0]["from_vector_steps"] == saved_at
    assert no_temp_files(run_dir)
    assert_same_run(baseline, run_dir)


def test_a_second_signal_during_the_final_write_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process, deterministic: Ctrl-C at step 7, and again inside each final write."""
    for module, name in ((checkpoint_mod, "save_torch_atomic"), (core_mod, "write_json_atomic")):
        real = getattr(module, name)

        def interrupted_write(path: Any, obj: Any, real: Any = real) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            real(path, obj)

        monkeypatch.setattr(module, name, interrupted_write)
    steps = []

    def on_step() -> None:
        steps.append(1)
        if len(steps) == 7:
            os.kill(os.getpid(), signal.SIGINT)

    cfg = config_from("smoke", ["run.threads=1", "run.device=cpu", "train.log_every=100"], steps=STEPS)
    before = signal.getsignal(signal.SIGINT)
    result = train_run(cfg, out=tmp_path, quiet=True, dashboard=False, hooks=RunHooks(on_step=on_step))
    assert result.exit_code == 130
    assert result.record["totals"]["vector_steps"] == 7
    assert read_record(result.run_dir)["status"] == "interrupted"
    assert load_checkpoint(result.run_dir)["progress"]["vector_steps"] == 7
    assert signal.getsignal(signal.SIGINT) is before  # the library restores the caller's handlers


def test_a_signal_before_the_run_starts_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = runner.build_env

    def build_env(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "build_env", build_env)
    cfg = config_from("smoke", ["run.threads=1", "run.device=cpu"])
    with pytest.raises(runner.RunInterrupted) as exc:
        train_run(cfg, out=tmp_path / "out", quiet=True, dashboard=False)
    assert exc.value.exit_code == 143
    assert not (tmp_path / "out").exists()


def test_divergence_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    code = cli_main(
        [
            "train",
            "-c",
            "smoke",
            "--out",
            str(tmp_path),
            "--quiet",
            "--set",
            "agent.lr=1e30",
            "--set",
            "train.log_every=10",
            "--set",
            "run.threads=1",
            "--set",
            "run.device=cpu",
        ]
    )
    assert code == 1
    run_dir = only_dir(tmp_path)
    record = read_record(run_dir)
    assert record["status"] == "diverged"
    assert "agent.lr" in record["error"]
    assert record["learning"]["last_loss"] is None  # NaN/inf is not a number in JSON
    assert record["totals"]["env_steps"] < 2000
    kept = load_checkpoint(run_dir)
    assert kept["progress"]["env_steps"] == record["checkpoint"]["env_steps"] < record["totals"]["env_steps"]
    assert all(torch.isfinite(w).all() for w in kept["agent"]["q"].values())
    assert record["files"]["checkpoint"] == "checkpoint.pt"


def test_out_of_memory_during_the_run_fails_with_record_and_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = runner.Agent.update
    calls = []

    def update(self: Any, buffer: Any) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 30:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 1.00 GiB free)")
        return real(self, buffer)

    monkeypatch.setattr(runner.Agent, "update", update)
    cfg = config_from("smoke", ["run.threads=1", "run.device=cpu", "train.log_every=10"])
    result = train_run(cfg, out=tmp_path, quiet=True, dashboard=False)
    assert result.exit_code == 1
    record = read_record(result.run_dir)
    assert record["status"] == "failed"
    assert "out of memory" in record["error"] and "Tried to allocate 2.00 GiB" in record["error"]
    assert "buffer.batch_size" in record["error"]  # the hint
    # The half-done step is not checkpointed: the periodic checkpoint from the first log row stays.
    assert load_checkpoint(result.run_dir)["progress"]["vector_steps"] == record["checkpoint"]["vector_steps"] == 10


def test_a_run_in_use_cannot_be_resumed(tmp_path: Path) -> None:
    import fcntl

    cfg = config_from("smoke", ["run.threads=1", "run.device=cpu"], steps=64)
    run_dir = train_run(cfg, out=tmp_path, quiet=True, dashboard=False).run_dir
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running rlperf holds on its run directory
        resumed = runner.resume_config(run_dir, steps=128)
        with pytest.raises(RlperfError, match="in use by another rlperf process"):
            train_run(resumed, quiet=True, dashboard=False, resume=run_dir)
    finally:
        os.close(fd)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


WRITER = textwrap.dedent("""
    import sys, torch
    from rlperf.atomic import save_torch_atomic, write_json_atomic
    folder = sys.argv[1]
    version = 0
    while True:
        record = {"schema": 1, "version": version, "payload": [version] * 400_000}
        write_json_atomic(folder + "/run.json", record)
        save_torch_atomic(folder + "/checkpoint.pt", {"version": version, "weights": torch.full((2_000_000,), float(version))})
        if version == 0:
            print("ready", flush=True)
        version += 1
""")


def test_killed_during_a_write_the_previous_files_stay_readable(tmp_path: Path) -> None:
    """SIGKILL a process that rewrites a big record and checkpoint in a loop, at random moments."""
    folders = [tmp_path / f"w{i}" for i in range(2)]
    procs = []
    for folder in folders:
        folder.mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], stdout=subprocess.PIPE, text=True))
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        time.sleep(random.uniform(0.05, 0.4))
        proc.kill()
        proc.communicate()
    for folder in folders:
        record = json.loads((folder / "run.json").read_text())
        assert record["payload"] == [record["version"]] * 400_000
        checkpoint = torch.load(folder / "checkpoint.pt", weights_only=True)
        assert torch.equal(checkpoint["weights"], torch.full((2_000_000,), float(checkpoint["version"])))
        assert checkpoint["version"] in (record["version"], record["version"] - 1)


def run_args(steps: int) -> list[str]:
    """RUN_ARGS stopping after ``steps`` env steps."""
    args = list(RUN_ARGS)
    args[args.index("--steps") + 1] = str(steps)
    return args


def test_extending_a_completed_run_reproduces_the_uninterrupted_run(tmp_path: Path, baseline: Path) -> None:
    """A run that completed at a step that is not a log boundary wrote a last row there; extended with
    --steps, its curve (the first row after the resume too: its loss and episode length are the
    interval's since the last log boundary) and its state are those of one uninterrupted run."""
    short = 505 * 16  # 505 vector steps of 16 boards: between the log rows at 500 and 510
    assert cli_main(["train", *run_args(short), "--out", str(tmp_path), "--name", "short"]) == 0
    run_dir = only_dir(tmp_path)
    assert learning_rows(run_dir)[-1]["vector_steps"] == "505"
    assert cli_main(["train", "--resume", str(run_dir), "--steps", str(STEPS), "--quiet"]) == 0
    assert read_record(run_dir)["status"] == "completed"
    assert_same_run(baseline, run_dir)


# Learning starts at vector step 13 (208 transitions of 16 boards): the 21st learning step is vector
# step 33, the 28th is 40, a log boundary whose row must wait for the updates still owed.
@pytest.mark.parametrize("learning_step", [21, 28], ids=["inside-an-interval", "at-a-log-boundary"])
def test_a_stop_inside_one_steps_updates_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          learning_step: int) -> None:
    """Ctrl-C between two of a vector step's 40 updates stops there; the updates still owed are paid
    first on resume, so weights, replay and curve are the uninterrupted run's."""
    cfg = config_from("smoke", ["run.threads=1", "run.device=cpu", "train.log_every=10", "train.train_ratio=40"],
                      steps=60 * 16)
    base = train_run(cfg, out=tmp_path / "base", quiet=True, dashboard=False).run_dir
    real = runner.Agent.update
    calls = []

    def update(self: Any, buffer: Any) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 40 * (learning_step - 1) + 7:  # the 8th update of that step
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, buffer)

    monkeypatch.setattr(runner.Agent, "update", update)
    cut = train_run(cfg, out=tmp_path / "cut", quiet=True, dashboard=False)
    monkeypatch.setattr(runner.Agent, "update", real)
    assert cut.exit_code == 130 and cut.record["status"] == "interrupted"
    assert cut.record["totals"]["updates"] == 40 * (learning_step - 1) + 7
    assert load_checkpoint(cut.run_dir)["progress"]["owed_updates"] >= 33
    resumed = train_run(runner.resume_config(cut.run_dir), quiet=True, dashboard=False, resume=cut.run_dir)
    assert resumed.exit_code == 0
    assert_same_run(base, cut.run_dir)


def test_sigint_lands_inside_a_long_train_phase(tmp_path: Path) -> None:
    """train.train_ratio at its bound (10,000 updates per vector step, seconds to minutes each): Ctrl-C
    reaches the update loop and the run stops, checkpointed, inside the step, not at its end."""
    # 256 boards fill the replay to one batch in the first vector step, which then trains for minutes
    # (10,000 updates of a few ms).
    proc = spawn(["train", "-c", "smoke", "--envs", "256", "--steps", "1024", "--quiet", "--out", str(tmp_path),
                  "--train-ratio", "10000", "--set", "train.learning_starts=256", "--set", "agent.hidden=[512,512]",
                  "--set", "buffer.batch_size=256", "--set", "buffer.capacity=512", "--set", "run.threads=1",
                  "--set", "run.device=cpu", "--set", "train.update=torch"])
    try:
        wait_for(lambda: any(tmp_path.iterdir()), proc)
        run_dir = only_dir(tmp_path)
        wait_for(lambda: (run_dir / "metrics.csv").exists(), proc)  # opened right before the first step
        time.sleep(1.0)  # inside the first vector step's updates: the step before them takes milliseconds
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    record = read_record(run_dir)
    assert record["status"] == "interrupted"
    # Stopped inside the step's updates, not at its end (that is minutes away, and more on a busy
    # machine): the bound on wall time is only loose, teardown and the final writes share the CPUs.
    assert record["totals"]["updates"] < 10_000
    assert took < 30, f"the stop took {took:.1f} s"


def test_a_run_that_ends_inside_the_replay_fill_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--episodes 5 on 16 boards ends before train.learning_starts: the output says no training
    happened, why, and what --episodes counts; no phase table of zeros, no footnote claiming the rates
    exclude a warm-up they are all made of."""
    code = cli_main(["train", "-c", "smoke", "--episodes", "5", "--out", str(tmp_path), "--set", "run.device=cpu",
                     "--set", "run.threads=1", "--no-plot"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = read_record(only_dir(tmp_path))
    assert record["totals"]["updates"] == 0 and record["timing"]["measured_steps"] == 0
    assert "no training happened" in err and "summed over all 16 boards" in err and "train.learning_starts" in err
    assert "rates exclude" not in out and "every step was warm-up: rates are over the whole run" in " ".join(out.split())
    assert "phases" not in out.split("summary")[0]
