"""Run a function right after a module is imported (for optional integrations).

``import torch`` loads openreg before any training framework; the framework's
registry (e.g. Lightning's ``AcceleratorRegistry``) exists only once its module
has run. ``when_imported(name, callback)`` calls ``callback(module)`` then, or
at once if the module is already loaded, without importing the framework.
"""

import importlib.abc
import sys
import threading
import types
from collections.abc import Callable

_callbacks: dict[str, list[Callable[[types.ModuleType], None]]] = {}
_lock = threading.Lock()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a watched module."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _callbacks:
            return None
        # The other finders decide where the module comes from.
        index = sys.meta_path.index(self)
        for finder in sys.meta_path[index + 1 :]:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        class _Loader(importlib.abc.Loader):
            """The real loader, with a call after the module has run."""

            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                original_exec(module)
                _run(fullname, module)

            def __getattr__(self, name):  # get_source, get_data, ... of the real one
                return getattr(loader, name)

        spec.loader = _Loader()
        return spec


_finder = _Finder()


def _run(name: str, module: types.ModuleType) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
    for callback in callbacks:
        callback(module)


def when_imported(name: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Calls ``callback(module)`` once module ``name`` has been imported."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
