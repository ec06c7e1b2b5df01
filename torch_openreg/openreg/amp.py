"""Automatic mixed precision for openreg (the device module's AMP functions).

``torch.autocast("openreg", dtype=...)`` uses the AutocastPrivateUse1 kernels
registered in csrc/amp (CUDA's cast policy); ``torch.amp.GradScaler("openreg")``
works with the device's ``_amp_foreach_non_finite_check_and_unscale_`` and
``_amp_update_scale_`` (through the fallback).
"""

import functools
import warnings
from typing import Any

import torch

# What PyTorch's autocast asks the device module for (re-exported by torch.openreg).
DEVICE_MODULE_API = [
    "get_amp_supported_dtype",
    "get_autocast_dtype",
    "is_autocast_enabled",
    "set_autocast_dtype",
    "set_autocast_enabled",
]

__all__ = [
    *DEVICE_MODULE_API,
    # torch.cuda.amp's names: deprecated spellings of torch.amp's classes and
    # decorators for "openreg", warning as torch.cuda.amp's do.
    "GradScaler",
    "amp_definitely_not_available",
    "autocast",
    "custom_bwd",
    "custom_fwd",
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


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"`torch.openreg.amp.{old}(args...)` is deprecated, as torch.cuda.amp's is. "
        f"Please use `{new}` instead.",
        FutureWarning,
        stacklevel=3,
    )


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("openreg", ...)`` (deprecated spelling, as torch.cuda.amp.autocast)."""

    def __init__(
        self,
        enabled: bool = True,
        dtype: torch.dtype = torch.float16,
        cache_enabled: bool = True,
    ) -> None:
        _deprecated("autocast", "torch.amp.autocast('openreg', args...)")
        super().__init__("openreg", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("openreg", ...)`` (deprecated spelling, as torch.cuda.amp's)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        _deprecated("GradScaler", "torch.amp.GradScaler('openreg', args...)")
        super().__init__(
            "openreg",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


def custom_fwd(fwd: Any = None, *, cast_inputs: torch.dtype | None = None) -> Any:
    """``torch.amp.custom_fwd(..., device_type="openreg")`` (deprecated spelling)."""
    _deprecated("custom_fwd", "torch.amp.custom_fwd(args..., device_type='openreg')")
    return functools.partial(torch.amp.custom_fwd, device_type="openreg")(
        fwd=fwd, cast_inputs=cast_inputs
    )


def custom_bwd(bwd: Any) -> Any:
    """``torch.amp.custom_bwd(..., device_type="openreg")`` (deprecated spelling)."""
    _deprecated("custom_bwd", "torch.amp.custom_bwd(args..., device_type='openreg')")
    return functools.partial(torch.amp.custom_bwd, device_type="openreg")(bwd)


def amp_definitely_not_available() -> bool:
    """True if no openreg device exists (then autocast cannot run on one)."""
    from . import is_available

    return not is_available()
