"""The CUDA migration shim: code written for CUDA runs on openreg unchanged.

``activate()`` is what ``import torch_openreg.transfer_to_openreg`` and
``python -m torch_openreg.run script.py`` do. It maps

- ``"cuda"``/``"cuda:N"`` strings and ``torch.device("cuda")`` objects in every
  torch function and Tensor method (``devices.CudaToOpenRegMode``), so
  factories, ``.to()``, ``.cuda()``, ``Module.cuda()``, ``pin_memory`` and
  ``non_blocking`` copies land on openreg;
- ``torch.cuda`` to a stand-in built from the parity table
  (``cuda_module.py``, rows in ``torch_openreg/api_parity.py``);
- autocast, GradScaler, ``torch.load``, ``torch.set_default_device``,
  ``torch.Generator(device="cuda")``, ``torch.distributed``'s ``"nccl"``
  (``patches.py``).

It prints one line on stderr, and sets ``OPENREG_CUDA_SHIM=1`` so that
processes started from this one (spawned DataLoader workers,
``torch.multiprocessing.spawn``, subprocesses running Python) activate it at
``import torch`` as well (through the autoload entry point).
See docs/migration.md for what is mapped and what cannot be.
"""

import os
import sys
import threading

import torch

from . import cuda_module, devices, patches
from .cuda_module import CudaApiNotSupportedError
from .devices import map_device

__all__ = ["CudaApiNotSupportedError", "activate", "is_active", "map_device"]

ENV_VAR = "OPENREG_CUDA_SHIM"
# 1: no notice. Set once the notice is printed, so processes started from this one stay quiet.
_NOTICE_VAR = "OPENREG_CUDA_SHIM_QUIET"

_lock = threading.Lock()
_active = False


def is_active() -> bool:
    """True once ``activate()`` ran in this process."""
    return _active


# [doc:activate]
def activate() -> None:
    """Maps CUDA to openreg for the rest of the process (idempotent)."""
    global _active
    with _lock:
        if _active:
            return
        torch.openreg  # noqa: B018  (the backend is registered: torch_openreg imported)
        stand_in = cuda_module.build()
        torch.cuda = stand_in
        sys.modules["torch.cuda"] = stand_in
        for name in ("amp", "memory", "random", "streams"):
            sys.modules[f"torch.cuda.{name}"] = getattr(stand_in, name)
        patches.patch_amp()
        patches.patch_default_device()
        patches.patch_generator()
        patches.patch_serialization()
        patches.patch_distributed()
        patches.patch_data_parallel()
        patches.fold_in_dynamo()
        devices.install_thread_hook()
        devices.push_mode()
        _active = True
        os.environ[ENV_VAR] = "1"
        if not os.environ.get(_NOTICE_VAR):
            os.environ[_NOTICE_VAR] = "1"
            print(
                "torch_openreg: CUDA is mapped to openreg (torch_openreg.transfer_to_openreg): "
                '"cuda" devices, .cuda(), torch.cuda.*, autocast and GradScaler run on the '
                "simulated openreg device; see docs/migration.md",
                file=sys.stderr,
            )
            # [/doc:activate]
