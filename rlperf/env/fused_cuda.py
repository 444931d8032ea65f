"""The ``fused`` Snake kernel on CUDA: the same per-board source as :mod:`rlperf.env.fused`, one
thread per board, launched on PyTorch's current stream.

The board functions in ``fused.BOARD_FUNCTIONS`` are plain scalar code (no allocation, no Python
objects); numba keeps each one's Python source as ``py_func``. This module makes a copy of each
whose globals name the CUDA copies of the others, and compiles them as CUDA device functions: a
rule changed in ``fused.py`` changes both builds, and ``tests/test_fused_cuda.py`` checks the two
against each other (and against the ``ops`` kernel) given the same draws. The CPU driver's chunks
become threads: board ``i`` is thread ``i`` and owns scratch row ``i`` (allocated only with the
flood fill on).

Invalid actions. The CPU driver checks every action before it changes anything, which needs the
actions on the host; here that would be a device sync per step. As on the ``ops`` kernel's dense
path, an action outside {0, 1, 2} is clamped, the step runs, and a device flag records it, raised
at the next point that reads the device (``VectorSnake._raise_deferred``).

No disk cache: numba-cuda's cache index would share names with the CPU build's in ``__pycache__``.
The compile (a few seconds) happens once per process, when the env is built, and is reported apart
from the step's time.
"""

from __future__ import annotations

import contextlib
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from rlperf.env import fused

THREADS_PER_BLOCK = 128

_built: dict[str, Any] = {}


def _cuda() -> Any:
    from numba import cuda  # imported only when a CUDA env asks for the fused kernel

    return cuda


def _step_kernel(actions, draws, injected, key, counter, reset_all, out, occ, ring, state, floats, flags, obs, table,
                 scratch, size, initial_length, hunger, grid, flood, bad):
    """Board ``i`` is thread ``i`` (compiled by ``_build`` with ``cuda`` and the CUDA ``step_board``
    as its globals)."""
    i = cuda.grid(1)  # type: ignore[name-defined]  # noqa: F821
    if i >= state.shape[1]:
        return
    action = 0
    if not reset_all:
        action = actions[i]
        if action < 0 or action > 2:
            bad[0] = True
            action = 0 if action < 0 else 2
    step_board(i, action, reset_all, draws, injected, key, counter, out, occ, ring, state, floats, flags, obs,  # type: ignore[name-defined]  # noqa: F821
               table, scratch, i if flood else 0, size, initial_length, hunger, grid, flood)


def _build() -> Any:
    """The CUDA kernel, compiled lazily at its first launch (built once per process)."""
    if "kernel" in _built:
        return _built["kernel"]
    cuda = _cuda()
    # The grid follows num_envs (a thread per board): numba's low-occupancy warning at a few hundred
    # boards says nothing a user can act on.
    warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU under-utilization")
    scope = dict(vars(fused))  # the constants the board functions read, by the same names
    for name in fused.BOARD_FUNCTIONS:
        source = getattr(fused, name).py_func
        copy = types.FunctionType(source.__code__, scope, name, source.__defaults__, source.__closure__)
        scope[name] = cuda.jit(device=True)(copy)
    scope["cuda"] = cuda
    kernel = types.FunctionType(_step_kernel.__code__, scope, "step_kernel")
    _built["kernel"] = cuda.jit(kernel)
    return _built["kernel"]


def available() -> str | None:
    """None if the kernel can run on CUDA here, else why not (one line)."""
    why = fused.available()
    if why is not None:
        return why
    try:
        cuda = _cuda()
    except Exception as exc:
        return f"numba's CUDA target cannot be imported ({type(exc).__name__}: {exc})"
    if not cuda.is_available():
        return "numba's CUDA target finds no usable GPU (pip install numba-cuda matching the CUDA driver)"
    return None


def _view(tensor: torch.Tensor) -> Any:
    """A zero-copy numba view of a CUDA tensor, without numba synchronizing the tensor's stream."""
    cuda = _cuda()
    try:
        return cuda.as_cuda_array(tensor, sync=False)
    except TypeError:  # an older numba without the argument
        return cuda.as_cuda_array(tensor)


