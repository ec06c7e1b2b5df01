"""Tensors over existing device memory, and tags in a tensor's backend metadata.

``from_blob`` wraps openreg memory something else owns, without a copy (the
Python face of ``at::from_blob``; see ``csrc/python/Module.cpp``).

Tags live in the openreg backend metadata of a tensor (``c10::BackendMeta``).
They follow PyTorch's rules for backend metadata: shallow copies
(``detach()``, ``.data``, ``nn.Parameter``) keep them, new tensors (``clone()``,
``to()``, views) start without them, and ``torch.save``/``torch.load`` carry
them (also with ``weights_only=True``). Loading onto the CPU drops them.
See ``csrc/serialization/OpenRegBackendMeta.cpp``.
"""

from collections.abc import Sequence
from typing import Any

import torch

from torch_openreg import _C

__all__ = ["from_blob", "set_tensor_tag", "tensor_tags"]


def from_blob(
    data_ptr: int,
    size: Sequence[int],
    *,
    dtype: torch.dtype,
    stride: Sequence[int] | None = None,
    storage_offset: int = 0,
    owner: Any = None,
) -> torch.Tensor:
    """A tensor over openreg device memory at ``data_ptr``, without copying.

    The device comes from the pointer. ``owner`` (for example the tensor or
    object that owns the memory) is kept alive as long as the new tensor's
    storage. The extent the sizes and strides reach must lie inside the
    driver allocation that holds ``data_ptr``; host pointers are refused.
    """
    return _C._from_blob(
        int(data_ptr),
        list(size),
        None if stride is None else list(stride),
        dtype,
        int(storage_offset),
        owner,
    )


def tensor_tags(tensor: torch.Tensor) -> dict[str, bool]:
    """The tags of an openreg tensor, ``{}`` if it has none."""
    return dict(_C._tensor_tags(tensor))


def set_tensor_tag(tensor: torch.Tensor, name: str, value: bool = True) -> None:
    """Sets the boolean tag ``name`` on an openreg tensor."""
    _C._set_tensor_tag(tensor, name, bool(value))
