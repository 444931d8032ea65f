"""The DQN replay buffer: a fixed-capacity ring of (obs, action, reward, next_obs, done).

Two knobs live here (shared/DESIGN.md §2), each with the seed's slow form kept as a reference:

- ``buffer.push`` — how a batch of ``n`` transitions from the vector env gets in.
  ``loop`` is seed 001 §1 verbatim: one ``_push_one`` per board with a host copy of each
  observation and three ``.item()`` calls (each a device sync on CUDA). ``batch`` is one vectorized
  write of the whole batch (TorchRL style).
- ``buffer.storage`` — where the ring lives. ``list`` is seed 000's "bad" form: a Python list of
  tuples, sampled by a list comprehension and ``np.stack``. ``numpy`` is Stable-Baselines3's form:
  preallocated host arrays, copied to the model's device on every sample. ``tensor`` keeps
  preallocated tensors on the model's device and draws the sample indices there, so a sample never
  leaves the device.

Every combination stores exactly the same transitions in the same slots (tests check loop against
batch for each storage), so a measured difference between knob values is pure overhead.

The capacity is checked against free memory before anything is allocated: Stable-Baselines3 warns
when a buffer will not fit; rlperf refuses with the size asked for and a hint (DESIGN.md §7).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import psutil
import torch
from torch import Tensor

from rlperf.errors import ConfigError, RlperfError

__all__ = [
    "PUSH_MODES",
    "STORAGES",
    "Batch",
    "BufferMemoryError",
    "ReplayBuffer",
    "available_memory",
]

STORAGES: tuple[str, ...] = ("list", "numpy", "tensor")
PUSH_MODES: tuple[str, ...] = ("loop", "batch")

# Bytes a slot needs besides the observations: action (int64) + reward (float32) + done (float32).
_SCALAR_NBYTES = 8 + 4 + 4
# Python objects a ``list`` slot holds on top of the raw data: the 5-tuple (~80 B), two ndarray
# headers (~112 B each), a float and an int (~28 B each). An estimate, not an exact count.
_LIST_SLOT_OVERHEAD = 384
# Keep this share of the free memory for everything else (model, batches, the allocator's slack).
_HEADROOM = 0.10
_STATE_VERSION = 1
# torch.OutOfMemoryError (CPU and CUDA) is new in torch 2.5; older versions only have the CUDA one.
_TorchOOM: type[Exception] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


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


class BufferMemoryError(RlperfError, MemoryError):
    """The replay buffer asked for more memory than the machine has free."""


def available_memory(device: torch.device) -> int:
    """Bytes free for a new allocation on ``device``: host RAM, or the CUDA device's free memory.

    A module-level function so that tests can monkeypatch it instead of asking for terabytes.
    """
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


def _is_out_of_memory(exc: BaseException) -> bool:
    """Whether an allocation failed for lack of memory (torch < 2.5 reports a CPU one as RuntimeError)."""
    if isinstance(exc, (MemoryError, _TorchOOM)):
        return True
    text = str(exc).lower()
    return "can't allocate memory" in text or "out of memory" in text


def _format_bytes(nbytes: float) -> str:
    """``1.5 GiB`` / ``12.0 MiB`` / ``3.0 KiB``: binary units, as ``free -h`` and nvidia-smi use."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype host storages use for ``dtype`` (bfloat16 has none, hence an error)."""
    try:
        return torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:
        raise ConfigError(
            f"obs dtype {dtype} has no numpy equivalent, so it cannot be kept in host storage",
            hint="use buffer.storage=tensor or a float32/float16/uint8 observation dtype",
        ) from None