class Launcher:
    """One env's bound launch: numba views of its state made once, the stream taken per call."""

    def __init__(self, occ: torch.Tensor, ring: torch.Tensor, state: torch.Tensor, floats: torch.Tensor,
                 flags: torch.Tensor, obs_all: torch.Tensor, draws: torch.Tensor, actions: torch.Tensor,
                 bad: torch.Tensor, size: int, initial_length: int, hunger: int, grid: bool, flood: bool) -> None:
        n = state.shape[1]
        device = state.device
        self.kernel = _build()
        self.blocks = (n + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
        self.num_envs = n
        cuda = _cuda()
        # Per-board scratch, only where the flood fill runs (one row of masks per board and fill);
        # numba's own arrays, since torch has no uint64 array interface. Each fill writes its masks
        # before it reads them, so they start uninitialised.
        with cuda.gpus[device.index if device.index is not None else torch.cuda.current_device()]:
            scratch = cuda.device_array((n if flood else 1, fused.SCRATCH_SETS, size), dtype=fused.np.uint64)
            table = cuda.to_device(fused.cell_table(size))
        self.state = tuple(_view(t) for t in (occ, ring, state, floats, flags))
        self.obs = _view(obs_all.view(3, n, -1))
        self.draws = _view(draws)
        self.actions = _view(actions)
        self.bad = _view(bad.view(1))
        self.rest = (table, scratch, size, initial_length, hunger, grid, flood)
        self._streams: dict[int, Any] = {}

    def _stream(self) -> Any:
        handle = torch.cuda.current_stream().cuda_stream
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = _cuda().external_stream(handle)
        return stream

    def __call__(self, injected: bool, key: Any, counter: int, reset_all: bool, out_slot: int,
                 obs: torch.Tensor | None = None) -> None:
        """Step every board (or start a new episode on each), reading the bound actions and draws.

        ``obs``: a new ``(2, N, ...)`` tensor to write the observation and ``final_obs`` into
        (copy=True), in place of the env's own buffers.
        """
        target = self.obs if obs is None else _view(obs.view(2, self.num_envs, -1))
        self.kernel[self.blocks, THREADS_PER_BLOCK, self._stream()](
            self.actions, self.draws, injected, key, counter, reset_all, out_slot, *self.state, target, *self.rest,
            self.bad)


@contextlib.contextmanager
def _numpy_row_stack() -> Iterator[None]:
    """numba-cuda (0.30 and earlier) types ``np.row_stack`` when its CUDA target first loads, and
    NumPy 2.4+ removed that name: lend it NumPy's own ``vstack`` (what it was an alias of) for the
    first compile only."""
    lent = not hasattr(fused.np, "row_stack")
    if lent:
        setattr(fused.np, "row_stack", fused.np.vstack)  # noqa: B010 (a name this NumPy's stubs may lack)
    try:
        yield
    finally:
        if lent:
            delattr(fused.np, "row_stack")


def compile_kernel(device: torch.device) -> tuple[float, str | None]:
    """Build and run the kernel once on a tiny board of ``device``: (seconds, None) or (seconds, why
    not in one line). Once per process."""
    if "result" in _built:
        return _built["result"]
    why = available()
    if why is not None:
        _built["result"] = (0.0, why)
        return _built["result"]
    started = time.perf_counter()
    try:
        with torch.cuda.device(device), _numpy_row_stack(), fused.compile_notice("the CUDA env step kernel"):
            size, n = 4, 1
            i64: dict[str, Any] = {"dtype": torch.int64, "device": device}
            launch = Launcher(torch.zeros((n, size * size + 1), dtype=torch.bool, device=device),
                              torch.zeros((n, size * size), **i64), torch.zeros((fused.STATE_ROWS, n), **i64),
                              torch.zeros((fused.FLOAT_ROWS, n), dtype=torch.float32, device=device),
                              torch.zeros((fused.FLAG_ROWS, n), dtype=torch.bool, device=device),
                              torch.zeros((3, n, fused.N_FEATURES + 3), dtype=torch.float32, device=device),
                              torch.zeros((fused.DRAW_ROWS, n), dtype=torch.float64, device=device),
                              torch.zeros(n, **i64), torch.zeros((), dtype=torch.bool, device=device),
                              size, 1, 10, False, True)
            for reset_all in (True, False):
                launch(False, fused.np.uint64(0), 0, reset_all, 0)
            torch.cuda.synchronize(device)
        result: tuple[float, str | None] = (time.perf_counter() - started, None)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        result = (time.perf_counter() - started,
                  f"numba failed to compile the CUDA kernel ({type(exc).__name__}: {first[:200]})")
    _built["result"] = result
    return result
