"""``train.update=graph``: the whole DQN update, and greedy action selection, replayed as CUDA graphs.

A small MLP's update on a GPU is launch-bound: forward, loss, backward, clipping, Adam and the soft
target update are ~100 kernels of a few microseconds each, and the CPU's launch of each costs more
than the GPU's run of it (docs/bottlenecks.md §11). Captured once as a CUDA graph, the same kernels
go to the GPU in one launch. The captured body is the eager update (:meth:`rlperf.dqn.Agent.
_update_torch`'s single-micro-batch form), so the two agree to floating-point rounding, which
``tests/test_graph_update.py`` checks on CUDA.

What capture asks of the code around it: fixed shapes and addresses (the sampled batch is copied
into static tensors, the loss comes back in the same tensor every call: read it before the next
update), Adam with ``capturable=True`` (its step count lives on the device), gradients allocated by
the captured backward itself (set to None before capture, overwritten by each replay), and no host
sync inside (the eager update has none). The first call runs eagerly on a side stream (PyTorch's
warm-up rule for capture), the second captures and replays; a resume that replaces the optimizer's
state drops the graph, and the next call captures again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class GraphStep:
    """``body(*inputs)`` (fixed shapes, no host sync) captured once and replayed.

    ``prepare`` runs before the eager warm-up and before capture (e.g. setting gradients to None).
    The outputs are the same tensors on every replay.
    """

    def __init__(self, body: Callable[..., torch.Tensor], prepare: Callable[[], None] | None = None,
                 warmup: int = 1) -> None:
        self.body = body
        self.prepare = prepare or (lambda: None)
        self.warmup = warmup
        self.calls = 0
        self.captures = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self._inputs: list[torch.Tensor] = []
        self._out: torch.Tensor | None = None
        self.shape: torch.Size | None = None  # the first input's shape, as captured

    def reset(self) -> None:
        """Drop the graph (the tensors it captured were replaced); the next call captures again."""
        self.graph, self._inputs, self._out, self.calls, self.shape = None, [], None, 0, None

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.graph is not None and self._out is not None:
            for static, x in zip(self._inputs, inputs, strict=True):
                static.copy_(x)
            self.graph.replay()
            return self._out
        self.calls += 1
        if self.calls <= self.warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.prepare()
                out = self.body(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            return out
        self._inputs = [x.clone() for x in inputs]
        self.shape = inputs[0].shape
        self.prepare()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self.body(*self._inputs)
        self.graph = graph
        self.captures += 1
        graph.replay()
        return self._out


def capturable_adam(params: Sequence[torch.Tensor], lr: float) -> torch.optim.Adam:
    """Adam whose step count and bias corrections stay on the device, as capture needs."""
    return torch.optim.Adam(params, lr=lr, foreach=True, capturable=True)
