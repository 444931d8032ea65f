"""The DQN replay buffer: a fixed-capacity ring of (obs, action, reward, next_obs, done).

Two knobs live here, each with its slow form kept as a reference (docs/bottlenecks.md §1, §2):

- ``buffer.push`` — how a batch of ``n`` transitions from the vector env gets in. ``loop`` is the
  per-board loop: one ``write_one`` per board with a host copy of each observation and three
  ``.item()`` calls (each a device sync on CUDA). ``batch`` is one vectorized write of the whole
  batch (at most two slice copies per field).
- ``buffer.storage`` — where the ring lives. ``list`` is a Python list of tuples, sampled by a list
  comprehension and ``np.stack``. ``numpy`` is Stable-Baselines3's form: preallocated host arrays,
  copied to the model's device on every sample. ``tensor`` keeps preallocated tensors on the
  model's device and draws the sample indices there, so a sample never leaves the device.

Both are decided once, when the buffer is built: the storage is one of three classes, and
:meth:`ReplayBuffer.push` is bound to the loop or the batch form. Every combination stores exactly
the same transitions in the same slots (tests check loop against batch for each storage), so a
measured difference between knob values is pure overhead.

The capacity is checked against free memory before anything is allocated (Stable-Baselines3
warns when a buffer will not fit; rlperf refuses with the size asked for and a hint).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from rlperf.device import MemoryRefused, check_fits, is_out_of_memory
from rlperf.errors import ConfigError, RlperfError

__all__ = [
    "PUSH_MODES",
    "STORAGES",
    "Batch",
    "BufferMemoryError",
    "ReplayBuffer",
]

STORAGES: tuple[str, ...] = ("list", "numpy", "tensor")
PUSH_MODES: tuple[str, ...] = ("loop", "batch")

# Bytes a slot needs besides the observations: action (int64) + reward (float32) + done (float32).
_SCALAR_NBYTES = 8 + 4 + 4
# Python objects a ``list`` slot holds on top of the raw data: the 5-tuple (~80 B), two ndarray
# headers (~112 B each), a float and an int (~28 B each). An estimate, not an exact count.
_LIST_SLOT_OVERHEAD = 384
_STATE_VERSION = 1

BufferMemoryError = MemoryRefused
"""The replay buffer asked for more memory than its device has free (nothing was allocated)."""


class Batch(NamedTuple):
    """A sampled minibatch, all on the buffer's (model's) device."""

    obs: Tensor
    """``(B, *obs_shape)`` in the buffer's ``obs_dtype``."""
    actions: Tensor
    """``(B,)`` int64."""
    rewards: Tensor
    """``(B,)`` float32."""
    next_obs: Tensor
    """``(B, *obs_shape)`` in the buffer's ``obs_dtype``."""
    dones: Tensor
    """``(B,)`` float32, 1.0 where the episode terminated (truncation is not a done)."""


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype host storages use for ``dtype`` (bfloat16 has none, hence an error)."""
    try:
        return torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:
        raise ConfigError(
            f"obs dtype {dtype} has no numpy equivalent, so it cannot be kept in host storage",
            hint="use buffer.storage=tensor or a float32/float16/uint8 observation dtype",
        ) from None


# ---------------------------------------------------------------------------------- storages


class _Storage:
    """The ring's memory and its sampling generator. Slots are addressed by the buffer."""

    name = ""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, device: torch.device,
                 seed: int) -> None:
        self.capacity, self.obs_shape, self.obs_dtype, self.device = capacity, obs_shape, obs_dtype, device

    def write_one(self, slot: int, obs: np.ndarray, action: Any, reward: Any, next_obs: np.ndarray,
                  done: Any) -> None:
        """One transition, as the per-board loop hands it over (host arrays and Python scalars)."""
        raise NotImplementedError

    def write_batch(self, start: int, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor,
                    dones: Tensor) -> None:
        """``m = len(obs) <= capacity`` transitions into slots ``start, start + 1, ...`` (wrapping)."""
        raise NotImplementedError

    def sample(self, size: int, batch_size: int) -> Batch:
        """``batch_size`` uniform draws (with replacement) from slots ``[0, size)``."""
        raise NotImplementedError

    def contents(self, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Slots ``[0, size)`` as CPU tensors that own their memory (obs, actions, rewards, next_obs, dones)."""
        raise NotImplementedError

    def load(self, size: int, fields: list[Tensor]) -> None:
        """Put :meth:`contents`' tensors back into slots ``[0, size)``."""
        raise NotImplementedError

    rng_kind = ""

    def rng_state(self) -> Any:
        raise NotImplementedError

    def set_rng_state(self, state: Any) -> None:
        raise NotImplementedError


def _ring_slices(start: int, m: int, capacity: int) -> int:
    """``m`` slots from ``start`` as ``[start, start + first)`` then ``[0, m - first)``: returns ``first``."""
    return min(m, capacity - start)


class _HostRng:
    """The host storages' index generator (numpy): what ``list`` and ``numpy`` share."""

    rng_kind = "numpy"

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def draw(self, size: int, batch_size: int) -> np.ndarray:
        return self._rng.integers(0, size, size=batch_size)

    def rng_state(self) -> Any:
        return self._rng.bit_generator.state

    def set_rng_state(self, state: Any) -> None:
        self._rng.bit_generator.state = state


class ListStorage(_HostRng, _Storage):
    """A Python list of tuples, grown by append until full; sampled by a comprehension and ``np.stack``."""

    name = "list"

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, device: torch.device,
                 seed: int) -> None:
        _Storage.__init__(self, capacity, obs_shape, obs_dtype, device, seed)
        _HostRng.__init__(self, seed)
        self._np_dtype = _numpy_dtype(obs_dtype)
        self._list: list[tuple[np.ndarray, Any, Any, np.ndarray, Any] | None] = []

    def _put(self, slot: int, item: tuple[np.ndarray, Any, Any, np.ndarray, Any]) -> None:
        if slot == len(self._list):
            self._list.append(item)  # not full yet, so the slot is the list's end
        else:
            self._list[slot] = item

    def write_one(self, slot: int, obs: np.ndarray, action: Any, reward: Any, next_obs: np.ndarray,
                  done: Any) -> None:
        # Copy: on the CPU ``obs[i].cpu().numpy()`` is a view of the env's own buffer, which the
        # env overwrites on its next step.
        self._put(slot, (np.array(obs, dtype=self._np_dtype), action, reward, np.array(next_obs, dtype=self._np_dtype),
                         done))

    def write_batch(self, start: int, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor,
                    dones: Tensor) -> None:
        # astype copies, so the stored rows never alias the caller's tensors.
        obs_h = obs.cpu().numpy().astype(self._np_dtype)
        next_h = next_obs.cpu().numpy().astype(self._np_dtype)
        a, r, d = actions.cpu().tolist(), rewards.cpu().tolist(), dones.cpu().tolist()
        m = len(a)
        if len(self._list) < self.capacity and start + m > len(self._list) and m >= self.capacity - len(self._list):
            # This write reaches the list's end and wraps (or fills it exactly): pad to full length
            # so every write is a slot assignment. Every pad is overwritten below.
            self._list.extend([None] * (self.capacity - len(self._list)))
        for j in range(m):
            self._put((start + j) % self.capacity, (obs_h[j], a[j], r[j], next_h[j], d[j]))

    def sample(self, size: int, batch_size: int) -> Batch:
        items = [self._list[i] for i in self.draw(size, batch_size)]
        arrays = (
            np.stack([t[0] for t in items]),
            np.array([t[1] for t in items], dtype=np.int64),
            np.array([t[2] for t in items], dtype=np.float32),
            np.stack([t[3] for t in items]),
            np.array([t[4] for t in items], dtype=np.float32),
        )
        return Batch(*(torch.from_numpy(x).to(self.device) for x in arrays))

    def contents(self, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        items = [t for t in self._list[:size] if t is not None]
        empty_obs = np.empty((0, *self.obs_shape), dtype=self._np_dtype)
        return (
            torch.from_numpy(np.stack([t[0] for t in items]) if items else empty_obs),
            torch.tensor([t[1] for t in items], dtype=torch.int64),
            torch.tensor([float(t[2]) for t in items], dtype=torch.float32),
            torch.from_numpy(np.stack([t[3] for t in items]) if items else empty_obs.copy()),
            torch.tensor([float(t[4]) for t in items], dtype=torch.float32),
        )

    def load(self, size: int, fields: list[Tensor]) -> None:
        obs, actions, rewards, next_obs, dones = fields
        obs_np, next_np = obs.numpy().astype(self._np_dtype), next_obs.numpy().astype(self._np_dtype)
        a, r, d = actions.tolist(), rewards.tolist(), dones.tolist()
        self._list = [(obs_np[i], a[i], r[i], next_np[i], d[i]) for i in range(size)]


class NumpyStorage(_HostRng, _Storage):
    """Preallocated host arrays (Stable-Baselines3's form), copied to the device on every sample."""

    name = "numpy"

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, device: torch.device,
                 seed: int) -> None:
        _Storage.__init__(self, capacity, obs_shape, obs_dtype, device, seed)
        _HostRng.__init__(self, seed)
        np_dtype = _numpy_dtype(obs_dtype)
        # ``empty``, not ``zeros``: only the filled part is ever read.
        self._fields: tuple[np.ndarray, ...] = (
            np.empty((capacity, *obs_shape), dtype=np_dtype),
            np.empty((capacity,), dtype=np.int64),
            np.empty((capacity,), dtype=np.float32),
            np.empty((capacity, *obs_shape), dtype=np_dtype),
            np.empty((capacity,), dtype=np.float32),
        )

    def write_one(self, slot: int, obs: np.ndarray, action: Any, reward: Any, next_obs: np.ndarray,
                  done: Any) -> None:
        for dst, value in zip(self._fields, (obs, action, reward, next_obs, done), strict=True):
            dst[slot] = value

    def write_batch(self, start: int, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor,
                    dones: Tensor) -> None:
        # One host copy per field; numpy does the dtype casts so that contents match the loop path
        # (which hands numpy arrays and Python scalars to the same storage) bit for bit.
        m = obs.shape[0]
        first = _ring_slices(start, m, self.capacity)
        for dst, src in zip(self._fields, (obs, actions, rewards, next_obs, dones), strict=True):
            host = src.cpu().numpy()
            dst[start:start + first] = host[:first]
            dst[:m - first] = host[first:]

    def sample(self, size: int, batch_size: int) -> Batch:
        idx = self.draw(size, batch_size)
        return Batch(*(torch.from_numpy(f[idx]).to(self.device) for f in self._fields))

    def contents(self, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        return tuple(torch.from_numpy(f[:size].copy()) for f in self._fields)  # type: ignore[return-value]

    def load(self, size: int, fields: list[Tensor]) -> None:
        for dst, src in zip(self._fields, fields, strict=True):
            dst[:size] = src.numpy()


class TensorStorage(_Storage):
    """Preallocated tensors on the model's device; sample indices drawn there too."""

    name = "tensor"

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, device: torch.device,
                 seed: int) -> None:
        super().__init__(capacity, obs_shape, obs_dtype, device, seed)
        self._fields = (
            torch.empty((capacity, *obs_shape), dtype=obs_dtype, device=device),
            torch.empty((capacity,), dtype=torch.int64, device=device),
            torch.empty((capacity,), dtype=torch.float32, device=device),
            torch.empty((capacity, *obs_shape), dtype=obs_dtype, device=device),
            torch.empty((capacity,), dtype=torch.float32, device=device),
        )
        self._rng = torch.Generator(device=device)
        self._rng.manual_seed(seed)

    def write_one(self, slot: int, obs: np.ndarray, action: Any, reward: Any, next_obs: np.ndarray,
                  done: Any) -> None:
        # Each of these is a separate host-to-device copy or fill kernel: that is the point.
        f = self._fields
        f[0][slot] = torch.from_numpy(obs)
        f[1][slot] = action
        f[2][slot] = reward
        f[3][slot] = torch.from_numpy(next_obs)
        f[4][slot] = float(done)

    def write_batch(self, start: int, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor,
                    dones: Tensor) -> None:
        # The ring as at most two contiguous slice copies, [start, start + first) then the wrapped
        # head: ``start`` is a host int, so no sync, and ``copy_`` casts and moves in the same kernel
        # (one op per field, where an index scatter needs an index and a cast first).
        m = obs.shape[0]
        first = _ring_slices(start, m, self.capacity)
        for dst, src in zip(self._fields, (obs, actions, rewards, next_obs, dones), strict=True):
            dst[start:start + first].copy_(src[:first])
            if first < m:
                dst[:m - first].copy_(src[first:])

    def sample(self, size: int, batch_size: int) -> Batch:
        # Indices drawn on the storage's own device: the gather never touches the host.
        idx = torch.randint(size, (batch_size,), device=self.device, generator=self._rng)
        return Batch(*(f.index_select(0, idx) for f in self._fields))

    def draw_into(self, size: int, out: Tensor) -> tuple[Tensor, ...]:
        """The slots :meth:`sample` would draw, written into ``out``; returns the ring's fields."""
        torch.randint(size, out.shape, device=self.device, generator=self._rng, out=out)
        return self._fields

    def contents(self, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        # copy=True: on the CPU ``.to("cpu")`` would return a view of the live ring.
        return tuple(f[:size].to("cpu", copy=True) for f in self._fields)  # type: ignore[return-value]

    def load(self, size: int, fields: list[Tensor]) -> None:
        for dst, src in zip(self._fields, fields, strict=True):
            dst[:size].copy_(src)

    @property
    def rng_kind(self) -> str:  # type: ignore[override]
        return f"torch-{self.device.type}"

    def rng_state(self) -> Any:
        return self._rng.get_state().clone()

    def set_rng_state(self, state: Any) -> None:
        self._rng.set_state(state)


_STORAGE_CLASSES: dict[str, type[_Storage]] = {"list": ListStorage, "numpy": NumpyStorage, "tensor": TensorStorage}


# ---------------------------------------------------------------------------------- the buffer


class ReplayBuffer:
    """A uniform-sampling ring buffer of transitions for DQN.

    ``push(obs, actions, rewards, next_obs, dones)`` adds ``n`` transitions from one vector-env
    step: ``(n, *obs_shape)`` observations the actions were taken in, ``(n,)`` actions and rewards,
    the observations after the step (the final observation for a board that just finished, not the
    reset one) and ``(n,)`` *terminated* flags (a truncated episode must still bootstrap, so pass
    terminations only). Inputs may live on any device. With ``n > capacity`` only the last
    ``capacity`` transitions are kept, in the slots a one-by-one push would have left them in.

    Args:
        capacity: number of transitions kept; the oldest is overwritten first (``buffer.capacity``).
        obs_shape: shape of one observation, e.g. ``(11,)`` or ``(3, 10, 10)``.
        device: the model's device; :meth:`sample` returns tensors there. With ``storage="tensor"``
            the ring itself is allocated there too.
        storage: ``"list"``, ``"numpy"`` or ``"tensor"`` (``buffer.storage``; see the module doc).
        push: ``"batch"`` (one vectorized write) or ``"loop"`` (per board, with host copies and
            ``.item()``), the ``buffer.push`` knob. Both leave identical contents.
        obs_dtype: dtype observations are stored and sampled in (``torch.uint8`` for pixels).
        seed: seeds the index generator: a ``numpy.random.Generator`` for the host storages, a
            ``torch.Generator`` on ``device`` for ``tensor``. Same seed and pushes, same samples.
        check_memory: refuse (:class:`BufferMemoryError`) when the estimate does not fit in the free
            memory with the headroom every rlperf memory check keeps. Off when the caller has
            checked the whole run's memory already (``rlperf train`` does).

    Raises:
        ConfigError: ``capacity < 1``, a bad ``obs_shape``, or an unknown ``storage`` or ``push``.
        BufferMemoryError: the buffer cannot fit in the free memory of the device that would hold it.
    """

    push: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
    """Add a batch of transitions: the ``buffer.push`` form chosen at construction."""

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        device: torch.device | str,
        storage: str = "tensor",
        push: str = "batch",
        obs_dtype: torch.dtype = torch.float32,
        seed: int = 0,
        check_memory: bool = True,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ConfigError(
                f"buffer.capacity must be a whole number ≥ 1, got {capacity!r}",
                hint="set buffer.capacity to the number of transitions to keep, e.g. 100000",
            )
        if storage not in STORAGES:
            raise ConfigError(f"unknown storage {storage!r} for buffer.storage; expected one of {', '.join(STORAGES)}")
        if push not in PUSH_MODES:
            raise ConfigError(f"unknown push mode {push!r} for buffer.push; expected one of {', '.join(PUSH_MODES)}")
        obs_shape = tuple(obs_shape)
        if not all(isinstance(d, (int, np.integer)) and d >= 1 for d in obs_shape):
            raise ConfigError(f"observation shape must be positive whole numbers, got {obs_shape!r}")

        self.capacity: int = int(capacity)
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in obs_shape)
        self.device: torch.device = torch.device(device)
        self.storage: str = storage
        self.push_mode: str = push
        self.obs_dtype: torch.dtype = obs_dtype
        self.seed: int = int(seed)
        self._cursor = 0  # the slot the next transition goes to
        self._size = 0  # how many slots hold a transition (== capacity once the ring has wrapped)

        # Host storages need a numpy dtype; find out before the memory check so that a bad dtype
        # reads as a dtype problem, not a memory one.
        if storage != "tensor":
            _numpy_dtype(obs_dtype)
        if check_memory:
            self._check_memory()
        try:
            self._store = _STORAGE_CLASSES[storage](self.capacity, self.obs_shape, obs_dtype, self.device, self.seed)
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                raise
            # The estimate said it fits (or the check is off) but the allocator disagrees
            # (fragmentation, another process): the same clear message instead of a C++ traceback.
            raise BufferMemoryError(
                f"replay buffer (buffer.capacity={self.capacity}) could not be allocated on "
                f"{self._memory_device()}: out of memory", hint="lower buffer.capacity") from exc
        # The knob, decided once: the loop and the hot path never ask which form is on.
        self.push = self._push_loop if push == "loop" else self._push_batch

    # ------------------------------------------------------------------ sizing

    @staticmethod
    def estimate_nbytes(
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype = torch.float32,
        storage: str = "tensor",
    ) -> int:
        """Bytes a full buffer holds: obs and next_obs, plus action, reward and done per slot.

        ``storage="list"`` adds an estimate of the Python object overhead per slot, which for small
        observations is larger than the data itself.
        """
        obs_nbytes = int(np.prod(obs_shape, dtype=np.int64)) * torch.empty((), dtype=obs_dtype).element_size()
        per_slot = 2 * obs_nbytes + _SCALAR_NBYTES
        if storage == "list":
            per_slot += _LIST_SLOT_OVERHEAD
        return int(capacity) * per_slot

    def _memory_device(self) -> torch.device:
        """Where the ring's memory comes from: the model's device only for ``tensor`` storage."""
        return self.device if self.storage == "tensor" else torch.device("cpu")

    def _check_memory(self) -> None:
        needed = self.estimate_nbytes(self.capacity, self.obs_shape, self.obs_dtype, storage=self.storage)
        per_slot = needed // self.capacity
        what = (f"replay buffer (obs {self.obs_shape} {str(self.obs_dtype).removeprefix('torch.')}, "
                f"storage={self.storage})")
        check_fits(what, {"replay": (needed, f"buffer.capacity={self.capacity}")}, self._memory_device(),
                   {"replay": lambda room: f"lower buffer.capacity to at most {room // per_slot}"})

    # ------------------------------------------------------------------ push

    def __len__(self) -> int:
        """Number of transitions held (at most ``capacity``)."""
        return self._size

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(capacity={self.capacity}, size={self._size}, obs_shape={self.obs_shape}, "
            f"obs_dtype={self.obs_dtype}, storage={self.storage!r}, push={self.push_mode!r}, "
            f"device={str(self.device)!r})"
        )

    def _check_shapes(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor, dones: Tensor) -> int:
        n = obs.shape[0]
        if obs.shape[1:] != self.obs_shape or next_obs.shape != obs.shape:
            raise ValueError(
                f"push expects obs and next_obs of shape (n, *{self.obs_shape}), got "
                f"{tuple(obs.shape)} and {tuple(next_obs.shape)}"
            )
        if actions.shape != (n,) or rewards.shape != (n,) or dones.shape != (n,):
            raise ValueError(
                f"push expects actions, rewards and dones of shape ({n},), got {tuple(actions.shape)}, "
                f"{tuple(rewards.shape)} and {tuple(dones.shape)}"
            )
        return int(n)

    def _push_loop(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor, dones: Tensor) -> None:
        """The slow form: per board, two host copies and three ``.item()`` syncs."""
        n = self._check_shapes(obs, actions, rewards, next_obs, dones)
        for i in range(n):
            self._store.write_one(
                self._cursor,
                obs[i].cpu().numpy(),
                actions[i].item(),
                rewards[i].item(),
                next_obs[i].cpu().numpy(),
                dones[i].item(),
            )
            self._cursor = (self._cursor + 1) % self.capacity
            self._size = min(self._size + 1, self.capacity)

    def _push_batch(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor, dones: Tensor) -> None:
        """The fast form: the whole batch at once."""
        n = self._check_shapes(obs, actions, rewards, next_obs, dones)
        if not n:
            return
        # With more transitions than slots, the first ``skip`` would be overwritten within this same
        # call, so drop them and start writing where the one-by-one loop would have put the survivors.
        skip = max(0, n - self.capacity)
        start = (self._cursor + skip) % self.capacity
        if skip:
            obs, actions, rewards, next_obs, dones = obs[skip:], actions[skip:], rewards[skip:], next_obs[skip:], dones[skip:]
        self._store.write_batch(start, obs, actions, rewards, next_obs, dones)
        self._cursor = (self._cursor + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    # ------------------------------------------------------------------ sample

    def sample(self, batch_size: int) -> Batch:
        """Draw ``batch_size`` transitions uniformly (with replacement) from the filled part.

        Raises:
            RlperfError: fewer than ``batch_size`` transitions are held.
        """
        if batch_size < 1:
            raise ConfigError(f"batch size must be ≥ 1, got {batch_size}", hint="set buffer.batch_size ≥ 1")
        if self._size < batch_size:
            raise RlperfError(
                f"cannot sample {batch_size} transitions: the replay buffer holds only {self._size}",
                hint="start training after at least buffer.batch_size transitions (train.learning_starts)",
            )
        return self._store.sample(self._size, batch_size)

    def sample_slots(self, out: Tensor) -> tuple[Tensor, ...] | None:
        """Draw the slots :meth:`sample` would draw for a batch of ``len(out)`` into ``out`` and return
        the ring's own fields (obs, actions, rewards, next_obs, dones; no copies), for an update that
        gathers the batch itself (:mod:`rlperf.fused_update`); None where the storage is not tensors."""
        if not isinstance(self._store, TensorStorage):
            return None
        if self._size < out.shape[0]:
            self.sample(out.shape[0])  # the same refusal as sample's
        return self._store.draw_into(self._size, out)

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: the filled slots, cursor, size and sampling RNG.

        Tensors are on the CPU and the rest is plain Python, so ``torch.save`` /
        ``torch.load(weights_only=True)`` round-trip it.
        """
        obs, actions, rewards, next_obs, dones = self._store.contents(self._size)
        return {
            "version": _STATE_VERSION,
            "storage": self.storage,
            "capacity": self.capacity,
            "obs_shape": list(self.obs_shape),
            "obs_dtype": str(self.obs_dtype),
            "cursor": self._cursor,
            "size": self._size,
            "obs": obs,
            "actions": actions,
            "rewards": rewards,
            "next_obs": next_obs,
            "dones": dones,
            "rng": {"kind": self._store.rng_kind, "state": self._store.rng_state()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; afterwards :meth:`sample` continues the saved sequence.

        The contents load into any storage with the same capacity, observation shape and dtype. The
        sampling RNG only restores into the same kind of generator (``list``/``numpy`` share one;
        ``tensor`` needs the same device type), so anything else is refused rather than silently
        giving a different sample stream.
        """
        hint = "resume with the buffer.capacity, buffer.storage and device the checkpoint was written with"
        try:
            capacity, obs_shape, obs_dtype = state["capacity"], tuple(state["obs_shape"]), state["obs_dtype"]
            cursor, size, rng = int(state["cursor"]), int(state["size"]), state["rng"]
            fields = [state[k] for k in ("obs", "actions", "rewards", "next_obs", "dones")]
        except (KeyError, TypeError) as exc:
            raise RlperfError(f"replay buffer state is incomplete (missing {exc})", hint=hint) from None
        if capacity != self.capacity or obs_shape != self.obs_shape or obs_dtype != str(self.obs_dtype):
            raise RlperfError(
                f"replay buffer state has capacity {capacity}, obs {obs_shape} {obs_dtype}; this buffer "
                f"has capacity {self.capacity}, obs {self.obs_shape} {self.obs_dtype}",
                hint=hint,
            )
        if rng["kind"] != self._store.rng_kind:
            raise RlperfError(
                f"replay buffer state was saved with a {rng['kind']} sampling RNG; storage={self.storage} "
                f"on {self.device} uses {self._store.rng_kind}",
                hint=hint,
            )
        if not (0 <= size <= capacity and 0 <= cursor < capacity and (size == capacity or cursor == size)):
            raise RlperfError(f"replay buffer state is inconsistent: size {size}, cursor {cursor}", hint=hint)
        if any(f.shape[0] != size for f in fields):
            rows = [f.shape[0] for f in fields]
            raise RlperfError(f"replay buffer state holds {rows} rows for size {size}", hint=hint)
        self._store.load(size, fields)
        self._cursor, self._size = cursor, size
        self._store.set_rng_state(rng["state"])
