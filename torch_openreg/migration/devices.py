"""CUDA device arguments to openreg ones, wherever PyTorch's Python API takes them.

Three paths carry a device into PyTorch, and each needs its own mapping:

1. Every function and Tensor method of the torch-function protocol (factories'
   ``device=``, ``Tensor.to``, ``Tensor.cuda``, ``pin_memory``, ``new_*``,
   ``_parse_to`` behind ``Module.to``, ...): a ``TorchFunctionMode``
   (``CudaToOpenRegMode``) rewrites the arguments before the C++ argument
   parser sees them. That parser turns ``"cuda"`` into ``DeviceType::CUDA``;
   nothing after it can be changed from Python, so the mapping must happen
   here. A mode is per thread: the main thread gets it at activation, threads
   started later get it from ``Thread.start`` (``install_thread_hook``), and
   the autograd engine's threads inherit it with the rest of the thread-local
   state.
2. Python classes and functions outside that protocol (autocast, GradScaler,
   ``torch.load``, ``torch.set_default_device``, the ``torch.cuda`` stand-in):
   wrapped one by one in ``patches.py`` and ``cuda_module.py``, all through
   ``map_device`` below.
3. ``torch.device("cuda")`` objects stay CUDA devices: the mode lets the
   constructor (a torch function too) through unmapped, and the class is
   never replaced. Code that branches on ``device.type == "cuda"`` takes its
   GPU path (autocast, pinned memory, accelerate's and the HF Trainer's
   mixed precision), devices built before activation behave like later
   ones, and pickling is untouched; 1 and 2 map the object where it is used.
   The tensors are openreg tensors (``x.device`` is ``openreg:0``), so
   ``x.device == torch.device("cuda")`` is False: docs/migration.md.
"""

import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode

BACKEND = "openreg"
_TORCH_DEVICE = torch._C.device  # the real class, whatever torch.device is bound to


# [doc:map-device]
def map_device(device: Any) -> Any:
    """``"cuda"``, ``"cuda:N"`` and ``torch.device("cuda", N)`` as openreg; anything else as is.

    A string keeps its kind (``"cuda:1"`` gives ``"openreg:1"``) and a device
    object too; an index-less device stays index-less, so it means the
    current openreg device where CUDA's meant the current CUDA device.
    """
    kind = type(device)
    if kind is str:
        if device == "cuda":
            return BACKEND
        if device.startswith("cuda:"):
            return BACKEND + device[4:]
        return device
    if kind is _TORCH_DEVICE and device.type == "cuda":
        return torch.device(BACKEND, device.index)
    return device
    # [/doc:map-device]


def map_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``map_device`` over positional and keyword arguments (top level only)."""
    if any(type(a) is str or type(a) is _TORCH_DEVICE for a in args):
        args = tuple(map_device(a) for a in args)
    if kwargs:
        kwargs = {k: map_device(v) for k, v in kwargs.items()}
    return args, kwargs


# [doc:mode]
class CudaToOpenRegMode(TorchFunctionMode):
    """Maps CUDA device arguments of every torch function to openreg.

    ``Tensor.cuda(...)`` becomes ``Tensor.openreg(...)`` (so ``Module.cuda()``,
    which calls it on every parameter, follows). Everything else keeps its
    function and gets its arguments mapped, except the ``torch.device``
    constructor; results are never touched, so a tensor made this way
    reports ``device.type == "openreg"``.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _TORCH_DEVICE:  # device objects keep their type (module docstring, 3.)
            return func(*args, **kwargs)
        args, kwargs = map_arguments(args, kwargs)
        if func is _TENSOR_CUDA:
            return torch.Tensor.openreg(*args, **kwargs)
        if _is_compiling() and args and isinstance(args[0], torch.Tensor):
            # torch.compile traces this handler. A Tensor method written in
            # Python (Tensor.unflatten, ...) called as a function would be
            # inlined, and Dynamo cannot trace its super() call
            # (fullgraph=True fails); called as a method of the tensor it is
            # the operator Dynamo knows.
            name = getattr(func, "__name__", None)
            if name and getattr(torch.Tensor, name, None) is func:
                return getattr(args[0], name)(*args[1:], **kwargs)
        return func(*args, **kwargs)
        # [/doc:mode]


_TENSOR_CUDA = torch.Tensor.cuda
_is_compiling = torch.compiler.is_compiling


def push_mode() -> None:
    """Puts the mapping mode on this thread's torch-function mode stack, for good."""
    _push_mode(CudaToOpenRegMode())


def install_thread_hook() -> None:
    """Threads started from now on run with the mapping mode on their stack.

    ``Thread.start`` wraps the thread's ``run`` (an instance attribute, so
    subclasses that override ``run`` are covered too).
    """
    original_start = threading.Thread.start
    if getattr(original_start, "_openreg_shim", False):
        return

    def start(self: threading.Thread) -> None:
        run = self.run

        def run_with_mode() -> None:
            _push_mode(CudaToOpenRegMode())
            try:
                run()
            finally:
                _pop_mode()

        self.run = run_with_mode
        original_start(self)

    start._openreg_shim = True
    start.__doc__ = original_start.__doc__
    threading.Thread.start = start
