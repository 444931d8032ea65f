"""``copy=True``, VectorSnake's default: returned tensors come from a pool of output sets
(rlperf.env.outputs) and must never change while the caller holds them in any way -- the tensor
itself, a view, a numpy array, an autograd graph that saved it -- while the usual loop reuses two
sets and allocates nothing, and a caller that keeps everything still gets correct results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from rlperf.env import outputs
from rlperf.env.vector import VectorSnake

KERNELS = ["ops", "fused"]
N = 8


def infos_tensors(infos: dict) -> list[torch.Tensor]:
    return [infos["final_obs"], infos["_final_obs"], infos["_final_info"], *infos["final_info"].values()]


def returned(result: tuple) -> list[torch.Tensor]:
    """Every tensor a step returned: obs, rewards, terminations, truncations and the infos' tensors."""
    obs, rewards, terminated, truncated, infos = result
    return [obs, rewards, terminated, truncated, *infos_tensors(infos)]


def actions(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 3, (N,), generator=gen)


def run_until_reset(env: VectorSnake, gen: torch.Generator) -> tuple:
    """Steps until some board's episode ends (so final_obs differs from obs and final_info is set)."""
    for _ in range(200):
        result = env.step(actions(gen))
        if bool(result[4]["_final_obs"].any()):
            return result
    raise AssertionError("no episode ended in 200 random steps")


# How a caller may hold a step's results, and how to get the held values back as tensors: every
# returned tensor except with "infos dict only", where it is the infos' (returned(...)[4:]).
HOLDS: dict[str, tuple[Callable[[tuple], list[Any]], Callable[[list[Any]], list[torch.Tensor]]]] = {
    "tensors": (returned, lambda held: held),
    "infos dict only": (lambda result: [result[4]], lambda held: infos_tensors(held[0])),
    "views": (lambda result: [t[:] for t in returned(result)], lambda held: held),
    "numpy arrays": (lambda result: [t.numpy() for t in returned(result)], lambda held: [torch.from_numpy(a) for a in held]),
    "dlpack capsules": (lambda result: [torch.utils.dlpack.to_dlpack(t) for t in returned(result)],
                        lambda held: [torch.utils.dlpack.from_dlpack(c) for c in held]),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("how", list(HOLDS))
def test_held_results_never_change(kernel: str, how: str) -> None:
    env = VectorSnake(N, size=5, device="cpu", kernel=kernel)
    env.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    hold, restore = HOLDS[how]
    result = run_until_reset(env, gen)
    snapshot = [t.clone() for t in (infos_tensors(result[4]) if how == "infos dict only" else returned(result))]
    held = hold(result)
    del result
    for _ in range(30):  # the caller drops these: the pool reuses their sets around the held one
        env.step(actions(gen))
    for now, then in zip(restore(held), snapshot, strict=True):
        assert torch.equal(now, then)


@pytest.mark.parametrize("kernel", KERNELS)
def test_an_autograd_graph_that_saved_the_observation_keeps_it(kernel: str) -> None:
    """Autograd's saved tensors hold the observation from C++ only (no Python reference to it)."""
    env = VectorSnake(N, size=5, device="cpu", kernel=kernel)
    env.reset(seed=3)
    gen = torch.Generator().manual_seed(1)
    obs = env.step(actions(gen))[0]
    expected = obs.sum(0)
    weight = torch.ones(obs.shape[1], requires_grad=True)
    loss = (obs * weight).sum()  # mul saves obs for weight's gradient
    del obs
    for _ in range(10):
        env.step(actions(gen))
    loss.backward()
    assert torch.equal(weight.grad, expected)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("obs", "flood_fill"), [("features", "off"), ("features", "tensor"), ("grid", "off")])
def test_values_equal_copy_false_step_by_step(kernel: str, obs: str, flood_fill: str) -> None:
    """Through many pool rotations (and sets the caller keeps a while), copy=True returns exactly
    what copy=False does."""
    envs = [VectorSnake(N, size=5, obs=obs, flood_fill=flood_fill, device="cpu", kernel=kernel, copy=copy)
            for copy in (True, False)]
    starts = [env.reset(seed=4)[0] for env in envs]
    assert torch.equal(starts[0], starts[1])
    gen = torch.Generator().manual_seed(0)
    kept: list[Any] = []
    for step in range(120):  # long enough for deaths, truncations, resets and final_info rows
        a = actions(gen)
        fresh, views = (returned(env.step(a)) for env in envs)
        for mine, reference in zip(fresh, views, strict=True):
            assert mine.dtype == reference.dtype and torch.equal(mine, reference)
        if step % 7 == 0:
            kept[:] = fresh  # hold a set for a while, as a caller with a lag would
    assert len(envs[0]._outputs.sets) <= 3


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_usual_loop_reuses_two_sets(kernel: str) -> None:
    """``obs, ... = env.step(a)`` holds the previous step's set while the next is filled: two sets,
    alternating, and no allocation after the first two steps."""
    env = VectorSnake(N, size=5, device="cpu", kernel=kernel)
    obs, _ = env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    addresses = set()
    for _ in range(50):
        obs, _rewards, _terminated, _truncated, _infos = env.step(actions(gen))  # all held, as a loop does
        addresses.add(obs.data_ptr())
    assert len(env._outputs.sets) == 2 and len(addresses) == 2


