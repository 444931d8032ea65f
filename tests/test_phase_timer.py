"""The public :class:`rlperf.PhaseTimer` on loops written by anyone: ``num_envs`` checked, nested
phases timed as self time, threads timed per thread, a CUDA timer refused where there is no CUDA,
and the record's per-interval phase series."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rlperf
from rlperf.errors import ConfigError, DeviceError, RlperfError


def busy(seconds: float) -> None:
    """Spin (not sleep): the time is the thread's own work."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("num_envs", [-1, 0, 1.5, True, 10**30, "8", None])
def test_num_envs_must_be_a_positive_whole_number(num_envs: object, tmp_path: Path) -> None:
    timer = rlperf.PhaseTimer("cpu")
    with timer.phase("step"):
        pass
    timer.step_done()
    with pytest.raises(ConfigError, match="num_envs must be a whole number from 1 to"):
        timer.record(num_envs=num_envs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_envs"):  # a ValueError too, for code that catches those
        timer.save(tmp_path / "runs", num_envs=num_envs)  # type: ignore[arg-type]
    assert not (tmp_path / "runs").exists()  # refused before the run directory was made


def test_num_envs_takes_numpy_integers() -> None:
    timer = rlperf.PhaseTimer("cpu")
    for _ in range(3):
        timer.step_done()
    assert timer.record(num_envs=np.int64(16))["totals"]["env_steps"] == 48


def test_nested_phases_are_self_time_and_add_up_to_the_measured_time_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]  # a clock the test moves: exact figures on a loaded machine
    monkeypatch.setattr("rlperf.external.perf_counter", lambda: clock[0])
    timer = rlperf.PhaseTimer("cpu")
    for _ in range(5):
        with timer.phase("train"):
            clock[0] += 4.0
            with timer.phase("backward"):
                clock[0] += 6.0
            clock[0] += 1.0
        with timer.phase("log"):
            clock[0] += 1.0
        timer.step_done()
    stats = timer.stats()
    assert stats["backward"].total_s == 30.0 and stats["backward"].p50_ms == 6000.0
    assert stats["train"].total_s == 25.0 and stats["train"].calls == 5  # without backward's 30 s
    assert sum(s.total_s for s in stats.values()) == clock[0] == 60.0  # the measured time, once
    assert stats["train"].share == pytest.approx(25 / 60)
    assert timer.nested == {"backward": "train"}
    assert timer.record()["timing"]["nested"] == {"backward": "train"}


def test_two_threads_in_the_same_phase_both_count() -> None:
    timer = rlperf.PhaseTimer("cpu")

    def work() -> None:
        for _ in range(10):
            with timer.phase("rollout"):
                time.sleep(0.02)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    timer.step_done()
    rollout = timer.stats()["rollout"]
    assert rollout.calls == 20
    assert rollout.total_s >= 20 * 0.02 * 0.95  # a shared start time loses about a quarter of it
    assert rollout.p50_ms >= 19


def test_nesting_is_refused_in_cuda_events_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from tests.test_timers import _FakeEvent

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    timer = rlperf.PhaseTimer(torch.device("cuda"))
    assert timer.mode == "events"
    with timer.phase("train"):
        pass
    with timer.phase("train"), pytest.raises(ConfigError, match=r'CUDA events cannot time nested phases.*mode="sync"'):
        with timer.phase("backward"):
            pass


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "auto"])
def test_a_cuda_timer_without_cuda_is_refused_when_made(device: str) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if device == "auto":  # auto picks the CPU here: nothing to refuse
        assert rlperf.PhaseTimer(device).mode == "cpu"
        return
    with pytest.raises(DeviceError, match="CUDA is not available on this machine") as exc:
        rlperf.PhaseTimer(device)
    assert isinstance(exc.value, RlperfError) and isinstance(exc.value, ValueError)
    assert rlperf.PhaseTimer(device, enabled=False).phase("step") is not None  # a disabled timer times nothing


