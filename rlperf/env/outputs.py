"""What ``VectorSnake.step`` returns with ``copy=True``: output sets, pooled on the CPU.

The contract (Gymnasium's for ``copy=True``): a caller may keep any tensor a step returned, and no
later step changes it. Allocating fresh tensors every step keeps it, at a cost that doubled the
fused kernel's step: at 256 boards the fixed cost of the new numpy and torch objects (four arrays,
four tensors, nine row views), at 4,096 fresh memory for ~490 KB every step (page faults).

An :class:`OutputSet` is one allocation that holds a step's results -- observation slots shaped
like the env's own, and the byte rows of the final counters, floats and flags (adjacent in the
env's memory, see ``VectorSnake._allocate``) -- with the nine tensors a step returns made once as
views of it. The fused kernel writes a step's observation and ``final_obs`` straight into the set
(it takes the set's slots in place of the env's), so filling it costs one ``memcpy`` of ~31 bytes
a board; the ops kernel's observations are copied in too (one more ``memcpy``).

:class:`OutputPool` hands a set out again only once nothing outside the pool refers to it: no
reference to a returned tensor object beyond the set's own (Python reference counts; torch also
keeps a tensor's Python object referenced while C++ holds the tensor: autograd's saved tensors, a
DLPack capsule), and no other tensor, view or numpy array on the set's memory (the storage's use
count). Both counts must equal the ones taken when the set was made, so anything unforeseen keeps
a set out of use rather than overwriting it; ``tests/test_env_copy.py`` holds results each way. In
the usual loop (``obs, ... = env.step(a)``) the caller holds the previous step's set while the
next step fills the other: two sets, warm in the cache, and nothing allocated. A caller that keeps
more results gets more sets, up to :data:`MAX_SETS` (fewer for very large sets, see
:data:`POOL_BYTES`); beyond that every step allocates a set of its own (the old cost; still correct).

Only on the CPU: on a GPU the caller's queued kernels may still read a dropped tensor on another
stream, so there each step makes a new set (the caching allocator makes that cheap).
"""

from __future__ import annotations

import math
import sys
from typing import TypeAlias

import numpy as np
import torch

# Sets kept for reuse. The usual loop needs two; an ``obs, next_obs`` hand-off three. Beyond two,
# no more than POOL_BYTES in all (grid observations of many boards make large sets).
MAX_SETS = 4
POOL_BYTES = 512 * 2**20
# The observation slots start at this alignment inside a set (after the rows).
ALIGN = 64

_refcount = sys.getrefcount
_storage_uses = torch._C._storage_Use_Count

View: TypeAlias = tuple[int, int, torch.dtype, int]  # a returned row: (start byte, stop byte, dtype, row)


class OutputSet:
    """One step's returned tensors, as views of a single allocation: observations ``slots`` shaped
    like the env's ``(3, N, ...)`` (slot 2 the returned observation, slot 1 ``final_obs``; slot 0,
    never written, is there so the fused kernel takes the set in place of the env's own observation
    buffer) and the returned ``rows`` (bytes).

    ``tensors``: the observation, ``final_obs``, then the rows' views in the order given.
    """

    __slots__ = ("_baseline", "_cdata", "_storage", "kernel_slots", "rows", "rows_array", "slots", "slots_array",
                 "tensors")

    def __init__(self, slots_shape: tuple[int, ...], rows_bytes: int, views: tuple[View, ...], device: torch.device) -> None:
        start = -(-rows_bytes // ALIGN) * ALIGN
        base = torch.empty(start + 4 * math.prod(slots_shape), dtype=torch.uint8, device=device)
        self.rows = base[:rows_bytes]
        self.slots = base[start:].view(torch.float32).view(slots_shape)
        n = slots_shape[1]
        self.tensors = (self.slots[2], self.slots[1],
                        *(self.rows[a:b].view(dtype).view(-1, n)[row] for a, b, dtype, row in views))
        on_cpu = device.type == "cpu"
        self.rows_array = self.rows.numpy() if on_cpu else None
        self.slots_array = self.slots.numpy() if on_cpu else None
        # What the fused kernel writes into: each observation flattened, as VectorSnake passes its own.
        self.kernel_slots = self.slots_array.reshape(3, n, -1) if self.slots_array is not None else None
        self._storage = base.untyped_storage()
        self._cdata = self._storage._cdata
        self._baseline = self._counts()

    def _counts(self) -> tuple[int, int]:
        tensors = self.tensors
        return _storage_uses(self._cdata), sum(map(_refcount, tensors))

    def free(self) -> bool:
        """Whether nothing outside this set refers to its memory any more."""
        return self._counts() == self._baseline


class OutputPool:
    """Output sets for a step's results, filled from the env's observations and returned rows."""

    def __init__(self, obs_all: torch.Tensor, rows: torch.Tensor, views: tuple[View, ...]) -> None:
        """``obs_all``: the env's ``(3, N, ...)`` float32 observations (with ``copy=True`` a step
        returns slot 2, its ``final_obs`` in slot 1); ``rows``: the env's returned rows as one uint8
        tensor; ``views``: the returned rows' tensors, ``(start byte, stop byte, dtype, row)`` each."""
        self._obs_all = obs_all
        self._rows = rows
        self._views = views
        self._pooled = obs_all.device.type == "cpu"
        if self._pooled:
            self._pair_array = obs_all[1:3].numpy()
            self._rows_array = rows.numpy()
        self.max_sets = max(2, min(MAX_SETS, POOL_BYTES // (rows.numel() + 4 * obs_all.numel())))
        self.sets: list[OutputSet] = []
        self._next = 0  # where the set handed out longest ago sits

    def _new(self) -> OutputSet:
        return OutputSet(tuple(self._obs_all.shape), self._rows.numel(), self._views, self._rows.device)

    def take(self) -> OutputSet:
        """A set nothing outside the pool refers to, or a new one where none is."""
        if not self._pooled:
            return self._new()
        sets = self.sets
        count = len(sets)
        for k in range(count):  # oldest first: in the usual loop the first one tried is free
            index = (self._next + k) % count
            if sets[index].free():
                self._next = (index + 1) % count
                return sets[index]
        chosen = self._new()
        if count < self.max_sets:  # join the rotation as the newest
            sets.insert(self._next, chosen)
            self._next = (self._next + 1) % (count + 1)
        return chosen

    def fill(self, chosen: OutputSet, observations: bool) -> tuple[torch.Tensor, ...]:
        """Copy the rows (and, with ``observations``, the observation and ``final_obs``) into
        ``chosen``: its tensors."""
        if chosen.rows_array is None:
            chosen.rows.copy_(self._rows)
            if observations:
                chosen.slots[1:3].copy_(self._obs_all[1:3])
            return chosen.tensors
        np.copyto(chosen.rows_array, self._rows_array)
        if observations:
            np.copyto(chosen.slots_array[1:3], self._pair_array)  # type: ignore[index]
        return chosen.tensors
