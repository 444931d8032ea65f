"""SnakeEnv: Gymnasium conformance, every rule on hand-built boards, and rollout invariants."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlperf  # noqa: F401  (registers rlperf/Snake-v0)
from rlperf.env.single import DELTAS, SnakeEnv, render_board
import itertools

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3
STRAIGHT, TURN_RIGHT, TURN_LEFT = 0, 1, 2

# A size-6 board with a one-cell pocket at (2, 2) left of the head, heading up:
#   . . . . . .
#   . o o T . .        T = tail (1, 3)
#   . o . H . .        H = head (2, 3)
#   . o o o . .
POCKET_BODY = [(2, 3), (3, 3), (3, 2), (3, 1), (2, 1), (1, 1), (1, 2), (1, 3)]


def _env(size: int = 6, **kwargs) -> SnakeEnv:
    env = SnakeEnv(size=size, **kwargs)
    env.reset(seed=0)
    return env


def _straight_body(head: tuple[int, int], direction: int, length: int) -> list[tuple[int, int]]:
    d_row, d_col = DELTAS[direction]
    return [(head[0] - k * d_row, head[1] - k * d_col) for k in range(length)]


def _check_invariants(env: SnakeEnv) -> None:
    state = env.get_state()
    body = state["body"]
    assert len(set(body)) == len(body)
    for row, col in body:
        assert 0 <= row < env.size and 0 <= col < env.size
    for (r0, c0), (r1, c1) in itertools.pairwise(body):
        assert abs(r0 - r1) + abs(c0 - c1) == 1
    if state["fruit"] is None:
        assert len(body) == env.size * env.size
    else:
        assert state["fruit"] not in body


# ---------------------------------------------------------------- Gymnasium conformance


@pytest.mark.parametrize("kwargs", [{}, {"obs": "grid"}, {"flood_fill": "bfs"}, {"flood_fill": "tensor"}])
def test_check_env_passes_without_warnings(kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gymnasium.make("rlperf/Snake-v0", **kwargs).unwrapped)
    assert [str(w.message) for w in caught] == []


def test_check_env_on_a_bare_instance():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(SnakeEnv())
    # Without a registry spec the checker can only say it cannot make other render modes.
    assert all("not having a spec" in str(w.message) for w in caught)


def test_make_passes_kwargs_through():
    env = gymnasium.make("rlperf/Snake-v0", size=6, obs="grid")
    assert env.unwrapped.size == 6
    obs, info = env.reset(seed=3)
    assert obs.shape == (3, 6, 6) and obs.dtype == np.float32
    assert env.observation_space.contains(obs)
    assert info == {"score": 0, "snake_length": 3, "steps": 0}
    obs, _reward, _terminated, _truncated, info = env.step(0)
    assert obs.shape == (3, 6, 6) and info["steps"] == 1
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "shape"),
    [({}, (11,)), ({"flood_fill": "bfs"}, (14,)), ({"flood_fill": "tensor"}, (14,)), ({"obs": "grid", "size": 7}, (3, 7, 7))],
)
def test_spaces(kwargs, shape):
    env = SnakeEnv(**kwargs)
    assert env.observation_space == gymnasium.spaces.Box(0.0, 1.0, shape, np.float32)
    assert env.action_space == gymnasium.spaces.Discrete(3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"size": 3}, "size"),
        ({"size": 4.5}, "size"),
        ({"obs": "pixels"}, "obs"),
        ({"flood_fill": "fast"}, "flood_fill"),
        ({"initial_length": 0}, "initial_length"),
        ({"size": 5, "initial_length": 6}, "initial_length"),
        ({"hunger": 0}, "hunger"),
        ({"hunger": -3}, "hunger"),
        ({"render_mode": "human"}, "render_mode"),
        ({"device": "cuda"}, "device"),
        ({"device": "cuda:0"}, "device"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SnakeEnv(**kwargs)


@pytest.mark.parametrize("device", [None, "cpu", "auto", "CPU"])
def test_host_devices_are_accepted(device):
    SnakeEnv(device=device).reset(seed=0)


# ---------------------------------------------------------------- reset


def test_reset_covers_every_legal_start():
    size, length = 4, 3
    env = SnakeEnv(size=size, initial_length=length)
    seen = set()
    for seed in range(1500):
        env.reset(seed=seed)
        state = env.get_state()
        assert state["body"] == _straight_body(state["body"][0], state["direction"], length)
        assert state["steps_since_fruit"] == state["score"] == state["steps"] == 0
        _check_invariants(env)
        seen.add((state["direction"], state["body"][0]))
    expected = set()
    for direction in range(4):
        for row in range(size):
            for col in range(size):
                body = _straight_body((row, col), direction, length)
                if all(0 <= r < size and 0 <= c < size for r, c in body):
                    expected.add((direction, (row, col)))
    assert seen == expected


def test_full_length_start_spans_the_board():
    env = SnakeEnv(size=4, initial_length=4)
    env.reset(seed=1)
    body = env.get_state()["body"]
    assert len(body) == 4
    assert len({row for row, _ in body}) == 1 or len({col for _, col in body}) == 1


# ---------------------------------------------------------------- rules on hand-built boards


@pytest.mark.parametrize(
    ("head", "direction"), [((0, 2), UP), ((2, 4), RIGHT), ((4, 2), DOWN), ((2, 0), LEFT)]
)
def test_wall_death(head, direction):
    env = _env(size=5)
    body = _straight_body(head, direction, 3)
    env.set_state(body, direction, fruit=(2, 2) if (2, 2) not in body else (1, 1))
    before = env.get_state()
    _, reward, terminated, truncated, info = env.step(STRAIGHT)
    assert (reward, terminated, truncated) == (-1.0, True, False)
    assert info == {"score": 0, "snake_length": 3, "steps": 1}
    assert env.get_state()["body"] == before["body"]


def test_self_death():
    env = _env(size=6)
    # Heading right; turning right (down) runs into (3, 2), a segment that is not the tail.
    env.set_state([(2, 2), (2, 1), (3, 1), (3, 2), (3, 3)], RIGHT, fruit=(0, 0))
    _, reward, terminated, truncated, _ = env.step(TURN_RIGHT)
    assert (reward, terminated, truncated) == (-1.0, True, False)


def test_eating_grows_by_one_and_respawns_on_a_free_cell():
    for seed in range(20):
        env = SnakeEnv(size=5)
        env.reset(seed=seed)
        body = [(2, 2), (3, 2), (4, 2)]
        env.set_state(body, UP, fruit=(1, 2), steps_since_fruit=7, score=4, steps=9)
        _, reward, terminated, truncated, info = env.step(STRAIGHT)
        assert (reward, terminated, truncated) == (1.0, False, False)
        state = env.get_state()
        assert state["body"] == [(1, 2), *body]
        assert state["score"] == 5 and state["steps_since_fruit"] == 0 and state["steps"] == 10
        assert info == {"score": 5, "snake_length": 4, "steps": 10}
        assert state["fruit"] is not None and state["fruit"] not in state["body"]
        _check_invariants(env)


def test_plain_move_frees_the_tail():
    env = _env(size=5)
    env.set_state([(2, 2), (3, 2), (4, 2)], UP, fruit=(0, 0), steps_since_fruit=2)
    _, reward, terminated, truncated, info = env.step(STRAIGHT)
    assert (reward, terminated, truncated) == (0.0, False, False)
    state = env.get_state()
    assert state["body"] == [(1, 2), (2, 2), (3, 2)]
    assert state["fruit"] == (0, 0) and state["steps_since_fruit"] == 3
    assert info["snake_length"] == 3


def test_following_the_tail_round_a_loop_is_legal():
    env = _env(size=5, hunger=1000)
    # A 2x2 loop: head (1,1) heading left, tail (2,1) right below it; turning left enters the tail.
    env.set_state([(1, 1), (1, 2), (2, 2), (2, 1)], LEFT, fruit=(4, 4))
    square = {(1, 1), (1, 2), (2, 1), (2, 2)}
    for _ in range(40):
        _, reward, terminated, truncated, _ = env.step(TURN_LEFT)
        assert (reward, terminated, truncated) == (0.0, False, False)
        body = env.get_state()["body"]
        assert set(body) == square and len(body) == 4
        _check_invariants(env)


def test_hunger_truncates_after_exactly_hunger_steps():
    hunger = 6
    env = _env(size=5, hunger=hunger)
    env.set_state([(1, 1), (1, 2), (2, 2), (2, 1)], LEFT, fruit=(4, 4))
    for step in range(1, hunger + 1):
        _, reward, terminated, truncated, _ = env.step(TURN_LEFT)
        assert reward == 0.0 and not terminated
        assert truncated == (step == hunger)


def test_hunger_counts_from_the_given_state_and_defaults_to_the_board_area():
    env = _env(size=5)
    assert env.hunger == 25
    env.set_state([(1, 1), (1, 2), (2, 2), (2, 1)], LEFT, fruit=(4, 4), steps_since_fruit=23)
    assert env.step(TURN_LEFT)[3] is False
    assert env.step(TURN_LEFT)[3] is True


def test_eating_resets_hunger():
    env = _env(size=5, hunger=2)
    env.set_state([(2, 2), (3, 2)], UP, fruit=(1, 2), steps_since_fruit=1)
    _, reward, terminated, truncated, _ = env.step(STRAIGHT)
    assert (reward, terminated, truncated) == (1.0, False, False)
    assert env.get_state()["steps_since_fruit"] == 0


def _snake_order(size: int) -> list[tuple[int, int]]:
    """Every cell in a boustrophedon path: row 0 left to right, row 1 right to left, ..."""
    return [(row, col if row % 2 == 0 else size - 1 - col) for row in range(size) for col in range(size)]


def test_filling_the_board_wins():
    path = _snake_order(4)
    body = path[14::-1]  # head at path[14] = (3, 1), tail at (0, 0)
    env = SnakeEnv(size=4, render_mode="ansi", flood_fill="bfs")
    env.reset(seed=0)
    env.set_state(body, LEFT, fruit=path[15], score=12)
    obs, reward, terminated, truncated, info = env.step(STRAIGHT)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info == {"score": 13, "snake_length": 16, "steps": 1}
    state = env.get_state()
    assert state["fruit"] is None and state["body"] == path[15::-1]
    assert obs[7:11].tolist() == [0.0, 0.0, 0.0, 0.0]  # no fruit, no fruit flags
    assert "*" not in env.render() and "." not in env.render()


def test_last_free_cell_needs_no_respawn_before_win():
    # One short of a win, eating leaves exactly one free cell for the new fruit.
    path = _snake_order(4)
    env = _env(size=4)
    env.set_state(path[13::-1], LEFT, fruit=path[14])
    _, reward, terminated, _, _ = env.step(STRAIGHT)
    assert reward == 1.0 and not terminated
    assert env.get_state()["fruit"] == path[15]


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        (UP, [UP, RIGHT, LEFT]),
        (RIGHT, [RIGHT, DOWN, UP]),
        (DOWN, [DOWN, LEFT, RIGHT]),
        (LEFT, [LEFT, UP, DOWN]),
    ],
)
def test_relative_actions(heading, expected):
    env = _env(size=7)
    for action, direction in zip((STRAIGHT, TURN_RIGHT, TURN_LEFT), expected, strict=True):
        env.set_state([(3, 3)], heading, fruit=(0, 0))
        env.step(action)
        state = env.get_state()
        d_row, d_col = DELTAS[direction]
        assert state["direction"] == direction
        assert state["body"] == [(3 + d_row, 3 + d_col)]


def test_invalid_action_raises():
    env = _env()
    with pytest.raises(ValueError, match="action"):
        env.step(3)


# ---------------------------------------------------------------- observations


def test_features_on_a_board_with_a_closed_pocket():
    env = _env(size=6, flood_fill="bfs")
    env.set_state(POCKET_BODY, UP, fruit=(5, 0))
    obs = env.observe()
    free = 36 - (len(POCKET_BODY) - 1)  # the tail leaves on a non-eating move
    # Straight enters the tail's cell (legal); right is open; left is the one-cell pocket.
    expected = [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, (free - 1) / free, (free - 1) / free, 1 / free]
    np.testing.assert_allclose(obs, np.array(expected, dtype=np.float32))


@pytest.mark.parametrize(
    ("fruit", "fruit_flags", "flood"),
    [
        # Eating in the pocket keeps the tail at (1, 2), which seals it: 1 of 36 - 7 cells.
        ((2, 2), [1, 0, 0, 0], [1.0, 1.0, 1 / 29]),
        # Not eating there frees the tail's cell, which opens the pocket: all 30 free cells.
        ((5, 5), [0, 1, 0, 1], [1.0, 1.0, 1.0]),
    ],
)
def test_flood_fill_blocks_the_tail_only_when_eating(fruit, fruit_flags, flood):
    env = _env(size=6, flood_fill="bfs")
    env.set_state(POCKET_BODY[:-1], UP, fruit=fruit)
    obs = env.observe()
    np.testing.assert_allclose(obs[:3], [0, 0, 0])
    np.testing.assert_allclose(obs[7:11], fruit_flags)
    np.testing.assert_allclose(obs[11:], np.array(flood, dtype=np.float32))


def test_danger_and_zero_flood_for_deadly_moves():
    env = _env(size=6, flood_fill="bfs")
    # Head (0, 2) heading up against the wall; turning right runs into (0, 3), not the tail.
    env.set_state([(0, 2), (1, 2), (1, 3), (0, 3), (0, 4)], UP, fruit=(5, 2))
    obs = env.observe()
    np.testing.assert_array_equal(obs[:3], [1, 1, 0])
    np.testing.assert_array_equal(obs[3:7], [1, 0, 0, 0])
    np.testing.assert_array_equal(obs[7:11], [0, 0, 0, 1])
    assert obs[11] == 0.0 and obs[12] == 0.0 and obs[13] > 0.0


def test_flood_fill_modes_agree_and_off_is_the_prefix():
    envs = {mode: SnakeEnv(size=6, flood_fill=mode) for mode in ("off", "bfs", "tensor")}
    rng = np.random.default_rng(0)
    for env in envs.values():
        env.reset(seed=5)
    for _ in range(300):
        action = int(rng.integers(3))
        results = {mode: env.step(action) for mode, env in envs.items()}
        np.testing.assert_array_equal(results["bfs"][0], results["tensor"][0])
        np.testing.assert_array_equal(results["off"][0], results["bfs"][0][:11])
        if results["bfs"][2] or results["bfs"][3]:
            for env in envs.values():
                env.reset()


def test_grid_planes():
    env = _env(size=5, obs="grid")
    body = [(2, 2), (3, 2), (3, 3)]
    env.set_state(body, UP, fruit=(0, 4))
    grid = env.observe()
    assert grid.shape == (3, 5, 5) and grid.dtype == np.float32
    assert {tuple(c) for c in np.argwhere(grid[0])} == set(body)
    assert [tuple(c) for c in np.argwhere(grid[1])] == [(2, 2)]
    assert [tuple(c) for c in np.argwhere(grid[2])] == [(0, 4)]
    assert grid.sum() == 5


# ---------------------------------------------------------------- render and state access


def test_render_board():
    text = render_board(4, [(1, 1), (2, 1), (2, 2)], UP, (0, 3))
    assert text == "\n".join(["######", "#...*#", "#.^..#", "#.oo.#", "#....#", "######"])
    assert [render_board(4, [(1, 1)], d, None).splitlines()[2][2] for d in range(4)] == list("^>v<")


def test_render_modes():
    env = SnakeEnv(size=5, render_mode="ansi")
    env.reset(seed=0)
    state = env.get_state()
    assert env.render() == render_board(5, state["body"], state["direction"], state["fruit"])
    quiet = _env(size=5)
    with pytest.warns(UserWarning, match="render_mode"):
        assert quiet.render() is None


@pytest.mark.parametrize(
    ("body", "fruit", "message"),
    [
        ([], (0, 0), "body"),
        ([(0, 0), (0, 5)], (2, 2), "outside"),
        ([(0, 0), (0, 1), (0, 0)], (2, 2), "distinct"),
        ([(0, 0), (0, 2)], (2, 2), "adjacent"),
        ([(0, 0), (1, 1)], (2, 2), "adjacent"),
        ([(0, 0), (0, 1)], (0, 1), "fruit"),
        ([(0, 0), (0, 1)], (5, 0), "fruit"),
        ([(0, 0), (0, 1)], None, "fruit"),
    ],
)
def test_set_state_rejects_impossible_boards(body, fruit, message):
    env = _env(size=5)
    with pytest.raises(ValueError, match=message):
        env.set_state(body, UP, fruit)


def test_get_state_round_trips():
    env = _env(size=6, flood_fill="bfs")
    rng = np.random.default_rng(0)
    for _ in range(20):
        if any(env.step(_greedy_action(env, rng))[2:4]):
            break
    state = env.get_state()
    other = _env(size=6, flood_fill="bfs")
    other.set_state(**state)
    assert other.get_state() == state
    np.testing.assert_array_equal(other.observe(), env.observe())


# ---------------------------------------------------------------- rollouts


def _greedy_action(env: SnakeEnv, rng: np.random.Generator) -> int:
    """Mostly chase the fruit while avoiding immediate death, sometimes act at random."""
    if rng.random() < 0.15:
        return int(rng.integers(3))
    state = env.get_state()
    head, fruit, body = state["body"][0], state["fruit"], state["body"]
    best, best_score = 0, None
    for action, turn in enumerate((0, 1, 3)):
        d_row, d_col = DELTAS[(state["direction"] + turn) % 4]
        row, col = head[0] + d_row, head[1] + d_col
        deadly = not (0 <= row < env.size and 0 <= col < env.size) or (
            (row, col) in body[:-1] and (row, col) != fruit
        )
        distance = 0 if fruit is None else abs(row - fruit[0]) + abs(col - fruit[1])
        score = (deadly, distance, rng.random())
        if best_score is None or score < best_score:
            best, best_score = action, score
    return best


def _rollout(seed: int, steps: int, **kwargs) -> list:
    env = SnakeEnv(**kwargs)
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    trajectory = [(obs.tobytes(), info)]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(_greedy_action(env, rng))
        trajectory.append((obs.tobytes(), reward, terminated, truncated, info))
        if terminated or truncated:
            obs, info = env.reset()
            trajectory.append((obs.tobytes(), info))
    return trajectory


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": 4, "initial_length": 1},
        {"size": 5, "flood_fill": "bfs"},
        {"size": 8, "initial_length": 5, "hunger": 30},
        {"size": 10, "obs": "grid"},
    ],
)
def test_rollout_invariants(kwargs):
    env = SnakeEnv(**kwargs)
    rng = np.random.default_rng(1)
    env.reset(seed=1)
    episodes, best_score = 0, 0
    for _ in range(3000):
        before = env.get_state()
        obs, reward, terminated, truncated, info = env.step(_greedy_action(env, rng))
        state = env.get_state()
        assert env.observation_space.contains(obs)
        assert reward in (-1.0, 0.0, 1.0)
        assert not (terminated and truncated)
        assert info["snake_length"] == len(state["body"]) == env.initial_length + state["score"]
        assert info["score"] == state["score"] and info["steps"] == state["steps"]
        assert state["steps"] == before["steps"] + 1
        assert (reward == 1.0) == (state["score"] == before["score"] + 1)
        assert (reward == -1.0) == (terminated and state["fruit"] is not None)
        assert truncated == (not terminated and state["steps_since_fruit"] >= env.hunger)
        _check_invariants(env)
        best_score = max(best_score, state["score"])
        if terminated or truncated:
            episodes += 1
            env.reset()
    assert episodes > 3 and best_score > 2


def test_same_seed_same_trajectory_different_seed_different():
    first = _rollout(7, 400, size=6, flood_fill="bfs")
    assert first == _rollout(7, 400, size=6, flood_fill="bfs")
    assert first != _rollout(8, 400, size=6, flood_fill="bfs")
