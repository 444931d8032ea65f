"""Run a callback once a module has been imported, without importing it (a post-import hook).

``import rlperf`` registers the Snake with Gymnasium, but importing Gymnasium (and NumPy with it)
costs a large part of a second, which ``rlperf --help`` and shell completion must not pay. So when
Gymnasium is not imported yet, the registration waits for the moment it is, whoever imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _CallingLoader(importlib.abc.Loader):
    """Delegates to the module's real loader and calls ``callback`` once the module has executed."""

    def __init__(self, inner: Any, callback: Callable[[], None]) -> None:
        self._inner = inner
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._callback()

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ...
        return getattr(self._inner, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it lets the other finders find ``name`` and wraps the loader they return."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot, and find_spec below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _CallingLoader(spec.loader, self.callback)
        return spec


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call ``callback`` now if module ``name`` is imported, else right after it is."""
    if name in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
