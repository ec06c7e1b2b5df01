"""The CUDA entry points outside the torch-function protocol, wrapped one by one.

Each ``patch_*`` replaces a PyTorch attribute by a wrapper that maps CUDA
device arguments with ``devices.map_device`` and calls the original; every
wrapper is marked (``_openreg_shim``) so activating twice wraps once.
"""

import functools
import re
import types
from typing import Any

import torch

from .cuda_module import _proxy_class
from .devices import BACKEND, map_arguments, map_device

_ORIGINALS: dict[Any, Any] = {}  # each wrapper -> the function it wraps


def _replace(owner: Any, name: str, make: Any) -> None:
    original = getattr(owner, name)
    if getattr(original, "_openreg_shim", False):
        return
    wrapper = make(original)
    _ORIGINALS[wrapper] = original
    functools.update_wrapper(wrapper, original)
    wrapper._openreg_shim = True
    # TorchScript compiles what scripted code calls: a wrapper of one of its
    # builtin operators (torch.set_autocast_enabled, called by
    # torch.autocast's methods) stays that operator there, as without the
    # shim (its source is not TorchScript, and inspect cannot read a
    # builtin's).
    from torch.jit import _builtins

    op = _builtins._find_builtin(original)
    if op is not None:
        _builtins._register_builtin(wrapper, op)
    setattr(owner, name, wrapper)


def fold_in_dynamo() -> None:
    """torch.compile folds torch's state queries (``torch.is_autocast_enabled``,
    ``torch.get_autocast_dtype``, ...) to constants when it meets them, from a
    table made when ``torch._dynamo`` is imported. Imported after the shim,
    the table holds the wrappers, and Dynamo, tracing into a wrapper, meets
    the original it does not know ("torch.* op returned non-Tensor", so
    ``fullgraph=True`` fails): the originals are added beside them."""
    from torch_openreg import _post_import

    def add(module: Any) -> None:
        table = module.constant_fold_functions
        for wrapper, original in _ORIGINALS.items():
            if wrapper in table or original in table:
                table[original] = None

    _post_import.when_imported("torch._dynamo.variables.torch", add)


