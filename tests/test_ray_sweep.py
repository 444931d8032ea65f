"""The Ray Tune sweep backend, on a real local Ray instance and on a real ``ray start`` cluster (no
mocks). Skipped without Ray.

CI installs the ``ray`` extra, so these run there. Ray binds the machine's addresses, so every test
that starts Ray runs inside a network namespace that has only loopback (skipped where ``unshare -n``
is not permitted): the ``local_ray`` tests (one ``ray.init(num_cpus=2)`` for them all) in a pytest
run that ``test_the_local_ray_tests_pass_in_a_loopback_namespace`` starts there, and the cluster
tests around one ``ray start --head`` cluster. They are the slowest sweep tests.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import run_cli
from rlperf.config import config_from
from rlperf.errors import RlperfError
from rlperf.run.files import read_record
from rlperf.experiments.sweep import LOCAL_RAY_CONFIG, Axis, run_sweep

ray = pytest.importorskip("ray", reason="Ray is the optional extra 'ray' (pip install 'rlperf[ray]')")
pytest.importorskip("ray.tune")

pytestmark = pytest.mark.slow


def _only_loopback() -> bool:
    """Whether this process's network namespace has no interface but loopback."""
    try:  # /proc/net/dev is the calling process's namespace's (/sys/class/net is that of whoever mounted /sys)
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return False
    return [line.split(":")[0].strip() for line in lines] == ["lo"]


def _namespaces_permitted() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        return subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "ip", "link",
                               "set", "lo", "up"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.timeout(900)
def test_the_local_ray_tests_pass_in_a_loopback_namespace() -> None:
    if _only_loopback():
        pytest.skip("already in a loopback-only namespace: the local_ray tests run here directly")
    if not _namespaces_permitted():
        pytest.skip("needs `unshare -n` (root, or user namespaces) and `ip`: Ray must see only loopback")
    # One worker (-n 0), the local_ray tests only; the outcome of each is in the output on failure.
    proc = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c",
         'ip link set lo up && exec "$0" -m pytest -q -n 0 -p no:cacheprovider -m local_ray "$1"',
         sys.executable, __file__], capture_output=True, text=True, timeout=840, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-3000:]


@pytest.fixture(scope="module")
def local_ray():
    if not _only_loopback():
        pytest.skip("starts Ray: runs in a loopback-only namespace, through test_the_local_ray_tests_pass_in_a_"
                    "loopback_namespace")
    # As a sweep starts its own local instance (sweep.LOCAL_RAY_CONFIG: trials at the driver's priority).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             _system_config=LOCAL_RAY_CONFIG)
    try:
        yield
    finally:
        ray.shutdown()


def tiny():
    return config_from("smoke", ["train.learning_starts=64", "train.checkpoint=false", "run.threads=1"],
                       steps=256, envs=8, device="cpu")


@pytest.mark.local_ray
def test_ray_sweep_runs_trials_and_records_a_failure(local_ray, tmp_path: Path) -> None:
    # Two real trials, plus a third whose buffer cannot fit in memory: its values are valid, and only
    # a node can judge its memory, so it fails inside its Ray worker, where train_run refuses it.
    # One Tune run keeps the test short.
    events = []
    axis = Axis("buffer.capacity", ("5000", "6000", "1000000000000"))
    result = run_sweep(tiny(), [axis], out=tmp_path, backend="ray", trial_cpus=1,
                       on_trial=lambda event, t: events.append((event, t.index)))
    ok1, ok2, bad = result.trials
    assert (ok1.status, ok2.status, bad.status) == ("completed", "completed", "failed")
    assert "buffer.capacity" in (bad.error or "") and "\n" not in bad.error  # one line, the trial's own error
    assert sorted(i for e, i in events if e == "end") == [0, 1, 2]
    data = json.loads((result.sweep_dir / "sweep.json").read_text())
    assert data["backend"] == "ray" and not data["interrupted"]
    for t, row in zip((ok1, ok2), data["trials"][:2], strict=True):
        run_dir = Path(t.run_dir)
        assert run_dir.parent == result.sweep_dir  # the run directory lives under the sweep directory
        record = read_record(run_dir)
        assert record["kind"] == "sweep" and record["config"]["buffer"]["capacity"] == row["buffer.capacity"]
        assert row["env_steps_per_s"] == record["throughput"]["env_steps_per_s"]
    assert data["trials"][2]["status"] == "failed" and data["trials"][2]["env_steps_per_s"] is None
    assert (result.sweep_dir / "sweep.csv").is_file() and (result.sweep_dir / "sweep.png").is_file()


