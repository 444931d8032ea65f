"""Devices: resolving ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``, waiting for one, and its memory
(what is free, whether an error means it ran out, and refusing what will not fit)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from rlperf.errors import DeviceError, RlperfError


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn a user's device string into a ``torch.device`` that exists on this machine."""
    if isinstance(device, torch.device):
        device = str(device)
    name = device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"unknown device {device!r}", hint="use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {device!r} asked for, but CUDA is not available here", hint="use --device cpu")
        index = 0 if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise DeviceError(
                f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist",
                hint="use cuda:0",
            )
        return torch.device("cuda", index)
    raise DeviceError(f"device type {dev.type!r} is not supported", hint="use auto, cpu, cuda or cuda:N")


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- memory --------------------------------------------------------------------------------------

MEMORY_HEADROOM = 0.10
"""Share of a device's free memory kept for everything an estimate does not count (the allocator's
slack, temporaries, other processes). Every memory check in rlperf uses this one figure."""

# torch.OutOfMemoryError (CPU and CUDA) is new in torch 2.5; older versions only have the CUDA one.
_TORCH_OOM: tuple[type[BaseException], ...] = tuple(
    {getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError})


class MemoryRefused(RlperfError, MemoryError):
    """Something asked for more memory than its device has free; nothing was allocated."""


def available_memory(device: torch.device) -> int:
    """Bytes free for a new allocation on ``device``: host RAM, or the CUDA device's free memory
    plus what PyTorch's caching allocator holds but does not use (it hands that out first)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + max(cached, 0))
    import psutil

    return int(psutil.virtual_memory().available)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is an allocation that failed for lack of memory: Python's MemoryError,
    torch's OutOfMemoryError, or the RuntimeError older torch versions, cuBLAS and cuDNN raise."""
    if isinstance(exc, (MemoryError, *_TORCH_OOM)):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(s in text for s in ("can't allocate memory", "out of memory", "cublas_status_alloc_failed",
                                   "cudnn_status_alloc_failed", "cudnn_status_not_enough_memory"))


def check_fits(what: str, parts: Mapping[str, tuple[int, str]], device: torch.device,
               hints: Mapping[str, str | Callable[[int], str]]) -> None:
    """Refuse, before allocating, ``what`` whose parts together do not fit in ``device``'s free memory.

    ``parts`` maps a name to (bytes, the config key that sizes it). The message names every part
    with its size; the hint is the largest part's, from ``hints``: a string, or a function of the
    bytes that part could have (to say "lower buffer.capacity to at most N").
    """
    needed = sum(nbytes for nbytes, _key in parts.values())
    free = available_memory(device)
    usable = int(free * (1 - MEMORY_HEADROOM))
    if needed <= usable:
        return
    from rlperf.report.units import nbytes as fmt

    names = sorted(parts, key=lambda n: -parts[n][0])
    detail = ", ".join(f"{n} {fmt(parts[n][0])} ({parts[n][1]})" for n in names)
    place = "host memory" if device.type == "cpu" else f"memory on {device}"
    hint = hints.get(names[0])
    if callable(hint):
        hint = hint(max(0, usable - (needed - parts[names[0]][0])))
    raise MemoryRefused(f"{what} needs about {fmt(needed)} of {place} but only {fmt(free)} is free: {detail}",
                        hint=hint)
