"""Gymnasium interop: registration, make/make_vec, spaces, the gym-sync backend and same-step autoreset."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import rlperf  # noqa: F401  (registers rlperf/Snake-v0)
from rlperf.env.backends import GymVectorBackend, make_env
from rlperf.env.single import SnakeEnv
from rlperf.env.vector import VectorSnake

ENV_ID = "rlperf/Snake-v0"
UP = 0
STRAIGHT = 0
# Heading up against the top wall: going straight dies.
DOOMED = {"body": [(0, 2), (1, 2), (2, 2)], "direction": UP, "fruit": (5, 5)}


def safe_action(state: dict, size: int) -> int:
    """A relative action that does not run into the wall or the body."""
    deltas = ((-1, 0), (0, 1), (1, 0), (0, -1))
    (row, col), body = state["body"][0], state["body"]
    for action, turn in enumerate((0, 1, 3)):
        dr, dc = deltas[(state["direction"] + turn) % 4]
        if 0 <= row + dr < size and 0 <= col + dc < size and (row + dr, col + dc) not in body[:-1]:
            return action
    raise AssertionError(f"no safe move from {state}")


def test_import_registers_both_entry_points():
    spec = gymnasium.spec(ENV_ID)
    assert spec.entry_point == "rlperf.env.single:SnakeEnv"
    assert spec.vector_entry_point == "rlperf.env.vector:VectorSnake"


def test_make_single_board_env_with_kwargs():
    env = gymnasium.make(ENV_ID, size=6, obs="grid")
    assert isinstance(env.unwrapped, SnakeEnv)
    assert env.unwrapped.size == 6 and env.unwrapped.obs_mode == "grid"
    assert env.observation_space == gymnasium.spaces.Box(0.0, 1.0, (3, 6, 6), np.float32)
    assert env.action_space == gymnasium.spaces.Discrete(3)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    obs, *_ = env.step(1)
    assert env.observation_space.contains(obs)
    env.close()


def test_make_vec_uses_the_native_vector_env():
    env = gymnasium.make_vec(ENV_ID, num_envs=32, vectorization_mode="vector_entry_point",
                             size=8, flood_fill="tensor", device="cpu")
    assert isinstance(env, VectorSnake)
    assert (env.num_envs, env.size, env.flood_fill, env.device) == (32, 8, "tensor", torch.device("cpu"))
    mode = env.metadata["autoreset_mode"]
    assert isinstance(mode, AutoresetMode) and mode is AutoresetMode.SAME_STEP
    assert env.single_observation_space == gymnasium.spaces.Box(0.0, 1.0, (14,), np.float32)
    assert env.single_action_space == gymnasium.spaces.Discrete(3)
    assert env.observation_space.shape == (32, 14)
    assert env.action_space == gymnasium.spaces.MultiDiscrete(np.full(32, 3))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (32, 14) and obs.dtype == torch.float32
    obs, rewards, terminated, truncated, _infos = env.step(torch.zeros(32, dtype=torch.long))
    assert obs.shape == (32, 14) and rewards.shape == terminated.shape == truncated.shape == (32,)
    assert env.observation_space.contains(obs.numpy())
    env.close()


@pytest.mark.parametrize("kernel", ["ops", "fused"])
def test_make_vec_passes_the_kernel_through(kernel):
    env = gymnasium.make_vec(ENV_ID, num_envs=8, vectorization_mode="vector_entry_point", size=6, device="cpu",
                             kernel=kernel)
    assert isinstance(env, VectorSnake) and env.kernel == kernel and env.kernel_reason
    assert roll(env, 8, 40, seed=1) > 0


def test_the_single_board_env_refuses_the_fused_kernel():
    from rlperf.errors import ConfigError

    assert gymnasium.make(ENV_ID, kernel="auto").unwrapped.size == 10
    with pytest.raises(ConfigError, match="make_vec"):
        gymnasium.make(ENV_ID, kernel="fused")


def test_make_vec_passes_grid_obs_through():
    env = gymnasium.make_vec(ENV_ID, num_envs=5, vectorization_mode="vector_entry_point", size=7, obs="grid",
                             device="cpu")
    assert env.observation_space.shape == (5, 3, 7, 7)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (5, 3, 7, 7)
    assert env.action_space.contains(env.action_space.sample())


def test_make_vec_sync_steps_single_board_envs():
    env = gymnasium.make_vec(ENV_ID, num_envs=4, vectorization_mode="sync")
    assert isinstance(env, gymnasium.vector.SyncVectorEnv)
    assert all(isinstance(sub.unwrapped, SnakeEnv) for sub in env.envs)
    assert env.single_action_space == gymnasium.spaces.Discrete(3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 11)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(30):
        obs, rewards, terminated, truncated, _ = env.step(rng.integers(0, 3, 4))
        assert obs.shape == (4, 11) and rewards.shape == (4,)
        ended += int((terminated | truncated).sum())
    assert ended > 0
    env.close()


def roll(env, num_envs: int, steps: int, seed: int) -> int:
    """Random rollout checking the trainer-facing contract; returns the number of ended episodes."""
    gen = torch.Generator().manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    assert obs.shape == (num_envs, *env.single_observation_space.shape) and obs.dtype == torch.float32
    score = torch.zeros(num_envs, dtype=torch.int64)
    length = torch.zeros(num_envs, dtype=torch.int64)
    ended = 0
    for _ in range(steps):
        obs, rewards, terminated, truncated, infos = env.step(torch.randint(0, 3, (num_envs,), generator=gen))
        assert obs.shape == (num_envs, *env.single_observation_space.shape) and obs.dtype == torch.float32
        assert rewards.shape == (num_envs,) and rewards.dtype == torch.float32
        assert terminated.dtype == truncated.dtype == torch.bool
        done = terminated | truncated
        assert torch.equal(infos["_final_obs"], done) and torch.equal(infos["_final_info"], done)
        assert infos["final_obs"].shape == obs.shape
        score += (rewards == 1).long()
        length += 1
        for i in done.nonzero().squeeze(1).tolist():
            ended += 1
            assert not torch.equal(infos["final_obs"][i], obs[i])  # last position vs a fresh start
            assert int(infos["final_info"]["score"][i]) == int(score[i])
            assert int(infos["final_info"]["steps"][i]) == int(length[i])
        score[done] = 0
        length[done] = 0
    return ended


@pytest.mark.parametrize(("backend", "kernel"), [("tensor", "ops"), ("tensor", "fused"), ("gym-sync", "auto")])
def test_backends_speak_the_same_interface(backend, kernel):
    env = make_env(backend, 8, torch.device("cpu"), size=6, obs="grid", kernel=kernel)
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert env.single_observation_space.shape == (3, 6, 6)
    assert roll(env, 8, 60, seed=3) > 0
    if isinstance(env, GymVectorBackend):
        env.close()


def test_gym_sync_features_match_vector_snake_shapes():
    native = make_env("tensor", 8, torch.device("cpu"))
    gym_sync = make_env("gym-sync", 8, torch.device("cpu"))
    assert isinstance(gym_sync, GymVectorBackend)
    a, _ = native.reset(seed=0)
    b, _ = gym_sync.reset(seed=0)
    assert a.shape == b.shape == (8, 11) and a.dtype == b.dtype
    actions = torch.zeros(8, dtype=torch.long)
    out_a, out_b = native.step(actions), gym_sync.step(actions)
    for x, y in zip(out_a[:4], out_b[:4], strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype and x.device == y.device
    assert out_a[4].keys() == out_b[4].keys()
    assert out_a[4]["final_info"].keys() == out_b[4]["final_info"].keys()
    gym_sync.close()


@pytest.mark.parametrize("kernel", ["ops", "fused"])
def test_same_step_autoreset_native(kernel):
    env = gymnasium.make_vec(ENV_ID, num_envs=3, vectorization_mode="vector_entry_point", size=6, device="cpu",
                             kernel=kernel)
    env.reset(seed=4)
    env.set_board(1, **DOOMED, score=2, steps=9)
    single = SnakeEnv(size=6)
    single.reset(seed=0)
    single.set_state(**DOOMED)
    last_obs, *_ = single.step(STRAIGHT)

    obs, rewards, terminated, _truncated, infos = env.step(torch.zeros(3, dtype=torch.long))
    assert bool(terminated[1]) and float(rewards[1]) == -1.0 and bool(infos["_final_obs"][1])
    # final_obs holds the last observation of the ended episode ...
    assert np.array_equal(infos["final_obs"][1].numpy(), last_obs)
    # ... and the returned observation is the first of the next one, in this same step.
    fresh = env.get_board(1)
    assert len(fresh["body"]) == 3 and fresh["steps"] == fresh["score"] == 0
    single.set_state(**fresh)
    assert np.array_equal(obs[1].numpy(), single.observe())
    assert int(infos["final_info"]["score"][1]) == 2 and int(infos["final_info"]["steps"][1]) == 10
    # The next action already moves the new snake (no reset step in between, as NEXT_STEP would have).
    actions = torch.zeros(3, dtype=torch.long)
    actions[1] = safe_action(fresh, 6)
    env.step(actions)
    moved = env.get_board(1)
    assert moved["steps"] == 1 and moved["body"][1] == fresh["body"][0]


@pytest.mark.parametrize("kernel", ["ops", "fused"])
def test_same_step_autoreset_matches_gymnasium_sync_vector_env(kernel):
    """Gymnasium's own SAME_STEP vector env over SnakeEnv is the reference for the semantics."""
    reference = gymnasium.vector.SyncVectorEnv([lambda: SnakeEnv(size=6)] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    reference.reset(seed=0)
    reference.envs[0].unwrapped.set_state(**DOOMED)
    native = VectorSnake(num_envs=2, size=6, device="cpu", kernel=kernel)
    native.reset(seed=0)
    native.set_board(0, **DOOMED)

    ref_obs, _, ref_term, _, ref_infos = reference.step(np.zeros(2, dtype=np.int64))
    obs, _, terminated, _, infos = native.step(torch.zeros(2, dtype=torch.long))
    assert bool(ref_term[0]) and bool(terminated[0])
    assert ref_infos["_final_obs"][0] and bool(infos["_final_obs"][0])
    assert np.array_equal(infos["final_obs"][0].numpy(), ref_infos["final_obs"][0])
    fresh_starts = ((ref_obs[0], reference.envs[0].unwrapped.get_state()), (obs[0].numpy(), native.get_board(0)))
    for vec_obs, state in fresh_starts:
        assert state["steps"] == 0 and len(state["body"]) == 3
        single = SnakeEnv(size=6)
        single.set_state(**state)
        assert np.array_equal(vec_obs, single.observe())
    reference.close()