_NICENESS = """
import os
from rlperf.experiments.sweep import _RaySession

session = _RaySession(None, 1, 0)
ray = session.ray
print(os.nice(0), ray.get(ray.remote(lambda: os.nice(0)).remote()))
ray.shutdown()
"""


@pytest.mark.local_ray
def test_a_sweep_s_own_ray_instance_runs_trials_at_the_driver_s_priority() -> None:
    if not _only_loopback():
        pytest.skip("starts Ray: runs in a loopback-only namespace, through test_the_local_ray_tests_pass_in_a_"
                    "loopback_namespace")
    # Ray's default runs workers at nice 15: beside two busy processes a three-trial sweep took 245 s, not 10-24 s.
    proc = subprocess.run([sys.executable, "-c", _NICENESS], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    driver, worker = proc.stdout.split()[-2:]
    assert worker == driver


@pytest.mark.local_ray
def test_gpu_request_on_cpu_only_cluster_is_refused_up_front(local_ray, tmp_path: Path) -> None:
    if ray.cluster_resources().get("GPU", 0) > 0:
        pytest.skip("this Ray cluster has a GPU")
    with pytest.raises(RlperfError, match="asks for 1 GPU but the Ray cluster has 0"):
        run_sweep(tiny(), [Axis("train.train_ratio", ("1", "2"))], out=tmp_path / "runs", backend="ray", trial_gpus=1)
    assert not (tmp_path / "runs").exists()  # refused before anything was written


TINY = ["--config", "smoke", "--steps", "256", "--device", "cpu", "--set", "train.learning_starts=64",
        "--set", "train.checkpoint=false", "--set", "run.threads=1"]


@pytest.mark.local_ray
def test_cli_ray_sweep_with_its_display(local_ray, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The command line as a user runs it: the progress display is on (no --quiet), and nothing of it
    # may reach what Ray pickles; each trial's end line comes from the result it reported.
    code, out, err = run_cli(["sweep", *TINY, "--train-ratio", "1,2", "--backend", "ray", "--out", str(tmp_path)],
                             capsys)
    assert code == 0, err
    assert "Traceback" not in err
    (sweep_dir,) = tmp_path.iterdir()
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert [t["status"] for t in data["trials"]] == ["completed", "completed"]
    for line in ("trial000 train_ratio=1.0 repeat 0: completed", "trial001 train_ratio=2.0 repeat 0: completed"):
        assert line in err
    assert "train_ratio" in out  # the table


@pytest.mark.local_ray
def test_a_failed_tune_run_is_one_line_and_leaves_no_sweep_directory(
    local_ray, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray import tune

    def lost(self):
        raise RuntimeError("the cluster went away")

    monkeypatch.setattr(tune.Tuner, "fit", lost)
    code, _, err = run_cli(["sweep", *TINY, "--train-ratio", "1,2", "--backend", "ray", "--out", str(tmp_path)],
                           capsys)
    assert code == 2 and "Traceback" not in err
    assert "rlperf: error: the Ray Tune run failed: RuntimeError: the cluster went away" in err
    assert list(tmp_path.iterdir()) == []  # not even Tune's ray/ folder is left


def test_a_ray_client_address_is_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Through Ray Client, Tune runs on the cluster with a copy of the driver's hooks: no trial's outcome
    # would come back. Nothing is contacted.
    code, _, err = run_cli(["sweep", *TINY, "--train-ratio", "1,2", "--backend", "ray", "--address",
                            "ray://127.0.0.1:10001", "--out", str(tmp_path / "runs")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "a sweep cannot run through Ray Client" in err and not (tmp_path / "runs").exists()


def test_a_trial_whose_worker_died_is_failed_with_tunes_last_line(tmp_path: Path) -> None:
    # A run's own error comes back as its result; a trial Tune saw fail (its worker killed, say) is
    # known only from the error file Tune wrote for it.
    from rlperf.experiments.sweep import Trial, _TuneEvents

    class TuneTrial:
        def __init__(self, index: int, error_file: str | None) -> None:
            self.config, self.error_file = {"trial": index}, error_file

    (tmp_path / "error.txt").write_text("Failure # 1 (occurred at 2026-11-28)\nray.exceptions.ActorDiedError: "
                                        "The actor died unexpectedly before finishing this task.\n")
    trials = {i: Trial(i, i, 0, [], {}) for i in range(2)}
    events = []
    tune_events = _TuneEvents(trials, lambda event, t: events.append((event, t.index)), None)
    for i, path in enumerate((str(tmp_path / "error.txt"), None)):
        tune_events.started(TuneTrial(i, path))
        tune_events.failed(TuneTrial(i, path))
        tune_events.ended(TuneTrial(i, path))
    assert trials[0].status == "failed" and trials[0].error == (
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.")
    assert (trials[1].status, trials[1].error) == ("failed", "the Ray trial failed")
    assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1)] and not tune_events.running


# -- a real cluster, loopback only --------------------------------------------------------------

# Runs as the first process of new network, PID and mount namespaces: the network has only loopback
# (so every port is free, and Ray can reach nothing else), `ray stop` sees only this cluster's
# processes, and whatever is left when the script ends dies with the namespace. The cluster wants a
# token; the sweep runs without one (RAY_AUTH_MODE unset), with a wrong one, and with the right one.
CLUSTER_SCRIPT = r"""
py=$1 work=$2 token=$3; shift 3
ip link set lo up || exit 90
ip -o link show > "$work/links"
trap '"$py" -m ray.scripts.scripts stop > "$work/stop.log" 2>&1' EXIT
env -u RAY_ADDRESS RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$token" "$py" -m ray.scripts.scripts start --head \
    --node-ip-address=127.0.0.1 --port=6379 --num-cpus=2 --include-dashboard=false --disable-usage-stats \
    --temp-dir="$work/ray" > "$work/start.log" 2>&1 || exit 91
sweep() {
    name=$1; shift
    env -u RAY_ADDRESS -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN -u RAY_AUTH_TOKEN_PATH "$@" "$py" -m rlperf sweep "${args[@]}" \
        --backend ray --address 127.0.0.1:6379 --out "$work/$name" > "$work/$name.out" 2> "$work/$name.err"
    echo $? > "$work/$name.rc"
}
args=("$@")
sweep no_token
sweep wrong_token RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${token//?/0}"
sweep with_token RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$token"
"""


@pytest.fixture(scope="module")
def loopback_cluster_sweeps():
    """The two sweeps against a token-protected `ray start --head` cluster on 127.0.0.1: their folders."""
    if not _namespaces_permitted():
        pytest.skip("needs `unshare -n` (root, or user namespaces) and `ip`: the cluster must see only loopback")
    # A short path: Ray's socket paths under its temp dir must stay within the limit on socket names.
    work = Path(tempfile.mkdtemp(prefix="rlray"))
    try:
        proc = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c", CLUSTER_SCRIPT,
             "bash", sys.executable, str(work), secrets.token_hex(32), *TINY, "--train-ratio", "1,2"],
            capture_output=True, text=True, timeout=540,
        )
        start_log = (work / "start.log").read_text() if (work / "start.log").exists() else ""
        assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr}\n{start_log}"
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_cli_ray_sweep_on_a_loopback_cluster(loopback_cluster_sweeps: Path) -> None:
    work = loopback_cluster_sweeps
    links = (work / "links").read_text().splitlines()
    assert len(links) == 1 and ": lo:" in links[0]  # nothing but loopback to send anything to
    err = (work / "with_token.err").read_text()
    assert (work / "with_token.rc").read_text().strip() == "0", err
    assert "Traceback" not in err and "completed" in err  # the display's lines
    (sweep_dir,) = (work / "with_token").iterdir()
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert data["backend"] == "ray" and [t["status"] for t in data["trials"]] == ["completed", "completed"]
    for row in data["trials"]:
        assert Path(row["run_dir"]).parent == sweep_dir and read_record(row["run_dir"])["kind"] == "sweep"
    assert "Stopped all" in (work / "stop.log").read_text()


@pytest.mark.parametrize(("run", "what"), [("no_token", "requires an authentication token"),
                                           ("wrong_token", "refused the authentication token this process sent")])
def test_a_cluster_that_refuses_the_token_is_one_line(loopback_cluster_sweeps: Path, run: str, what: str) -> None:
    # Ray's own client retries for ~20 s, a warning per try, then says only "Failed to connect": the
    # sweep must say at once what to set, and write nothing.
    work = loopback_cluster_sweeps
    err = (work / f"{run}.err").read_text()
    assert (work / f"{run}.rc").read_text().strip() == "2", err
    assert "InvalidAuthToken" not in err and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"rlperf: error: the Ray cluster at 127.0.0.1:6379 {what} (set RAY_AUTH_MODE=token and "
                     "RAY_AUTH_TOKEN to the cluster's token, or RAY_AUTH_TOKEN_PATH to a file holding it, default "
                     "~/.ray/auth_token; `ray get-auth-token` on the head node prints it)"]
    assert not (work / run).exists() or not any((work / run).iterdir())
