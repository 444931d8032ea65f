"""The fused kernel against the ops kernel: the same draws give the same everything, bit for bit.

Both kernels consume three uniform draws per board and step (fruit after eating, start of a new
episode, fruit after that start). Fed the same draws through ``step_with_draws``, every field must
agree after every step: the state tensors, the returned observation, ``final_obs``, rewards,
flags and episode statistics, on trajectories that include deaths, truncations, resets and wins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from rlperf.config import config_from
from rlperf.env import fused
from rlperf.env.floodfill import bfs_count
from rlperf.env.vector import VectorSnake, resolve_kernel
from rlperf.errors import ConfigError

CPU = torch.device("cpu")
STATE = ("_state", "_ring", "_occ", "_floats", "_flags", "_obs_all")
DELTAS = ((-1, 0), (0, 1), (1, 0), (0, -1))


def cycle_successor(size: int) -> torch.Tensor:
    """The next cell on a Hamiltonian cycle of an even board: rows 0.. boustrophedon over columns
    1..S-1, then up column 0. A snake that follows it never dies and eats every fruit: it wins."""
    order = []
    for row in range(size):
        cols = range(1, size) if row % 2 == 0 else range(size - 1, 0, -1)
        order += [(row, col) for col in cols]
    order += [(row, 0) for row in range(size - 1, -1, -1)]
    succ = torch.zeros(size * size, dtype=torch.int64)
    for (r0, c0), (r1, c1) in zip(order, order[1:] + order[:1], strict=True):
        succ[r0 * size + c0] = r1 * size + c1
    return succ


def cycle_actions(env: VectorSnake, succ: torch.Tensor, rng: np.random.Generator, explore: float) -> torch.Tensor:
    """Follow the cycle where the heading allows it, else (and with probability ``explore``) act at random."""
    head, heading, size = env._head, env._dir, env.size
    nxt = succ[head]
    step = torch.stack([nxt // size - head // size, nxt % size - head % size], 1)
    wanted = torch.full_like(head, -1)
    for d, (dr, dc) in enumerate(DELTAS):
        wanted[(step[:, 0] == dr) & (step[:, 1] == dc)] = d
    turn = (wanted - heading) % 4  # 0 straight, 1 right, 3 left, 2 reverse (impossible)
    actions = torch.as_tensor(rng.integers(0, 3, env.num_envs))
    follow = torch.as_tensor(rng.random(env.num_envs) >= explore) & (turn != 2)
    actions[follow & (turn == 0)] = 0
    actions[follow & (turn == 1)] = 1
    actions[follow & (turn == 3)] = 2
    return actions


def assert_same(a: VectorSnake, b: VectorSnake, out_a: tuple, out_b: tuple, where: str) -> None:
    for name in STATE:
        assert torch.equal(getattr(a, name), getattr(b, name)), f"{name} differs {where}"
    for x, y, name in zip(out_a[:4], out_b[:4], ("obs", "rewards", "terminated", "truncated"), strict=True):
        assert torch.equal(x, y), f"{name} differs {where}"
    infos_a, infos_b = out_a[4], out_b[4]
    for key in ("final_obs", "_final_obs", "_final_info"):
        assert torch.equal(infos_a[key], infos_b[key]), f"infos[{key!r}] differs {where}"
    for key in infos_a["final_info"]:
        assert torch.equal(infos_a["final_info"][key], infos_b["final_info"][key]), f"episode {key} differs {where}"


CASES = {
    # (size, obs, flood_fill, initial_length, hunger, explore)
    "4x4 features, wins": (4, "features", "off", 3, None, 0.02),
    "4x4 grid, wins": (4, "grid", "off", 2, None, 0.02),
    "4x4 flood fill, wins": (4, "features", "tensor", 3, None, 0.05),
    "6x6 flood fill": (6, "features", "tensor", 3, 30, 0.4),
    "5x5 length 1, hungry": (5, "features", "off", 1, 6, 1.0),
    "6x6 grid, hungry": (6, "grid", "off", 4, 8, 0.5),
}


@pytest.mark.parametrize("dense", [False, True], ids=["ops-subset", "ops-dense"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_ops_given_the_same_draws(case, dense):
    size, obs, flood_fill, length, hunger, explore = CASES[case]
    n, steps = 64, 300
    # copy=False: the observation buffers are compared with the state (with copy=True the fused kernel
    # writes a step's observations into the returned set instead; tests/test_env_copy.py checks those).
    kwargs = dict(size=size, obs=obs, flood_fill=flood_fill, initial_length=length, hunger=hunger, device="cpu",
                  copy=False)
    ops, fast = VectorSnake(n, kernel="ops", **kwargs), VectorSnake(n, kernel="fused", **kwargs)
    ops.dense = dense
    rng = np.random.default_rng(sum(map(ord, case)))
    draws = rng.random((3, n))
    a, b = ops.reset_with_draws(draws), fast.reset_with_draws(draws)
    assert torch.equal(a[0], b[0]) and all(torch.equal(getattr(ops, s), getattr(fast, s)) for s in STATE)
    succ = cycle_successor(size) if size % 2 == 0 else torch.arange(1, size * size + 1) % (size * size)
    seen: Counter = Counter()
    for t in range(steps):
        actions = cycle_actions(ops, succ, rng, explore)
        draws = rng.random((3, n))
        out_a, out_b = ops.step_with_draws(actions, draws), fast.step_with_draws(actions, draws)
        assert_same(ops, fast, out_a, out_b, f"at step {t} ({case})")
        rewards, terminated, truncated = out_a[1], out_a[2], out_a[3]
        seen["episodes"] += int((terminated | truncated).sum())
        seen["deaths"] += int((rewards < 0).sum())
        seen["fruits"] += int((rewards > 0).sum())
        seen["wins"] += int((terminated & (rewards > 0)).sum())
        seen["truncations"] += int(truncated.sum())
    assert seen["episodes"] >= 300 and seen["deaths"] and seen["fruits"], seen
    if size == 4:
        assert seen["wins"], seen
    if hunger is not None:
        assert seen["truncations"], seen


def test_full_board_won_and_last_cell_on_both_kernels():
    # Board 0 fills all but one cell and eats it (a win); board 1 eats the second-last fruit, so
    # the respawn has exactly one free cell to pick from. Both heading left along the bottom row.
    path = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2), (1, 1), (1, 0),
            (2, 0), (2, 1), (2, 2), (2, 3), (3, 3), (3, 2), (3, 1), (3, 0)]
    envs = [VectorSnake(2, size=4, device="cpu", kernel=k, flood_fill="tensor", copy=False) for k in ("ops", "fused")]
    for env in envs:
        env.reset(seed=0)
        env.set_board(0, path[:15][::-1], 3, path[15], score=12, steps=40)
        env.set_board(1, path[:14][::-1], 3, path[14], score=11, steps=30)
    draws = np.full((3, 2), 0.999999)
    out_a, out_b = (env.step_with_draws(torch.zeros(2, dtype=torch.long), draws) for env in envs)
    assert_same(envs[0], envs[1], out_a, out_b, "on the full board")
    assert out_a[1].tolist() == [1.0, 1.0] and out_a[2].tolist() == [True, False]
    assert int(out_a[4]["final_info"]["score"][0]) == 13
    assert envs[1].get_board(1)["fruit"] == (3, 0)  # the only free cell left


def test_default_stream_is_the_materialised_draws():
    """Stepping with the fused kernel's own stream equals stepping with its draws injected, and
    ``reset(seed)`` reproduces it."""
    n, seed = 32, 7
    own = VectorSnake(n, size=6, device="cpu", kernel="fused")
    fed = VectorSnake(n, size=6, device="cpu", kernel="fused")
    own.reset(seed=seed)
    key = fused.seed_key(seed)
    fed.reset_with_draws(fused.counter_draws(key, 0, n))
    gen = torch.Generator().manual_seed(0)
    actions = torch.randint(0, 3, (60, n), generator=gen)
    trace = []
    for t, a in enumerate(actions):
        out_a = own.step(a)
        out_b = fed.step_with_draws(a, fused.counter_draws(key, t + 1, n))
        assert_same(own, fed, out_a, out_b, f"at step {t}")
        trace.append(out_a[0].clone())
    assert sum(int(x.sum()) for x in trace) > 0
    again = VectorSnake(n, size=6, device="cpu", kernel="fused")
    again.reset(seed=seed)
    assert all(torch.equal(again.step(a)[0], x) for a, x in zip(actions, trace, strict=True))


def test_a_boards_fused_stream_does_not_depend_on_num_envs():
    small, large = (VectorSnake(n, size=6, device="cpu", kernel="fused") for n in (8, 40))
    small.reset(seed=3)
    large.reset(seed=3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(80):
        actions = torch.randint(0, 3, (40,), generator=gen)
        obs_small = small.step(actions[:8])[0]
        obs_large = large.step(actions)[0]
        assert torch.equal(obs_small, obs_large[:8])
    assert [small.get_board(i) for i in range(8)] == [large.get_board(i) for i in range(8)]


@pytest.mark.parametrize("size", [4, 7, 10, 31, 64])
def test_fused_flood_fill_equals_the_bfs_reference(size):
    rng = np.random.default_rng(size)
    boards = 300 if size <= 31 else 60
    scratch = fused.scratch(1, size)
    for _ in range(boards):
        blocked = rng.random((size, size)) < rng.random() * 0.8
        free_cells = np.flatnonzero(~blocked)
        if not len(free_cells):
            continue
        start = int(rng.choice(free_cells))
        for row in range(size):
            scratch[0, fused.FREE, row] = sum(1 << col for col in range(size) if not blocked[row, col])
        count = fused.fill_rows(scratch, 0, fused.FILLS, size, start)
        assert count == bfs_count(blocked, start)
        reached = [(int(scratch[0, fused.FILLS, r]) >> c) & 1 for r in range(size) for c in range(size)]
        assert sum(reached) == count and reached[start]


# ---------------------------------------------------------------- which kernel runs


def test_auto_takes_fused_on_the_cpu_and_says_why_not_elsewhere():
    assert resolve_kernel("auto", CPU)[0] == "fused"
    assert resolve_kernel("ops", CPU) == ("ops", "env.kernel=ops (the tensor-operator reference)")
    kernel, reason = resolve_kernel("auto", CPU, flood_fill="bfs")
    assert kernel == "ops" and "flood_fill=bfs" in reason
    if not torch.cuda.is_available():  # on CUDA, auto takes the kernel's CUDA build (tests/test_fused_cuda.py)
        kernel, reason = resolve_kernel("auto", torch.device("cuda"))
        assert kernel == "ops" and "CUDA" in reason
    kernel, reason = resolve_kernel("auto", CPU, size=65)
    assert kernel == "ops" and "64" in reason
    env = VectorSnake(4, device="cpu")
    assert (env.kernel, env.kernel_reason) == resolve_kernel("auto", CPU)


@pytest.mark.parametrize(("device", "flood_fill", "match"), [
    pytest.param("cuda", "off", "CUDA", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="runs on CUDA here")),
    ("cpu", "bfs", "flood_fill=bfs"),
])
def test_explicit_fused_that_cannot_run_is_one_config_error(device, flood_fill, match):
    with pytest.raises(ConfigError, match=match) as raised:
        resolve_kernel("fused", torch.device(device), flood_fill)
    assert "\n" not in str(raised.value)


def test_a_missing_numba_falls_back_or_fails_in_one_line(monkeypatch):
    monkeypatch.setattr(fused, "compile_kernel", lambda: (0.0, "numba cannot be imported (ModuleNotFoundError: x)"))
    kernel, reason = resolve_kernel("auto", CPU)
    assert kernel == "ops" and "numba cannot be imported" in reason
    env = VectorSnake(4, device="cpu")
    assert env.kernel == "ops" and "numba" in env.kernel_reason
    with pytest.raises(ConfigError, match="pip install numba"):
        VectorSnake(4, device="cpu", kernel="fused")


def test_the_kernel_takes_torchs_thread_count():
    """run.threads sets torch's threads before the env is built; the fused kernel follows them (and
    numba's first parallel launch, which sets the OpenMP thread count torch shares, leaves it)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        VectorSnake(4, device="cpu", kernel="fused")
        assert fused.numba.get_num_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
        VectorSnake(4, device="cpu", kernel="fused")
    assert fused.numba.get_num_threads() == min(threads, fused.numba.config.NUMBA_NUM_THREADS)


