"""torch.openreg: the device module, shaped like torch.cuda.

Device management lives here; random number generation in ``random.py``.
Initialisation is lazy, as for CUDA: nothing touches the simulated devices
until the first tensor, stream or explicit ``init()``, so a process can fork
before that.
"""

import os
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch

from torch_openreg import _C

from . import amp, faults, memory, random, sanitizer, storages, streams, tensors
from .amp import (  # noqa: F401  (the device-module AMP functions torch.autocast asks for)
    get_amp_supported_dtype,
    get_autocast_dtype,
    is_autocast_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
)
from .memory import *  # noqa: F403
from .random import *  # noqa: F403
from .storages import *  # noqa: F403
from .streams import *  # noqa: F403
from .tensors import *  # noqa: F403

__all__ = [
    "DeferredOpenRegCallError",
    "can_device_access_peer",
    "current_device",
    "default_generators",
    "device",
    "device_count",
    "device_memory_used",
    "device_of",
    "fallback_ops",
    "faults",
    "get_arch_list",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_gencode_flags",
    "get_sync_debug_mode",
    "has_half",
    "init",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "is_tf32_supported",
    "load_library",
    "sanitizer",
    "set_device",
    "set_fallback_warnings",
    "set_sync_debug_mode",
    "synchronize",
    *amp.DEVICE_MODULE_API,
    *tensors.__all__,
    *memory.__all__,
    *random.__all__,
    *storages.__all__,
    *streams.__all__,
]

# As torch.cuda: True (half precision tensors and kernels exist).
has_half = True
# The default torch.Generator of each device, filled at initialisation (empty
# before, as torch.cuda.default_generators).
default_generators: tuple[torch.Generator, ...] = ()

_initialized = False
_init_lock = threading.Lock()
_tls = threading.local()
_queued_calls: list[tuple[Callable[[], None], list[str]]] = []


class DeferredOpenRegCallError(Exception):
    """A call queued before initialisation (e.g. manual_seed) failed."""


def fallback_ops() -> list[str]:
    """Operators that have run through the CPU fallback in this process."""
    return list(_C._fallback_ops())


def load_library(path: str | os.PathLike) -> None:
    """Loads a library of C++ operators (``TORCH_LIBRARY`` and their CPU
    kernels) as ``torch.ops.load_library`` does, and into every device too.

    Each openreg device with a process of its own (``OPENREG_DRIVER=process``)
    runs the CPU kernels of the fallback in that process. It knows only the
    operators of the libraries it loaded: without this call, such an
    operator's calls run staged in the user's process instead. The library
    must not need Python (a device process runs none). With the thread
    driver the device shares this process, and this is
    ``torch.ops.load_library``."""
    path = os.path.realpath(os.fspath(path))
    torch.ops.load_library(path)
    if hasattr(_C, "_load_library"):  # a build with the simulator's engine
        _C._load_library(path)


def _launch_stats() -> dict:
    """How operators ran since the last reset: queued on a stream, run
    synchronously, run synchronously to learn their signature, queued as
    captured host objects instead of serialized calls (the format cannot
    carry them, or ``OPENREG_SERIALIZED_CALLS=0``), openreg kernels run
    staged on the host because the driver runs named kernels only and they
    are not named kernels yet, with the operators of the last four; tasks
    launched, host waits, and calls run by the copying fallback
    (``host_copied``, ``OPENREG_FALLBACK=copy``). A profiling aid
    (benchmarks/bench_loops.py --breakdown), not a stable API."""
    return _C._launch_stats()


def _named_kernels_only() -> bool:
    """True when the driver runs named kernels only: each device in a process
    of its own (``OPENREG_DRIVER=process``, docs/process-driver.md). Kernels
    not yet ported to named kernels then raise NotImplementedError."""
    return _C._named_kernels_only()


def _reset_launch_stats() -> None:
    """Sets every launch statistic back to zero."""
    _C._reset_launch_stats()


def set_fallback_warnings(enabled: bool) -> None:
    """Turns the once-per-operator fallback warning on or off
    (``OPENREG_FALLBACK_WARNINGS=0`` turns it off at start)."""
    _C._set_fallback_warnings(bool(enabled))


def _is_in_bad_fork() -> bool:
    """True in a child forked after openreg was initialised (torch.random asks)."""
    return _C._is_in_bad_fork()


def is_available() -> bool:
    """True if at least one openreg device exists (never initialises them)."""
    return device_count() > 0


def device_count() -> int:
    """Number of openreg devices (``OPENREG_DEVICE_COUNT``, default 2)."""
    return _C._device_count()


def is_initialized() -> bool:
    """True once the devices have been initialised in this process."""
    return _initialized and not _C._is_in_bad_fork()


def _lazy_call(callable: Callable[[], None]) -> None:
    if is_initialized():
        callable()
    else:
        _queued_calls.append((callable, traceback.format_stack()))


