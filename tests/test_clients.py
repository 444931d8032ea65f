"""rlperf's Snake under the clients its users already run: Gymnasium's checker and wrappers,
Stable-Baselines3 and TorchRL, plus the env-side contracts they rely on (rendering, fresh returned
tensors, the episode statistics' key, ``autoreset_mode``, clear errors for bad input)."""

from __future__ import annotations

import importlib.util

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import rlperf  # noqa: F401  (registers rlperf/Snake-v0)
from rlperf.env import single
from rlperf.env.single import SnakeEnv
from rlperf.env.vector import VectorSnake
from rlperf.errors import InvalidActionError, ResetNeededError

ENV_ID = "rlperf/Snake-v0"
KERNELS = ["ops", "fused"]


def needs(module: str, install: str = "pip install -e '.[dev,bench]'") -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module} ({install})")


def random_steps(env: VectorSnake, steps: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        env.step(torch.randint(0, 3, (env.num_envs,), generator=gen))


# ---------------------------------------------------------------- rendering


def test_rgb_array_draws_the_board():
    env = SnakeEnv(size=5, render_mode="rgb_array")
    env.reset(seed=0)
    env.set_state(body=[(1, 1), (1, 2), (2, 2)], direction=3, fruit=(4, 0))
    frame = env.render()
    px = single.CELL_PIXELS
    assert frame.shape == (7 * px, 7 * px, 3) and frame.dtype == np.uint8
    colour = lambda row, col: tuple(frame[(row + 1) * px + px // 2, (col + 1) * px + px // 2])  # noqa: E731
    assert colour(1, 1) == tuple(single.PALETTE[single.HEAD])
    assert colour(1, 2) == colour(2, 2) == tuple(single.PALETTE[single.BODY])
    assert colour(4, 0) == tuple(single.PALETTE[single.FRUIT]) and colour(0, 0) == tuple(single.PALETTE[single.EMPTY])
    assert tuple(frame[0, 0]) == tuple(frame[-1, -1]) == tuple(single.PALETTE[single.WALL])
    assert "rgb_array" in SnakeEnv.metadata["render_modes"] and SnakeEnv.metadata["render_fps"] > 0


@pytest.mark.parametrize("kernel", KERNELS)
def test_vector_frames_are_the_single_board_frames(kernel):
    env = VectorSnake(6, size=5, device="cpu", render_mode="rgb_array", kernel=kernel)
    env.reset(seed=1)
    random_steps(env, 7)
    frames = env.render()
    assert isinstance(frames, tuple) and len(frames) == 6
    twin = SnakeEnv(size=5, render_mode="rgb_array")
    twin.reset(seed=0)
    for i, frame in enumerate(frames):
        twin.set_state(**env.get_board(i))
        assert np.array_equal(frame, twin.render()), i


def test_frames_reach_a_wrapper_without_a_video_writer():
    """What ``RecordVideo`` hands its writer, checked with ``RenderCollection`` (no moviepy needed)."""
    env = gymnasium.wrappers.RenderCollection(gymnasium.make(ENV_ID, size=6, render_mode="rgb_array"))
    env.reset(seed=0)
    for _ in range(5):
        env.step(0)
    frames = env.render()
    assert len(frames) == 6 and len({f.shape for f in frames}) == 1 and frames[0].dtype == np.uint8
    env.close()


@needs("moviepy", "pip install -e \".[dev]\": moviepy is RecordVideo's writer, in the test extras")
def test_record_video_over_snake_env(tmp_path):
    env = gymnasium.wrappers.RecordVideo(gymnasium.make(ENV_ID, size=6, render_mode="rgb_array"), str(tmp_path),
                                         episode_trigger=lambda episode: episode == 0, disable_logger=True)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        done = terminated or truncated
    env.close()
    videos = list(tmp_path.glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000


# ---------------------------------------------------------------- the checkers, every mode


@pytest.mark.filterwarnings("ignore:It seems that your observation:UserWarning")  # SB3 on float planes: advice only
@pytest.mark.filterwarnings("ignore:The minimal resolution:UserWarning")
@pytest.mark.parametrize("render_mode", [None, "ansi", "rgb_array"])
@pytest.mark.parametrize(("obs", "flood_fill"), [("features", "off"), ("features", "bfs"), ("grid", "off")])
def test_env_checkers_pass_in_every_mode(obs, flood_fill, render_mode):
    from gymnasium.utils.env_checker import check_env

    # Made through the registry, so the checker can also try the other render modes (it needs a spec).
    check_env(gymnasium.make(ENV_ID, size=6, obs=obs, flood_fill=flood_fill, render_mode=render_mode).unwrapped,
              skip_render_check=False)
    if importlib.util.find_spec("stable_baselines3"):
        from stable_baselines3.common.env_checker import check_env as sb3_check_env

        sb3_check_env(SnakeEnv(size=6, obs=obs, flood_fill=flood_fill, render_mode=render_mode))


# ---------------------------------------------------------------- returned tensors


@pytest.mark.parametrize("kernel", KERNELS)
def test_returned_tensors_never_change_by_default(kernel):
    env = VectorSnake(8, size=5, device="cpu", kernel=kernel)
    obs, _ = env.reset(seed=2)
    kept = [obs]
    for _ in range(3):
        out = env.step(torch.randint(0, 3, (8,)))
        kept += [*out[:4], out[4]["final_obs"], out[4]["_final_obs"], *out[4]["final_info"].values()]
    snapshot = [t.clone() for t in kept]
    random_steps(env, 20)
    assert all(torch.equal(a, b) for a, b in zip(kept, snapshot, strict=True))


@pytest.mark.parametrize("kernel", KERNELS)
def test_copy_false_returns_the_envs_own_buffers(kernel):
    env = VectorSnake(8, size=5, device="cpu", kernel=kernel, copy=False)
    obs0, _ = env.reset(seed=2)
    obs1, rewards, *_ = env.step(torch.zeros(8, dtype=torch.long))
    obs2, rewards2, *_ = env.step(torch.zeros(8, dtype=torch.long))
    # Two observation buffers alternate (obs = next_obs hand-offs stay valid); the rest is reused.
    assert obs0.data_ptr() == obs2.data_ptr() != obs1.data_ptr() and rewards.data_ptr() == rewards2.data_ptr()


@pytest.mark.parametrize("kernel", KERNELS)
def test_copy_false_returns_the_same_values_as_copy_true(kernel):
    envs = [VectorSnake(8, size=5, device="cpu", kernel=kernel, copy=copy) for copy in (True, False)]
    for env in envs:
        env.reset(seed=4)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):  # long enough for deaths, resets and final_info rows
        actions = torch.randint(0, 3, (8,), generator=g)
        fresh, views = (env.step(actions) for env in envs)
        for a, b in zip(fresh[:4], views[:4], strict=True):
            assert torch.equal(a, b)
        for key in ("final_obs", "_final_obs", "_final_info"):
            assert torch.equal(fresh[4][key], views[4][key])
        for key in ("score", "steps", "return"):
            assert torch.equal(fresh[4]["final_info"][key], views[4]["final_info"][key])


def test_make_env_gives_the_trainer_the_zero_copy_env():
    from rlperf.env.backends import make_env

    assert make_env("tensor", 4, torch.device("cpu")).copy is False
    assert VectorSnake(4, device="cpu").copy is True


def test_autoreset_mode_is_an_attribute_too():
    env = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", device="cpu")
    assert env.autoreset_mode is env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("actions", "words"), [
    (torch.tensor([0, 1, -1, 2]), "action -1 for board 2"),
    (np.array([3, 0, 0, 0]), "action 3 for board 0"),
    (torch.tensor([0.0, 1.0, 2.0, 0.0]), "dtype torch.float32"),
    (np.array([True, False, True, False]), "dtype torch.bool"),
    (torch.tensor([0, 1, 2]), "shape (4,)"),
])
def test_invalid_actions_are_one_clear_error_and_change_nothing(kernel, actions, words):
    env = VectorSnake(4, size=5, device="cpu", kernel=kernel)
    env.reset(seed=0)
    before = env.state_dict()
    with pytest.raises(InvalidActionError, match=words.replace("(", r"\(").replace(")", r"\)")) as raised:
        env.step(actions)
    assert isinstance(raised.value, ValueError) and "\n" not in str(raised.value)
    after = env.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if isinstance(before[k], torch.Tensor))
    env.step(torch.zeros(4, dtype=torch.long))  # still usable


@pytest.mark.parametrize("kernel", KERNELS)
def test_step_before_reset_is_refused(kernel):
    env = VectorSnake(4, size=5, device="cpu", kernel=kernel)
    with pytest.raises(ResetNeededError, match="before reset") as raised:
        env.step(torch.zeros(4, dtype=torch.long))
    assert isinstance(raised.value, RuntimeError)


def test_the_sync_free_path_raises_at_the_next_read_of_the_device():
    """On CUDA (``dense``) the check must not wait on the device: a flag, raised at the next sync."""
    env = VectorSnake(4, size=5, device="cpu", kernel="ops")
    env.dense = True
    env.reset(seed=0)
    env.step(torch.tensor([0, -1, 2, 1]))  # no host read in the step
    with pytest.raises(InvalidActionError, match="detected on the device"):
        env.get_board(0)
    env.get_board(0)  # raised once
    env.step(torch.tensor([0, 5, 2, 1]))
    with pytest.raises(InvalidActionError):
        env.reset()


# ---------------------------------------------------------------- Stable-Baselines3


@needs("stable_baselines3")
def test_sb3_dqn_trains_from_the_registered_id():
    """SB3 makes the env itself with render_mode="rgb_array" (and falls back only on TypeError)."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    model = DQN("MlpPolicy", ENV_ID, learning_starts=100, buffer_size=1_000, seed=0, device="cpu")
    assert model.get_env().render_mode == "rgb_array"
    model.learn(total_timesteps=400)
    assert model.num_timesteps >= 400 and model._n_updates > 0
    envs = make_vec_env(ENV_ID, n_envs=2, env_kwargs={"size": 6, "flood_fill": "bfs"})
    assert envs.reset().shape == (2, 14)
    envs.close()


# ---------------------------------------------------------------- TorchRL


def recording(env, calls: list) -> None:
    """Replace ``env.step``/``env.reset`` with versions that log clones of what they return."""
    step, reset = env.step, env.reset

    def recorded_step(action):
        out = step(action)
        calls.append(("step", torch.as_tensor(out[0]).clone(), out))
        return out

    def recorded_reset(**kwargs):
        out = reset(**kwargs)
        calls.append(("reset", torch.as_tensor(out[0]).clone(), out))
        return out

    env.step, env.reset = recorded_step, recorded_reset


@needs("torchrl")
def test_torchrl_gym_env_stores_what_the_env_returned():
    from torchrl.envs import GymEnv

    env = GymEnv(ENV_ID, size=6)
    calls: list = []
    recording(env._env, calls)
    env.set_seed(0)
    calls.clear()
    td = env.rollout(300, break_when_any_done=False)
    obs, nxt, done = td["observation"], td["next", "observation"], td["next", "done"].squeeze(-1)
    assert int(done.sum()) >= 5
    kinds = [c[0] for c in calls]
    assert kinds[0] == "reset"
    steps = [c for c in calls if c[0] == "step"]
    assert len(steps) == 300
    assert torch.equal(obs[0], calls[0][1])
    at = 1
    for t in range(300):
        assert calls[at][0] == "step" and torch.equal(nxt[t], calls[at][1]), t
        at += 1
        if done[t] and t + 1 < 300:  # TorchRL resets a finished single env; the next stored obs is that reset's
            assert calls[at][0] == "reset"
            at += 1
        if t + 1 < 300:
            assert torch.equal(obs[t + 1], calls[at - 1][1]), t


@needs("torchrl")
@pytest.mark.parametrize("kernel", KERNELS)
def test_torchrl_gym_wrapper_over_vector_snake_stores_what_the_env_returned(kernel):
    """SAME_STEP autoreset: ``next`` holds ``final_obs``, the following ``observation`` the returned one."""
    from torchrl.envs import GymWrapper

    venv = gymnasium.make_vec(ENV_ID, num_envs=8, vectorization_mode="vector_entry_point", size=6, device="cpu",
                              kernel=kernel)
    calls: list = []
    recording(venv, calls)
    env = GymWrapper(venv)
    env.set_seed(0)
    calls.clear()
    td = env.rollout(400, break_when_any_done=False)
    steps = [c for c in calls if c[0] == "step"]
    assert len(steps) == 400 and int(td["next", "done"].sum()) > 100
    obs, nxt = td["observation"], td["next", "observation"]
    assert torch.equal(obs[:, 0], calls[0][1])
    for t, (_, returned, out) in enumerate(steps):
        assert torch.equal(nxt[:, t], out[4]["final_obs"]), t
        if t + 1 < 400:
            assert torch.equal(obs[:, t + 1], returned), t


# ---------------------------------------------------------------- Gymnasium's vector wrappers


@needs("array_api_compat")
def test_gymnasium_record_episode_statistics_over_vector_snake():
    from gymnasium.wrappers.vector import ArrayConversion, RecordEpisodeStatistics

    venv = gymnasium.make_vec(ENV_ID, num_envs=8, vectorization_mode="vector_entry_point", size=6, device="cpu")
    env = RecordEpisodeStatistics(ArrayConversion(venv, env_xp=torch, target_xp=np))
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(100):
        _, rewards, _, _, info = env.step(rng.integers(0, 3, 8))
        assert isinstance(rewards, np.ndarray)
        if "_episode" in info:
            ended = info["_episode"]
            assert np.array_equal(info["episode"]["l"][ended], info["final_info"]["steps"][ended])
            assert np.allclose(info["episode"]["r"][ended], info["final_info"]["return"][ended])
            episodes += int(ended.sum())
    assert episodes > 20 and len(env.return_queue) == min(episodes, 100)
