"""``copy=True``, VectorSnake's default (Gymnasium's contract): what a step returns is the caller's.
No later step writes its memory, changes its metadata (shape, ``requires_grad``, ``grad``) or its
storage, however the caller holds or alters it -- the tensors, views, numpy arrays, DLPack capsules,
an autograd graph, only the storage, shared memory, in-place metadata changes -- and the values
equal ``copy=False``'s step by step."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

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


def twins(kernel: str, seed: int = 7) -> tuple[VectorSnake, VectorSnake]:
    """A copy=True env and its copy=False twin, reset at the same seed: they step identically."""
    mine, twin = (VectorSnake(N, size=5, device="cpu", kernel=kernel, copy=copy) for copy in (True, False))
    mine.reset(seed=seed)
    twin.reset(seed=seed)
    return mine, twin


def assert_steps_equal(mine: VectorSnake, twin: VectorSnake, gen: torch.Generator, steps: int = 20) -> None:
    """The next ``steps`` steps return what the twin's do: values, shapes, dtypes, no autograd."""
    for _ in range(steps):
        a = actions(gen)
        results, reference = returned(mine.step(a)), returned(twin.step(a))
        for x, y in zip(results, reference, strict=True):
            assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
            assert not x.requires_grad and x.grad is None


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
    for _ in range(30):  # the caller drops these: their memory is freed around the held one
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
    """copy=True returns exactly what copy=False does, results kept a while or dropped at once."""
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
            kept[:] = fresh  # hold a step's results for a while, as a caller with a lag would


@pytest.mark.parametrize("kernel", KERNELS)
def test_keeping_every_result_keeps_every_value(kernel: str) -> None:
    mine, twin = twins(kernel, seed=5)
    gen = torch.Generator().manual_seed(0)
    kept, expected = [], []
    for _ in range(40):
        a = actions(gen)
        kept.append(returned(mine.step(a)))
        expected.append([t.clone() for t in returned(twin.step(a))])
    for results, reference in zip(kept, expected, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(results, reference, strict=True))


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
    first = actions(gen).cuda()
    held = returned(envs[0].step(first))
    envs[1].step(first)
    snapshot = [t.clone() for t in held]
    for _ in range(30):
        a = actions(gen).cuda()
        for mine, reference in zip(returned(envs[0].step(a)), returned(envs[1].step(a)), strict=True):
            assert torch.equal(mine, reference)
    assert all(torch.equal(a, b) for a, b in zip(held, snapshot, strict=True))


def test_numpy_consumers_see_plain_arrays() -> None:
    """Gymnasium's numpy wrappers call ``np.asarray`` on what a step returns: dtypes as copy=False's."""
    env = VectorSnake(N, size=5, device="cpu", kernel="fused")
    env.reset(seed=0)
    obs, rewards, terminated, _truncated, infos = env.step(torch.zeros(N, dtype=torch.long))
    assert np.asarray(obs).dtype == np.float32 and np.asarray(rewards).dtype == np.float32
    assert np.asarray(terminated).dtype == np.bool_ and np.asarray(infos["final_info"]["score"]).dtype == np.int64
    assert obs.shape == (N, 11) and infos["final_obs"].shape == (N, 11) and rewards.shape == (N,)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("mode", "flood_fill"), [("features", "off"), ("features", "tensor"), ("grid", "off")])