@pytest.mark.parametrize("interval_s", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_interval_s_must_be_a_positive_number(interval_s: object) -> None:
    with pytest.raises(ConfigError, match="interval_s"):
        rlperf.PhaseTimer("cpu", interval_s=interval_s)  # type: ignore[arg-type]


def test_the_record_keeps_per_interval_phase_series(tmp_path: Path) -> None:
    timer = rlperf.PhaseTimer("cpu", warmup_steps=2, interval_s=0.03)
    for i in range(20):
        with timer.phase("step"):
            busy(0.004)
        if i % 2:
            with timer.phase("train"):
                busy(0.002)
        timer.step_done()
    record = json.loads((timer.save(tmp_path, num_envs=8) / "run.json").read_text())
    rows = record["intervals"]
    assert 2 <= len(rows) <= 20
    assert set(rows[0]) == {"env_steps", "wall_s", "episodes", "mean_episode_length", "s_per_1000_env_steps",
                            "phase_s"}
    assert rows[-1]["env_steps"] == 20 * 8 and all(r["env_steps"] % 8 == 0 for r in rows)
    assert [r["env_steps"] for r in rows] == sorted({r["env_steps"] for r in rows})  # cumulative, rising
    assert all(r["episodes"] is None and r["mean_episode_length"] is None for r in rows)
    assert all(r["s_per_1000_env_steps"] > 0 for r in rows)
    # The rows split the whole run: warm-up included, nothing counted twice.
    warm = record["timing"]["warmup_s"]
    phased = sum(p["total_s"] for p in record["phases"].values()) + warm
    assert sum(sum(r["phase_s"].values()) for r in rows) == pytest.approx(phased, rel=1e-9)
    assert sum(r["phase_s"]["train"] for r in rows) >= record["phases"]["train"]["total_s"]
    assert rows[-1]["wall_s"] >= record["totals"]["wall_s"] * 0.9


def test_intervals_past_the_limit_are_merged_evenly() -> None:
    from rlperf.external import MAX_INTERVALS

    timer = rlperf.PhaseTimer("cpu", interval_s=1e-9)  # an interval at every step
    for _ in range(1000):
        with timer.phase("step"):
            pass
        timer.step_done()
    rows = timer.record(num_envs=4)["intervals"]
    assert len(rows) == MAX_INTERVALS and rows[-1]["env_steps"] == 4000
    steps = np.diff([0] + [r["env_steps"] for r in rows])
    assert steps.min() > 0 and steps.max() <= 3 * steps.min()  # evenly spread, each covering whole intervals
    assert sum(r["phase_s"]["step"] for r in rows) == pytest.approx(timer.stats()["step"].total_s, rel=1e-9)


def test_the_interval_limit_is_the_run_records() -> None:
    pytest.importorskip("torch")
    from rlperf.external import MAX_INTERVALS
    from rlperf.run import record

    assert MAX_INTERVALS == record.MAX_INTERVALS


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.cuda
@pytest.mark.skipif(not _has_cuda(), reason="needs CUDA")
def test_on_cuda_sync_mode_nests_events_mode_times_threads_and_a_missing_device_is_refused() -> None:
    import torch

    a = torch.randn(512, 512, device="cuda")
    timer = rlperf.PhaseTimer("cuda", mode="sync")
    for _ in range(5):
        with timer.phase("train"):
            a @ a
            with timer.phase("backward"):
                for _ in range(8):
                    a @ a
        timer.step_done()
    stats = timer.stats()
    assert timer.nested == {"backward": "train"} and stats["backward"].total_s > stats["train"].total_s
    events = rlperf.PhaseTimer("cuda")
    assert events.mode == "events"
    with events.phase("step"):
        a @ a
    events.step_done()
    assert events.stats()["step"].calls == 1
    with pytest.raises(DeviceError, match="CUDA device"):
        rlperf.PhaseTimer(f"cuda:{torch.cuda.device_count()}")


# -- episode returns (issue 41.6) and a refused save (issue 38.7) ---------------------------------


def _vector_info(returns: list[float], lengths: list[int], done: list[bool]) -> dict[str, object]:
    """What gymnasium.wrappers.vector.RecordEpisodeStatistics puts in a step's info."""
    return {"episode": {"r": np.array(returns), "l": np.array(lengths), "t": np.zeros(len(done))},
            "_episode": np.array(done)}


def test_episode_returns_give_the_record_rlperfs_learning_fields() -> None:
    timer = rlperf.PhaseTimer("cpu", interval_s=1e9, score_targets=(2.0, 50.0))
    returns = [float(i % 5) for i in range(150)]  # the mean of any 100 in a row is 2.0
    for i, ret in enumerate(returns):
        timer.episode(ret, length=10 + i % 3)
        timer.step_done()
    record = timer.record(num_envs=4)
    learning = record["learning"]
    assert learning["mean_score_last_100"] == pytest.approx(np.mean(returns[-100:]))
    assert learning["mean_return_last_100"] == learning["mean_score_last_100"] and learning["best_score"] == 4
    assert learning["mean_episode_length"] == pytest.approx(11.0, abs=0.02) and record["totals"]["episodes"] == 150
    (row,) = record["intervals"]
    assert row["episodes"] == 150 and row["mean_score_100"] == pytest.approx(2.0)
    hit, missed = record["time_to_score"]["targets"]
    assert hit["reached"] and hit["episodes"] == 100 and hit["env_steps"] == 100 * 4  # the 100th episode's step
    assert not missed["reached"] and missed["score"] == 50.0


def test_episodes_read_gymnasiums_record_episode_statistics_in_every_form() -> None:
    timer = rlperf.PhaseTimer("cpu")
    assert timer.episodes({}) == 0 and timer.episodes({"episode": None}) == 0
    assert timer.episodes(_vector_info([1.0, 7.0, 3.0], [5, 9, 4], [False, True, True])) == 2
    assert timer.episodes({"episode": {"r": 2.5, "l": 8, "t": 0.1}}) == 1  # one env
    assert timer.episodes({"episode": {"r": np.array([4.0]), "l": np.array([3])}}) == 1  # (1,) arrays
    old = {"final_info": [None, {"episode": {"r": np.array([6.0]), "l": np.array([2])}}, {}]}  # gymnasium < 1.0
    assert timer.episodes(old) == 1
    torch = pytest.importorskip("torch")
    assert timer.episodes({"episode": {"r": torch.tensor([1.0, 2.0]), "l": torch.tensor([1, 2])},
                           "_episode": torch.tensor([True, False])}) == 1
    assert [e[3] for e in timer._episodes] == [7.0, 3.0, 2.5, 4.0, 6.0, 1.0]
    assert [e[4] for e in timer._episodes] == [9, 4, 8, 3, 2, 1]


def test_episodes_from_a_real_gymnasium_vector_env() -> None:
    gym = pytest.importorskip("gymnasium")
    envs = gym.wrappers.vector.RecordEpisodeStatistics(gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync"))
    envs.reset(seed=0)
    envs.action_space.seed(0)
    timer = rlperf.PhaseTimer("cpu")
    returns = []
    for _ in range(300):
        with timer.phase("step"):
            _, _, _, _, info = envs.step(envs.action_space.sample())
        timer.episodes(info)
        if "_episode" in info:
            returns += info["episode"]["r"][info["_episode"]].tolist()
        timer.step_done()
    envs.close()
    record = timer.record(num_envs=4)
    assert returns and record["totals"]["episodes"] == len(returns)
    assert record["learning"]["mean_score_last_100"] == pytest.approx(np.mean(returns[-100:]))
    assert sum(r["episodes"] for r in record["intervals"]) == len(returns)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "3", None, True])
