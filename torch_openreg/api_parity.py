"""The torch.cuda -> torch.openreg parity table: one source for the docs, the tests and the shim.

Every public name of ``torch.cuda`` (its ``__all__``, which contains the
public names of torch.cuda.memory, .random, .streams and .graphs) and of
``torch.cuda.amp`` has one row. tests/test_api_parity.py walks these rows, and
checks that docs/api_parity.md is exactly what ``render_markdown()`` prints.
The migration shim (``torch_openreg.migration``, behind
``torch_openreg.transfer_to_openreg``) builds its ``torch.cuda`` stand-in from
the same rows: a ``same`` or ``partial`` name forwards to its ``torch.openreg``
counterpart, every other status raises an error quoting the row's notes.
After editing a row, regenerate the page:

    .venv/bin/python -m torch_openreg.api_parity > docs/api_parity.md

Statuses:

- ``same``: ``torch.openreg.<openreg>`` exists, takes the same parameters
  (names, kinds, defaults; a default of ``"cuda"`` reads ``"openreg"``) and
  means the same; the test calls it and checks the values.
- ``partial``: the counterpart exists with the same signature, but some
  argument values raise ``NotImplementedError`` (named in the notes) instead
  of pretending to work.
- ``cuda``: CUDA-specific (a CUDA library, tool or hardware sensor); openreg
  has no counterpart, by design.
- ``legacy``: a legacy typed tensor/storage class; PyTorch generates these
  for CPU and CUDA only, every other device uses ``dtype=`` and ``device=``.
- ``gap``: meaningful on any accelerator but not implemented by openreg yet;
  the test checks that torch.openreg does not have the name, so it cannot
  be half there.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    cuda: str  # the name under torch.cuda ("amp.autocast" for torch.cuda.amp)
    status: str  # same | partial | cuda | legacy | gap
    openreg: str  # the name under torch.openreg ("" when there is none)
    notes: str


def _same(name: str, notes: str, openreg: str | None = None) -> Row:
    return Row(name, "same", name if openreg is None else openreg, notes)


def _partial(name: str, notes: str) -> Row:
    return Row(name, "partial", name, notes)


def _cuda(name: str, reason: str) -> Row:
    return Row(name, "cuda", "", reason)


def _gap(name: str, reason: str) -> Row:
    return Row(name, "gap", "", reason)


STORAGE_DTYPES = (
    "BFloat16",
    "Bool",
    "Byte",
    "Char",
    "ComplexDouble",
    "ComplexFloat",
    "Double",
    "Float",
    "Half",
    "Int",
    "Long",
    "Short",
)

SECTIONS: list[tuple[str, list[Row]]] = [
    (
        "Device management and properties",
        [
            _same("is_available", "True when at least one device exists; never initialises"),
            _same("device_count", "`OPENREG_DEVICE_COUNT`, default 2"),
            _same("init", "initialises the runtime; calls queued before it run then"),
            _same("is_initialized", "False until first use, False again in a forked child"),
            _same("current_device", "per thread, as on CUDA"),
            _same("set_device", "a negative index is ignored, as on CUDA"),
            _same("device", "context manager; restores the previous device on exit"),
            _same("device_of", "context manager; no-op for a CPU tensor"),
            _same(
                "synchronize", "waits for every stream of the device; raises deferred kernel errors"
            ),
            _same(
                "get_device_properties",
                "fields `name`, `total_memory`, `major`, `minor`, `multi_processor_count` "
                "(the simulator has no warp size, L2 cache or PCI bus id)",
            ),
            _same("get_device_name", '`"openreg simulated device"`'),
            _same("get_device_capability", "`(major, minor)` of the properties: `(1, 0)`"),
            _same(
                "can_device_access_peer",
                "True for two different devices (copies go arena to arena), "
                "False for a device and itself, as `cudaDeviceCanAccessPeer`",
            ),
            _same("is_bf16_supported", "True: native bfloat16 kernels"),
            _same("is_tf32_supported", "False: float32 math is never done in TF32"),
            _same(
                "device_memory_used",
                "capacity minus free bytes as the runtime counts them (CUDA asks NVML)",
            ),
            _same("has_half", "True"),
            _same("default_generators", "one `torch.Generator` per device, filled at init"),
            _same(
                "DeferredCudaCallError",
                "raised by `init()` when a call queued before initialisation fails",
                openreg="DeferredOpenRegCallError",
            ),
            _same("get_sync_debug_mode", "0, 1 or 2 as set"),
            _same(
                "set_sync_debug_mode",
                "warns or raises on `Tensor.item()`, blocking copies to or from the CPU, "
                "`Stream.synchronize()` and the data-dependent operators CUDA reports "
                "(`nonzero`, boolean-mask indexing, `masked_select`, `unique`), naming the "
                "Python-level call and line",
            ),
            _same(
                "get_arch_list",
                "`[]`: no kernel is compiled for a device architecture, as a CPU-only "
                "PyTorch answers",
            ),
            _same("get_gencode_flags", '`""`, as a CPU-only PyTorch answers'),
            _cuda("check_error", "checks a `cudaError_t` code"),
            _cuda("cudart", "the CUDA runtime library handle"),
            _cuda("cudaStatus", "CUDA runtime status constants"),
            _cuda("CudaError", "wraps a `cudaError_t`; openreg raises `torch.AcceleratorError`"),
            _cuda("current_blas_handle", "cuBLAS handle"),
            _cuda("current_solver_handle", "cuSOLVER handle"),
            _cuda("has_magma", "MAGMA (GPU LAPACK) build flag"),
            _cuda("GreenContext", "CUDA green contexts (SM partitioning)"),
            _cuda("clock_rate", "NVML/amdsmi sensor"),
            _cuda("power_draw", "NVML/amdsmi sensor"),
            _cuda("temperature", "NVML/amdsmi sensor"),
            _cuda("utilization", "NVML/amdsmi sensor"),
            _cuda("memory_usage", "NVML/amdsmi sensor (memory controller busy time)"),
            _cuda("list_gpu_processes", "NVML process list"),
        ],
    ),
    (
        "Streams and events",
        [
            _same(
                "Stream",
                "`Stream(device=None, priority=0)`; a `torch.Stream` subclass with "
                "`query`, `synchronize`, `wait_event`, `wait_stream`, `record_event`, `priority`",
            ),
            _partial(
                "Event",
                "returns a `torch.Event` on openreg (record, query, synchronize, wait, "
                "elapsed_time); `interprocess=True` and `external=True` raise "
                "NotImplementedError (no IPC, no graph capture)",
            ),
            _same("StreamContext", "makes the stream and its device current, restores both"),
            _same("stream", "context manager over StreamContext; `None` is a no-op"),
            _same("current_stream", "per thread and device"),
            _same("default_stream", "stream id 0 of the device"),
            _same("set_stream", "makes a stream current for its device"),
            _same("is_current_stream_capturing", "always False: openreg has no graph capture"),
            _cuda("ExternalStream", "wraps a `cudaStream_t` made by another CUDA library"),
            _cuda(
                "get_stream_from_external", "wraps a `cudaStream_t` made by another CUDA library"
            ),
        ],
    ),
    (
        "Memory",
        [
            _same("memory_allocated", "bytes held by tensors (block sizes, rounded to 512)"),
            _same("max_memory_allocated", "peak of memory_allocated since the last reset"),
            _same("memory_reserved", "bytes the caching allocator holds (allocated + cached)"),
            _same("max_memory_reserved", "peak of memory_reserved"),
            _same(
                "memory_stats", "the same flat keys as CUDA (`allocated_bytes.all.current`, ...)"
            ),
            _same("memory_stats_as_nested_dict", "memory_stats as nested dicts"),
            _same("memory_summary", "a table of the statistics"),
            _same(
                "memory_snapshot",
                "segments with their blocks; no allocation history is recorded, so "
                "`include_traces` has nothing to add; a `mempool_id` raises "
                "NotImplementedError (no memory pools)",
            ),
            _same("reset_peak_memory_stats", "resets every `peak` value"),
            _same("reset_accumulated_memory_stats", "resets `allocated`/`freed` counters"),
            _same("empty_cache", "returns cached blocks; the runtime punches the pages out"),
            _same(
                "ipc_collect",
                "returns the blocks of tensors shared with other processes "
                "(`torch.multiprocessing`) once every receiver released them or exited "
                "([ipc.md](ipc.md))",
            ),
            _same("mem_get_info", "`(free, total)` of the device; total is the device capacity"),
            _same(
                "set_per_process_memory_fraction",
                "caps reservations at fraction * capacity; beyond it allocations raise "
                "`torch.OutOfMemoryError`",
            ),
            _same("get_per_process_memory_fraction", "the fraction set, 1.0 by default"),
            _same(
                "caching_allocator_alloc",
                "a raw block from the caching allocator on the given stream; "
                "`stream` is a `torch.Stream` (openreg has no raw stream pointers)",
            ),
            _same("caching_allocator_delete", "returns a block from caching_allocator_alloc"),
            _partial(
                "caching_allocator_enable",
                "`True` (the state it is always in) works; `False` raises NotImplementedError",
            ),
            _partial(
                "caching_allocator_disabled",
                "raises NotImplementedError on entry (see caching_allocator_enable)",
            ),
            _same("get_allocator_backend", '`"native"`: openreg has one allocator'),
            _same(
                "host_memory_stats",
                "pinned host allocator, flat keys (`allocations.current`, `num_host_alloc`, ...)",
            ),
            _same("host_memory_stats_as_nested_dict", "host_memory_stats as nested dicts"),
            _same("reset_peak_host_memory_stats", "resets the pinned allocator's peaks"),
            _same("reset_accumulated_host_memory_stats", "resets its `allocated`/`freed` counters"),
            _same("memory_cached", "deprecated alias of memory_reserved (FutureWarning)"),
            _same("max_memory_cached", "deprecated alias of max_memory_reserved (FutureWarning)"),
            _same(
                "reset_max_memory_allocated",
                "deprecated; resets all peaks (FutureWarning)",
            ),
            _same("reset_max_memory_cached", "deprecated; resets all peaks (FutureWarning)"),
            _gap(
                "MemPool",
                "private memory pools need pool support in the caching allocator",
            ),
            _gap("use_mem_pool", "needs MemPool"),
            _gap(
                "CUDAPluggableAllocator",
                "openreg's allocator cannot be replaced at run time",
            ),
            _gap("change_current_allocator", "needs a pluggable allocator"),
        ],
    ),
    (
        "Random numbers",
        [
            _same("manual_seed", "seeds the current device; queued before initialisation"),
            _same("manual_seed_all", "seeds every device"),
            _same("seed", "a random seed for the current device"),
            _same("seed_all", "one random seed for every device"),
            _same("initial_seed", "the current device's seed"),
            _same("get_rng_state", 'a CPU ByteTensor; default device `"openreg"`'),
            _same("get_rng_state_all", "one state per device"),
            _same("set_rng_state", "restores a state; queued before initialisation"),
            _same("set_rng_state_all", "one state per device"),
        ],
    ),
    (
        "Automatic mixed precision (torch.cuda.amp)",
        [
            _same(
                "amp.autocast",
                "`torch.autocast('openreg', ...)`; deprecated spelling, FutureWarning as CUDA's",
            ),
            _same(
                "amp.GradScaler",
                "`torch.amp.GradScaler('openreg', ...)`; deprecated spelling, FutureWarning",
            ),
            _same("amp.custom_fwd", "`torch.amp.custom_fwd(device_type='openreg')`; deprecated"),
            _same("amp.custom_bwd", "`torch.amp.custom_bwd(device_type='openreg')`; deprecated"),
            _same("amp.amp_definitely_not_available", "True only if no openreg device exists"),
        ],
    ),
    (
        "Graphs",
        [
            _cuda("CUDAGraph", "CUDA graphs (openreg has no stream capture)"),
            _cuda("graph", "CUDA graphs"),
            _cuda("graph_pool_handle", "CUDA graphs"),
            _cuda("make_graphed_callables", "CUDA graphs"),
        ],
    ),
    (
        "Submodules",
        [
            _same("amp", "the AMP functions above"),
            _same("memory", "the memory functions above"),
            _same("random", "the random functions above"),
            _same("streams", "Stream and Event"),
            _cuda("graphs", "CUDA graphs"),
            _cuda("jiterator", "NVRTC run-time compiled kernels"),
            _cuda("nccl", "NCCL collectives"),
            _cuda("nvtx", "NVTX profiler ranges"),
            _cuda("profiler", "cudaProfilerStart/Stop"),
            _cuda("tunable", "TunableOp (cuBLAS/hipBLASLt GEMM tuning)"),
            _cuda("sparse", "legacy typed sparse tensor classes"),
        ],
    ),
    (
        "Legacy typed tensor and storage classes",
        [
            Row(f"{dtype}Tensor", "legacy", "", "use `torch.empty(..., dtype=, device='openreg')`")
            for dtype in (
                "BFloat16",
                "Bool",
                "Byte",
                "Char",
                "ComplexDouble",
                "ComplexFloat",
                "Double",
                "Float",
                "Half",
                "Int",
                "Long",
                "Short",
            )
            if not dtype.startswith("Complex")
        ]
        + [
            Row(
                f"{dtype}Storage",
                "same",
                f"{dtype}Storage",
                "legacy typed storage; `Tensor.storage_type()` returns it",
            )
            for dtype in STORAGE_DTYPES
        ],
    ),
]

ROWS: list[Row] = [row for _, rows in SECTIONS for row in rows]

# torch.accelerator (and torch.accelerator.memory): what works on openreg.
# tests/test_api_parity.py calls every name here; a name PyTorch adds shows
# up as a failure until it is listed.
ACCELERATOR: dict[str, str] = {
    "current_accelerator": 'returns `device(type="openreg")`',
    "is_available": "True",
    "device_count": "2 by default",
    "current_device_index": "the current openreg device",
    "current_device_idx": "deprecated alias of current_device_index",
    "set_device_index": "sets the current openreg device",
    "set_device_idx": "deprecated alias of set_device_index",
    "device_index": "context manager; restores the previous device",
    "get_device_capability": "`supported_dtypes`: every dtype the CPU kernels handle",
    "current_stream": "the thread's current stream, as torch.openreg.current_stream",
    "set_stream": "as torch.openreg.set_stream",
    "synchronize": "as torch.openreg.synchronize",
    "empty_cache": "as torch.openreg.empty_cache",
    "empty_host_cache": "releases cached pinned host blocks",
    "get_memory_info": "as torch.openreg.mem_get_info",
    "memory_stats": "the same dict as torch.openreg.memory_stats",
    "memory_allocated": "as torch.openreg.memory_allocated",
    "max_memory_allocated": "as torch.openreg.max_memory_allocated",
    "memory_reserved": "as torch.openreg.memory_reserved",
    "max_memory_reserved": "as torch.openreg.max_memory_reserved",
    "reset_peak_memory_stats": "as torch.openreg.reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "as torch.openreg.reset_accumulated_memory_stats",
    "Graph": "**not supported**: raises RuntimeError (no graph implementation registered "
    "for openreg, see Graphs above)",
}

STATUS_TEXT = {
    "same": "same",
    "partial": "partial",
    "cuda": "CUDA-specific",
    "legacy": "legacy",
    "gap": "not yet",
}


def counts() -> dict[str, int]:
    result = {status: 0 for status in STATUS_TEXT}
    for row in ROWS:
        result[row.status] += 1
    return result


def _cuda_ref(name: str) -> str:
    return f"`torch.cuda.{name}`"


def render_markdown() -> str:
    import torch

    c = counts()
    lines = [
        "# torch.cuda and torch.openreg: API parity",
        "",
        "<!-- Generated by torch_openreg/api_parity.py; edit the table there and run",
        "     .venv/bin/python -m torch_openreg.api_parity > docs/api_parity.md -->",
        "",
        f"Every public name of `torch.cuda` in torch {torch.__version__.split('+')[0]} "
        "(its `__all__`, which includes the public names of `torch.cuda.memory`, "
        "`.random`, `.streams` and `.graphs`) and of `torch.cuda.amp`, with its "
        "`torch.openreg` counterpart. Device-agnostic code can call "
        "`torch.get_device_module(device)` and use the same names.",
        "",
        f"**{len(ROWS)} names**: {c['same']} same, {c['partial']} partial "
        f"(counterpart present, some argument values unsupported and raising), "
        f"{c['cuda']} CUDA-specific, {c['legacy']} legacy typed classes, "
        f"{c['gap']} not yet implemented.",
        "",
        "- **same**: `torch.openreg.<name>` takes the same parameters (names, kinds, "
        'defaults; a default `"cuda"` reads `"openreg"`) and means the same. '
        "`tests/test_api_parity.py` checks every signature and calls every one, checking "
        "values (memory counters move by the allocation size, seeds reproduce, stream "
        "contexts change the current stream, ...).",
        "- **partial**: same signature; the argument values named in the notes raise "
        "`NotImplementedError` rather than pretend to succeed.",
        "- **CUDA-specific**: a CUDA library, toolchain detail or hardware sensor; no "
        "counterpart by design.",
        "- **legacy**: legacy typed tensor classes, which PyTorch generates only for CPU and CUDA.",
        "- **not yet**: would make sense on openreg but is not implemented; "
        "`torch.openreg` does not define the name (checked), so feature tests with "
        "`hasattr` answer correctly.",
        "",
        "A test also compares this table with `torch.cuda.__all__` and "
        "`torch.cuda.amp.__all__`, so names a new PyTorch adds fail it until they are "
        "listed here.",
        "",
        "The migration shim ([migration.md](migration.md)) builds its `torch.cuda` from "
        "this table: a *same* or *partial* name is the `torch.openreg` counterpart "
        "(device arguments mapped), any other name raises `CudaApiNotSupportedError` "
        "with the notes below when it is used.",
    ]
    for title, rows in SECTIONS:
        lines += ["", f"## {title}", "", "| torch.cuda | torch.openreg | status | notes |"]
        lines.append("|---|---|---|---|")
        for row in rows:
            counterpart = f"`torch.openreg.{row.openreg}`" if row.openreg else "—"
            lines.append(
                f"| {_cuda_ref(row.cuda)} | {counterpart} | {STATUS_TEXT[row.status]} "
                f"| {row.notes} |"
            )
    lines += [
        "",
        "## torch.accelerator",
        "",
        "The device-generic API (`torch.accelerator.__all__` and "
        "`torch.accelerator.memory.__all__`) on openreg; `tests/test_api_parity.py` "
        "calls every function and checks the values against `torch.openreg`.",
        "",
        "| torch.accelerator | on openreg |",
        "|---|---|",
    ]
    for name, notes in ACCELERATOR.items():
        lines.append(f"| `torch.accelerator.{name}` | {notes} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
