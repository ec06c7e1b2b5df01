"""Device and pinned memory of openreg, shaped like torch.cuda.memory.

The numbers come from the caching allocator in csrc/memory; the statistics
have the keys and meanings of ``torch.cuda.memory_stats`` and are the same
numbers ``torch.accelerator`` reports.
"""

import contextlib
import pickle
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from torch_openreg import _C

__all__ = [
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "caching_allocator_disabled",
    "caching_allocator_enable",
    "empty_cache",
    "get_allocator_backend",
    "get_per_process_memory_fraction",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "ipc_collect",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
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


def ipc_collect() -> None:
    """Returns to the caching allocator the blocks of tensors this process
    shared with other processes (``torch.multiprocessing``) and dropped,
    once every receiver has released them or exited, as
    ``torch.cuda.ipc_collect``. It also happens by itself when another
    shared tensor dies or an allocation would run out of memory."""
    _C._ipc_collect()


def memory_stats(device: Any = None) -> "OrderedDict[str, Any]":
    """Allocator statistics, flattened as ``torch.cuda.memory_stats``."""
    if not _initialized():
        return OrderedDict()
    return torch.accelerator.memory_stats(_index(device))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """memory_stats as nested dicts: ``{"allocated_bytes": {"all": {"current": ...}}}``."""
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


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


# The pre-"reserved" names torch.cuda still has, with its FutureWarnings.


def memory_cached(device: Any = None) -> int:
    """Deprecated; see memory_reserved."""
    warnings.warn(
        "torch.openreg.memory_cached has been renamed to torch.openreg.memory_reserved",
        FutureWarning,
        stacklevel=2,
    )
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated; see max_memory_reserved."""
    warnings.warn(
        "torch.openreg.max_memory_cached has been renamed to torch.openreg.max_memory_reserved",
        FutureWarning,
        stacklevel=2,
    )
    return max_memory_reserved(device)


def reset_max_memory_allocated(device: Any = None) -> None:
    """Deprecated; resets every peak statistic (see reset_peak_memory_stats)."""
    warnings.warn(
        "torch.openreg.reset_max_memory_allocated now calls "
        "torch.openreg.reset_peak_memory_stats, which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated; resets every peak statistic (see reset_peak_memory_stats)."""
    warnings.warn(
        "torch.openreg.reset_max_memory_cached now calls "
        "torch.openreg.reset_peak_memory_stats, which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


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


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """Every segment of every device with its blocks (torch.cuda's shape).

    While ``_record_memory_history`` records, each block carries the stack
    that allocated it (``frames``). openreg has no memory pools besides the
    default one, so ``mempool_id`` must be None.
    """
    if mempool_id is not None:
        raise NotImplementedError(
            f"openreg has no memory pools besides the default one, got mempool_id={mempool_id!r}"
        )
    return _C._memory_snapshot_full()["segments"]


# [doc:memory-history]
def _record_memory_history(
    enabled: str | bool | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
    **legacy: Any,
) -> None:
    """Records the allocator's actions and the stacks behind them, for
    ``_snapshot()`` (the arguments of ``torch.cuda.memory._record_memory_history``).

    ``enabled``: None stops recording, "state" keeps the stack of each live
    block, "all" also keeps the last ``max_entries`` actions of each device
    (alloc, free_requested, free_completed, segment_alloc, segment_free, oom).
    ``context`` says which actions get a stack, ``stacks`` whether C++ frames
    join the Python ones ("all"). Every device records (``device`` is
    accepted, as on CUDA, where recording is process-wide too). The legacy
    boolean form (``enabled=True, trace_alloc_max_entries=..., ...``) is
    accepted. What openreg does not record raises: compile contexts, global
    annotations, skipped actions.
    """
    if isinstance(enabled, bool):  # torch.cuda.memory's legacy spelling
        record_context = legacy.pop("record_context", True)
        max_entries = legacy.pop("trace_alloc_max_entries", 1)
        with_trace_context = legacy.pop("trace_alloc_record_context", False)
        cpp = legacy.pop("record_context_cpp", False)
        context = ("alloc" if with_trace_context else "state") if record_context else None
        stacks = "all" if cpp else "python"
        enabled = ("all" if max_entries > 1 else "state") if enabled else None
    if legacy:
        raise TypeError(f"_record_memory_history() got unexpected arguments {sorted(legacy)}")
    if compile_context or global_record_annotations or skip_actions:
        raise NotImplementedError(
            "openreg's allocator history has no compile contexts, annotations or skipped "
            "actions (compile_context, global_record_annotations, skip_actions)"
        )
    _C._record_memory_history(enabled, context, stacks, max_entries, clear_history)


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The state of the allocator and its recorded history, in the shape of
    ``torch.cuda.memory._snapshot()``: ``segments`` (each block with the
    stack that allocated it) and ``device_traces`` (one list per device), which
    PyTorch's memory viewer (``torch.cuda._memory_viz``, pytorch.org/memory_viz)
    reads."""
    if augment_with_fx_traces:
        raise NotImplementedError("openreg's snapshot has no FX trace augmentation")
    return _C._memory_snapshot_full()


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False):
    """Pickles ``_snapshot()`` to ``filename`` (for pytorch.org/memory_viz)."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


# [/doc:memory-history]


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """Statistics of the pinned host memory allocator, as nested dicts."""
    return _C._host_memory_stats()


def host_memory_stats() -> "OrderedDict[str, Any]":
    """Statistics of the pinned host memory allocator, flattened and sorted
    (``"allocations.current"``, ``"num_host_alloc"``, ...) as torch.cuda's."""
    flat: list[tuple[str, Any]] = []

    def add(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                add(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, obj))

    add("", host_memory_stats_as_nested_dict())
    return OrderedDict(sorted(flat))


def reset_peak_host_memory_stats() -> None:
    _C._host_reset_peak_stats()


def reset_accumulated_host_memory_stats() -> None:
    _C._host_reset_accumulated_stats()


def get_allocator_backend() -> str:
    """``"native"``: openreg has one allocator, the caching allocator in csrc/memory."""
    return "native"


def caching_allocator_enable(value: bool = True) -> None:
    """The caching allocator is always on; turning it off is not implemented
    (it would have to hand every freed block back to the device at once)."""
    if not value:
        raise NotImplementedError("openreg cannot disable its caching allocator")


@contextlib.contextmanager
def caching_allocator_disabled() -> Iterator[None]:
    """Not implemented on openreg (see caching_allocator_enable): raises on entry."""
    caching_allocator_enable(False)
    yield


# Raw blocks handed out by caching_allocator_alloc: the byte tensor that owns
# each one, by address. Deleting the tensor returns the block to the cache.
_raw_blocks: dict[int, torch.Tensor] = {}
_raw_blocks_lock = threading.Lock()


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocates ``size`` bytes from the caching allocator; returns the address.

    The block belongs to ``stream`` (default: the device's current stream),
    as a tensor allocated under that stream would. Release it with
    caching_allocator_delete. ``stream`` is a torch.Stream on the same
    openreg device (openreg has no raw stream handles to pass as int).
    """
    from . import _lazy_init
    from . import device as device_ctx
    from .streams import current_stream
    from .streams import stream as stream_ctx

    _lazy_init()
    index = _index(device)
    if stream is None:
        stream = current_stream(index)
    if not isinstance(stream, torch.Stream):
        raise TypeError(
            "Invalid type for stream argument, must be a `torch.Stream` on openreg, "
            f"got {type(stream).__name__}"
        )
    if stream.device != torch.device("openreg", index):
        raise ValueError(f"stream {stream} is not on openreg:{index}")
    if size == 0:
        return 0
    with device_ctx(index), stream_ctx(stream):
        block = torch.empty(size, dtype=torch.uint8, device=f"openreg:{index}")
    ptr = block.data_ptr()
    with _raw_blocks_lock:
        _raw_blocks[ptr] = block
    return ptr


def caching_allocator_delete(mem_ptr: int) -> None:
    """Returns a block from caching_allocator_alloc to the caching allocator."""
    if mem_ptr == 0:
        return
    with _raw_blocks_lock:
        block = _raw_blocks.pop(mem_ptr, None)
    if block is None:
        raise RuntimeError(
            f"invalid device pointer: {mem_ptr:#x} (not from caching_allocator_alloc)"
        )
    del block


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