def test_the_threaded_driver_steps_as_the_serial_one():
    """Many boards on two threads share chunks among them (a driver compiled only for such runs); a
    run on one thread, or with few boards, steps on the calling thread. Both give the same boards."""
    threads = torch.get_num_threads()
    n = fused.SERIAL_MAX_FLOOD + 3 * fused.CHUNK + 5  # a partial last chunk
    try:
        torch.set_num_threads(1)
        serial = VectorSnake(n, size=6, flood_fill="tensor", device="cpu", kernel="fused", copy=False)
        torch.set_num_threads(2)
        threaded = VectorSnake(n, size=6, flood_fill="tensor", device="cpu", kernel="fused", copy=False)
    finally:
        torch.set_num_threads(threads)
    assert serial._fused_driver is fused.step_boards
    if fused.numba.config.NUMBA_NUM_THREADS > 1:
        assert threaded._fused_driver is fused.step_boards_parallel
    gen = torch.Generator().manual_seed(2)
    out_a, out_b = serial.reset(seed=5), threaded.reset(seed=5)
    for t in range(60):
        actions = torch.randint(0, 3, (n,), generator=gen)
        out_a, out_b = serial.step(actions), threaded.step(actions)
        assert_same(serial, threaded, out_a, out_b, f"at step {t}")
    assert not fused.parallel_pays(n, True, 1) and not fused.parallel_pays(fused.SERIAL_MAX_FLOOD, True, 2)


