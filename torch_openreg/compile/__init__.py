"""torch.compile on openreg: the Dynamo device interface and the Inductor backend.

- ``dynamo.py``: ``OpenRegInterface``, the device interface Dynamo and
  Inductor use for device count, current device, streams, events,
  synchronization, properties and memory.
- ``inductor.py``: the Inductor backend (scheduling from Inductor's C++ code
  generator, the Python wrapper code generator, device op overrides).
- ``kernels.py``: what the generated code calls at run time (compiling a
  kernel into a ``_C._CompiledKernel`` launcher, allocating buffers).

``import torch`` imports neither Dynamo nor Inductor (together they cost
seconds), so openreg registers with each when it is loaded (``install()``
sets up the hooks, or registers at once if the module is already loaded):

- Dynamo: right after ``torch._dynamo.device_interface`` (its table of device
  interfaces) is imported;
- Inductor: right after ``torch._inductor.codegen.common`` (its per-device
  registry) is imported, through its own registration functions
  (``backend.py``); the code generators are imported on first use.
"""

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["install"]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after ``name`` has been imported."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_register(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def _register_dynamo(_module: ModuleType | None = None) -> None:
    from . import dynamo

    dynamo.register()


def _register_inductor(_module: ModuleType | None = None) -> None:
    from . import backend

    backend.register()


def _skip_in_dynamo(trace_rules: ModuleType | None = None) -> None:
    if trace_rules is None:
        trace_rules = sys.modules["torch._dynamo.trace_rules"]
    # The device module (torch.openreg), as torch.cuda: the rest of the
    # package (the conformance kit, the migration shim) is ordinary code.
    trace_rules.add("torch_openreg.openreg")


# [doc:compile-install]
def install() -> None:
    """Registers openreg with Dynamo and Inductor when they are loaded.

    Dynamo also treats openreg's Python (``torch.openreg.synchronize``,
    ``set_rng_state``, streams, ...) as it treats ``torch.cuda``'s runtime
    functions: called from a compiled function, it runs eagerly (a graph
    break) instead of being traced.
    """
    for name, register in (
        ("torch._dynamo.device_interface", _register_dynamo),
        ("torch._dynamo.trace_rules", _skip_in_dynamo),
        ("torch._inductor.codegen.common", _register_inductor),
    ):
        if name in sys.modules:
            register()
        else:
            sys.meta_path.insert(0, _AfterImport(name, register))


# [/doc:compile-install]
