"""Build and save a torch optimizer without importing ``torch._dynamo`` (1–1.5 s of CPU at start-up).

torch marks ``Optimizer.add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict``
with ``torch._disable_dynamo``, a wrapper that imports ``torch._dynamo`` on its first call only to
build the "do not trace this" mark. The mark matters only inside a ``torch.compile`` region, and
none can run before ``torch._dynamo`` is imported. :func:`defer_dynamo` gives those methods a mark
that calls them straight while ``torch._dynamo`` is not imported and builds torch's own mark once it
is (``train.compile`` imports it; so does a torch-form update's first ``Adam.step``). Every method
still runs its own code. A torch whose wrapper is not the one this expects is left as it is.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

# The attribute torch._compile._disable_dynamo caches its mark under, on the wrapped function.
_MARK = "__dynamo_disable"
_done: list[bool] = []


def defer_dynamo() -> None:
    """Let ``torch.optim.Optimizer``'s marked methods run without importing ``torch._dynamo``; idempotent."""
    if _done:
        return
    _done.append(True)
    import torch
    import torch._compile

    probe = torch._compile._disable_dynamo(lambda: None)
    for method in vars(torch.optim.Optimizer).values():
        if getattr(method, "__code__", None) is not probe.__code__:
            continue
        cells = dict(zip(method.__code__.co_freevars, (c.cell_contents for c in method.__closure__), strict=True))
        fn, recursive = cells.get("fn"), cells.get("recursive", True)
        if fn is None or getattr(fn, _MARK, None) is not None:
            continue  # already marked (torch._dynamo was imported and the method called)
        setattr(fn, _MARK, _until_dynamo(fn, recursive))


def _until_dynamo(fn: Callable[..., Any], recursive: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        import torch._dynamo

        mark = torch._dynamo.disable(fn, recursive, wrapping=False)
        setattr(fn, _MARK, mark)
        return mark(*args, **kwargs)

    return call