def test_the_config_refuses_fused_where_it_cannot_apply():
    assert config_from("smoke", ["env.kernel=fused"]).env.kernel == "fused"
    with pytest.raises(ConfigError, match="flood_fill=bfs"):
        config_from("smoke", ["env.kernel=fused", "env.flood_fill=bfs"])
    with pytest.raises(ConfigError, match=r"env\.backend=gym-sync"):
        config_from("smoke", ["env.kernel=fused", "env.backend=gym-sync"])
    with pytest.raises(ConfigError, match=r"env\.kernel"):
        config_from("smoke", ["env.kernel=numba"])


def test_without_numba_the_cli_runs_ops_or_refuses_fused(tmp_path: Path):
    """A numba that cannot be imported (shadowed here by a module that raises): ``auto`` trains
    with ``ops`` and the record says why; ``env.kernel=fused`` exits 2 with one line."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "numba.py").write_text("raise ImportError('numba is broken on purpose')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-m", "rlperf", "train", "--config", "smoke", "--steps", "200", "--quiet",
            "--out", str(tmp_path / "runs")]
    # Both at once: each is mostly its interpreter's start.
    refused, ran = (subprocess.Popen([*base, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                    for args in (["--set", "env.kernel=fused"], ["--json"]))
    _, refused_err = refused.communicate(timeout=300)
    assert refused.returncode == 2, refused_err
    lines = refused_err.strip().splitlines()
    assert len(lines) == 1 and "env.kernel=fused cannot run" in lines[0] and "numba is broken" in lines[0]
    ran_out, ran_err = ran.communicate(timeout=300)
    assert ran.returncode == 0, ran_err[-2000:]
    import json

    record = json.loads(ran_out)
    assert record["env"]["kernel"] == "ops" and "numba is broken" in record["env"]["reason"]
