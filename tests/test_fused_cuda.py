"""The fused kernel's CUDA build (rlperf.env.fused_cuda): the same per-board source as the CPU build.

On a machine without a GPU, numba's CUDA simulator runs the CUDA build's kernel (each thread as
Python) against the CPU build, which checks the translation (globals, the per-board scratch, the
invalid-action clamp) everywhere. On CUDA: fused-on-CUDA equals ops-on-CUDA given the same draws,
equals fused-on-CPU on the counter stream, never syncs, and raises an invalid action at the next read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlperf.env.vector import VectorSnake, resolve_kernel

sys.path.insert(0, os.path.dirname(__file__))
from test_fused_kernel import CASES, STATE, assert_same, cycle_actions, cycle_successor

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SIMULATED = textwrap.dedent("""
    import os, sys, warnings
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    warnings.simplefilter("ignore")  # numpy's uint64 scalars warn where the hash wraps on purpose
    import numpy as np, torch
    from rlperf.env import fused, fused_cuda
    from rlperf.env.vector import VectorSnake
    n, size, flood, grid, steps = 5, 5, sys.argv[1] == "flood", sys.argv[1] == "grid", 60
    env = VectorSnake(n, size=size, device="cpu", kernel="fused", flood_fill="tensor" if flood else "off",
                      obs="grid" if grid else "features", hunger=12, initial_length=2, copy=False)
    env.reset(seed=3)
    occ, ring, state, floats, flags = (a.copy() for a in env._fused_state)
    obs = env._fused_obs.copy()
    kernel = fused_cuda._build()
    table, scratch = fused.cell_table(size), np.zeros((n, fused.SCRATCH_SETS, size), dtype=np.uint64)
    bad = np.zeros(1, dtype=np.bool_)
    rng = np.random.default_rng(0)
    ends = fruits = 0
    for t in range(steps):
        actions = rng.integers(0, 3, n).astype(np.int64)
        wild = actions.copy()
        wild[0] = 7 if t == 5 else wild[0]  # clamped to 2 and flagged on CUDA; the CPU build gets the 2
        if t == 5:
            actions[0] = 2
        key, counter, out = env._key, env._counter, fused.OBS_SLOTS[env._out_index()]
        _, rewards, terminated, truncated, _ = env.step(torch.from_numpy(actions))
        ends += int((terminated | truncated).sum())
        fruits += int((rewards > 0).sum())
        kernel[1, n](wild, np.zeros((3, 1)), False, key, counter, False, out, occ, ring, state, floats, flags, obs,
                     table, scratch, size, env.initial_length, env.hunger, grid, flood, bad)
        for name, a, b in zip(("occ", "ring", "state", "floats", "flags"), (occ, ring, state, floats, flags),
                              env._fused_state):
            assert np.array_equal(a, b), f"{name} differs at step {t}"
        assert np.array_equal(obs[[out, 1]], env._fused_obs[[out, 1]]), f"observation differs at step {t}"
        assert bad[0] == (t >= 5), "the invalid action was not flagged"
    assert ends >= 5 and fruits >= 1, (ends, fruits)
    print("same", steps, ends, fruits)
