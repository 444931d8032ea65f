"""Replay buffer: the ring, both push modes, all storages, sampling, checkpoints, memory refusal.

Every transition carries its id ``t`` (its position in the push order) in all five fields, so a test
can tell exactly which pushed transition a slot or a sampled row is, and whether its fields belong
together. The expected ring contents come from a plain model (transition ``t`` lives in slot
``t % capacity`` and survives while it is among the last ``capacity``), so a bug shared by both push
modes still fails.
"""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch

import rlperf.buffer as buffer_mod
import rlperf.device as device_mod
from rlperf.buffer import STORAGES, Batch, BufferMemoryError, ReplayBuffer
from rlperf.errors import ConfigError, RlperfError

OBS_SHAPE = (3,)
CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
)
DEVICES = ["cpu", CUDA]


def transitions(start: int, n: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Transitions with ids ``start .. start+n-1``; every field is a function of the id."""
    t = torch.arange(start, start + n, dtype=torch.float32, device=device)
    obs = t[:, None] * 10 + torch.arange(OBS_SHAPE[0], device=device)  # exact in float32 for t < 1e5
    next_obs = -obs - 1
    actions = torch.arange(start, start + n, device=device) % 3
    rewards = t * 0.5
    dones = (torch.arange(start, start + n, device=device) % 7) == 0  # bool, as envs return it
    return obs, actions, rewards, next_obs, dones


def ids_of(obs: torch.Tensor) -> torch.Tensor:
    return (obs[:, 0] / 10).round().long()


def assert_consistent(obs, actions, rewards, next_obs, dones) -> torch.Tensor:
    """Every row is one pushed transition, whole; returns the ids."""
    ids = ids_of(obs.cpu().float())
    exp = transitions(0, int(ids.max()) + 1)
    torch.testing.assert_close(obs.cpu().float(), exp[0][ids], rtol=0, atol=0)
    torch.testing.assert_close(actions.cpu(), exp[1][ids], rtol=0, atol=0)
    torch.testing.assert_close(rewards.cpu(), exp[2][ids], rtol=0, atol=0)
    torch.testing.assert_close(next_obs.cpu().float(), exp[3][ids], rtol=0, atol=0)
    torch.testing.assert_close(dones.cpu(), exp[4][ids].float(), rtol=0, atol=0)
    return ids


def expected_slot_ids(total: int, capacity: int) -> list[int]:
    """The model: slot s holds the newest transition t < total with t % capacity == s."""
    held = range(max(0, total - capacity), total)
    slots = {t % capacity: t for t in held}
    return [slots[s] for s in range(min(total, capacity))]


def push_sequence(buf: ReplayBuffer, sizes: list[int], device: str = "cpu") -> int:
    total = 0
    for n in sizes:
        buf.push(*transitions(total, n, device))
        total += n
    return total


def contents(buf: ReplayBuffer) -> dict:
    state = buf.state_dict()
    return {k: state[k] for k in ("cursor", "size", "obs", "actions", "rewards", "next_obs", "dones")}


def assert_same_contents(a: dict, b: dict) -> None:
    assert (a["cursor"], a["size"]) == (b["cursor"], b["size"])
    for key in ("obs", "actions", "rewards", "next_obs", "dones"):
        assert a[key].dtype == b[key].dtype, key
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


# ---------------------------------------------------------------------------- push


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("storage", STORAGES)
def test_loop_and_batch_push_leave_identical_contents(storage: str, device: str) -> None:
    capacity = 37
    rng = np.random.default_rng(1)
    # Partial fills, exact fills, wrap-arounds, single items, empty pushes, and n > capacity both
    # from an empty ring and from a half-full one.
    first = [5, 0, 1, 20, 11, 3, 36, 37, 100]
    sizes = first + [int(x) for x in rng.integers(0, 90, size=15)]
    for start_sizes in (sizes, [100, 4], [12, 80, 1]):
        loop = ReplayBuffer(capacity, OBS_SHAPE, device, storage=storage, push="loop")
        batch = ReplayBuffer(capacity, OBS_SHAPE, device, storage=storage, push="batch")
        total = 0
        for n in start_sizes:
            loop.push(*transitions(total, n, device))
            batch.push(*transitions(total, n, device))
            total += n
            got = contents(batch)
            assert_same_contents(contents(loop), got)
            assert len(batch) == min(total, capacity)
            assert got["cursor"] == total % capacity
            assert ids_of(got["obs"]).tolist() == expected_slot_ids(total, capacity)
            if total:
                assert_consistent(got["obs"], got["actions"], got["rewards"], got["next_obs"], got["dones"])


def test_all_storages_hold_the_same_contents() -> None:
    sizes = [9, 30, 2, 64, 17]
    results = []
    for storage in STORAGES:
        buf = ReplayBuffer(50, OBS_SHAPE, "cpu", storage=storage)
        push_sequence(buf, sizes)
        results.append(contents(buf))
    for other in results[1:]:
        assert_same_contents(results[0], other)


@pytest.mark.parametrize("mode", ["loop", "batch"])
@pytest.mark.parametrize("storage", STORAGES)
def test_push_copies_the_callers_tensors(storage: str, mode: str) -> None:
    # Envs write each step into the same preallocated tensors; the buffer must not keep views.
    buf = ReplayBuffer(8, OBS_SHAPE, "cpu", storage=storage, push=mode)
    data = transitions(0, 4)
    buf.push(*data)
    before = contents(buf)
    for field in data:
        field.zero_() if field.dtype != torch.bool else field.fill_(True)
    assert_same_contents(before, contents(buf))


@pytest.mark.parametrize("storage", STORAGES)
def test_obs_dtype_is_honoured(storage: str) -> None:
    buf = ReplayBuffer(16, OBS_SHAPE, "cpu", storage=storage, obs_dtype=torch.uint8)
    obs = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    buf.push(obs, torch.zeros(4, dtype=torch.int64), torch.ones(4), obs + 1, torch.zeros(4, dtype=torch.bool))
    b = buf.sample(4)
    assert b.obs.dtype == torch.uint8 and b.next_obs.dtype == torch.uint8
    assert b.actions.dtype == torch.int64 and b.rewards.dtype == torch.float32 and b.dones.dtype == torch.float32


def test_bfloat16_obs_only_in_tensor_storage() -> None:
    ReplayBuffer(4, OBS_SHAPE, "cpu", storage="tensor", obs_dtype=torch.bfloat16)
    for storage in ("list", "numpy"):
        with pytest.raises(ConfigError, match="bfloat16"):
            ReplayBuffer(4, OBS_SHAPE, "cpu", storage=storage, obs_dtype=torch.bfloat16)


def test_push_rejects_mismatched_shapes() -> None:
    buf = ReplayBuffer(8, OBS_SHAPE, "cpu")
    obs, actions, rewards, next_obs, dones = transitions(0, 4)
    with pytest.raises(ValueError, match="obs"):
        buf.push(obs[:, :2], actions, rewards, next_obs[:, :2], dones)
    with pytest.raises(ValueError, match="actions"):
        buf.push(obs, actions[:3], rewards, next_obs, dones)


# ---------------------------------------------------------------------------- sample


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("storage", STORAGES)
def test_samples_are_whole_pushed_rows_from_the_filled_part(storage: str, device: str) -> None:
    buf = ReplayBuffer(50, OBS_SHAPE, device, storage=storage)
    buf.push(*transitions(0, 30, device))  # not full: slots 30..49 are uninitialised memory
    seen: set[int] = set()
    for _ in range(40):
        b = buf.sample(30)
        assert isinstance(b, Batch)
        assert all(x.device.type == torch.device(device).type for x in b)
        assert b.obs.shape == (30, *OBS_SHAPE) and b.actions.shape == (30,)
        assert b.actions.dtype == torch.int64 and b.rewards.dtype == torch.float32
        assert b.dones.dtype == torch.float32
        ids = assert_consistent(*b)
        assert ids.min() >= 0 and ids.max() < 30
        seen.update(ids.tolist())
    assert seen == set(range(30))  # 1200 draws over 30 rows: all of the filled part is reachable

    buf.push(*transitions(30, 90, device))  # wrapped: ids 70..119 are held
    for _ in range(20):
        ids = assert_consistent(*buf.sample(50))
        assert ids.min() >= 70 and ids.max() < 120


@pytest.mark.parametrize("storage", STORAGES)
def test_sampling_is_uniform(storage: str) -> None:
    capacity, draws = 100, 50_000
    buf = ReplayBuffer(capacity, OBS_SHAPE, "cpu", storage=storage, seed=3)
    buf.push(*transitions(0, 230))  # wrapped, so the slot order differs from the id order
    ids = torch.cat([ids_of(buf.sample(capacity).obs) for _ in range(draws // capacity)])
    counts = torch.bincount(ids - 130, minlength=capacity).double()
    assert counts.numel() == capacity  # nothing outside ids 130..229
    expected = draws / capacity
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 99 degrees of freedom: mean 99, sd 14, so 200 is ~7 sd out. A sampler that never draws one
    # slot (e.g. an off-by-one in the high bound) adds ~500 by itself.
    assert chi2 < 200, (chi2, counts.tolist())


def test_sample_needs_enough_transitions() -> None:
    buf = ReplayBuffer(100, OBS_SHAPE, "cpu")
    buf.push(*transitions(0, 10))
    with pytest.raises(RlperfError, match=r"32.*10"):
        buf.sample(32)


@pytest.mark.parametrize("storage", STORAGES)
def test_same_seed_same_samples(storage: str) -> None:
    def run(seed: int) -> list[torch.Tensor]:
        buf = ReplayBuffer(64, OBS_SHAPE, "cpu", storage=storage, seed=seed)
        buf.push(*transitions(0, 100))
        return [ids_of(buf.sample(16).obs) for _ in range(5)]

    a, b, c = run(7), run(7), run(8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_list_and_numpy_draw_the_same_samples() -> None:
    # Both use numpy's Generator the same way, so the slow and fast host storages are comparable
    # sample for sample.
    bufs = [ReplayBuffer(64, OBS_SHAPE, "cpu", storage=s, seed=5) for s in ("list", "numpy")]
    for buf in bufs:
        buf.push(*transitions(0, 90))
    for _ in range(5):
        x, y = (buf.sample(32) for buf in bufs)
        for a, b in zip(x, y, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("storage", STORAGES)
def test_state_dict_round_trip_continues_identically(storage: str, device: str) -> None:
    for first in (25, 70):  # not yet full, and wrapped
        orig = ReplayBuffer(40, OBS_SHAPE, device, storage=storage, seed=11)
        orig.push(*transitions(0, first, device))
        orig.sample(8)  # advance the RNG so the saved state is not the seed's
        state = orig.state_dict()
        assert all(v.device.type == "cpu" for v in state.values() if isinstance(v, torch.Tensor))

        # Through a real checkpoint file, loadable without unpickling arbitrary objects.
        blob = io.BytesIO()
        torch.save(state, blob)
        blob.seek(0)
        loaded = torch.load(blob, weights_only=True)

        restored = ReplayBuffer(40, OBS_SHAPE, device, storage=storage, seed=999)
        restored.load_state_dict(loaded)
        assert len(restored) == len(orig)
        assert_same_contents(contents(orig), contents(restored))
        for step in range(4):
            for a, b in zip(orig.sample(16), restored.sample(16), strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            # The cursor came back too: further pushes land in the same slots.
            more = transitions(first + 13 * step, 13, device)
            orig.push(*more)
            restored.push(*more)
            assert_same_contents(contents(orig), contents(restored))


@pytest.mark.parametrize("storage", STORAGES)
def test_state_dict_is_a_snapshot(storage: str) -> None:
    buf = ReplayBuffer(10, OBS_SHAPE, "cpu", storage=storage)
    buf.push(*transitions(0, 10))
    state = buf.state_dict()
    saved = state["obs"].clone()
    buf.push(*transitions(10, 10))
    torch.testing.assert_close(state["obs"], saved, rtol=0, atol=0)


def test_load_state_dict_refuses_a_mismatch() -> None:
    src = ReplayBuffer(10, OBS_SHAPE, "cpu", storage="numpy")
    src.push(*transitions(0, 4))
    state = src.state_dict()
    with pytest.raises(RlperfError, match="capacity"):
        ReplayBuffer(20, OBS_SHAPE, "cpu", storage="numpy").load_state_dict(state)
    with pytest.raises(RlperfError, match="RNG"):
        ReplayBuffer(10, OBS_SHAPE, "cpu", storage="tensor").load_state_dict(state)
    # list and numpy share a numpy RNG, so a checkpoint moves between them exactly.
    other = ReplayBuffer(10, OBS_SHAPE, "cpu", storage="list")
    other.load_state_dict(state)
    torch.testing.assert_close(other.sample(4).obs, src.sample(4).obs, rtol=0, atol=0)


# ---------------------------------------------------------------------------- sizing and errors


def test_estimate_nbytes() -> None:
    # (11,) float32: two observations of 44 bytes, an int64 action, float32 reward and done.
    assert ReplayBuffer.estimate_nbytes(1000, (11,)) == 1000 * (2 * 44 + 8 + 4 + 4)
    assert ReplayBuffer.estimate_nbytes(10, (3, 10, 10), torch.uint8) == 10 * (2 * 300 + 16)
    assert ReplayBuffer.estimate_nbytes(10, (11,), storage="list") > ReplayBuffer.estimate_nbytes(10, (11,))


@pytest.mark.parametrize("storage", STORAGES)
def test_refuses_a_buffer_that_does_not_fit(storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    free = 1 << 20  # pretend 1 MiB is free
    monkeypatch.setattr(device_mod, "available_memory", lambda device: free)

    def no_allocation(*args: object) -> None:
        raise AssertionError("allocated before checking the memory")

    monkeypatch.setitem(buffer_mod._STORAGE_CLASSES, storage, no_allocation)
    capacity = 40_000  # 40k × 104 B ≈ 4.0 MiB for float32 (11,)
    with pytest.raises(BufferMemoryError) as info:
        ReplayBuffer(capacity, (11,), "cpu", storage=storage)
    err = info.value
    assert isinstance(err, RlperfError)
    needed = ReplayBuffer.estimate_nbytes(capacity, (11,), storage=storage)
    assert f"{needed / 2**20:.1f} MiB" in err.message  # the size asked for
    assert "1.0 MiB" in err.message  # and what is free
    assert "buffer.capacity" in (err.hint or "")
    assert "\n" not in str(err)


def test_memory_check_keeps_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    needed = ReplayBuffer.estimate_nbytes(1000, (11,))
    monkeypatch.setattr(device_mod, "available_memory", lambda device: int(needed / 0.95))
    with pytest.raises(BufferMemoryError):
        ReplayBuffer(1000, (11,), "cpu")  # fits, but not with 10% to spare
    monkeypatch.setattr(device_mod, "available_memory", lambda device: int(needed / 0.85))
    ReplayBuffer(1000, (11,), "cpu")
    # check_memory=False skips the check entirely.
    monkeypatch.setattr(device_mod, "available_memory", lambda device: 0)
    ReplayBuffer(1000, (11,), "cpu", check_memory=False)


@pytest.mark.parametrize("storage", STORAGES)
def test_huge_capacity_fails_fast(storage: str) -> None:
    started = time.perf_counter()
    with pytest.raises(BufferMemoryError, match="TiB"):
        ReplayBuffer(10**13, (11,), "cpu", storage=storage)  # ~1 PB
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("capacity", [0, -5])
def test_capacity_must_be_positive(capacity: int) -> None:
    with pytest.raises(ConfigError, match=r"buffer\.capacity"):
        ReplayBuffer(capacity, OBS_SHAPE, "cpu")


def test_unknown_storage_and_mode() -> None:
    with pytest.raises(ValueError, match=r"storage.*list, numpy, tensor"):
        ReplayBuffer(8, OBS_SHAPE, "cpu", storage="deque")
    with pytest.raises(ValueError, match=r"push.*loop, batch"):
        ReplayBuffer(8, OBS_SHAPE, "cpu", push="vector")
