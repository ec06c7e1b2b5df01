"""Device and pinned memory of openreg, shaped like torch.cuda.memory.

The numbers come from the caching allocator in csrc/memory; the statistics
have the keys and meanings of ``torch.cuda.memory_stats`` and are the same
numbers ``torch.accelerator`` reports.
"""

from collections import OrderedDict
from typing import Any

import torch

from torch_openreg import _C

__all__ = [
    "empty_cache",
    "get_per_process_memory_fraction",
    "host_memory_stats",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]


def _index(device: Any) -> int:
    from . import _get_device_index

    return _get_device_index(device, optional=True)


def _initialized() -> bool:
    from . import is_initialized

    return is_initialized()


def empty_cache() -> None:
    """Returns the memory of unused cached blocks to the system."""
    if _initialized():
        torch.accelerator.empty_cache()


def memory_stats(device: Any = None) -> "OrderedDict[str, Any]":
    """Allocator statistics, flattened as ``torch.cuda.memory_stats``."""
    if not _initialized():
        return OrderedDict()
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device: Any = None) -> int:
    """Bytes occupied by tensors on the device."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Bytes held by the caching allocator (allocated plus cached)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    if _initialized():
        torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    if _initialized():
        torch.accelerator.reset_accumulated_memory_stats(_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device, as the driver sees them."""
    from . import _lazy_init

    _lazy_init()
    return torch.accelerator.get_memory_info(_index(device))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Caps what this process may reserve on a device to fraction * capacity."""
    from . import _lazy_init

    _lazy_init()
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    _C._set_memory_fraction(fraction, _index(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    from . import _lazy_init

    _lazy_init()
    return _C._get_memory_fraction(_index(device))


def memory_snapshot() -> list[dict[str, Any]]:
    """Every segment of every device with its blocks (torch.cuda's shape)."""
    return _C._memory_snapshot()


def host_memory_stats() -> dict[str, Any]:
    """Statistics of the pinned host memory allocator."""
    return _C._host_memory_stats()


def reset_peak_host_memory_stats() -> None:
    _C._host_reset_peak_stats()


def reset_accumulated_host_memory_stats() -> None:
    _C._host_reset_accumulated_stats()


def _format_size(n: int) -> str:
    for unit in ("B ", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:6d} {unit}" if unit == "B " else f"{n:6.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator statistics of a device."""
    stats = memory_stats(device)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Device reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Device reserved segments", "segment", False),
        ("Non-releasable allocs", "inactive_split", False),
    ]
    pools = ["all"] if abbreviated else ["all", "large_pool", "small_pool"]
    index = _index(device) if _initialized() else 0
    width = 80
    lines = [
        "=" * width,
        f" openreg memory summary, device {index}".ljust(width),
        "-" * width,
        f"{'Metric':<32}{'Cur Usage':>12}{'Peak Usage':>12}{'Tot Alloc':>12}{'Tot Freed':>12}",
        "-" * width,
    ]
    for title, key, is_bytes in rows:
        for pool in pools:
            label = f"{title}" if pool == "all" else f"  from {pool.replace('_', ' ')}"
            values = [
                stats.get(f"{key}.{pool}.{f}", 0) for f in ("current", "peak", "allocated", "freed")
            ]
            cells = [_format_size(v) if is_bytes else f"{v:10d}" for v in values]
            lines.append(f"{label:<32}" + "".join(f"{c:>12}" for c in cells))
        lines.append("-" * width)
    lines.append(
        f"{'OOMs':<20}{stats.get('num_ooms', 0):>8}   {'alloc retries':<20}"
        f"{stats.get('num_alloc_retries', 0):>8}"
    )
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