""")


@pytest.mark.parametrize("mode", ["flood", "grid"])
def test_the_cuda_build_equals_the_cpu_build_in_numbas_simulator(mode):
    """The CUDA build's source, run by numba's CUDA simulator on the CPU, against the CPU build."""
    proc = subprocess.run([sys.executable, "-c", SIMULATED, mode], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("same 60"), proc.stdout


# ---------------------------------------------------------------- on CUDA


@pytest.mark.cuda
@needs_cuda
def test_auto_takes_the_cuda_build_on_cuda():
    kernel, reason = resolve_kernel("auto", torch.device("cuda"))
    assert kernel == "fused" and "CUDA" in reason, reason
    env = VectorSnake(8, device="cuda")
    assert env.kernel == "fused" and env._cuda_launch is not None


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("case", list(CASES))
def test_fused_on_cuda_equals_ops_on_cuda_given_the_same_draws(case):
    size, obs, flood_fill, length, hunger, explore = CASES[case]
    n, steps = 300, 300  # three blocks of threads, the last one partial
    kwargs = dict(size=size, obs=obs, flood_fill=flood_fill, initial_length=length, hunger=hunger, device="cuda",
                  copy=False)
    ops, fast = VectorSnake(n, kernel="ops", **kwargs), VectorSnake(n, kernel="fused", **kwargs)
    rng = np.random.default_rng(sum(map(ord, case)))
    draws = torch.from_numpy(rng.random((3, n))).cuda()
    a, b = ops.reset_with_draws(draws), fast.reset_with_draws(draws)
    assert torch.equal(a[0], b[0]) and all(torch.equal(getattr(ops, s), getattr(fast, s)) for s in STATE)
    succ = cycle_successor(size) if size % 2 == 0 else torch.arange(1, size * size + 1) % (size * size)
    seen: Counter = Counter()
    for t in range(steps):
        on_host = SimpleNamespace(_head=ops._head.cpu(), _dir=ops._dir.cpu(), size=size, num_envs=n)
        actions = cycle_actions(on_host, succ, rng, explore).cuda()  # type: ignore[arg-type]
        draws = torch.from_numpy(rng.random((3, n))).cuda()
        out_a, out_b = ops.step_with_draws(actions, draws), fast.step_with_draws(actions, draws)
        assert_same(ops, fast, out_a, out_b, f"at step {t} ({case})")
        seen["episodes"] += int((out_a[2] | out_a[3]).sum())
        seen["fruits"] += int((out_a[1] > 0).sum())
    assert seen["episodes"] >= 300 and seen["fruits"], seen


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize(("obs", "flood_fill"), [("features", "off"), ("features", "tensor"), ("grid", "off")])
def test_fused_on_cuda_equals_fused_on_the_cpu_on_the_counter_stream(obs, flood_fill):
    n, steps = 2000, 200
    kwargs = dict(size=10, obs=obs, flood_fill=flood_fill, hunger=40, kernel="fused", copy=False)
    cpu, gpu = VectorSnake(n, device="cpu", **kwargs), VectorSnake(n, device="cuda", **kwargs)
    a, b = cpu.reset(seed=11), gpu.reset(seed=11)
    assert torch.equal(a[0], b[0].cpu())
    gen = torch.Generator().manual_seed(0)
    ends = 0
    for t in range(steps):
        actions = torch.randint(0, 3, (n,), generator=gen)
        out_a, out_b = cpu.step(actions), gpu.step(actions.cuda())
        for name in STATE:
            assert torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()), f"{name} differs at step {t}"
        assert torch.equal(out_a[0], out_b[0].cpu()) and torch.equal(out_a[1], out_b[1].cpu())
        ends += int(out_a[2].sum() + out_a[3].sum())
    assert ends > n


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("copy", [False, True])
def test_a_cuda_fused_step_does_not_sync_and_copy_returns_new_tensors(copy):
    env = VectorSnake(1024, device="cuda", flood_fill="tensor", copy=copy)
    env.reset(seed=0)
    actions = torch.randint(0, 3, (50, 1024), device="cuda")
    env.step(actions[0])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [env.step(actions[t]) for t in range(1, 50)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    if copy:
        assert len({o[0].data_ptr() for o in outs}) == len(outs), "copy=True handed out a reused buffer"
        twin = VectorSnake(1024, device="cuda", flood_fill="tensor", copy=False)
        twin.reset(seed=0)
        twin.step(actions[0])
        for t in range(1, 50):
            obs, rewards, *_ = twin.step(actions[t])
            assert torch.equal(obs, outs[t - 1][0]) and torch.equal(rewards, outs[t - 1][1])


@pytest.mark.cuda
@needs_cuda
def test_an_invalid_action_on_cuda_is_raised_at_the_next_read():
    from rlperf.errors import InvalidActionError

    env = VectorSnake(256, device="cuda")
    env.reset(seed=0)
    actions = torch.zeros(256, dtype=torch.int64, device="cuda")
    actions[17] = 5
    env.step(actions)  # no sync: clamped and flagged on the device
    with pytest.raises(InvalidActionError):
        env.get_board(0)


@pytest.mark.cuda
@needs_cuda
def test_the_kernel_runs_on_torchs_current_stream():
    """Launched on a side stream, the step is ordered after that stream's earlier work."""
    env = VectorSnake(4096, device="cuda", copy=False)
    twin = VectorSnake(4096, device="cuda", copy=False)
    env.reset(seed=4), twin.reset(seed=4)
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    for t in range(20):
        with torch.cuda.stream(side):
            actions = (big @ big).sum(1).abs().long() % 3  # slow work the step must wait for
            env.step(actions)
        side.synchronize()
        twin.step(actions)
        assert torch.equal(env._state, twin._state), f"differs at step {t}"
