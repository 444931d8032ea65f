"""Memory a run needs: an estimate by part, one check before anything is allocated, and
one-line messages for the allocations that fail anyway.

The estimate is rough but on the safe side; it is checked against the free memory of each device
that would hold a part (the replay of the host storages lives on the host), with the headroom
every rlperf memory check keeps (:data:`rlperf.device.MEMORY_HEADROOM`). An allocation that the
estimate let through but the allocator refuses becomes a one-line error naming the key that sized it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from rlperf.buffer import ReplayBuffer
from rlperf.config import Config
from rlperf.device import check_fits, is_out_of_memory
from rlperf.errors import RlperfError

HINTS = {"replay": "lower buffer.capacity", "model": "use narrower agent.hidden",
         "env": "lower env.num_envs", "batch": "lower buffer.batch_size"}


def estimate_memory(cfg: Config, obs_shape: tuple[int, ...]) -> dict[str, tuple[int, str]]:
    """Bytes the run's large allocations take, by part, with the key that sizes each.

    The env's state and step temporaries, the networks with their gradients and Adam moments, one
    update's batch and activations, the replay buffer.
    """
    e, a, b = cfg.env, cfg.agent, cfg.buffer
    obs_numel = int(np.prod(obs_shape))
    cells = e.size * e.size
    per_board = (cells + 1) + 8 * cells + 12 * 8 + 3 * 4 * obs_numel  # occupancy, body ring, scalars, obs
    if e.flood_fill == "tensor":
        per_board += 3 * 8 * cells
    widths = list(a.hidden)
    if len(obs_shape) == 3:
        widths = [32 * cells, 64 * cells, 64 * cells, *widths]
    params, width = 0, (obs_numel if len(obs_shape) == 1 else 64 * cells)
    if len(obs_shape) == 3:
        params += obs_shape[0] * 32 * 9 + 32 * 64 * 9
    for size in [*a.hidden, 3]:
        params += width * size + size
        width = size
    activations = 4 * sum(widths)
    return {
        "replay": (ReplayBuffer.estimate_nbytes(b.capacity, obs_shape, storage=b.storage), f"buffer.capacity={b.capacity}"),
        "model": (5 * 4 * params, f"agent.hidden={list(a.hidden)}"),  # q, grads, Adam m and v, target
        "env": (2 * e.num_envs * (per_board + activations), f"env.num_envs={e.num_envs}"),
        "batch": (b.batch_size * (2 * 4 * obs_numel + 6 * activations), f"buffer.batch_size={b.batch_size}"),
    }


def check_run_memory(cfg: Config, obs_shape: tuple[int, ...], device: torch.device) -> None:
    """Refuse, before allocating anything, a run whose parts do not fit in the free memory."""
    parts = estimate_memory(cfg, obs_shape)
    on_host = cfg.buffer.storage != "tensor"
    places: dict[torch.device, dict[str, tuple[int, str]]] = {}
    for name, part in parts.items():
        where = torch.device("cpu") if name == "replay" and on_host else device
        places.setdefault(where, {})[name] = part
    per_slot = ReplayBuffer.estimate_nbytes(1, obs_shape, storage=cfg.buffer.storage)
    hints: dict[str, object] = {**HINTS, "replay": lambda room: f"lower buffer.capacity to at most {room // per_slot}"}
    for where, named in places.items():
        check_fits("this run", named, where, hints)  # type: ignore[arg-type]


@contextlib.contextmanager
def refusing_oom(what: str, key: str, hint: str) -> Iterator[None]:
    """An allocation the estimate let through but the allocator refused: one line, not a traceback."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise RlperfError(f"out of memory allocating {what} ({key}): {str(exc).strip().splitlines()[0]}",
                          hint=hint) from None


def oom_message(exc: BaseException, device: torch.device, checkpoint_env_steps: int | None) -> str:
    """The record's error for a run that ran out of memory while it ran."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    where = f"CUDA memory on {device}" if device.type == "cuda" and not isinstance(exc, MemoryError) else "memory"
    kept = f"; checkpoint.pt is from env step {checkpoint_env_steps}" if checkpoint_env_steps is not None else ""
    return (f"out of {where} during the run: {first}{kept} (lower buffer.batch_size or env.num_envs, "
            f"or keep the replay on the host with buffer.storage=numpy)")
