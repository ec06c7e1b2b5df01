"""openreg tensors between processes (``torch.multiprocessing``), like CUDA IPC.

PyTorch's reducers (``torch/multiprocessing/reductions.py``) share CUDA
tensors through CUDA IPC handles and everything else through CPU shared
memory, which an openreg tensor cannot use. This module registers reducers
for ``torch.Tensor``, ``nn.Parameter`` and ``torch.UntypedStorage`` with
``ForkingPickler`` (the pickler of ``torch.multiprocessing`` queues, pipes,
pools and spawned processes' arguments): openreg tensors and storages are
shared here, everything else goes to PyTorch's reducers unchanged. Ordinary
``pickle``/``torch.save`` still copy the data.

What a receiver gets: a tensor on ``openreg:<same index>`` whose storage is
the sender's device memory, mapped into the receiver (see
``csrc/memory/OpenRegIpc.h`` and ``orIpcOpenMemHandle`` in
``runtime/include/openreg.h``). The rules, the same as CUDA's:

- The sender synchronizes the tensor's device when it pickles it, so the
  receiver sees every write queued before ``put()``.
- After that, each side finishes its own device work on the tensor
  (``torch.openreg.synchronize()``) before telling the other side by host
  means (a queue, an ``Event``); then the other side's next operations see
  the writes.
- The sender's block is not reused until every receiver has dropped the
  tensor (or exited) and the sender has dropped it too; the sender returns
  such blocks to its cache on its next shared-tensor deletion, when an
  allocation would otherwise run out of memory, or on
  ``torch.openreg.ipc_collect()``.
- A received tensor cannot be sent on (send a ``clone()``); its storage
  cannot be resized.

What cannot be shared fails clearly, never with a hang: the sender raises at
``put()`` where pickling happens there (``SimpleQueue``, ``Pipe``, pool
arguments); a ``multiprocessing.Queue`` pickles in a background feeder
thread, where an exception would only be printed and the receiver would wait
forever, so there the sender warns and the receiver's ``get()`` raises the
error instead.
"""

import threading
import warnings
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing import reductions as _torch_reductions

from torch_openreg import _C

__all__ = ["reduce_storage", "reduce_tensor"]

_torch_reduce_tensor = _torch_reductions.reduce_tensor
_torch_reduce_storage = _torch_reductions.reduce_storage


def _cache_key(share: tuple) -> tuple:
    # (segment handle, offset in the segment) names a storage, as for CUDA.
    return ("openreg", share[1], share[2])


# [doc:ipc-share]
def _share(tensor: torch.Tensor) -> tuple:
    """Shares the storage of ``tensor`` (an openreg tensor) with whoever
    unpickles the result: the fields of ``IpcShare`` (OpenRegIpc.h)."""
    # Writes queued before the put() must be visible to the receiver.
    torch.openreg.synchronize(tensor.device.index)
    share = _C._ipc_share(tensor)
    # The sender's own get() of the tensor finds the storage itself.
    _torch_reductions.shared_cache[_cache_key(share)] = _torch_reductions.StorageWeakRef(
        tensor.untyped_storage()
    )
    return share


def _rebuild_storage(share: tuple) -> torch.UntypedStorage:
    """The receiver's storage: the sender's device memory, mapped here."""
    try:
        torch.openreg._lazy_init()  # a forked child gets the fork error here
    except Exception:
        _C._ipc_release(share)  # give the send back (no device needed)
        raise
    key = _cache_key(share)
    storage = _torch_reductions.storage_from_cache(torch.UntypedStorage, key)
    if storage is not None:
        _C._ipc_release(share)  # this process holds the storage already
        return storage
    storage = _C._ipc_open(share).untyped_storage()
    _torch_reductions.shared_cache[key] = _torch_reductions.StorageWeakRef(storage)
    return storage


# [/doc:ipc-share]


def _rebuild_tensor(
    cls: type,
    share: tuple | None,
    device: int,
    dtype: torch.dtype,
    storage_offset: int,
    size: torch.Size,
    stride: tuple[int, ...],
    requires_grad: bool,
) -> torch.Tensor:
    if share is None:
        storage = torch.UntypedStorage(0, device=torch.device("openreg", device))
    else:
        storage = _rebuild_storage(share)
    # Straight on the untyped storage: a TypedStorage would print its
    # deprecation warning in the receiver.
    t = torch.empty((0,), dtype=dtype, device=storage.device)
    t.set_(storage, storage_offset, size, stride)
    if cls is torch.nn.parameter.Parameter:
        # Through the constructor: integer Parameters need requires_grad=False.
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _rebuild_empty_storage(device: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device=torch.device("openreg", device))


def _raise_sharing_error(message: str) -> None:
    raise RuntimeError(f"openreg: the sending process could not share this object: {message}")


# [doc:ipc-refuse]
def _refuse(error: Exception) -> tuple:
    """What to do when an openreg object cannot be shared."""
    if threading.current_thread().name != "QueueFeederThread":
        raise error  # pickled inside put()/send(): the caller sees it
    warnings.warn(
        f"openreg: an object put on a multiprocessing queue cannot be shared "
        f"({error}); the receiver's get() raises this error",
        RuntimeWarning,
        stacklevel=2,
    )
    return (_raise_sharing_error, (f"{type(error).__name__}: {error}",))


# [/doc:ipc-refuse]


def reduce_tensor(tensor: torch.Tensor) -> tuple:
    """ForkingPickler reducer of torch.Tensor and nn.Parameter."""
    if tensor.device.type != "openreg" or tensor.layout != torch.strided or tensor.is_nested:
        return _torch_reduce_tensor(tensor)
    try:
        if tensor.requires_grad and not tensor.is_leaf:
            raise RuntimeError(
                "Cowardly refusing to serialize non-leaf tensor which requires_grad, "
                "since autograd does not support crossing process boundaries.  "
                "If you just want to transfer the data, call detach() on the tensor "
                "before serializing (e.g., putting it on the queue)."
            )
        torch.utils.hooks.warn_if_has_hooks(tensor)
        share = _share(tensor) if tensor.untyped_storage().nbytes() > 0 else None
    except Exception as e:
        return _refuse(e)
    return (
        _rebuild_tensor,
        (
            type(tensor),
            share,
            tensor.device.index,
            tensor.dtype,
            tensor.storage_offset(),
            tensor.size(),
            tensor.stride(),
            tensor.requires_grad,
        ),
    )


def reduce_storage(storage: Any) -> tuple:
    """ForkingPickler reducer of torch.UntypedStorage (typed storages reduce
    to their untyped storage through PyTorch's reducer)."""
    if storage.device.type != "openreg":
        return _torch_reduce_storage(storage)
    if storage.nbytes() == 0:
        return (_rebuild_empty_storage, (storage.device.index,))
    try:
        as_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        share = _share(as_bytes)
    except Exception as e:
        return _refuse(e)
    return (_rebuild_storage, (share,))


def _register() -> None:
    """Installs the reducers (after torch.multiprocessing installed its own)."""
    ForkingPickler.register(torch.Tensor, reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)