class ReplayBuffer:
    """A uniform-sampling ring buffer of transitions for DQN.

    Args:
        capacity: number of transitions kept; the oldest is overwritten first (``buffer.capacity``).
        obs_shape: shape of one observation, e.g. ``(11,)`` or ``(3, 10, 10)``.
        device: the model's device; :meth:`sample` returns tensors there. With ``storage="tensor"``
            the ring itself is allocated there too.
        storage: ``"list"``, ``"numpy"`` or ``"tensor"`` (``buffer.storage``; see the module doc).
        obs_dtype: dtype observations are stored and sampled in (``torch.uint8`` for pixels).
        seed: seeds the index generator: a ``numpy.random.Generator`` for the host storages, a
            ``torch.Generator`` on ``device`` for ``tensor``. Same seed and pushes, same samples.
        check_memory: refuse (:class:`BufferMemoryError`) when the estimate does not fit in the free
            memory with 10% headroom. Turn off only to overcommit on purpose.

    Raises:
        ConfigError: ``capacity < 1``, a bad ``obs_shape``, or an unknown ``storage``.
        BufferMemoryError: the buffer cannot fit in the free memory of the device that would hold it.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        device: torch.device | str,
        storage: str = "tensor",
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
            raise ConfigError(
                f"unknown storage {storage!r} for buffer.storage; expected one of {', '.join(STORAGES)}"
            )
        obs_shape = tuple(obs_shape)
        if not all(isinstance(d, (int, np.integer)) and d >= 1 for d in obs_shape):
            raise ConfigError(f"observation shape must be positive whole numbers, got {obs_shape!r}")

        self.capacity: int = int(capacity)
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in obs_shape)
        self.device: torch.device = torch.device(device)
        self.storage: str = storage
        self.obs_dtype: torch.dtype = obs_dtype
        self.seed: int = int(seed)
        self._cursor = 0  # the slot the next transition goes to
        self._size = 0  # how many slots hold a transition (== capacity once the ring has wrapped)

        # Host storages need a numpy dtype; find out before the memory check so that a bad dtype
        # reads as a dtype problem, not a memory one.
        self._np_obs_dtype = _numpy_dtype(obs_dtype) if storage != "tensor" else None
        if check_memory:
            self._check_memory()

        try:
            self._allocate()
        except (MemoryError, RuntimeError) as exc:
            if not _is_out_of_memory(exc):
                raise
            # The estimate said it fits (or the check is off) but the allocator disagrees
            # (fragmentation, another process): the same clear message instead of a C++ traceback.
            needed = self.estimate_nbytes(self.capacity, self.obs_shape, obs_dtype, storage=storage)
            raise BufferMemoryError(
                f"replay buffer of {_format_bytes(needed)} (buffer.capacity={self.capacity}) could not be "
                f"allocated on {self._memory_device()}: out of memory",
                hint="lower buffer.capacity",
            ) from exc

        if storage == "tensor":
            self._torch_rng: torch.Generator | None = torch.Generator(device=self.device)
            self._torch_rng.manual_seed(self.seed)
            self._np_rng: np.random.Generator | None = None
        else:
            self._torch_rng = None
            self._np_rng = np.random.default_rng(self.seed)

    # ------------------------------------------------------------------ sizing and allocation

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
        """Refuse before allocating when the full buffer would not fit with headroom to spare."""
        needed = self.estimate_nbytes(self.capacity, self.obs_shape, self.obs_dtype, storage=self.storage)
        where = self._memory_device()
        free = available_memory(where)
        usable = int(free * (1.0 - _HEADROOM))
        if needed <= usable:
            return
        per_slot = needed // self.capacity
        fits = usable // per_slot
        place = "host memory" if where.type == "cpu" else f"memory on {where}"
        raise BufferMemoryError(
            f"replay buffer needs {_format_bytes(needed)} (buffer.capacity={self.capacity}, obs "
            f"{self.obs_shape} {str(self.obs_dtype).removeprefix('torch.')}, storage={self.storage}) "
            f"but only {_format_bytes(free)} of {place} is free",
            hint=f"lower buffer.capacity to at most {max(fits, 0)}",
        )

    def _allocate(self) -> None:
        """Create the ring. ``empty``, not ``zeros``: only the filled part is ever read."""
        cap, shape = self.capacity, self.obs_shape
        if self.storage == "list":
            # Grows by append until full, then slots are replaced in place (seed 000).
            self._list: list[tuple[np.ndarray, int, float, np.ndarray, float]] = []
        elif self.storage == "numpy":
            self._np_obs = np.empty((cap, *shape), dtype=self._np_obs_dtype)
            self._np_next_obs = np.empty((cap, *shape), dtype=self._np_obs_dtype)
            self._np_actions = np.empty((cap,), dtype=np.int64)
            self._np_rewards = np.empty((cap,), dtype=np.float32)
            self._np_dones = np.empty((cap,), dtype=np.float32)
        else:
            dev = self.device
            self._obs = torch.empty((cap, *shape), dtype=self.obs_dtype, device=dev)
            self._next_obs = torch.empty((cap, *shape), dtype=self.obs_dtype, device=dev)
            self._actions = torch.empty((cap,), dtype=torch.int64, device=dev)
            self._rewards = torch.empty((cap,), dtype=torch.float32, device=dev)
            self._dones = torch.empty((cap,), dtype=torch.float32, device=dev)

    # ------------------------------------------------------------------ push

    def __len__(self) -> int:
        """Number of transitions held (at most ``capacity``)."""
        return self._size

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(capacity={self.capacity}, size={self._size}, obs_shape={self.obs_shape}, "
            f"obs_dtype={self.obs_dtype}, storage={self.storage!r}, device={str(self.device)!r})"
        )

    def push(
        self,
        obs: Tensor,
        actions: Tensor,
        rewards: Tensor,
        next_obs: Tensor,
        dones: Tensor,
        mode: str = "batch",
    ) -> None:
        """Add ``n`` transitions from one vector-env step.

        Args:
            obs: ``(n, *obs_shape)`` observations the actions were taken in (any device).
            actions: ``(n,)`` integer actions.
            rewards: ``(n,)`` rewards.
            next_obs: ``(n, *obs_shape)`` observations after the step (the final observation for a
                board that just finished, not the reset one).
            dones: ``(n,)`` bool/float *terminated* flags. Pass terminations only: a truncated
                episode must still bootstrap from ``next_obs``.
            mode: ``"batch"`` (one vectorized write) or ``"loop"`` (seed 001's per-board loop),
                the ``buffer.push`` knob. Both leave identical contents.

        When ``n > capacity`` only the last ``capacity`` transitions are kept, in the same slots a
        one-by-one push would have left them in.
        """
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
        if mode == "batch":
            if n:
                self._push_batch(obs, actions, rewards, next_obs, dones)
        elif mode == "loop":
            # Seed 001 §1 as written: per board, two host copies and three .item() syncs.
            for i in range(n):
                self._push_one(
                    obs[i].cpu().numpy(),
                    actions[i].item(),
                    rewards[i].item(),
                    next_obs[i].cpu().numpy(),
                    dones[i].item(),
                )
        else:
            raise ConfigError(f"unknown push mode {mode!r} for buffer.push; expected one of {', '.join(PUSH_MODES)}")

    def _push_one(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: Any) -> None:
        """Write one transition at the cursor (the slow reference path)."""
        c = self._cursor
        if self.storage == "list":
            # Copy: on the CPU ``obs[i].cpu().numpy()`` is a view of the env's own buffer, which the
            # env overwrites on its next step.
            item = (
                np.array(obs, dtype=self._np_obs_dtype),
                action,
                reward,
                np.array(next_obs, dtype=self._np_obs_dtype),
                done,
            )
            if len(self._list) < self.capacity:
                self._list.append(item)  # not full yet, so the cursor is the list's end
            else:
                self._list[c] = item
        elif self.storage == "numpy":
            self._np_obs[c] = obs
            self._np_actions[c] = action
            self._np_rewards[c] = reward
            self._np_next_obs[c] = next_obs
            self._np_dones[c] = done
        else:
            # Each of these is a separate host-to-device copy or fill kernel: that is the point.
            self._obs[c] = torch.from_numpy(obs)
            self._actions[c] = action
            self._rewards[c] = reward
            self._next_obs[c] = torch.from_numpy(next_obs)
            self._dones[c] = float(done)
        self._cursor = (c + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def _push_batch(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor, dones: Tensor) -> None:
        """Write ``n >= 1`` transitions at once; the fast path."""
        n = obs.shape[0]
        # With more transitions than slots, the first ``skip`` would be overwritten within this same
        # call, so drop them and start writing where the one-by-one loop would have put the survivors.
        skip = max(0, n - self.capacity)
        m = n - skip
        start = (self._cursor + skip) % self.capacity
        if skip:
            obs, actions, rewards = obs[skip:], actions[skip:], rewards[skip:]
            next_obs, dones = next_obs[skip:], dones[skip:]

        if self.storage == "tensor":
            # The ring as at most two contiguous slice copies, [start, end) then the wrapped head:
            # ``start`` is a host int, so no sync, and ``copy_`` casts and moves in the same kernel
            # (one op per field, where an index scatter needs an index and a cast first).
            first = min(m, self.capacity - start)
            for dst, src in (
                (self._obs, obs),
                (self._next_obs, next_obs),
                (self._actions, actions),
                (self._rewards, rewards),
                (self._dones, dones),
            ):
                dst[start : start + first].copy_(src[:first])
                if first < m:
                    dst[: m - first].copy_(src[first:])
        else:
            # One host copy per field; numpy does the dtype casts so that contents match the loop
            # path (which hands numpy arrays and Python scalars to the same storage) bit for bit.
            obs_h = obs.cpu().numpy()
            next_h = next_obs.cpu().numpy()
            if self.storage == "numpy":
                # The ring as at most two contiguous slice writes: [start, end) then the wrapped head.
                first = min(m, self.capacity - start)
                for dst, src in (
                    (self._np_obs, obs_h),
                    (self._np_next_obs, next_h),
                    (self._np_actions, actions.cpu().numpy()),
                    (self._np_rewards, rewards.cpu().numpy()),
                    (self._np_dones, dones.cpu().numpy()),
                ):
                    dst[start : start + first] = src[:first]
                    dst[: m - first] = src[first:]
            else:
                # astype copies, so the stored rows never alias the caller's tensors.
                obs_h = obs_h.astype(self._np_obs_dtype)
                next_h = next_h.astype(self._np_obs_dtype)
                a, r, d = actions.cpu().tolist(), rewards.cpu().tolist(), dones.cpu().tolist()
                if len(self._list) < self.capacity and self._size + n >= self.capacity:
                    # This push fills the ring, possibly wrapping (or skipping) past the list's end:
                    # pad to full length so every write is a slot assignment. Every pad is overwritten
                    # below, since each slot from the old end onwards receives a transition.
                    self._list.extend([None] * (self.capacity - len(self._list)))  # type: ignore[list-item]
                for j in range(m):
                    item = (obs_h[j], a[j], r[j], next_h[j], d[j])
                    slot = (start + j) % self.capacity
                    if slot == len(self._list):
                        self._list.append(item)
                    else:
                        self._list[slot] = item
        self._cursor = (self._cursor + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    # ------------------------------------------------------------------ sample

    def sample(self, batch_size: int) -> Batch:
        """Draw ``batch_size`` transitions uniformly (with replacement) from the filled part.

        Raises:
            RlperfError: fewer than ``batch_size`` transitions are held.
        """
        if batch_size < 1:
            raise ConfigError(f"batch size must be ≥ 1, got {batch_size}", hint="set train.batch_size ≥ 1")
        if self._size < batch_size:
            raise RlperfError(
                f"cannot sample {batch_size} transitions: the replay buffer holds only {self._size}",
                hint="start training after at least train.batch_size transitions (train.learning_starts)",
            )
        if self.storage == "tensor":
            # Indices drawn on the storage's own device: the gather never touches the host.
            idx = torch.randint(self._size, (batch_size,), device=self.device, generator=self._torch_rng)
            return Batch(
                self._obs.index_select(0, idx),
                self._actions.index_select(0, idx),
                self._rewards.index_select(0, idx),
                self._next_obs.index_select(0, idx),
                self._dones.index_select(0, idx),
            )
        idx = self._np_rng.integers(0, self._size, size=batch_size)
        if self.storage == "numpy":
            arrays = (
                self._np_obs[idx],
                self._np_actions[idx],
                self._np_rewards[idx],
                self._np_next_obs[idx],
                self._np_dones[idx],
            )
        else:
            # Seed 000's form: gather Python tuples, then stack field by field.
            items = [self._list[i] for i in idx]
            arrays = (
                np.stack([t[0] for t in items]),
                np.array([t[1] for t in items], dtype=np.int64),
                np.array([t[2] for t in items], dtype=np.float32),
                np.stack([t[3] for t in items]),
                np.array([t[4] for t in items], dtype=np.float32),
            )
        return Batch(*(torch.from_numpy(a).to(self.device) for a in arrays))

    # ------------------------------------------------------------------ checkpointing

    def _contents(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Slots ``[0, size)`` as CPU tensors that own their memory (obs, actions, rewards, next_obs, dones)."""
        s = self._size
        if self.storage == "tensor":
            fields = (self._obs, self._actions, self._rewards, self._next_obs, self._dones)
            # copy=True: on the CPU ``.to("cpu")`` would return a view of the live ring.
            return tuple(t[:s].to("cpu", copy=True) for t in fields)  # type: ignore[return-value]
        if self.storage == "numpy":
            fields_np = (self._np_obs, self._np_actions, self._np_rewards, self._np_next_obs, self._np_dones)
            return tuple(torch.from_numpy(a[:s].copy()) for a in fields_np)  # type: ignore[return-value]
        empty_obs = np.empty((0, *self.obs_shape), dtype=self._np_obs_dtype)
        items = self._list
        return (
            torch.from_numpy(np.stack([t[0] for t in items]) if items else empty_obs),
            torch.tensor([t[1] for t in items], dtype=torch.int64),
            torch.tensor([float(t[2]) for t in items], dtype=torch.float32),
            torch.from_numpy(np.stack([t[3] for t in items]) if items else empty_obs.copy()),
            torch.tensor([float(t[4]) for t in items], dtype=torch.float32),
        )

    @property
    def _rng_kind(self) -> str:
        """Which generator draws the sample indices; states only restore into the same kind."""
        return f"torch-{self.device.type}" if self._torch_rng is not None else "numpy"

    def _rng_state(self) -> dict[str, Any]:
        if self._torch_rng is not None:
            return {"kind": self._rng_kind, "state": self._torch_rng.get_state().clone()}
        return {"kind": self._rng_kind, "state": self._np_rng.bit_generator.state}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: the filled slots, cursor, size and sampling RNG.

        Tensors are on the CPU and the rest is plain Python, so ``torch.save`` /
        ``torch.load(weights_only=True)`` round-trip it.
        """
        obs, actions, rewards, next_obs, dones = self._contents()
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
            "rng": self._rng_state(),
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
        if rng["kind"] != self._rng_kind:
            raise RlperfError(
                f"replay buffer state was saved with a {rng['kind']} sampling RNG; storage={self.storage} "
                f"on {self.device} uses {self._rng_kind}",
                hint=hint,
            )
        if not (0 <= size <= capacity and 0 <= cursor < capacity and (size == capacity or cursor == size)):
            raise RlperfError(f"replay buffer state is inconsistent: size {size}, cursor {cursor}", hint=hint)
        if any(f.shape[0] != size for f in fields):
            rows = [f.shape[0] for f in fields]
            raise RlperfError(f"replay buffer state holds {rows} rows for size {size}", hint=hint)

        obs, actions, rewards, next_obs, dones = fields
        if self.storage == "tensor":
            for dst, src in zip((self._obs, self._actions, self._rewards, self._next_obs, self._dones), fields):
                dst[:size].copy_(src)
        elif self.storage == "numpy":
            dsts = (self._np_obs, self._np_actions, self._np_rewards, self._np_next_obs, self._np_dones)
            for dst, src in zip(dsts, fields):
                dst[:size] = src.numpy()
        else:
            obs_np, next_np = obs.numpy().astype(self._np_obs_dtype), next_obs.numpy().astype(self._np_obs_dtype)
            a, r, d = actions.tolist(), rewards.tolist(), dones.tolist()
            self._list = [(obs_np[i], a[i], r[i], next_np[i], d[i]) for i in range(size)]
        self._cursor, self._size = cursor, size

        if self._torch_rng is not None:
            self._torch_rng.set_state(rng["state"])
        else:
            self._np_rng.bit_generator.state = rng["state"]
