"""``rlperf train --set env.id=...``: any registered Gymnasium env with Discrete actions and a Box
observation, through its vector entry point or Gymnasium's wrappers; the rest refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import run_cli
from rlperf.cli import main
from rlperf.config import config_from
from rlperf.env.gym_env import GymnasiumEnv, env_spaces
from rlperf.run.lifecycle import train_run

CARTPOLE = ["env.id=CartPole-v1", "run.threads=1", "train.learning_starts=256", "buffer.capacity=5000",
            "agent.hidden=[32,32]", "train.checkpoint=false"]


@pytest.mark.parametrize("backend", ["tensor", "gym-sync"])
def test_cartpole_trains_through_the_vector_entry_point_or_the_wrappers(backend: str, tmp_path: Path) -> None:
    cfg = config_from(None, [*CARTPOLE, f"env.backend={backend}"], envs=8, steps=4000)
    record = train_run(cfg, out=tmp_path, quiet=True, dashboard=False).record
    assert record["status"] == "completed" and record["totals"]["env_steps"] >= 4000 and record["totals"]["updates"] > 0
    learning = record["learning"]
    # CartPole's score is its return: +1 a step, so a finished episode's return is its length.
    assert learning["mean_score_last_100"] == learning["mean_return_last_100"] > 5
    assert record["totals"]["episodes"] > 0 and learning["mean_episode_length"] > 5
    assert record["config"]["env"]["id"] == "CartPole-v1"


def test_next_step_autoreset_is_not_pushed_as_a_transition() -> None:
    env = GymnasiumEnv("CartPole-v1", "tensor", 4, torch.device("cpu"))  # CartPoleVectorEnv: NEXT_STEP only
    assert not env.same_step
    env.reset(seed=0)
    always_left = torch.zeros(4, dtype=torch.int64)
    length = 0
    for t in range(200):
        _obs, _r, terminated, truncated, infos = env.step(always_left)
        assert infos["_valid"].all()  # no board was resetting yet
        done = terminated | truncated
        if done.any():
            length = t + 1
            break
    assert length > 0
    assert (infos["final_info"]["steps"][done] == length).all() and infos["_final_info"][done].all()
    _obs, _r, _term, _trunc, infos = env.step(always_left)
    assert not infos["_valid"][done].any() and infos["_valid"][~done].all()  # those boards' reset step
    env.close()


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("Pendulum-v1", "env.id=Pendulum-v1 has a Box action space; rlperf's DQN needs Discrete actions"),
        ("CartPole-v9", "env.id='CartPole-v9' is not a registered Gymnasium env (did you mean 'CartPole-v1'?)"),
        ("Blackjack-v1", "env.id=Blackjack-v1 has a Tuple observation; rlperf's DQN needs a Box"),
    ],
)
def test_an_env_that_does_not_fit_is_one_line_exit_2(env_id: str, message: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "--set", f"env.id={env_id}", "--steps", "100", "--out", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_acrobot_has_no_vector_entry_point_and_says_which_backend_works(tmp_path: Path, capsys) -> None:
    import gymnasium

    if gymnasium.spec("Acrobot-v1").vector_entry_point is not None:
        pytest.skip("this Gymnasium has a vector entry point for Acrobot")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--set", "env.id=Acrobot-v1", "--steps", "100", "--out", str(tmp_path / "runs")])
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and "no vector entry point" in err and "env.backend=gym-sync" in err


def test_spaces_and_shapes() -> None:
    from rlperf.env.gym_env import network_shape

    assert env_spaces("CartPole-v1") == ((4,), 2) and env_spaces("MountainCar-v0") == ((2,), 3)
    assert network_shape((2, 3, 4, 5)) == (120,) and network_shape((3, 8, 8)) == (3, 8, 8)


@pytest.mark.parametrize("sets", [
    ["env.id=CartPole-v1", "env.kernel=fused"],
    ["env.id=CartPole-v1", "env.kernel=ops"],
    ["env.id=CartPole-v1", "env.flood_fill=bfs"],
    ["env.id=CartPole-v1", "env.size=8"],
    ["env.backend=gym-async", "env.kernel=ops"],
    ["env.backend=gym-sync", "env.kernel=ops"],
    ["env.backend=gym-sync", "env.kernel=fused"],
])
def test_an_explicit_setting_that_cannot_take_effect_is_one_line_exit_2(sets: list[str], tmp_path: Path, capsys) -> None:
    args = [item for s in sets for item in ("--set", s)]
    code, out, err = run_cli(["train", "--config", "smoke", "--steps", "100", "--out", str(tmp_path / "runs"), *args], capsys)
    key = sets[1].split("=")[0]
    assert code == 2 and out == "" and key in err and ("cannot take effect" in err or "steps single boards" in err)
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_what_another_env_does_anyway_is_accepted() -> None:
    """A packaged config's Snake keys (default's flood_fill=tensor) and an explicit no-op are not refused."""
    from rlperf.cli.options import RunArgs

    for sets in (["env.id=CartPole-v1"], ["env.id=CartPole-v1", "env.kernel=auto", "env.flood_fill=off"],
                 ["env.backend=gym-sync", "env.kernel=auto"]):
        cfg = RunArgs(config="default", set_=sets).build_config()
        assert cfg.env.flood_fill == ("tensor" if len(sets) == 1 or "gym" in sets[0] else "off")


def test_the_env_is_resolved_once_for_the_record_and_async_actors_step_on_the_cpu() -> None:
    from rlperf.env.plan import plan_env

    snake = config_from("smoke", ["env.kernel=ops"])
    plan = plan_env(snake, torch.device("cpu"))
    assert (plan.kernel, plan.record()) == ("ops", {"kernel": "ops", "reason": plan.reason})
    assert plan_env(config_from("smoke", ["run.mode=async"]), torch.device("cuda")).device == torch.device("cpu")
    assert plan_env(config_from("smoke", ["env.id=CartPole-v1"]), torch.device("cpu")).kernel is None