def test_an_episode_return_must_be_a_finite_number(value: object) -> None:
    with pytest.raises(ConfigError, match="return must be a finite number"):
        rlperf.PhaseTimer("cpu").episode(value)  # type: ignore[arg-type]


def test_a_record_without_episodes_keeps_its_shape() -> None:
    timer = rlperf.PhaseTimer("cpu")
    timer.step_done()
    record = timer.record()
    assert "learning" not in record and "time_to_score" not in record and "episodes" not in record["totals"]
    assert record["intervals"][0]["episodes"] is None


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")


@pytest.mark.parametrize("config", [[1, 2], "lr=3", {"net": _Unprintable()}])
def test_a_refused_config_is_one_error_and_leaves_nothing(config: object, tmp_path: Path) -> None:
    timer = rlperf.PhaseTimer("cpu")
    timer.step_done()
    with pytest.raises(ConfigError, match="config"):
        timer.save(tmp_path / "runs", config=config)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="config"):
        timer.record(config=config)  # type: ignore[arg-type]
    assert not (tmp_path / "runs").exists()


def test_compare_shows_a_scripts_learning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_cli

    dirs = []
    for offset in (0.0, 1.0):
        timer = rlperf.PhaseTimer("cpu", score_targets=(3.0,))
        for i in range(120):
            with timer.phase("step"):
                pass
            timer.episode(offset + i / 20)
            timer.step_done()
        dirs.append(str(timer.save(tmp_path, num_envs=2)))
    code, out, err = run_cli(["compare", *dirs, "--no-plot", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "mean score (last 100)" in out and "time to score 3" in out
