"""Device resolution: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``."""

from __future__ import annotations

import torch

from rlperf.errors import DeviceError


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