def _mapping_all_arguments(original: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = map_arguments(args, kwargs)
        return original(*args, **kwargs)

    return wrapper


# [doc:patch-amp]
def patch_amp() -> None:
    """``torch.autocast("cuda")``, ``torch.amp.GradScaler("cuda")`` and their helpers.

    ``torch.cuda.amp.autocast``/``GradScaler`` (the real, deprecated classes,
    reached by ``from torch.cuda.amp import ...``) call these constructors with
    ``"cuda"``, so they follow. GradScaler's default device is ``"cuda"``: a
    bare ``GradScaler()`` scales on openreg too.
    """
    autocast = torch.amp.autocast_mode.autocast

    def autocast_init(original: Any) -> Any:
        def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(self, map_device(device_type), *args, **kwargs)

        return __init__

    _replace(autocast, "__init__", autocast_init)

    def scaler_init(original: Any) -> Any:
        def __init__(self, device: str = "cuda", *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(self, map_device(device), *args, **kwargs)

        return __init__

    _replace(torch.amp.GradScaler, "__init__", scaler_init)
    # [/doc:patch-amp]

    for owner in (torch.amp, torch.amp.autocast_mode):
        for name in ("custom_fwd", "custom_bwd", "is_autocast_available"):
            if hasattr(owner, name):
                _replace(owner, name, _mapping_all_arguments)
    # The device-type functions of torch's namespace (C++, no torch-function
    # support). Without an argument, is_autocast_enabled() asks about CUDA.
    for name in ("get_autocast_dtype", "set_autocast_dtype", "set_autocast_enabled"):
        _replace(torch, name, _mapping_all_arguments)

    def is_autocast_enabled(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> bool:
            if not args and not kwargs:
                args = (BACKEND,)
            args, kwargs = map_arguments(args, kwargs)
            return original(*args, **kwargs)

        return wrapper

    _replace(torch, "is_autocast_enabled", is_autocast_enabled)
    # The deprecated "gpu" spellings mean CUDA.
    torch.get_autocast_gpu_dtype = lambda: torch.get_autocast_dtype(BACKEND)
    torch.set_autocast_gpu_dtype = lambda dtype: torch.set_autocast_dtype(BACKEND, dtype)


def patch_generator() -> None:
    """``torch.Generator(device="cuda")``: an openreg generator.

    ``torch.Generator`` is a C type that no torch function mode sees, so its
    device argument is mapped by a proxy class in its place (the one the
    stand-in uses for ``torch.cuda.Stream``); the object made is a real
    ``torch.Generator`` (``isinstance`` checks hold, kernels accept it).
    Without this, PyTorch raises "Cannot get CUDA generator without
    ATen_cuda library".
    """
    if torch.Generator is torch._C.Generator:
        torch.Generator = _proxy_class(torch._C.Generator, "torch.Generator")


def patch_default_device() -> None:
    """``torch.set_default_device("cuda")`` and ``with torch.device("cuda"):``.

    Both build a ``DeviceContext`` (the second from C++); it sits at the
    bottom of the mode stack, below the mapping mode, so it must hold an
    openreg device itself.
    """
    from torch.utils._device import DeviceContext

    def init(original: Any) -> Any:
        def __init__(self, device: Any) -> None:  # noqa: N807
            original(self, map_device(device))

        return __init__

    _replace(DeviceContext, "__init__", init)


def _cuda_location_deserializer(obj: Any, location: str) -> Any:
    """Loads storages tagged ``cuda``/``cuda:N`` onto openreg (``N`` kept)."""
    if location == "cuda" or re.match(r"cuda(:|[0-9]+)", location):
        mapped = map_device(location)
        device = torch.serialization._validate_device(mapped, BACKEND)
        return obj.to(device=device)
    return None


def patch_serialization() -> None:
    """``torch.load`` of CUDA checkpoints and ``map_location`` naming CUDA.

    ``map_location="cuda"``, ``torch.device("cuda")`` and ``{"cuda:1": "cuda:0"}``
    all end in the location deserializers with a ``cuda`` string, as does a
    checkpoint saved on a CUDA machine without ``map_location``: one
    deserializer ahead of CUDA's (priority 20) maps them. A ``map_location``
    callable that calls ``storage.cuda()`` is covered by the storage methods.
    """
    registry = torch.serialization._package_registry
    if any(entry[2] is _cuda_location_deserializer for entry in registry):
        return
    torch.serialization.register_package(19, lambda storage: None, _cuda_location_deserializer)

    def storage_cuda(original: Any) -> Any:
        def cuda(self, device: Any = None, non_blocking: bool = False) -> Any:
            device = map_device(device)
            if isinstance(device, str):
                device = torch.device(device)
            return self.openreg(device=device, non_blocking=non_blocking)

        return cuda

    _replace(torch.storage._StorageBase, "cuda", storage_cuda)
    _replace(torch.storage.TypedStorage, "cuda", storage_cuda)


def _openreg_process_group_backend() -> str:
    backend = torch.distributed.Backend.default_device_backend_map.get(BACKEND)
    if backend is None:
        from .cuda_module import CudaApiNotSupportedError

        raise CudaApiNotSupportedError(
            "torch.distributed backend 'nccl' has no openreg counterpart in this process: "
            "no torch.distributed backend is registered for the openreg device "
            "(torch.distributed.Backend.default_device_backend_map has no 'openreg')"
        )
    return backend


def map_process_group_backend(backend: Any) -> Any:
    """``"nccl"`` (and ``"cuda:nccl"`` in a per-device list) as openreg's backend.

    For openreg tensors only (``orccl_device``), as NCCL serves CUDA tensors
    only: a CPU tensor passed to a collective of that group raises "No backend
    type associated with device type cpu", as it does with NCCL, instead of
    going to Gloo.
    """
    if not isinstance(backend, str):
        return backend
    if backend.lower() == "nccl":
        _openreg_process_group_backend()  # a backend is registered for openreg
        from torch_openreg.distributed import DEVICE_ONLY_BACKEND

        return DEVICE_ONLY_BACKEND
    if ":" in backend:
        parts = []
        for part in backend.split(","):
            device, _, name = part.partition(":")
            if device.strip() == "cuda":
                part = f"{BACKEND}:{_openreg_process_group_backend() if name == 'nccl' else name}"
            parts.append(part)
        return ",".join(parts)
    return backend


def patch_distributed() -> None:
    """``init_process_group("nccl")`` / ``new_group(backend="nccl")`` on openreg's backend."""
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist

    def with_backend(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if args:
                args = (map_process_group_backend(args[0]), *args[1:])
            if "backend" in kwargs:
                kwargs["backend"] = map_process_group_backend(kwargs["backend"])
            return original(*args, **kwargs)

        return wrapper

    _replace(dist, "init_process_group", with_backend)
    _replace(dist.distributed_c10d, "init_process_group", with_backend)

    def new_group(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if "backend" in kwargs:
                kwargs["backend"] = map_process_group_backend(kwargs["backend"])
            elif len(args) >= 3:
                args = (*args[:2], map_process_group_backend(args[2]), *args[3:])
            return original(*args, **kwargs)

        return wrapper

    _replace(dist, "new_group", new_group)
    _replace(dist.distributed_c10d, "new_group", new_group)


def _openreg_device(device: Any) -> torch.device:
    from torch._utils import _get_device_index

    return torch.device(BACKEND, _get_device_index(map_device(device), optional=True))


# [doc:patch-data-parallel]
def patch_data_parallel() -> None:
    """``torch.nn.DataParallel`` across openreg devices (the HF Trainer uses it).

    DataParallel moves data with ``torch.nn.parallel.comm``, whose scatter,
    gather and broadcast are CUDA kernels (``torch._C._scatter``, ...) absent
    from other builds. Here they are device-to-device copies; the reductions
    (``reduce_add``) are already copies and additions. ``src_device_obj`` is
    mapped, so DataParallel's check that the module lives there passes.
    """
    from torch.nn.parallel import comm

    def broadcast_coalesced(tensors: Any, devices: Any, buffer_size: int = 0) -> list:
        targets = [_openreg_device(d) for d in devices]
        return [[t.to(d, non_blocking=True) for t in tensors] for d in targets]

    def broadcast(tensor: Any, devices: Any = None, *, out: Any = None) -> tuple:
        if out is not None:
            for o in out:
                o.copy_(tensor, non_blocking=True)
            return tuple(out)
        return tuple(tensor.to(_openreg_device(d), non_blocking=True) for d in devices)

    def scatter(
        tensor: Any,
        devices: Any = None,
        chunk_sizes: Any = None,
        dim: int = 0,
        streams: Any = None,
        *,
        out: Any = None,
    ) -> tuple:
        if out is not None:
            chunks = tensor.split([o.size(dim) for o in out], dim)
            for o, chunk in zip(out, chunks, strict=True):
                o.copy_(chunk, non_blocking=True)
            return tuple(out)
        if chunk_sizes:
            chunks = tensor.split(list(chunk_sizes), dim)
        else:
            chunks = tensor.chunk(len(devices), dim)
        outputs = []
        for i, (chunk, d) in enumerate(zip(chunks, devices, strict=True)):
            stream = streams[i] if streams else None
            with torch.openreg.stream(stream):
                outputs.append(chunk.to(_openreg_device(d), non_blocking=True).contiguous())
        return tuple(outputs)

    def gather(tensors: Any, dim: int = 0, destination: Any = None, *, out: Any = None) -> Any:
        if out is not None:
            return torch.cat(list(tensors), dim, out=out)
        target = torch.device("cpu") if destination == -1 else _openreg_device(destination)
        return torch.cat([t.to(target, non_blocking=True) for t in tensors], dim)
        # [/doc:patch-data-parallel]

    for name, replacement in (
        ("broadcast_coalesced", broadcast_coalesced),
        ("broadcast", broadcast),
        ("scatter", scatter),
        ("gather", gather),
    ):
        if not hasattr(torch._C, f"_{name}"):  # a build without CUDA's kernels
            _replace(comm, name, lambda original, replacement=replacement: replacement)

    # reduce_add asks NCCL first (warning that this build has none): openreg has none.
    comm.nccl = types.SimpleNamespace(is_available=lambda tensors: False)

    def dp_init(original: Any) -> Any:
        def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(self, *args, **kwargs)
            self.src_device_obj = map_device(self.src_device_obj)

        return __init__

    _replace(torch.nn.DataParallel, "__init__", dp_init)
