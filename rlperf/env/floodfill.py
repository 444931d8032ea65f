"""Flood fill: how many free cells a snake can still reach from a cell.

Two implementations of one contract, selected by the ``env.flood_fill`` knob:

- ``bfs``: the slow form (docs/bottlenecks.md §4) — a Python ``deque`` BFS per board on the CPU.
  Kept as the reference that the fast form is tested against.
- ``tensor``: batched on the boards' device, no Python loop over boards: row bitmasks filled a
  whole row run or column run at a time (S <= 62), a bool-plane dilation beyond. On the CPU it
  stops when a round changes nothing; elsewhere it runs a proven bound of rounds, so it never
  waits on the device (details above ``reachable_tensor``).

Contract of both ``reachable_bfs`` and ``reachable_tensor``: ``blocked`` is a bool tensor
``(M, S, S)``, ``start`` an int64 tensor ``(M,)`` of linear cell indices ``row * S + col``.
The result is an int64 tensor ``(M,)`` on ``blocked``'s device: the number of unblocked cells
4-connected to ``start`` (``start`` included), or 0 where ``start`` itself is blocked.
"""

from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import Any

import numpy as np
import torch


def bfs_count(blocked: np.ndarray, start: int) -> int:
    """Cells reachable from ``start`` on one ``(S, S)`` board, by breadth-first search."""
    size = blocked.shape[0]
    if blocked.flat[start]:
        return 0
    seen = np.zeros(size * size, dtype=bool)
    seen[start] = True
    queue = deque([start])
    count = 0
    while queue:
        cell = queue.popleft()
        count += 1
        row, col = divmod(cell, size)
        for r, c in ((row - 1, col), (row + 1, col), (row, col - 1), (row, col + 1)):
            if 0 <= r < size and 0 <= c < size:
                nxt = r * size + c
                if not seen[nxt] and not blocked[r, c]:
                    seen[nxt] = True
                    queue.append(nxt)
    return count