@pytest.mark.parametrize("kernel", KERNELS)
def test_keeping_every_result_works_and_the_pool_stays_bounded(kernel: str) -> None:
    envs = [VectorSnake(N, size=5, device="cpu", kernel=kernel, copy=copy) for copy in (True, False)]
    for env in envs:
        env.reset(seed=5)
    gen = torch.Generator().manual_seed(0)
    kept, expected = [], []
    for _ in range(40):
        a = actions(gen)
        kept.append(returned(envs[0].step(a)))
        expected.append([t.clone() for t in returned(envs[1].step(a))])
    assert len(envs[0]._outputs.sets) == outputs.MAX_SETS  # the rest were allocated for the caller alone
    for mine, reference in zip(kept, expected, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(mine, reference, strict=True))
    kept.clear()  # dropped: the pooled sets come back into use, and no new ones are made
    pooled = {t.data_ptr() for s in envs[0]._outputs.sets for t in s.tensors[:2]}
    for _ in range(20):
        assert envs[0].step(actions(gen))[0].data_ptr() in pooled
    assert len(envs[0]._outputs.sets) == outputs.MAX_SETS


def test_large_sets_are_pooled_two_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outputs, "POOL_BYTES", 1)  # as if each set were larger than the whole budget
    env = VectorSnake(N, size=5, device="cpu", kernel="fused")
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    kept = [returned(env.step(actions(gen))) for _ in range(6)]
    assert len(env._outputs.sets) == 2 and len({results[0].data_ptr() for results in kept}) == 6


def test_reset_observation_never_changes() -> None:
    env = VectorSnake(N, size=5, device="cpu", kernel="fused")
    obs, _ = env.reset(seed=0)
    snapshot = obs.clone()
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        env.step(actions(gen))
    assert torch.equal(obs, snapshot)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_results_are_fresh_and_equal_copy_false() -> None:
    envs = [VectorSnake(N, size=5, device="cuda", kernel="ops", copy=copy) for copy in (True, False)]
    for env in envs:
        env.reset(seed=4)
    gen = torch.Generator().manual_seed(0)
    held = returned(envs[0].step(actions(gen)))
    snapshot = [t.clone() for t in held]
    for _ in range(30):
        a = actions(gen).cuda()
        for mine, reference in zip(returned(envs[0].step(a)), returned(envs[1].step(a)), strict=True):
            assert torch.equal(mine, reference)
    assert all(torch.equal(a, b) for a, b in zip(held, snapshot, strict=True))
    assert not envs[0]._outputs.sets  # not pooled on a GPU (see rlperf.env.outputs)


def test_numpy_consumers_see_plain_arrays() -> None:
    """Gymnasium's numpy wrappers call ``np.asarray`` on what a step returns: dtypes as copy=False's."""
    env = VectorSnake(N, size=5, device="cpu", kernel="fused")
    env.reset(seed=0)
    obs, rewards, terminated, _truncated, infos = env.step(torch.zeros(N, dtype=torch.long))
    assert np.asarray(obs).dtype == np.float32 and np.asarray(rewards).dtype == np.float32
    assert np.asarray(terminated).dtype == np.bool_ and np.asarray(infos["final_info"]["score"]).dtype == np.int64
    assert obs.shape == (N, 11) and infos["final_obs"].shape == (N, 11) and rewards.shape == (N,)


@pytest.mark.parametrize("kernel", KERNELS)
def test_observations_and_checkpoints_follow_the_returned_observation(kernel: str) -> None:
    """With the fused kernel a step's observation lives only in its output set: ``observations``,
    ``state_dict`` and a resume must still see it, as with copy=False."""
    envs = [VectorSnake(N, size=5, device="cpu", kernel=kernel, copy=copy) for copy in (True, False)]
    for env in envs:
        env.reset(seed=6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(15):
        a = actions(gen)
        obs = envs[0].step(a)[0]
        envs[1].step(a)
        assert torch.equal(envs[0].observations, obs) and torch.equal(envs[0].observations, envs[1].observations)
    del obs
    resumed = VectorSnake(N, size=5, device="cpu", kernel=kernel)
    resumed.load_state_dict(envs[0].state_dict())
    assert torch.equal(resumed.observations, envs[1].observations)
    for _ in range(15):
        a = actions(gen)
        assert torch.equal(resumed.step(a)[0], envs[1].step(a)[0])
