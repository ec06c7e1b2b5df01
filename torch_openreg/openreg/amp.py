"""Automatic mixed precision for openreg (the device module's AMP functions).

``torch.autocast("openreg", dtype=...)`` uses the AutocastPrivateUse1 kernels
registered in csrc/amp (CUDA's cast policy); ``torch.amp.GradScaler("openreg")``
works with the device's ``_amp_foreach_non_finite_check_and_unscale_`` and
``_amp_update_scale_`` (through the fallback).
"""

import torch

__all__ = [
    "get_amp_supported_dtype",
    "get_autocast_dtype",
    "is_autocast_enabled",
    "set_autocast_dtype",
    "set_autocast_enabled",
]


# [doc:amp-dtypes]
def get_amp_supported_dtype() -> list[torch.dtype]:
    """Lower-precision dtypes autocast may use on openreg."""
    return [torch.float16, torch.bfloat16]
    # [/doc:amp-dtypes]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("openreg")


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("openreg", enabled)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("openreg")


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("openreg", dtype)