def reachable_bfs(blocked: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """The slow reference: one Python BFS per board, on host copies (docs/bottlenecks.md §4)."""
    blocked_np = blocked.cpu().numpy()
    start_np = start.cpu().numpy()
    counts = [bfs_count(blocked_np[i], int(start_np[i])) for i in range(blocked_np.shape[0])]
    return torch.tensor(counts, dtype=torch.int64, device=blocked.device)


# --------------------------------------------------------------------------------------------
# The fast form.
#
# Boards with S <= 62 are packed into row bitmasks, one integer per row, stored row-major as
# (S, M) so that "the row above" is a contiguous slice. One round of the fill is
#   1. a horizontal fill: every row run (maximal stretch of free cells) that holds a reached
#      cell becomes reached, in one shot: the carry of ``reached + free`` runs up to the end
#      of the run, and a log2(S)-step doubling fill runs down to its start;
#   2. a vertical fill: the same doubling fill along columns, up and down the rows.
# So the number of rounds is the number of turns on the way, not the path length. Larger
# boards fall back to a plain masked dilation of bool planes, one cell per iteration.
# --------------------------------------------------------------------------------------------

PACKED_MAX_SIZE = 62
"""Largest board side that ``reachable_tensor`` bit-packs (S + 1 bits must fit in an int64)."""

# Packing reads M*S*S bools once. For big batches the bitstream packer (8 cells per int64
# multiply, little memory traffic) wins; for small ones its ~50 ops cost more than the
# plain weighted sum's 3.
_BITSTREAM_MIN_CELLS = 1 << 20
# Up to this many rows (S * M) the rounds run on numpy views of the CPU tensors: numpy's cost
# per call is about a third of torch's eager dispatch, and that is most of the cost of a small
# batch (M=768, S=10: 0.6 ms instead of 1.1). Past it, torch's intra-op threads can help.
_NUMPY_MAX_ROWS = 1 << 16
_BYTE_GATHER = 0x0102040810204080  # (8 bytes of 0/1) * this >> 56 == the 8 bits, byte i -> bit i


def reachable_tensor(blocked: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """The fast form: cells reachable from ``start`` on every board at once, on the boards' device.

    Same contract as :func:`reachable_bfs` (see the module docstring); ``start`` must lie in
    ``[0, S*S)`` (not checked: checking values would synchronize with a CUDA device).
    No Python loop over boards. On the CPU the fill stops as soon as a round changes nothing;
    on any other device it runs a fixed number of rounds that provably suffices
    (:func:`packed_rounds_bound`, 49 for S=10), because asking "did anything change?" would make
    the host wait for the device every round.
    """
    _check_inputs(blocked, start)
    # The device decision: an early exit costs a host sync on CUDA (and any other async
    # device), and nothing on the CPU.
    early_exit = blocked.device.type == "cpu"
    if blocked.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=blocked.device)
    if blocked.shape[1] <= PACKED_MAX_SIZE:
        return _reachable_packed(blocked, start, early_exit)
    return _reachable_dilated(blocked, start, early_exit)


def _check_inputs(blocked: torch.Tensor, start: torch.Tensor) -> None:
    """Shape and dtype checks (free: no values are read)."""
    if blocked.dtype != torch.bool or blocked.dim() != 3 or blocked.shape[1] != blocked.shape[2]:
        raise ValueError(f"blocked must be a bool tensor (M, S, S), got {blocked.dtype} {tuple(blocked.shape)}")
    if start.dtype != torch.int64 or start.shape != blocked.shape[:1]:
        raise ValueError(f"start must be an int64 tensor (M,) = {tuple(blocked.shape[:1])}, "
                         f"got {start.dtype} {tuple(start.shape)}")
    if start.device != blocked.device:
        raise ValueError(f"start is on {start.device} but blocked is on {blocked.device}")


def packed_rounds_bound(size: int) -> int:
    """Rounds after the first horizontal fill that always suffice on an ``size`` x ``size`` board.

    After each horizontal fill the reached set is a union of whole row runs. A round that
    changes anything adds at least one new row run, a round that changes nothing is a fixed
    point, and a board has at most ``size * ceil(size / 2)`` row runs, the start's among them.
    """
    return size * ((size + 1) // 2) - 1


def _row_dtype(size: int) -> torch.dtype:
    """Smallest integer type in which ``free + reached`` (S + 1 bits) cannot overflow."""
    if size <= 14:
        return torch.int16
    if size <= 30:
        return torch.int32
    return torch.int64


def _reachable_packed(blocked: torch.Tensor, start: torch.Tensor, early_exit: bool,
                      use_numpy: bool | None = None) -> torch.Tensor:
    """Row-bitmask flood fill for ``S <= PACKED_MAX_SIZE`` (see the comment above).

    ``use_numpy`` picks the array library for the rounds (default: see ``_NUMPY_MAX_ROWS``);
    it must be false off the CPU.
    """
    m, size, _ = blocked.shape
    device = blocked.device
    dtype = _row_dtype(size)
    free = _pack_free_rows(blocked, dtype)  # (S, M)
    reached = torch.zeros(size, m, dtype=dtype, device=device)
    cell = torch.arange(m, device=device) + (start // size) * m
    reached.view(-1).index_put_((cell,), torch.ones((), dtype=dtype, device=device) << (start % size).to(dtype))
    reached &= free
    if use_numpy is None:
        use_numpy = device.type == "cpu" and size * m <= _NUMPY_MAX_ROWS
    # numpy views of the same memory where numpy is faster (small boards on the CPU).
    free_x: Any = free.numpy() if use_numpy else free
    reached_x: Any = reached.numpy() if use_numpy else reached
    fill = _RowFill(free_x, np if use_numpy else torch)

    fill.rows(reached_x)
    before = fill.xp.empty_like(reached_x)
    for _ in range(packed_rounds_bound(size)):
        if early_exit:
            before[...] = reached_x
        fill.columns(reached_x)
        if early_exit and fill.equal(reached_x, before):
            break
        fill.rows(reached_x)
    counts = fill.count(reached_x)
    return torch.from_numpy(counts) if use_numpy else counts


class _RowFill:
    """The two halves of a round on (S, M) row bitmasks, torch tensors or numpy arrays alike.

    ``xp`` is the module (``torch`` or ``numpy``): both spell these ops ``xp.op(a, b, out=c)``,
    all but the right shift. Every op writes into a buffer allocated here: fresh multi-MB
    tensors cost page faults, which show at M = 3 * 65536.
    """

    def __init__(self, free: Any, xp: ModuleType) -> None:
        """Precompute the doubling masks of ``free``: ``left[j]`` has bit c set when cells
        c .. c + 2^j - 1 of the row are free, ``down[j]`` row r when rows r - 2^j + 1 .. r are
        free in that column. Moving up needs rows r .. r + 2^j - 1: ``down[j]``, 2^j - 1 rows on."""
        self.xp, self.free = xp, free
        self.equal = torch.equal if xp is torch else np.array_equal
        self.shift_right = torch.bitwise_right_shift if xp is torch else np.right_shift  # numpy < 2 spelling
        size = free.shape[0]
        self.left: list[tuple[int, Any]] = []
        self.vertical: list[tuple[int, Any, Any]] = []
        left, down, step = free, free, 1
        while step < size:
            self.left.append((step, left))
            self.vertical.append((step, down[step:], down[step - 1:size - 1]))
            next_left, next_down = xp.empty_like(free), xp.empty_like(free)
            self.shift_right(left, step, out=next_left)
            xp.bitwise_and(next_left, left, out=next_left)
            next_down[:step] = down[:step]  # rows the next step never reads; kept defined
            xp.bitwise_and(down[step:], down[:-step], out=next_down[step:])
            left, down, step = next_left, next_down, step * 2
        self.scratch = xp.empty_like(free)
        self.carry = xp.empty_like(free)

    def rows(self, reached_x: Any) -> None:
        """Horizontal fill, in place: every row run holding a reached_x cell becomes reached_x."""
        xp, free, carry, scratch = self.xp, self.free, self.carry, self.scratch
        # Up the bits: adding ``free`` to a reached_x bit carries through the rest of its run.
        xp.add(reached_x, free, out=carry)
        xp.bitwise_xor(carry, free, out=carry)
        xp.bitwise_or(carry, reached_x, out=carry)
        xp.bitwise_and(carry, free, out=carry)
        # Down the bits: doubling, free cells c .. c + 2^j - 1 let bit c + 2^j reach bit c.
        for shift, ok in self.left:
            self.shift_right(reached_x, shift, out=scratch)
            xp.bitwise_and(scratch, ok, out=scratch)
            xp.bitwise_or(reached_x, scratch, out=reached_x)
        xp.bitwise_or(reached_x, carry, out=reached_x)

    def columns(self, reached_x: Any) -> None:
        """Vertical fill, in place: every column run holding a reached_x cell becomes reached_x."""
        xp, scratch = self.xp, self.scratch
        for shift, ok_down, ok_up in self.vertical:
            xp.bitwise_and(reached_x[:-shift], ok_down, out=scratch[shift:])
            xp.bitwise_or(reached_x[shift:], scratch[shift:], out=reached_x[shift:])
            xp.bitwise_and(reached_x[shift:], ok_up, out=scratch[:-shift])
            xp.bitwise_or(reached_x[:-shift], scratch[:-shift], out=reached_x[:-shift])

    def count(self, reached_x: Any) -> Any:
        """Set bits per board (column) of ``reached_x``, as int64 (M,); uses the scratch buffers.

        SWAR popcount: bit pairs, then nibbles, then bytes count their own bits; the bytes are
        folded before the rows are summed (S <= 62 rows of up to 8 would overflow a byte). At
        most 127 per row and S*S in all fit the row type, so the sum stays in it (much faster).
        """
        xp, x, t = self.xp, self.carry, self.scratch
        nbytes = reached_x.dtype.itemsize
        fives, threes, nibbles = (int(pattern * nbytes, 16) for pattern in ("55", "33", "0f"))
        self.shift_right(reached_x, 1, out=t)
        xp.bitwise_and(t, fives, out=t)
        xp.subtract(reached_x, t, out=x)
        self.shift_right(x, 2, out=t)
        xp.bitwise_and(t, threes, out=t)
        xp.bitwise_and(x, threes, out=x)
        xp.add(x, t, out=x)
        self.shift_right(x, 4, out=t)
        xp.add(x, t, out=x)
        xp.bitwise_and(x, nibbles, out=x)
        shift = 8
        while shift < 8 * nbytes:
            self.shift_right(x, shift, out=t)
            xp.add(x, t, out=x)
            shift *= 2
        xp.bitwise_and(x, 0x7F, out=x)
        total = x.sum(0, dtype=x.dtype)
        return total.long() if xp is torch else total.astype(np.int64)


def _pack_free_rows(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Free-cell row bitmasks, shape (S, M): bit c of ``[r, i]`` is ``not blocked[i, r, c]``."""
    m, size, _ = blocked.shape
    if blocked.numel() >= _BITSTREAM_MIN_CELLS:
        rows = _pack_rows_bitstream(blocked, dtype)
    else:
        rows = _pack_rows_weighted(blocked, dtype)
    free = torch.empty(size, m, dtype=dtype, device=blocked.device)
    return torch.bitwise_xor(rows.t(), (1 << size) - 1, out=free)


def _pack_rows_weighted(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Blocked-cell row bitmasks (M, S) as a weighted sum: few ops, M*S*S-sized temporaries."""
    size = blocked.shape[1]
    weights = torch.bitwise_left_shift(torch.ones((), dtype=dtype, device=blocked.device),
                                       torch.arange(size, dtype=dtype, device=blocked.device))
    return (blocked.view(torch.uint8).to(dtype) * weights).sum(-1, dtype=dtype)


def _pack_rows_bitstream(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Blocked-cell row bitmasks (M, S), via the board bytes packed 8 cells per multiply.

    Every 8 consecutive rows of S cells are S bytes of the packed stream, and row j of such a
    group starts at the fixed bit ``j * S``: 8 sliced reads, no gather.
    """
    m, size, _ = blocked.shape
    device = blocked.device
    cells = blocked.numel()
    flat = blocked.reshape(-1)
    if flat.storage_offset() % 8:  # an int64 view needs 8-byte alignment
        flat = flat.clone()
    data = flat.view(torch.uint8)
    words = cells // 8
    groups = (m * size + 7) // 8
    stream = torch.zeros(groups * size, dtype=torch.uint8, device=device)
    packed = torch.mul(data[: words * 8].view(torch.int64), _BYTE_GATHER)
    stream[:words] = packed.bitwise_right_shift_(56)
    if cells % 8:
        tail = torch.zeros(8, dtype=torch.uint8, device=device)
        tail[: cells % 8] = data[words * 8:]
        stream[words:words + 1] = (tail.view(torch.int64) * _BYTE_GATHER) >> 56
    grouped = stream.view(groups, size)
    # Row j needs bits up to j*S % 8 + S - 1 of its bytes: int32 holds that while S <= 24.
    wide = torch.int32 if size <= 24 else torch.int64
    rows = torch.empty(groups, 8, dtype=dtype, device=device)
    for j in range(8):
        byte, shift = divmod(j * size, 8)
        row = grouped[:, byte].to(wide) >> shift
        k = 1
        while 8 * k - shift < size:
            row |= grouped[:, byte + k].to(wide) << (8 * k - shift)
            k += 1
        rows[:, j] = row & ((1 << size) - 1)
    return rows.view(-1)[: m * size].view(m, size)


def dilation_rounds_bound(size: int) -> int:
    """Dilations that always suffice for the bool fallback: a shortest path visits each cell once."""
    return size * size - 1


def _reachable_dilated(blocked: torch.Tensor, start: torch.Tensor, early_exit: bool) -> torch.Tensor:
    """Plain flood fill by masked 4-neighbour dilation of bool planes (any S, one cell a round)."""
    m, size, _ = blocked.shape
    free = ~blocked
    reached = torch.zeros_like(free).view(m, -1)
    reached.scatter_(1, start.unsqueeze(1), True)
    reached = reached.view(m, size, size) & free
    grown = torch.empty_like(reached)
    for _ in range(dilation_rounds_bound(size)):
        grown.copy_(reached)
        grown[:, 1:] |= reached[:, :-1]
        grown[:, :-1] |= reached[:, 1:]
        grown[:, :, 1:] |= reached[:, :, :-1]
        grown[:, :, :-1] |= reached[:, :, 1:]
        grown &= free
        if early_exit and torch.equal(grown, reached):
            break
        reached, grown = grown, reached
    return reached.sum((1, 2))