def test_observations_and_checkpoints_follow_the_returned_observation(kernel: str, mode: str, flood_fill: str) -> None:
    """With the fused kernel a step's observation is written only into the returned tensor:
    ``observations`` (observed again from the state), ``state_dict`` and a resume must still see
    it, as with copy=False."""
    kwargs: dict[str, Any] = {"size": 5, "obs": mode, "flood_fill": flood_fill, "device": "cpu", "kernel": kernel}
    envs = [VectorSnake(N, copy=copy, **kwargs) for copy in (True, False)]
    for env in envs:
        env.reset(seed=6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(15):
        a = actions(gen)
        obs = envs[0].step(a)[0]
        envs[1].step(a)
        assert torch.equal(envs[0].observations, obs) and torch.equal(envs[0].observations, envs[1].observations)
    del obs
    resumed = VectorSnake(N, **kwargs)
    resumed.load_state_dict(envs[0].state_dict())
    assert torch.equal(resumed.observations, envs[1].observations)
    for _ in range(15):
        a = actions(gen)
        assert torch.equal(resumed.step(a)[0], envs[1].step(a)[0])


# What a caller may do to a returned tensor that the env cannot see: each must leave later steps,
# and what the caller holds, alone.


@pytest.mark.parametrize("kernel", KERNELS)
def test_shared_memory_observations(kernel: str) -> None:
    """``share_memory_()`` (what ``torch.multiprocessing`` does on ``queue.put(obs)``) moves a
    storage's bytes to shared memory: later steps still equal the twin's, the shared one keeps its values."""
    mine, twin = twins(kernel)
    gen = torch.Generator().manual_seed(0)
    a = actions(gen)
    first = mine.step(a)[0].share_memory_()
    twin.step(a)
    snapshot = first.clone()
    for _ in range(150):
        a = actions(gen)
        result = mine.step(a)
        for x, y in zip(returned(result), returned(twin.step(a)), strict=True):
            assert torch.equal(x, y)
        result[0].share_memory_()  # put on a queue, then dropped
    assert torch.equal(first, snapshot)


@pytest.mark.parametrize("kernel", KERNELS)
def test_unsqueeze_in_place_once(kernel: str) -> None:
    mine, twin = twins(kernel)
    gen = torch.Generator().manual_seed(0)
    a = actions(gen)
    obs = mine.step(a)[0].unsqueeze_(0)
    twin.step(a)
    assert obs.shape == (1, N, 11)
    del obs
    assert_steps_equal(mine, twin, gen)


@pytest.mark.parametrize("kernel", KERNELS)
def test_requires_grad_once(kernel: str) -> None:
    mine, twin = twins(kernel)
    gen = torch.Generator().manual_seed(0)
    a = actions(gen)
    mine.step(a)[0].requires_grad_()
    twin.step(a)
    assert_steps_equal(mine, twin, gen)  # later observations and rewards do not require grad


@pytest.mark.parametrize("kernel", KERNELS)
def test_saliency_loop(kernel: str) -> None:
    """``obs.requires_grad_(); net(obs)...backward()`` every step: each step's ``obs.grad`` is its own
    (a new tensor object every step, no gradient carried over)."""
    mine, twin = twins(kernel)
    gen = torch.Generator().manual_seed(0)
    net = torch.nn.Linear(11, 3)
    earlier: list[weakref.ref] = []  # not references: they must not keep anything alive
    for _ in range(30):
        a = actions(gen)
        obs, reference = mine.step(a)[0], twin.step(a)[0]
        assert torch.equal(obs, reference) and obs.grad is None and not obs.requires_grad
        assert all(ref() is not obs for ref in earlier)
        earlier.append(weakref.ref(obs))
        obs.requires_grad_()
        net(obs).max(1).values.sum().backward()
        x = reference.clone().requires_grad_()
        (expected,) = torch.autograd.grad(net(x).max(1).values.sum(), x)
        assert torch.equal(obs.grad, expected)


@pytest.mark.parametrize("kernel", KERNELS)
def test_resize_of_a_returned_observation(kernel: str) -> None:
    """A resize that fails (a storage numpy has seen cannot grow) still leaves the tensor with the new
    shape on its old storage: nothing the env returns later may be that tensor."""
    mine, twin = twins(kernel)
    gen = torch.Generator().manual_seed(0)
    a = actions(gen)
    obs = mine.step(a)[0]
    twin.step(a)
    with contextlib.suppress(RuntimeError):
        obs.resize_(4096, 11)
    del obs
    assert_steps_equal(mine, twin, gen)


def _storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage).clone()


# Holding only a step's storage: how to get it from the observation, and its bytes from what is held.
STORAGE_HOLDS: dict[str, tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]] = {
    "untyped_storage()": (lambda obs: obs.untyped_storage(), _storage_bytes),
    "storage()": (lambda obs: obs.storage(), lambda held: _storage_bytes(held.untyped())),
    "x.set_(obs)": (lambda obs: torch.empty(0).set_(obs), lambda held: _storage_bytes(held.untyped_storage())),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("how", list(STORAGE_HOLDS))
def test_holding_only_the_storage(kernel: str, how: str) -> None:
    env = VectorSnake(N, size=5, device="cpu", kernel=kernel)
    env.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    hold, read = STORAGE_HOLDS[how]
    obs = env.step(actions(gen))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # obs.storage(): TypedStorage is deprecated
        held = hold(obs)
    del obs
    snapshot = read(held)
    for _ in range(20):
        env.step(actions(gen))
    assert torch.equal(read(held), snapshot)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_caller_changing_its_observation_leaves_the_env_alone(kernel: str) -> None:
    """The returned observation is the caller's to change: ``observations``, ``state_dict`` and
    later steps must not read it back."""
    mine, twin = twins(kernel)
    gen = torch.Generator().manual_seed(0)
    a = actions(gen)
    mine.step(a)[0].mul_(0).unsqueeze_(0)
    twin.step(a)
    assert torch.equal(mine.observations, twin.observations)
    assert torch.equal(mine.state_dict()["obs"], twin.state_dict()["obs"])
    assert_steps_equal(mine, twin, gen)
