"""The ``torch.cuda`` stand-in, built from the parity table (torch_openreg/api_parity.py).

Each public name of ``torch.cuda`` and ``torch.cuda.amp`` has one row there;
the stand-in resolves a name through its row:

- ``same`` and ``partial``: the ``torch.openreg`` counterpart. Functions get
  their CUDA device arguments mapped (``torch.cuda.set_device("cuda:1")``);
  classes whose constructor takes a device (``Stream``, ``device``) get a
  proxy class that maps the arguments and answers ``isinstance`` for the
  openreg class; other classes (``Event``, the exceptions) and values
  (``has_half``, ``default_generators``) are the counterparts themselves;
  submodules (``amp``, ``memory``, ``random``, ``streams``) are stand-ins
  of their own.
- every other status (a CUDA library, a legacy typed class, a feature openreg
  lacks): a placeholder of the same kind that raises
  ``CudaApiNotSupportedError`` naming ``torch.cuda.<name>`` and the row's
  reason when it is used: a function raises when called, a class when
  instantiated (``isinstance`` answers False), a submodule when one of its
  attributes is looked up (``torch.cuda.nvtx.range_push``). The lookup itself
  succeeds, because libraries name such classes at import time
  (transformers annotates with ``torch.cuda.CUDAGraph``); a flag such as
  ``has_magma`` is False.

Private names (``torch.cuda._lazy_init``, ...) are not in the table: they are
the real ``torch.cuda``'s, which PyTorch's own CUDA code paths use, except
the memory-snapshot tools (``torch.cuda.memory._record_memory_history``,
``_snapshot``, ``_dump_snapshot``), which are openreg's (``PRIVATE``).

``torch.cuda.amp``'s deprecated classes and decorators (``autocast``,
``GradScaler``, ``custom_fwd``, ``custom_bwd``) are the real ones: they call
``torch.amp`` with ``"cuda"``, which the shim maps (patches.py), and so warn
with the names the user wrote.

Assigning an attribute (``unittest.mock.patch``, pytest's ``monkeypatch``, a
user's own) works as on a module: a name of the table is shadowed in the
stand-in until deleted, any other name is set on (and deleted from) the real
``torch.cuda``.
"""

import functools
import inspect
import sys
import types
from typing import Any

import torch

from torch_openreg import api_parity

from .devices import map_arguments


class CudaApiNotSupportedError(NotImplementedError, AttributeError):
    """A ``torch.cuda`` name with no openreg meaning, used under the migration shim."""


def _unsupported(qualified: str, row: api_parity.Row) -> CudaApiNotSupportedError:
    what = {
        "cuda": "is CUDA-specific",
        "legacy": "is a legacy typed class PyTorch makes for CPU and CUDA only",
        "gap": "is not implemented by openreg yet",
    }[row.status]
    return CudaApiNotSupportedError(
        f"{qualified} {what} ({row.notes}); it has no openreg counterpart under the "
        "migration shim (torch_openreg.transfer_to_openreg). See docs/api_parity.md."
    )


class _UnsupportedClassMeta(type):
    """Metaclass of a placeholder class: instantiating it raises."""

    _error: CudaApiNotSupportedError

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise cls._error

    def __instancecheck__(cls, obj: Any) -> bool:
        return False


class _UnsupportedModule(types.ModuleType):
    """Placeholder submodule: looking up any public attribute raises."""

    def __init__(self, qualified: str, row: api_parity.Row) -> None:
        super().__init__(qualified, f"{qualified}: no openreg counterpart ({row.notes})")
        self.__dict__["_row"] = row

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _unsupported(f"{self.__name__}.{name}", self.__dict__["_row"])


def _placeholder(real: Any, qualified: str, row: api_parity.Row) -> Any:
    """Stands for an unsupported ``real`` object; raises when used."""
    module, name = qualified.rsplit(".", 1)
    if isinstance(real, bool):
        return False  # has_magma and the like: openreg has none of it
    if isinstance(real, types.ModuleType):
        return _UnsupportedModule(qualified, row)
    if isinstance(real, type):
        return _UnsupportedClassMeta(
            name,
            (),
            {"_error": _unsupported(qualified, row), "__module__": module, "__doc__": row.notes},
        )

    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise _unsupported(qualified, row)

    unsupported.__name__ = unsupported.__qualname__ = name
    unsupported.__module__ = module
    unsupported.__doc__ = row.notes
    return unsupported


class CudaDeviceProperties:
    """openreg's device properties as CUDA code reads them under the shim.

    Every field of ``torch.openreg.get_device_properties()``, plus
    ``gcnArchName`` (the device's name): on a PyTorch built without CUDA,
    whose ``torch.version.cuda`` is None, PyTorch's own CUDA code paths take
    the device for a ROCm one and read that field (Inductor's cache key does,
    under ``torch.compile``).
    """

    def __init__(self, properties: Any) -> None:
        self._properties = properties

    def __getattr__(self, name: str) -> Any:
        return getattr(self._properties, name)

    @property
    def gcnArchName(self) -> str:  # noqa: N802  (CUDA's field name)
        return self._properties.name

    def __repr__(self) -> str:
        return repr(self._properties)


# What a mapped function's result becomes under the shim, by name.
_RESULT_ADAPTERS = {"get_device_properties": CudaDeviceProperties}


