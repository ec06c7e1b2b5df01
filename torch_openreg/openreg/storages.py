"""Legacy typed storage classes (``torch.openreg.FloatStorage``, ...), as ``torch.cuda`` has.

``Tensor.storage_type()`` and ``TypedStorage`` look the class up by name in
the device's module; without them it answers ``None`` for openreg tensors.
Like CUDA's, they only wrap device memory: creating one from a host buffer
or in shared memory is refused.
"""

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal


class _OpenRegLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: not available for openreg storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: not available for openreg storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: not available for openreg storage")


_DTYPES = {
    "Byte": torch.uint8,
    "Double": torch.double,
    "Float": torch.float,
    "Half": torch.half,
    "Long": torch.long,
    "Int": torch.int,
    "Short": torch.short,
    "Char": torch.int8,
    "Bool": torch.bool,
    "BFloat16": torch.bfloat16,
    "ComplexDouble": torch.cdouble,
    "ComplexFloat": torch.cfloat,
}


def _make(name: str, dtype: torch.dtype) -> type:
    def _dtype_of(cls):
        return dtype

    def dtype_prop(cls):
        _warn_typed_storage_removal()
        return dtype

    cls = type(
        f"{name}Storage",
        (_OpenRegLegacyStorage,),
        {"dtype": classproperty(dtype_prop), "_dtype": classproperty(_dtype_of)},
    )
    # TypedStorage finds the device from the module name ("...openreg").
    cls.__module__ = "torch.openreg"
    cls.__qualname__ = cls.__name__
    return cls


__all__ = [f"{name}Storage" for name in _DTYPES]
globals().update({f"{name}Storage": _make(name, dtype) for name, dtype in _DTYPES.items()})
