"""What every benchmark script shares: the machine description, medians with spread, a timing loop.

Scripts run as ``python scripts/NAME.py``, so this directory is on ``sys.path`` and they import
this module by name.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from rlperf.device import synchronize
from rlperf.system import cpu_model


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(device: torch.device | None = None) -> dict:
    """CPU model, cores, GPU name, versions and date: what a reader needs to trust a figure."""
    gpu = None
    if device is not None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("rlperf", "gymnasium", "numpy", "stable-baselines3", "torchrl", "tensordict"):
        version = package_version(name)
        if version:
            versions[name] = version
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "device": str(device) if device is not None else "cpu",
        "gpu": gpu,
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d"),
    }


def summarize(values: Iterable[float]) -> dict[str, float]:
    """Median, min, max and the repeat count of a list of figures."""
    xs = list(values)
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "repeats": len(xs)}


def spread(summary: dict[str, float]) -> str:
    """Half the range relative to the median, as ``±12%``."""
    if not summary["median"]:
        return "±0%"
    return f"±{(summary['max'] - summary['min']) / summary['median'] / 2:.0%}"


def measure(fn: Callable[[], object], device: torch.device, repeats: int, min_time: float) -> list[float]:
    """Seconds per call of ``fn``, one figure per repeat.

    One warm-up call, then the loop length is calibrated so that each repeat takes about
    ``min_time`` seconds; on CUDA the device is synchronized at the edges of every repeat so queued
    work is counted.
    """
    fn()  # warm-up: first-call allocations, lazy CUDA init
    synchronize(device)
    iters, elapsed = 1, 0.0
    while True:
        started = time.perf_counter()
        for _ in range(iters):
            fn()
        synchronize(device)
        elapsed = time.perf_counter() - started
        if elapsed >= min_time / 4 or iters >= 1 << 20:
            break
        iters *= 4
    iters = max(1, round(iters * min_time / max(elapsed, 1e-9)))
    per_call = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        for _ in range(iters):
            fn()
        synchronize(device)
        per_call.append((time.perf_counter() - started) / iters)
    return per_call


def emit(results: dict, out: Path | None, as_json: bool) -> bool:
    """Write ``results`` to ``--out`` if given and print them for ``--json``; True when printed."""
    if out:
        out.write_text(json.dumps(results, indent=2))
    if as_json:
        print(json.dumps(results, indent=2))
    return as_json


def figure(ncols: int = 1, figsize: tuple[float, float] = (7, 4.5)):
    """A matplotlib figure on the file-only Agg backend: ``(plt, fig, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    return plt, fig, axes


def save_figure(plt, fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_line(machine: dict, threads: int | str | None = None) -> str:
    """``AMD EPYC, 2 cores[, GPU] | torch 2.13.0+cpu (2 threads)[, SB3 …] | 2026-11-23`` for titles."""
    versions = machine["versions"]
    hardware = f"{machine['cpu']}, {machine['cores']} cores" + (f", {machine['gpu']}" if machine.get("gpu") else "")
    peers = "".join(f", {label} {versions[name]}" for name, label in (("stable-baselines3", "SB3"), ("torchrl", "TorchRL"))
                    if name in versions)
    threads = machine["torch_threads"] if threads is None else threads
    return f"{hardware} | torch {versions['torch']} ({threads} threads){peers} | {machine['date']}"


def print_header(header: str) -> None:
    """A table's header line and its rule."""
    print(header)
    print("-" * len(header))
