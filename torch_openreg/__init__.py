"""openreg: a simulated accelerator for PyTorch, on the PrivateUse1 dispatch key.

Importing this package loads the C++ extension (which registers the device
guard, allocators, hooks, generators and kernels), renames PrivateUse1 to
``openreg``, registers ``torch.openreg`` and the generated methods
(``Tensor.openreg()``, ``Tensor.is_openreg``, ``Module.openreg()``, ...).

``import torch`` does this automatically through the ``torch.backends`` entry
point (``_autoload.py``), unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
``import torch_openreg`` as a program's first line works too.
"""

import atexit
import os
import sys
import time

import torch


def _check_build() -> str:
    """The version of this build; ImportError if the installed torch is not
    the one the extension was compiled against (its C++ ABI is not stable:
    loading it beside another torch fails with undefined symbols, or worse)."""
    try:
        from torch_openreg import _build_info
    except ImportError:
        raise ImportError(
            "torch_openreg is not built: build it with `make build` (or install its wheel)"
        ) from None
    built_for = _build_info.TORCH_VERSION.split("+")[0]
    running = torch.__version__.split("+")[0]
    if running != built_for:
        raise ImportError(
            f"torch_openreg {_build_info.VERSION} was built for torch {built_for}, but torch "
            f"{torch.__version__} is installed ({os.path.dirname(torch.__file__)}): install "
            f"torch=={built_for}, or build openreg against this torch; set "
            "TORCH_DEVICE_BACKEND_AUTOLOAD=0 to use this torch without openreg"
        )
    return _build_info.VERSION


__version__ = _check_build()

from torch_openreg import (  # noqa: E402  (after the check of the torch it needs)
    _C,  # noqa: F401  (loading it registers the C++ side)
    _post_import,
)
from torch_openreg import distributed as _distributed  # noqa: E402
from torch_openreg import ipc as _ipc  # noqa: E402
from torch_openreg import openreg as _device_module  # noqa: E402

__all__ = ["BACKEND_NAME", "__version__"]

BACKEND_NAME = "openreg"


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != BACKEND_NAME:
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    if not hasattr(torch, BACKEND_NAME):
        torch._register_device_module(BACKEND_NAME, _device_module)
    if not hasattr(torch.Tensor, "is_" + BACKEND_NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=True
        )


# [doc:dlpack-device]
def _fix_dlpack_device() -> None:
    """Makes ``Tensor.__dlpack_device__`` report openreg tensors as kDLExtDev.

    PyTorch 2.13 compares ``device.type`` with the literal "privateuse1", which
    a renamed backend never matches, so ``torch.from_dlpack(openreg_tensor)``
    raises "Unknown device type" (pytorch/pytorch PR 195815 fixes it upstream).
    The C++ export (``to_dlpack``) already maps PrivateUse1 to kDLExtDev; this
    reports the same pair and leaves every other device to PyTorch.
    """
    original = torch.Tensor.__dlpack_device__
    if getattr(original, "_openreg_fixed", False):
        return
    from torch.overrides import has_torch_function_unary
    from torch.utils.dlpack import DLDeviceType

    def __dlpack_device__(self):  # noqa: N807  (the protocol's name)
        # Subclasses that override torch functions go to PyTorch, which
        # dispatches them; every other openreg tensor (Parameter too) is ours.
        if self.device.type == BACKEND_NAME and not has_torch_function_unary(self):
            return (DLDeviceType.kDLExtDev, self.device.index)
        return original(self)

    __dlpack_device__._openreg_fixed = True
    __dlpack_device__.__doc__ = original.__doc__
    torch.Tensor.__dlpack_device__ = __dlpack_device__


# [/doc:dlpack-device]


# [doc:dlpack-import]
def _check_dlpack_imports() -> None:
    """``torch.from_dlpack`` checks what it imports onto openreg.

    A DLPack capsule is a pointer with sizes and strides that another library
    vouches for. PyTorch wraps it as is; openreg then checks, as
    ``torch.openreg.from_blob`` does, that the pointer is live device memory
    (not freed, not returned by ``empty_cache()``) and that everything the
    sizes and strides reach lies inside its allocation, so a bad capsule
    raises here instead of letting kernels read or write another tensor.
    """
    import torch.utils.dlpack as dlpack

    original = dlpack.from_dlpack
    if getattr(original, "_openreg_checked", False):
        return

    def from_dlpack(ext_tensor):
        tensor = original(ext_tensor)
        if isinstance(tensor, torch.Tensor) and tensor.device.type == BACKEND_NAME:
            try:
                _C._check_imported(tensor, "torch.from_dlpack")
            except RuntimeError:
                del tensor  # the producer gets its memory back now, not with the traceback
                raise
        return tensor

    from_dlpack._openreg_checked = True
    from_dlpack.__doc__ = original.__doc__
    from_dlpack.__name__ = original.__name__
    dlpack.from_dlpack = from_dlpack
    torch.from_dlpack = from_dlpack


# [/doc:dlpack-import]


# [doc:faults-from-environment]
def _arm_faults_from_environment() -> None:
    """Arms OPENREG_FAULTS; a bad value raises its ValueError.

    Under ``import torch`` (the autoload, which imports this package before
    torch has imported its last module, ``torch._native``) torch would wrap
    it in "Failed to load the backend extension: openreg", with the
    ValueError only in the chain. There it is raised right after the
    autoload instead, when torch imports ``torch._native``, so that
    ``import torch`` itself raises the ValueError.
    """
    try:
        _device_module.faults._arm_from_environment()
    except ValueError as error:
        if "torch._native" in sys.modules:
            raise

        def _raise(_module, error=error):
            raise error

        _post_import.when_imported("torch._native", _raise)


# [/doc:faults-from-environment]


_register()
_arm_faults_from_environment()  # OPENREG_FAULTS
_fix_dlpack_device()
_check_dlpack_imports()
_distributed._register()
_ipc._register()
# torch.compile's Inductor backend for the device: its C++ kernels run on the
# device memory through the simulator's engine (csrc/engine/inductor/); a
# build without the engine keeps torch.compile's defaults for the device.
if hasattr(_C, "_CompiledKernel"):
    from torch_openreg import compile as _compile

    _compile.install()


def _drain_at_exit() -> None:
    """Lets PyTorch's autograd device threads finish before Python finalizes.

    After ``backward()`` returns, the engine's thread for an openreg device can
    still hold the finished graph for a moment; if the interpreter is already
    finalizing when it drops the graph's Python objects, the process aborts
    (PyTorch issue 38228, shared by every accelerator). Waiting for the devices
    and yielding the GIL briefly at exit closes that window.
    """
    if _device_module.is_initialized():
        for index in range(_device_module.device_count()):
            try:
                _device_module.synchronize(index)
            except RuntimeError:
                pass  # a lost or failed device: its error was the program's to see
        time.sleep(0.02)


atexit.register(_drain_at_exit)

# Training frameworks, when (and if) they are imported: Lightning's accelerator
# registry gets "openreg" (torch_openreg/lightning.py).
from torch_openreg import lightning as _lightning  # noqa: E402

_lightning.install()

# The CUDA migration shim follows the processes started by one that runs it
# (spawned workers, subprocesses): they inherit OPENREG_CUDA_SHIM=1.
if os.environ.get("OPENREG_CUDA_SHIM") == "1":
    from torch_openreg.migration import activate as _activate_cuda_shim

    _activate_cuda_shim()

# Read by _autoload.load(): the package has finished registering.
_registered = True
