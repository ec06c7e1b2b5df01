"""torch.distributed on openreg: the ``orccl`` c10d backend, running on Gloo.

``orccl`` is a C++ ``c10d::Backend`` (``csrc/distributed/``) that hands Gloo
CPU tensors aliasing openreg device memory through the kernel view, ordered
with the current openreg stream the way NCCL is ordered with CUDA streams.
CPU tensors go to the same Gloo process group directly, so one backend serves
both device types.

Backend strings (all give openreg tensors to ``orccl``):

- ``init_process_group()`` (no backend, openreg being the accelerator):
  ``cpu:gloo,openreg:orccl``;
- ``init_process_group("orccl")``: ``orccl`` for CPU and openreg tensors;
- ``init_process_group("gloo")``: Gloo for CPU tensors, ``orccl`` (which is
  Gloo over device memory) for openreg tensors;
- ``"cpu:gloo,openreg:orccl"`` or ``"cpu:gloo,openreg:gloo"`` explicitly.
"""

import torch
import torch.distributed as dist

from torch_openreg import _C

__all__ = ["BACKEND", "create_backend"]

BACKEND = "orccl"
# The same backend for openreg tensors only, as NCCL serves CUDA tensors only:
# what the CUDA migration shim gives for "nccl" (a CPU tensor passed to its
# collectives raises "No backend type associated with device type cpu", as
# with NCCL).
DEVICE_ONLY_BACKEND = "orccl_device"
_DEVICE = "openreg"


# [doc:c10d-creator]
def create_backend(store, rank: int, world_size: int, timeout):
    """The creator c10d calls for each process group that uses ``orccl``.

    It makes a private Gloo process group on its own store prefix (so it never
    shares tags with a Gloo group for CPU tensors in the same process group)
    and wraps it in the C++ backend.
    """
    from torch.distributed import PrefixStore, ProcessGroupGloo

    gloo = ProcessGroupGloo(PrefixStore(f"{BACKEND}/", store), rank, world_size, timeout)
    return _C._create_orccl_backend(gloo, rank, world_size, timeout)


def _register_backend() -> None:
    if BACKEND.upper() in dist.Backend._plugins:
        return
    # devices: "openreg" makes orccl the default backend of openreg tensors
    # (Backend.default_device_backend_map); "cpu" lets init_process_group("orccl")
    # serve CPU tensors too (the C++ backend hands them to Gloo unchanged).
    dist.Backend.register_backend(BACKEND, create_backend, devices=["cpu", _DEVICE])
    dist.Backend.register_backend(DEVICE_ONLY_BACKEND, create_backend, devices=[_DEVICE])
    # orccl stays the default backend of openreg tensors (registering the
    # second name made it that).
    dist.Backend.default_device_backend_map[_DEVICE] = BACKEND


# [/doc:c10d-creator]


# [doc:c10d-backend-config]
def _fix_backend_config() -> None:
    """Completes the device -> backend map of every new process group.

    PyTorch 2.13 maps ``init_process_group()`` without a backend to the
    accelerator's backend only (``{"openreg": "orccl"}``), so CPU tensors in
    that group would have no backend; openreg adds Gloo for them, giving the
    ``cpu:gloo,openreg:orccl`` pair. A map that names Gloo for openreg
    tensors, or a plain ``"gloo"`` (whose device list has no openreg), gets
    ``orccl``, which is Gloo over device memory. A device that is not a known
    device type is refused with a message naming it.
    """
    config_cls = dist.distributed_c10d.BackendConfig
    original = config_cls.__init__
    if getattr(original, "_openreg_fixed", False):
        return

    def __init__(self, backend):  # noqa: N807
        original(self, backend)
        mapping = self.device_backend_map
        for device in mapping:
            try:
                torch.device(device)
            except RuntimeError as e:
                raise ValueError(
                    f"init_process_group: unknown device type {device!r} in backend "
                    f"{str(backend)!r} (known: cpu, {_DEVICE}, ...): {e}"
                ) from None
        if str(backend) == dist.Backend.UNDEFINED and _DEVICE in mapping:
            mapping.setdefault("cpu", dist.Backend(dist.Backend.GLOO))
        if mapping.get(_DEVICE) == dist.Backend.GLOO:
            mapping[_DEVICE] = dist.Backend(BACKEND)
        if str(backend) == dist.Backend.GLOO:
            mapping[_DEVICE] = dist.Backend(BACKEND)
            if not torch.cuda.is_available():
                mapping.pop("cuda", None)  # no second, unused Gloo context

    __init__._openreg_fixed = True
    config_cls.__init__ = __init__


# [/doc:c10d-backend-config]


def _register() -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        return
    _register_backend()
    _fix_backend_config()
