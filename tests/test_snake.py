"""VectorSnake: every rule on hand-built boards, rollout invariants, seeding, and the single-board twin.

Rule and invariant tests run on every step path (the ``path`` fixture): the ``ops`` kernel with
both code paths for the rare per-board work (resets and fruit respawn) -- ``dense=False`` (the CPU
default, subset of boards) and ``dense=True`` (the CUDA default, all boards with ``torch.where``),
both forced here on the CPU -- and the ``fused`` kernel. tests/test_fused_kernel.py checks that the
two kernels agree bit for bit.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from rlperf.errors import DeviceError
from rlperf.env.single import SnakeEnv, render_board
from rlperf.env.vector import VectorSnake
import itertools

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3
STRAIGHT, TURN_RIGHT, TURN_LEFT = 0, 1, 2
DELTAS = ((-1, 0), (0, 1), (1, 0), (0, -1))

# A 2x2 loop on which a length-4 snake chases its tail: head (1,1) heading left, tail (2,1) below it.
CCW_LOOP = [(1, 1), (1, 2), (2, 2), (2, 1)]  # heading LEFT, keep turning left
CW_LOOP = [(3, 4), (3, 3), (4, 3), (4, 4)]  # heading RIGHT, keep turning right

# A size-6 board with a one-cell pocket at (2, 2) left of the head, heading up:
#   . . . . . .
#   . o o T . .        T = tail (1, 3)
#   . o . H . .        H = head (2, 3)
#   . o o o . .
POCKET_BODY = [(2, 3), (3, 3), (3, 2), (3, 1), (2, 1), (1, 1), (1, 2), (1, 3)]

# Boustrophedon path over a 4x4 board; a snake of length k lies on PATH[:k] with its head at PATH[k-1].
PATH_4X4 = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2), (1, 1), (1, 0),
            (2, 0), (2, 1), (2, 2), (2, 3), (3, 3), (3, 2), (3, 1), (3, 0)]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


PATHS = {"ops-subset": ("ops", False), "ops-dense": ("ops", True), "fused": ("fused", False)}


@pytest.fixture(params=list(PATHS.values()), ids=list(PATHS))
def path(request) -> tuple[str, bool]:
    """(kernel, dense): which step code runs."""
    return request.param


@pytest.fixture(params=[False, True], ids=["subset", "dense"])
def dense(request) -> bool:
    return request.param


def make_env(num_envs: int, size: int = 6, path: tuple[str, bool] = ("ops", False), seed: int = 0,
             device: str = "cpu", **kwargs) -> VectorSnake:
    kernel, dense = path
    if kernel == "fused" and kwargs.get("flood_fill") == "bfs":
        pytest.skip("the fused kernel computes its own flood fill (flood_fill=bfs is the ops kernel's reference)")
    env = VectorSnake(num_envs=num_envs, size=size, device=device, kernel=kernel, **kwargs)
    env.dense = dense
    env.reset(seed=seed)
    return env


def twin(env: VectorSnake) -> SnakeEnv:
    """A single-board env with the same rules and observation as ``env``."""
    single = SnakeEnv(size=env.size, obs=env.obs_mode, flood_fill=env.flood_fill,
                      initial_length=env.initial_length, hunger=env.hunger)
    single.reset(seed=0)
    return single


def observe_state(single: SnakeEnv, state: dict) -> np.ndarray:
    single.set_state(**state)
    return single.observe()


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def path_board(k: int) -> tuple[list[tuple[int, int]], int]:
    """Body (head first) and heading of a length-``k`` snake on ``PATH_4X4``."""
    body = PATH_4X4[:k][::-1]
    (r0, c0), (r1, c1) = body[1], body[0]
    return body, DELTAS.index((r1 - r0, c1 - c0))


def check_board(state: dict, size: int, initial_length: int) -> None:
    """The invariants every reachable board satisfies."""
    body = state["body"]
    assert len(body) == initial_length + state["score"]
    assert len(set(body)) == len(body)
    assert all(0 <= r < size and 0 <= c < size for r, c in body)
    assert all(abs(r0 - r1) + abs(c0 - c1) == 1 for (r0, c0), (r1, c1) in itertools.pairwise(body))
    if len(body) > 1:  # the head moved away from the neck in the heading's direction
        assert (body[0][0] - body[1][0], body[0][1] - body[1][1]) == DELTAS[state["direction"]]
    if state["fruit"] is None:
        assert len(body) == size * size
    else:
        fr, fc = state["fruit"]
        assert 0 <= fr < size and 0 <= fc < size
        assert state["fruit"] not in body
    assert 0 <= state["steps_since_fruit"] <= state["steps"]


def assert_fresh_start(state: dict, initial_length: int) -> None:
    assert len(state["body"]) == initial_length
    assert state["score"] == state["steps"] == state["steps_since_fruit"] == 0


# ---------------------------------------------------------------- rules on hand-built boards

# name: (body head first, heading, fruit, action, score)
SCENARIOS = {
    "wall_up": ([(0, 2), (1, 2), (2, 2)], UP, (5, 5), STRAIGHT, 0),
    "wall_right": ([(2, 5), (2, 4), (2, 3)], RIGHT, (5, 0), STRAIGHT, 0),
    "wall_down": ([(5, 3), (4, 3), (3, 3)], DOWN, (0, 0), STRAIGHT, 0),
    "wall_left": ([(3, 0), (3, 1), (3, 2)], LEFT, (0, 5), STRAIGHT, 0),
    "wall_by_turn": ([(0, 3), (0, 2), (0, 1)], RIGHT, (5, 5), TURN_LEFT, 0),
    # Heading up; turning right enters (2, 3), a segment that is not the tail (0, 3).
    "self": ([(2, 2), (3, 2), (3, 3), (2, 3), (1, 3), (0, 3)], UP, (5, 5), TURN_RIGHT, 3),
    "eat": ([(3, 3), (3, 2), (3, 1)], RIGHT, (3, 4), STRAIGHT, 0),
    "tail_follow": (CCW_LOOP, LEFT, (5, 5), TURN_LEFT, 1),
    "plain": ([(3, 3), (4, 3), (5, 3)], UP, (0, 0), STRAIGHT, 0),
}
DEATHS = ("wall_up", "wall_right", "wall_down", "wall_left", "wall_by_turn", "self")


def test_every_rule_on_hand_built_boards(path):
    names = list(SCENARIOS)
    env = make_env(len(names), size=6, path=path, seed=1)
    single = twin(env)
    before = {}
    for i, name in enumerate(names):
        body, heading, fruit, _, score = SCENARIOS[name]
        env.set_board(i, body, heading, fruit, steps_since_fruit=2, score=score, steps=10)
        before[name] = env.get_board(i)
    actions = torch.tensor([SCENARIOS[name][3] for name in names])
    obs, rewards, terminated, truncated, infos = env.step(actions)
    final_obs = np_(infos["final_obs"])

    for i, name in enumerate(names):
        body, heading, fruit, action, score = SCENARIOS[name]
        # The single-board env's step from the same position is the reference for the final obs.
        single.set_state(**before[name])
        s_obs, s_reward, s_term, s_trunc, _ = single.step(action)
        died = name in DEATHS
        assert float(rewards[i]) == (-1.0 if died else 1.0 if name == "eat" else 0.0), name
        assert bool(terminated[i]) == died, name
        assert not bool(truncated[i]), name
        assert bool(infos["_final_obs"][i]) == died, name
        assert (float(rewards[i]), bool(terminated[i]), bool(truncated[i])) == (s_reward, s_term, s_trunc), name
        if died:
            # The final observation shows the position the snake died in, unchanged.
            assert np.array_equal(final_obs[i], observe_state(single, before[name])), name
            assert np.array_equal(final_obs[i], s_obs), name
            assert int(infos["final_info"]["score"][i]) == score, name
            assert int(infos["final_info"]["steps"][i]) == 11, name
            assert float(infos["final_info"]["return"][i]) == score - 1, name
            # ... and the returned observation is already the next episode's first.
            state = env.get_board(i)
            assert_fresh_start(state, 3)
            check_board(state, 6, 3)
            assert np.array_equal(np_(obs[i]), observe_state(single, state)), name
        else:
            assert np.array_equal(final_obs[i], np_(obs[i])), name
    # Explicit final features: danger straight/right/left, then the heading one-hot.
    assert final_obs[names.index("wall_up"), :7].tolist() == [1, 0, 0, 1, 0, 0, 0]
    assert final_obs[names.index("wall_right"), :7].tolist() == [1, 0, 0, 0, 1, 0, 0]
    assert final_obs[names.index("wall_down"), :7].tolist() == [1, 0, 0, 0, 0, 1, 0]
    assert final_obs[names.index("wall_left"), :7].tolist() == [1, 0, 0, 0, 0, 0, 1]
    # Dying by a turn does not turn the snake: still heading right, the wall to its left.
    assert final_obs[names.index("wall_by_turn"), :7].tolist() == [0, 0, 1, 0, 1, 0, 0]

    eat = env.get_board(names.index("eat"))
    assert eat["body"] == [(3, 4), (3, 3), (3, 2), (3, 1)]
    assert eat["score"] == 1 and eat["steps_since_fruit"] == 0 and eat["steps"] == 11
    assert eat["fruit"] is not None and eat["fruit"] not in eat["body"]
    check_board(eat, 6, 3)

    follow = env.get_board(names.index("tail_follow"))
    assert follow["body"] == [(2, 1), (1, 1), (1, 2), (2, 2)] and follow["direction"] == DOWN
    assert follow["fruit"] == (5, 5) and follow["steps_since_fruit"] == 3

    plain = env.get_board(names.index("plain"))
    assert plain["body"] == [(2, 3), (3, 3), (4, 3)] and plain["direction"] == UP


def test_eating_respawns_the_fruit_on_free_cells_only(path):
    # Many copies of one eating position: the new fruit is always free, and not always the same cell.
    n = 64
    env = make_env(n, size=6, path=path, seed=2)
    body = [(2, 2), (3, 2), (4, 2), (4, 3), (4, 4), (3, 4), (2, 4)]
    for i in range(n):
        env.set_board(i, body, UP, (1, 2), score=4)
    env.step(torch.zeros(n, dtype=torch.long))
    fruits = []
    for i in range(n):
        state = env.get_board(i)
        assert state["body"] == [(1, 2), *body] and state["score"] == 5
        check_board(state, 6, 3)
        fruits.append(state["fruit"])
    assert len(set(fruits)) > 10


@pytest.mark.parametrize("obs", ["features", "grid"])
def test_win_on_a_full_board_and_the_last_free_cell(path, obs):
    env = make_env(3, size=4, path=path, seed=3, obs=obs)
    single = twin(env)
    win_body, win_dir = path_board(15)  # eats the last free cell (3, 0)
    last_body, last_dir = path_board(14)  # after eating, exactly one free cell is left: (3, 0)
    env.set_board(0, win_body, win_dir, PATH_4X4[15], score=12, steps=40)
    env.set_board(1, last_body, last_dir, PATH_4X4[14], score=11, steps=30)
    env.set_board(2, [(1, 1), (2, 1)], UP, (3, 3))
    before = env.get_board(0)
    obs_t, rewards, terminated, truncated, infos = env.step(torch.tensor([STRAIGHT, STRAIGHT, TURN_RIGHT]))

    assert rewards.tolist() == [1.0, 1.0, 0.0]
    assert terminated.tolist() == [True, False, False]
    assert truncated.tolist() == [False, False, False]
    assert int(infos["final_info"]["score"][0]) == 13 and int(infos["final_info"]["steps"][0]) == 41

    # The final observation is the full board (no fruit anywhere), as the single-board env has it.
    single.set_state(**before)
    s_obs, s_reward, s_term, s_trunc, _ = single.step(STRAIGHT)
    assert (s_reward, s_term, s_trunc) == (1.0, True, False)
    final = np_(infos["final_obs"][0])
    assert np.array_equal(final, s_obs)
    if obs == "features":
        # Head at (3, 0) heading left: wall ahead and left, body (not the tail) to the right.
        assert final.tolist() == [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    else:
        assert final[0].sum() == 16 and final[1, 3, 0] == 1 and final[1].sum() == 1 and final[2].sum() == 0

    fresh = env.get_board(0)
    assert_fresh_start(fresh, 3)
    check_board(fresh, 4, 3)
    assert np.array_equal(np_(obs_t[0]), observe_state(single, fresh))

    last = env.get_board(1)
    assert len(last["body"]) == 15 and last["score"] == 12 and last["fruit"] == (3, 0)
    assert np.array_equal(np_(obs_t[1]), observe_state(single, last))


def test_following_the_tail_round_a_loop_is_legal(path):
    env = make_env(2, size=6, path=path, seed=4, hunger=1000)
    single = twin(env)
    env.set_board(0, CCW_LOOP, LEFT, (5, 5))
    env.set_board(1, CW_LOOP, RIGHT, (0, 0))
    actions = torch.tensor([TURN_LEFT, TURN_RIGHT])
    for step in range(1, 41):
        obs, rewards, terminated, truncated, _ = env.step(actions)
        assert rewards.tolist() == [0.0, 0.0] and not terminated.any() and not truncated.any()
        for i, loop in enumerate((CCW_LOOP, CW_LOOP)):
            state = env.get_board(i)
            assert set(state["body"]) == set(loop) and state["steps"] == step
            assert state["body"][0] == loop[-step % 4]  # each move enters the cell the tail leaves
            assert np.array_equal(np_(obs[i]), observe_state(single, state))


def test_hunger_truncates_at_exactly_hunger_steps(path):
    hunger = 5
    env = make_env(3, size=6, path=path, seed=5, hunger=hunger)
    single = twin(env)
    env.set_board(0, CCW_LOOP, LEFT, (5, 5), steps=7)
    env.set_board(1, CW_LOOP, RIGHT, (0, 0), steps_since_fruit=2)
    # Hungry for 4 steps but eating now: the counter restarts instead of truncating.
    env.set_board(2, [(5, 2), (5, 1), (5, 0)], RIGHT, (5, 3), steps_since_fruit=4)
    actions = torch.tensor([TURN_LEFT, TURN_RIGHT, STRAIGHT])
    for step in range(1, hunger + 1):
        before = env.get_board(0)
        obs, rewards, terminated, truncated, infos = env.step(actions)
        assert not terminated[0]
        if step == 1:
            assert (float(rewards[2]), bool(truncated[2]), bool(terminated[2])) == (1.0, False, False)
            assert env.get_board(2)["steps_since_fruit"] == 0
            actions[2] = TURN_LEFT  # heads up from (5, 3), away from the walls for a while
        if step < 3:
            assert not truncated[1] and not terminated[1]
        elif step == 3:
            assert bool(truncated[1]) and float(rewards[1]) == 0.0
            assert_fresh_start(env.get_board(1), 3)
        if step < hunger:
            assert not truncated[0] and float(rewards[0]) == 0.0
            assert env.get_board(0)["steps_since_fruit"] == step
    assert bool(truncated[0]) and not bool(terminated[0]) and float(rewards[0]) == 0.0
    assert bool(infos["_final_obs"][0])
    assert int(infos["final_info"]["steps"][0]) == 7 + hunger
    single.set_state(**before)
    s_obs, s_reward, s_term, s_trunc, _ = single.step(TURN_LEFT)
    assert (s_reward, s_term, s_trunc) == (0.0, False, True)
    assert np.array_equal(np_(infos["final_obs"][0]), s_obs)
    fresh = env.get_board(0)
    assert_fresh_start(fresh, 3)
    assert np.array_equal(np_(obs[0]), observe_state(single, fresh))


def test_relative_actions_turn_from_every_heading(path):
    # heading -> (body head first, {action: (new heading, new head)})
    table = {
        UP: ([(2, 2), (3, 2), (4, 2)], {STRAIGHT: (UP, (1, 2)), TURN_RIGHT: (RIGHT, (2, 3)), TURN_LEFT: (LEFT, (2, 1))}),
        RIGHT: ([(2, 2), (2, 1), (2, 0)], {STRAIGHT: (RIGHT, (2, 3)), TURN_RIGHT: (DOWN, (3, 2)), TURN_LEFT: (UP, (1, 2))}),
        DOWN: ([(2, 2), (1, 2), (0, 2)], {STRAIGHT: (DOWN, (3, 2)), TURN_RIGHT: (LEFT, (2, 1)), TURN_LEFT: (RIGHT, (2, 3))}),
        LEFT: ([(2, 2), (2, 3), (2, 4)], {STRAIGHT: (LEFT, (2, 1)), TURN_RIGHT: (UP, (1, 2)), TURN_LEFT: (DOWN, (3, 2))}),
    }
    cases = [(heading, action) for heading in table for action in (STRAIGHT, TURN_RIGHT, TURN_LEFT)]
    env = make_env(len(cases), size=6, path=path, seed=6)
    for i, (heading, _) in enumerate(cases):
        env.set_board(i, table[heading][0], heading, (5, 5))
    _, rewards, terminated, _, _ = env.step(torch.tensor([action for _, action in cases]))
    assert not terminated.any() and not rewards.any()
    for i, (heading, action) in enumerate(cases):
        state = env.get_board(i)
        assert (state["direction"], state["body"][0]) == table[heading][1][action], (heading, action)
        assert state["body"][1:] == table[heading][0][:2]


# ---------------------------------------------------------------- observations on hand-built boards


def test_features_on_hand_built_boards(path):
    # (body, heading, fruit) -> danger straight/right/left, heading one-hot, fruit left/right/up/down
    boards = [
        # Turning left enters the tail (2, 1): legal, so no danger there.
        ((CCW_LOOP, LEFT, (4, 4)), [0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 1]),
        # The same turn with one more segment enters the body, not the tail.
        (([*CCW_LOOP, (3, 1)], LEFT, (0, 0)), [0, 0, 1], [0, 0, 0, 1], [1, 0, 1, 0]),
        (([(0, 0), (1, 0), (2, 0)], UP, (0, 3)), [1, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]),
        (([(5, 5), (5, 4), (5, 3)], RIGHT, (5, 0)), [1, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]),
        (([(3, 2), (2, 2), (1, 2)], DOWN, (5, 2)), [0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]),
        # A fruit right ahead is not a danger.
        (([(2, 2), (2, 3), (2, 4)], LEFT, (2, 1)), [0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0]),
    ]
    env = make_env(len(boards), size=6, path=path, seed=7)
    single = twin(env)
    for i, ((body, heading, fruit), *_) in enumerate(boards):
        env.set_board(i, body, heading, fruit)
    obs = np_(env.observations)
    assert obs.shape == (len(boards), 11) and obs.dtype == np.float32
    for i, (_position, danger, one_hot, flags) in enumerate(boards):
        assert obs[i].tolist() == [*danger, *one_hot, *flags], i
        assert np.array_equal(obs[i], observe_state(single, env.get_board(i)))


@pytest.mark.parametrize("flood_fill", ["bfs", "tensor"])
def test_flood_fill_features_see_the_pocket(path, flood_fill):
    env = make_env(3, size=6, path=path, seed=8, flood_fill=flood_fill)
    single = twin(env)
    env.set_board(0, POCKET_BODY, UP, (5, 5))
    env.set_board(1, POCKET_BODY, UP, (2, 4))  # turning right eats: the tail stays
    env.set_board(2, [(0, 0), (1, 0), (2, 0)], UP, (0, 3))  # straight and left are deadly
    obs = np_(env.observations)
    assert obs.shape == (3, 14)
    # Non-eating moves free the tail: 36 - 7 = 29 free cells; the pocket is one of them.
    assert obs[0, 11:] == pytest.approx([28 / 29, 28 / 29, 1 / 29], rel=1e-6)
    assert obs[1, 11:] == pytest.approx([28 / 29, 27 / 28, 1 / 29], rel=1e-6)
    assert obs[2, 11:].tolist() == [0.0, 1.0, 0.0]
    assert obs[0, :3].tolist() == [0, 0, 0]  # straight is the tail: legal
    for i in range(3):
        assert np.allclose(obs[i], observe_state(single, env.get_board(i)), rtol=0, atol=1e-6)


def test_grid_planes(path):
    env = make_env(2, size=6, path=path, seed=9, obs="grid")
    body = [(2, 2), (2, 3), (3, 3), (4, 3)]
    env.set_board(1, body, LEFT, (0, 5))
    grid = np_(env.observations)
    assert grid.shape == (2, 3, 6, 6) and grid.dtype == np.float32
    expected = np.zeros((3, 6, 6), dtype=np.float32)
    for cell in body:
        expected[0][cell] = 1
    expected[1][2, 2] = 1
    expected[2][0, 5] = 1
    assert np.array_equal(grid[1], expected)
    assert np.array_equal(grid[0], observe_state(twin(env), env.get_board(0)))


# ---------------------------------------------------------------- rollout invariants


def run_invariants(device: str, path: tuple[str, bool], num_envs: int, size: int, obs: str = "features",
                   flood_fill: str = "off", hunger: int | None = None, steps: int = 50, sample: int = 6) -> Counter:
    env = make_env(num_envs, size=size, path=path, seed=11, device=device, obs=obs, flood_fill=flood_fill,
                   hunger=hunger)
    assert env.dense is path[1]
    single = twin(env)
    rng = np.random.default_rng(12)
    gen = torch.Generator(device=device).manual_seed(13)
    score = torch.zeros(num_envs, dtype=torch.int64, device=device)
    length = torch.zeros_like(score)
    seen = Counter()
    for _ in range(steps):
        actions = torch.randint(0, 3, (num_envs,), generator=gen, device=device)
        obs_t, rewards, terminated, truncated, infos = env.step(actions)
        done = terminated | truncated
        assert set(rewards.unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert not (terminated & truncated).any()
        assert torch.equal(rewards == -1, terminated & (rewards != 1))  # -1 exactly on death
        assert not (truncated & (rewards != 0)).any()
        assert torch.equal(infos["_final_obs"], done) and torch.equal(infos["_final_info"], done)
        assert torch.equal(infos["final_obs"][~done], obs_t[~done])
        score += (rewards == 1).long()
        length += 1
        assert torch.equal(infos["final_info"]["score"][done], score[done])
        assert torch.equal(infos["final_info"]["steps"][done], length[done])
        score[done] = 0
        length[done] = 0
        seen["done"] += int(done.sum())
        seen["truncated"] += int(truncated.sum())
        seen["ate"] += int((rewards == 1).sum())

        ended = done.nonzero().squeeze(1).tolist()
        others = rng.choice(num_envs, size=min(sample, num_envs), replace=False).tolist()
        for i in sorted(set(ended) | set(others)):
            state = env.get_board(i)
            check_board(state, size, env.initial_length)
            assert state["score"] == int(score[i]) and state["steps"] == int(length[i])
            expected = observe_state(single, state)
            assert np.allclose(np_(obs_t[i]), expected, rtol=0, atol=1e-6), (i, state)
            if obs == "grid" and state["fruit"] is not None:
                assert np_(obs_t[i])[2].sum() == 1
            if i in ended:
                assert_fresh_start(state, env.initial_length)
    return seen


@pytest.mark.parametrize(
    ("num_envs", "size", "obs", "flood_fill", "hunger"),
    [
        (1, 4, "features", "off", None),
        (1, 10, "grid", "off", None),
        (7, 6, "features", "off", None),
        (7, 4, "grid", "off", 5),
        (7, 6, "features", "bfs", None),
        (7, 6, "features", "tensor", None),
        (64, 10, "features", "off", 30),
        (64, 4, "features", "off", None),
    ],
)
def test_rollout_invariants(path, num_envs, size, obs, flood_fill, hunger):
    seen = run_invariants("cpu", path, num_envs, size, obs, flood_fill, hunger)
    if num_envs > 1:
        assert seen["done"] > 0
    if hunger is not None:
        assert seen["truncated"] > 0


# ---------------------------------------------------------------- seeding


def rollout(env: VectorSnake, actions: torch.Tensor) -> list[torch.Tensor]:
    out = [env.observations.clone()]
    for a in actions:
        obs, rewards, terminated, truncated, infos = env.step(a)
        out += [obs.clone(), rewards.clone(), terminated.clone(), truncated.clone(), infos["final_obs"].clone()]
    return out


def test_same_seed_same_trajectory_and_different_seeds_differ(path):
    actions = torch.randint(0, 3, (40, 16), generator=torch.Generator().manual_seed(0))
    a = rollout(make_env(16, path=path, seed=3), actions)
    b = rollout(make_env(16, path=path, seed=3), actions)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c = rollout(make_env(16, path=path, seed=4), actions)
    assert not torch.equal(a[0], c[0])
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    # Re-seeding a used env restarts the same trajectory.
    env = make_env(16, path=path, seed=9)
    rollout(env, actions[:10])
    env.reset(seed=3)
    again = rollout(env, actions)
    assert all(torch.equal(x, y) for x, y in zip(a, again, strict=True))


# ---------------------------------------------------------------- the single-board twin


def policy(state: dict, size: int, rng: np.random.Generator, greedy: bool) -> int:
    """Mostly safe moves, toward the fruit if ``greedy``; sometimes anything."""
    body, heading, fruit = state["body"], state["direction"], state["fruit"]
    safe = []
    for action, turn in enumerate((0, 1, 3)):
        dr, dc = DELTAS[(heading + turn) % 4]
        target = (body[0][0] + dr, body[0][1] + dc)
        if 0 <= target[0] < size and 0 <= target[1] < size and target not in body[:-1]:
            distance = abs(target[0] - fruit[0]) + abs(target[1] - fruit[1]) if fruit else 0
            safe.append((distance, action))
    if not safe or rng.random() < 0.08:
        return int(rng.integers(3))
    if greedy:
        return min(safe)[1]
    return safe[int(rng.integers(len(safe)))][1]


@pytest.mark.parametrize(
    ("obs", "flood_fill"), [("features", "off"), ("features", "bfs"), ("features", "tensor"), ("grid", "off")]
)
def test_matches_the_single_board_env(path, obs, flood_fill):
    n, size = 12, 6
    env = make_env(n, size=size, path=path, seed=21, obs=obs, flood_fill=flood_fill, hunger=24)
    single = twin(env)
    rng = np.random.default_rng(22)
    seen = Counter()
    for _ in range(60):
        states = [env.get_board(i) for i in range(n)]
        actions = [policy(s, size, rng, greedy=i % 3 != 0) for i, s in enumerate(states)]
        obs_t, rewards, terminated, truncated, infos = env.step(torch.tensor(actions))
        for i, state in enumerate(states):
            single.set_state(**state)
            s_obs, s_reward, s_term, s_trunc, _ = single.step(actions[i])
            assert (float(rewards[i]), bool(terminated[i]), bool(truncated[i])) == (s_reward, s_term, s_trunc), state
            final = np_(infos["final_obs"][i])
            if s_term or s_trunc:
                seen["died" if s_reward < 0 else "won" if s_term else "truncated"] += 1
                assert np.allclose(final, s_obs, rtol=0, atol=1e-6), (state, actions[i])
                continue
            after, s_after = env.get_board(i), single.get_state()
            assert (after["body"], after["direction"]) == (s_after["body"], s_after["direction"])
            assert after["score"] == s_after["score"] and after["steps"] == s_after["steps"]
            assert after["steps_since_fruit"] == s_after["steps_since_fruit"]
            if s_reward > 0:
                seen["ate"] += 1
                single.set_state(**{**s_after, "fruit": after["fruit"]})
                s_obs = single.observe()
            else:
                assert after["fruit"] == s_after["fruit"]
                seen["followed tail"] += len(state["body"]) > 2 and after["body"][0] == state["body"][-1]
            assert np.allclose(np_(obs_t[i]), s_obs, rtol=0, atol=1e-6), (state, actions[i])
            assert np.array_equal(final, np_(obs_t[i]))
    assert seen["died"] and seen["ate"] and seen["truncated"] and seen["followed tail"], seen


# ---------------------------------------------------------------- construction, rendering, checkpoints


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_envs": 0}, "num_envs"),
        ({"size": 3}, "size"),
        ({"obs": "pixels"}, "obs"),
        ({"flood_fill": "dfs"}, "flood_fill"),
        ({"initial_length": 0}, "initial_length"),
        ({"size": 6, "initial_length": 7}, "initial_length"),
        ({"hunger": 0}, "hunger"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        VectorSnake(**{"num_envs": 2, "device": "cpu", **kwargs})


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_a_device_error():
    with pytest.raises(DeviceError, match="device") as raised:
        VectorSnake(num_envs=2, device="cuda")
    assert isinstance(raised.value, ValueError)


def test_render_text_matches_render_board():
    env = make_env(3, size=5, seed=10, render_mode="ansi")
    env.set_board(1, [(1, 1), (1, 2), (2, 2)], LEFT, (4, 0))
    expected = "\n".join(["#######", "#.....#", "#.<o..#", "#..o..#", "#.....#", "#*....#", "#######"])
    assert env.render_text(1) == expected == render_board(5, [(1, 1), (1, 2), (2, 2)], LEFT, (4, 0))
    for i in range(3):
        board = env.get_board(i)
        assert env.render_text(i) == render_board(5, board["body"], board["direction"], board["fruit"])
    assert env.render() == env.render_text(0)
    assert make_env(2).render() is None


def test_state_dict_round_trip(path):
    gen = torch.Generator().manual_seed(1)
    env = make_env(16, size=6, path=path, seed=14)
    rollout(env, torch.randint(0, 3, (25, 16), generator=gen))
    state = env.state_dict()
    saved_obs = env.observations.clone()
    actions = torch.randint(0, 3, (30, 16), generator=gen)
    expected = rollout(env, actions)

    fresh = VectorSnake(num_envs=16, size=6, device="cpu", kernel=path[0])
    fresh.dense = path[1]
    fresh.load_state_dict(state)
    assert torch.equal(fresh.observations, saved_obs)
    replay = rollout(fresh, actions)
    assert len(replay) == len(expected)
    assert all(torch.equal(x, y) for x, y in zip(expected, replay, strict=True))
    assert any(t.any() for t in expected[3::5])  # episodes ended (resets drew from the generator)

    with pytest.raises(ValueError, match="env state"):
        VectorSnake(num_envs=8, size=6, device="cpu").load_state_dict(state)


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize(("obs", "flood_fill"), [("features", "off"), ("features", "tensor"), ("grid", "off")])
def test_cuda_step_does_not_sync(obs, flood_fill):
    env = VectorSnake(num_envs=512, size=10, obs=obs, flood_fill=flood_fill, device="cuda")
    assert env.dense
    env.reset(seed=0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    actions = torch.randint(0, 3, (200, 512), generator=gen, device="cuda")
    for a in actions[:5]:  # warm-up: lazy initialisation may sync once
        env.step(a)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for a in actions[5:]:
            env.step(a)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize(("num_envs", "size", "obs", "flood_fill"),
                         [(7, 6, "features", "tensor"), (64, 4, "grid", "off"), (64, 10, "features", "off")])
def test_cuda_rollout_invariants(dense, num_envs, size, obs, flood_fill):
    seen = run_invariants("cuda", ("ops", dense), num_envs, size, obs, flood_fill, hunger=30)
    assert seen["done"] > 0
