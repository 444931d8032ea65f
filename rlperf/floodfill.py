"""Flood fill: how many free cells a snake can still reach from a cell.

Two implementations of one contract, selected by the ``env.flood_fill`` knob:

- ``bfs``: the seed's slow form (seed 001 §3) — a Python ``deque`` BFS per board on the CPU.
  Kept as the reference that the fast form is tested against.
- ``tensor``: batched on the boards' device.

Contract of both ``reachable_bfs`` and ``reachable_tensor``: ``blocked`` is a bool tensor
``(M, S, S)``, ``start`` an int64 tensor ``(M,)`` of linear cell indices ``row * S + col``.
The result is an int64 tensor ``(M,)`` on ``blocked``'s device: the number of unblocked cells
4-connected to ``start`` (``start`` included), or 0 where ``start`` itself is blocked.
"""

from __future__ import annotations

from collections import deque

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
    """The slow reference: one Python BFS per board, on host copies (seed 001 §3)."""
    blocked_np = blocked.cpu().numpy()
    start_np = start.cpu().numpy()
    counts = [bfs_count(blocked_np[i], int(start_np[i])) for i in range(blocked_np.shape[0])]
    return torch.tensor(counts, dtype=torch.int64, device=blocked.device)