def _wrap_function(target: Any, qualified: str) -> Any:
    adapt = _RESULT_ADAPTERS.get(qualified.rsplit(".", 1)[-1])

    @functools.wraps(target)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = map_arguments(args, kwargs)
        result = target(*args, **kwargs)
        return adapt(result) if adapt is not None else result

    wrapper.__qualname__ = wrapper.__name__ = qualified.rsplit(".", 1)[-1]
    wrapper.__module__ = qualified.rsplit(".", 1)[0]
    return wrapper


class _ProxyMeta(type):
    """Metaclass of a proxy: calling it builds the openreg class with mapped arguments."""

    _target: type

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = map_arguments(args, kwargs)
        return cls._target(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._target)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._target)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls._target, name)


def _proxy_class(target: type, qualified: str) -> type:
    module, name = qualified.rsplit(".", 1)
    return _ProxyMeta(
        name, (), {"_target": target, "__doc__": target.__doc__, "__module__": module}
    )


def _takes_device(cls: type) -> bool:
    try:
        return "device" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _resolve(target: Any, qualified: str) -> Any:
    """The stand-in's value for a counterpart ``target`` of ``qualified``."""
    if isinstance(target, types.ModuleType):
        return target  # replaced by a sub-stand-in by the caller
    if isinstance(target, type):
        if issubclass(target, BaseException) or not _takes_device(target):
            return target
        return _proxy_class(target, qualified)
    if callable(target):
        return _wrap_function(target, qualified)
    return target


# Private names of torch.cuda that mean openreg's tool under the shim, by
# stand-in: the memory-snapshot tools.
def _private_names(qualified: str) -> dict[str, Any]:
    memory = torch.openreg.memory
    tools = {
        "_record_memory_history": memory._record_memory_history,
        "_snapshot": memory._snapshot,
        "_dump_snapshot": memory._dump_snapshot,
    }
    return tools if qualified == "torch.cuda.memory" else {}


# torch.cuda.amp's names that stay the real ones (see the module docstring).
_REAL_AMP = frozenset({"autocast", "GradScaler", "custom_fwd", "custom_bwd"})


class CudaStandIn(types.ModuleType):
    """``torch.cuda`` (or one of its submodules) answered by torch.openreg.

    ``rows`` maps the names this namespace knows to their rows; ``real`` is
    the real module, which keeps private names and loaded submodules.
    """

    def __init__(self, qualified: str, real: types.ModuleType, rows: dict, openreg: Any):
        super().__init__(qualified, real.__doc__)
        d = self.__dict__
        d["_real"] = real
        d["_rows"] = rows
        d["_openreg"] = openreg
        d["_cache"] = {}
        d["_subs"] = {}
        d["_private"] = _private_names(qualified)
        for attr in ("__file__", "__path__", "__spec__", "__loader__", "__package__"):
            if hasattr(real, attr):
                d[attr] = getattr(real, attr)
        d["__all__"] = list(getattr(real, "__all__", ()))

    def _add_sub(self, name: str, sub: "CudaStandIn") -> None:
        self.__dict__["_subs"][name] = sub

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name in d["_subs"]:
            return d["_subs"][name]
        if name in d["_private"]:
            return d["_private"][name]
        row = d["_rows"].get(name)
        qualified = f"{self.__name__}.{name}"
        if row is None or (self.__name__ == "torch.cuda.amp" and name in _REAL_AMP):
            return getattr(d["_real"], name)
        if name in d["_cache"]:
            return d["_cache"][name]
        if row.status not in ("same", "partial"):
            value = _placeholder(getattr(d["_real"], name, None), qualified, row)
            d["_cache"][name] = value
            return value
        # amp rows name "amp.X"; this namespace's target is torch.openreg.amp then.
        target = getattr(d["_openreg"], row.openreg.rsplit(".", 1)[-1])
        value = _resolve(target, qualified)
        # Values such as default_generators change at initialisation: not cached.
        if isinstance(value, type) or callable(value):
            d["_cache"][name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        ours = name in d["_rows"] or name in d["_private"]
        if ours and not isinstance(value, types.ModuleType):
            # A table name (mock.patch("torch.cuda.set_rng_state", ...)):
            # shadowed here until deleted, as a module attribute would be.
            d[name] = value
            return
        # Private names go to the real module, whose own code reads them;
        # the import system binds loaded submodules there too, so that our
        # lookup (not the instance dict) answers.
        setattr(d["_real"], name, value)

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        if (name in d["_rows"] or name in d["_private"]) and name in d:
            del d[name]  # the stand-in's answer again
            return
        delattr(d["_real"], name)

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__["_rows"]) | set(dir(self.__dict__["_real"])))

    def __repr__(self) -> str:
        return f"<module {self.__name__!r} (openreg stand-in, torch_openreg.migration)>"


def build() -> CudaStandIn:
    """The stand-in for torch.cuda and its mapped submodules, from the parity table."""
    real = sys.modules["torch.cuda"]
    top = {row.cuda: row for row in api_parity.ROWS if "." not in row.cuda}
    amp_rows = {
        row.cuda.split(".", 1)[1]: row for row in api_parity.ROWS if row.cuda.startswith("amp.")
    }
    stand_in = CudaStandIn("torch.cuda", real, top, torch.openreg)
    stand_in._add_sub("amp", CudaStandIn("torch.cuda.amp", real.amp, amp_rows, torch.openreg.amp))
    for sub in ("memory", "random", "streams"):
        real_sub = getattr(real, sub)
        rows = {n: row for n, row in top.items() if hasattr(real_sub, n)}
        stand_in._add_sub(sub, CudaStandIn(f"torch.cuda.{sub}", real_sub, rows, torch.openreg))
    return stand_in