def _lazy_init() -> None:
    """Initialises the devices once; PyTorch calls this before first use."""
    global _initialized
    if is_initialized() or hasattr(_tls, "is_initializing"):
        return
    with _init_lock:
        if is_initialized():
            return
        if _C._is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize openreg in forked subprocess. To use openreg with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        _C._init()
        global default_generators
        default_generators = tuple(_C._get_default_generator(i) for i in range(device_count()))
        _tls.is_initializing = True
        try:
            for queued_call, stack in _queued_calls:
                try:
                    queued_call()
                except Exception as e:
                    msg = (
                        f"openreg call failed lazily at initialization with error: {e}\n\n"
                        "openreg call was originally invoked at:\n\n" + "".join(stack)
                    )
                    raise DeferredOpenRegCallError(msg) from e
            _queued_calls.clear()
        finally:
            delattr(_tls, "is_initializing")
        _initialized = True


def init() -> None:
    """Initialises openreg explicitly (otherwise the first use does)."""
    _lazy_init()


def _get_device_index(device: Any, optional: bool = False) -> int:
    """Device index of an int, "openreg:N" string or torch.device.

    With ``optional``, ``None`` and an index-less "openreg" give the current
    device.
    """
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "openreg":
            raise ValueError(f"Expected an openreg device, but got: {device}")
        index = device.index
    elif device is None:
        index = None
    elif isinstance(device, int):
        index = device
    else:
        raise TypeError(f"Expected an int, str or torch.device, got {type(device).__name__}")
    if index is None:
        if not optional:
            raise ValueError(f"Expected an openreg device with an index, got {device!r}")
        return current_device()
    return index


def current_device() -> int:
    """Index of the current device of this thread."""
    _lazy_init()
    return _C._get_device()


def set_device(device: Any) -> None:
    """Sets the current device; a negative index is ignored (as torch.cuda)."""
    index = _get_device_index(device)
    if index >= 0:
        _lazy_init()
        _C._set_device(index)


class device:
    """Context manager that makes ``device`` current and restores the previous one."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *args: object) -> None:
        if self.idx >= 0:
            _C._exchange_device(self.prev_idx)


class device_of(device):
    """Makes the device of a tensor current; a no-op for non-openreg tensors."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.is_openreg else -1)


def synchronize(device: Any = None) -> None:
    """Waits for all work on all streams of a device (default: current)."""
    _lazy_init()
    _C._synchronize(_get_device_index(device, optional=True))


def get_device_properties(device: Any = None) -> Any:
    """Name, total_memory, major, minor and multi_processor_count of a device."""
    _lazy_init()
    index = _get_device_index(device, optional=True)
    return _C._get_device_properties(index)


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    prop = get_device_properties(device)
    return prop.major, prop.minor


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """True if ``device`` can read and write ``peer_device``'s memory directly.

    Every simulated device lives in this process, so copies between two
    different devices go directly from arena to arena; a device is not its
    own peer (as cudaDeviceCanAccessPeer answers).
    """
    _lazy_init()
    index = _get_device_index(device, optional=True)
    peer = _get_device_index(peer_device)
    count = device_count()
    if not 0 <= index < count:
        raise AssertionError(f"Invalid device id {index} (openreg has {count} devices)")
    if not 0 <= peer < count:
        raise AssertionError(f"Invalid peer device id {peer} (openreg has {count} devices)")
    return index != peer


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: bfloat16 tensors and kernels exist natively (no emulation needed)."""
    return is_available()


def is_tf32_supported() -> bool:
    """False: float32 matmuls and convolutions run in full float32 precision."""
    return False


def get_arch_list() -> list[str]:
    """[]: no kernel of this build is compiled for a device architecture (the
    kernels are the CPU's), as a CPU-only PyTorch answers for CUDA."""
    return []


def get_gencode_flags() -> str:
    """ "": no device code generation flags (see get_arch_list)."""
    return ""


def device_memory_used(device: Any = None) -> int:
    """Bytes of the device in use, as the driver counts them (capacity minus free)."""
    free, total = memory.mem_get_info(device)
    return total - free


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def get_sync_debug_mode() -> int:
    """The sync debug mode: 0 silent, 1 warn, 2 error (see set_sync_debug_mode)."""
    _lazy_init()
    return _C._get_sync_debug_mode()


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """Warns (``"warn"``/1) or raises (``"error"``/2) on synchronizing operations.

    As on CUDA, the operations that make the host wait for the device for a
    reason a GPU shares report it: ``Tensor.item()``, blocking copies between
    the device and the CPU, ``Stream.synchronize()``. ``synchronize()`` of a
    whole device does not; the operators whose result's size depends on the
    data (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``)
    do, as CUDA's. The report names the Python-level call (``Tensor.item()``,
    ``Tensor.__bool__``, printing) and its line. The waits only the simulator
    makes (first runs, blocking launches) are not reported.
    """
    _lazy_init()
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError(
                "invalid value of debug_mode, expected one of `default`, `warn`, `error`"
            )
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    _C._set_sync_debug_mode(debug_mode)
