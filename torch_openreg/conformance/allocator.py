"""The device allocator: CUDA-compatible statistics (keys and arithmetic),
caching and ``empty_cache``, out of memory as ``torch.OutOfMemoryError`` and
recovery from it, per-device accounting, ``record_stream``.

Device-agnostic code reads memory through both ``torch.accelerator`` and
``torch.get_device_module(NAME)``; both must answer, and agree.
"""

from __future__ import annotations

import gc

import torch

from .core import Context, Failure, check, expect, expect_equal, expect_raises, topic

T = topic("allocator", "Device allocator")

MiB = 1 << 20

_FAMILIES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
_POOLS = ("all", "large_pool", "small_pool")
_METRICS = ("current", "peak", "allocated", "freed")
# torch.cuda.memory_stats() keys (see its docstring), which tools such as
# memory_summary() and profilers read.
CUDA_STATS_KEYS = sorted(
    [f"{f}.{p}.{m}" for f in _FAMILIES for p in _POOLS for m in _METRICS]
    + [f"oversize_{k}.{m}" for k in ("allocations", "segments") for m in _METRICS]
    + [
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "max_split_size",
    ]
)


def _missing_keys(stats: dict) -> list[str]:
    return [k for k in CUDA_STATS_KEYS if k not in stats]


def _settle(ctx: Context) -> None:
    gc.collect()
    ctx.synchronize_all()


@check(T)
def accelerator_stats_keys(ctx: Context) -> None:
    """torch.accelerator.memory_stats() has every key of torch.cuda.memory_stats()."""
    torch.empty(1, device=ctx.name)
    missing = _missing_keys(torch.accelerator.memory_stats())
    expect(not missing, f"missing keys ({len(missing)}): {missing[:12]}")


@check(T)
def module_stats_keys(ctx: Context) -> None:
    """The device module's memory_stats() has every key of torch.cuda.memory_stats()."""
    torch.empty(1, device=ctx.name)
    missing = _missing_keys(ctx.module.memory_stats())
    expect(not missing, f"missing keys ({len(missing)}): {missing[:12]}")


@check(T)
def stats_arithmetic(ctx: Context) -> None:
    """Across allocations and frees, every memory_stats() counter changes by allocated
    minus freed, peak >= current, and all == large_pool + small_pool for current,
    allocated and freed."""
    before = torch.accelerator.memory_stats()
    keep = [torch.empty(n, device=ctx.name) for n in (10, 1000, 300_000, 3_000_000)]
    del keep[1]
    stats = torch.accelerator.memory_stats()
    problems = []
    for f in _FAMILIES:
        for p in _POOLS:
            key = f"{f}.{p}"
            delta = {m: stats.get(f"{key}.{m}", 0) - before.get(f"{key}.{m}", 0) for m in _METRICS}
            if delta["current"] != delta["allocated"] - delta["freed"]:
                problems.append(
                    f"{key}: current changed by {delta['current']}, allocated - freed by "
                    f"{delta['allocated']} - {delta['freed']}"
                )
            if stats.get(f"{key}.peak", 0) < stats.get(f"{key}.current", 0):
                problems.append(
                    f"{key}: peak {stats[key + '.peak']} < current {stats[key + '.current']}"
                )
        for m in ("current", "allocated", "freed"):
            parts = [stats.get(f"{f}.{p}.{m}") for p in _POOLS]
            if None not in parts and parts[0] != parts[1] + parts[2]:
                problems.append(f"{f}.all.{m} {parts[0]} != large {parts[1]} + small {parts[2]}")
    expect(not problems, "; ".join(problems[:6]))
    del keep


@check(T)
def functions_agree_with_stats(ctx: Context) -> None:
    """memory_allocated/reserved and their max_ in torch.accelerator and the device
    module equal the matching memory_stats() counters."""
    x = torch.empty(5 * MiB, dtype=torch.uint8, device=ctx.name)
    stats = torch.accelerator.memory_stats()
    pairs = {
        "memory_allocated": "allocated_bytes.all.current",
        "max_memory_allocated": "allocated_bytes.all.peak",
        "memory_reserved": "reserved_bytes.all.current",
        "max_memory_reserved": "reserved_bytes.all.peak",
    }
    for fn, key in pairs.items():
        expect_equal(getattr(torch.accelerator, fn)(), stats[key], f"torch.accelerator.{fn}()")
        expect_equal(getattr(ctx.module, fn)(), stats[key], f"device module {fn}()")
    del x


@check(T)
def allocation_is_counted(ctx: Context) -> None:
    """A 1 MiB tensor raises memory_allocated() by at least 1 MiB and requested_bytes by
    exactly 1 MiB; freeing it restores both."""
    _settle(ctx)
    before = torch.accelerator.memory_allocated()
    req_before = torch.accelerator.memory_stats()["requested_bytes.all.current"]
    x = torch.empty(MiB, dtype=torch.uint8, device=ctx.name)
    grown = torch.accelerator.memory_allocated() - before
    req = torch.accelerator.memory_stats()["requested_bytes.all.current"] - req_before
    expect(grown >= MiB, f"memory_allocated grew by {grown}, expected >= {MiB}")
    expect_equal(req, MiB, "requested_bytes.all.current growth")
    del x
    expect_equal(torch.accelerator.memory_allocated(), before, "memory_allocated after del")


@check(T)
def zero_size_allocates_nothing(ctx: Context) -> None:
    """A tensor with no elements does not change memory_allocated()."""
    _settle(ctx)
    before = torch.accelerator.memory_allocated()
    x = torch.empty(0, device=ctx.name)
    expect_equal(torch.accelerator.memory_allocated(), before, "memory_allocated")
    del x


@check(T)
def allocated_within_reserved(ctx: Context) -> None:
    """memory_allocated <= memory_reserved <= max_memory_reserved, and active_bytes >=
    allocated_bytes."""
    x = torch.empty(3 * MiB, dtype=torch.uint8, device=ctx.name)
    s = torch.accelerator.memory_stats()
    alloc, res = s["allocated_bytes.all.current"], s["reserved_bytes.all.current"]
    expect(alloc <= res, f"allocated {alloc} > reserved {res}")
    expect(res <= s["reserved_bytes.all.peak"], "reserved above its peak")
    expect(s["active_bytes.all.current"] >= alloc, "active_bytes below allocated_bytes")
    del x


@check(T)
def peak_and_reset(ctx: Context) -> None:
    """max_memory_allocated() remembers a freed 8 MiB tensor; reset_peak_memory_stats()
    brings the peak down to the current value."""
    _settle(ctx)
    base = torch.accelerator.memory_allocated()
    x = torch.empty(8 * MiB, dtype=torch.uint8, device=ctx.name)
    del x
    peak = torch.accelerator.max_memory_allocated()
    expect(peak >= base + 8 * MiB, f"peak {peak} < {base} + 8 MiB")
    torch.accelerator.reset_peak_memory_stats()
    expect_equal(
        torch.accelerator.max_memory_allocated(),
        torch.accelerator.memory_allocated(),
        "peak after reset_peak_memory_stats()",
    )


@check(T)
def reset_accumulated(ctx: Context) -> None:
    """reset_accumulated_memory_stats() zeroes the allocated/freed counters; a later
    allocation counts from zero."""
    torch.accelerator.reset_accumulated_memory_stats()
    s = torch.accelerator.memory_stats()
    for key in ("allocated_bytes.all.allocated", "allocated_bytes.all.freed", "num_ooms"):
        expect_equal(s[key], 0, f"{key} after the reset")
    x = torch.empty(MiB, dtype=torch.uint8, device=ctx.name)
    del x
    s = torch.accelerator.memory_stats()
    expect(s["allocated_bytes.all.allocated"] >= MiB, "allocated counter after 1 MiB")
    expect(s["allocated_bytes.all.freed"] >= MiB, "freed counter after 1 MiB")


@check(T)
def cache_is_reused(ctx: Context) -> None:
    """A freed block is cached: allocating the same size again reserves nothing new."""
    _settle(ctx)
    x = torch.empty(16 * MiB, dtype=torch.uint8, device=ctx.name)
    del x
    reserved = torch.accelerator.memory_reserved()
    allocs = torch.accelerator.memory_stats()["num_device_alloc"]
    y = torch.empty(16 * MiB, dtype=torch.uint8, device=ctx.name)
    expect_equal(torch.accelerator.memory_reserved(), reserved, "memory_reserved")
    expect_equal(torch.accelerator.memory_stats()["num_device_alloc"], allocs, "num_device_alloc")
    del y


def _empty_cache_releases(ctx: Context, empty_cache, what: str) -> None:
    _settle(ctx)
    x = torch.empty(64 * MiB, dtype=torch.uint8, device=ctx.name)
    del x
    _settle(ctx)
    cached = torch.accelerator.memory_reserved() - torch.accelerator.memory_allocated()
    expect(cached >= 64 * MiB, f"only {cached} bytes cached after freeing 64 MiB")
    free_before = torch.accelerator.get_memory_info()[0]
    empty_cache()
    after = torch.accelerator.memory_reserved() - torch.accelerator.memory_allocated()
    expect(after < 64 * MiB, f"{what}: {after} bytes still cached (was {cached})")
    free_after = torch.accelerator.get_memory_info()[0]
    expect(
        free_after >= free_before + 64 * MiB,
        f"{what}: free device memory went from {free_before} to {free_after}",
    )


@check(T)
def accelerator_empty_cache_releases(ctx: Context) -> None:
    """torch.accelerator.empty_cache() returns cached blocks to the device (reserved
    drops, get_memory_info() free grows)."""
    _empty_cache_releases(ctx, torch.accelerator.empty_cache, "torch.accelerator.empty_cache()")


@check(T)
def module_empty_cache_releases(ctx: Context) -> None:
    """The device module's empty_cache() returns cached blocks to the device."""
    _empty_cache_releases(ctx, ctx.module.empty_cache, "device module empty_cache()")


@check(T)
def mem_get_info_agrees(ctx: Context) -> None:
    """The device module's mem_get_info() equals torch.accelerator.get_memory_info()."""
    _settle(ctx)
    expect_equal(ctx.module.mem_get_info(), torch.accelerator.get_memory_info(), "(free, total)")


def _too_big(ctx: Context) -> int:
    return torch.accelerator.get_memory_info()[1] + 64 * MiB


@check(T)
def oom_raises(ctx: Context) -> None:
    """Allocating more than the device's total memory raises torch.OutOfMemoryError (a
    RuntimeError) whose message speaks of memory."""
    n = _too_big(ctx)
    e = expect_raises(
        torch.OutOfMemoryError,
        lambda: torch.empty(n, dtype=torch.uint8, device=ctx.name),
        f"torch.empty({n} bytes)",
        contains=["memory"],
    )
    expect(isinstance(e, RuntimeError), "OutOfMemoryError is not a RuntimeError")


@check(T)
def oom_is_counted(ctx: Context) -> None:
    """Each out-of-memory error adds one to memory_stats()["num_ooms"]."""
    before = torch.accelerator.memory_stats()["num_ooms"]
    for _ in range(2):
        try:
            torch.empty(_too_big(ctx), dtype=torch.uint8, device=ctx.name)
        except torch.OutOfMemoryError:
            pass
    expect_equal(torch.accelerator.memory_stats()["num_ooms"] - before, 2, "num_ooms growth")


@check(T)
def oom_recovery(ctx: Context) -> None:
    """After filling the device until torch.OutOfMemoryError, freeing the tensors makes
    the same allocations succeed again and memory_allocated() returns to its start."""
    _settle(ctx)
    base = torch.accelerator.memory_allocated()
    chunk = torch.accelerator.get_memory_info()[1] // 8
    held = []
    try:
        for _ in range(16):
            held.append(torch.empty(chunk, dtype=torch.uint8, device=ctx.name))
    except torch.OutOfMemoryError:
        pass
    n = len(held)
    expect(0 < n < 16, f"{n} chunks of 1/8 of the device fit before running out")
    held.clear()
    try:
        held = [torch.empty(chunk, dtype=torch.uint8, device=ctx.name) for _ in range(n)]
    except torch.OutOfMemoryError as e:
        raise Failure(f"re-allocating {n} chunks after freeing them failed: {e}") from None
    finally:
        held.clear()
        torch.accelerator.empty_cache()
    expect_equal(torch.accelerator.memory_allocated(), base, "memory_allocated after all")
    y = torch.arange(4.0, device=ctx.name) + 1
    expect_equal(y.cpu().tolist(), [1.0, 2.0, 3.0, 4.0], "a computation after the OOM")


@check(T, devices=2)
def per_device_accounting(ctx: Context) -> None:
    """An allocation on NAME:1 counts on device 1 only."""
    _settle(ctx)
    before = [torch.accelerator.memory_allocated(i) for i in range(2)]
    x = torch.empty(2 * MiB, dtype=torch.uint8, device=ctx.device(1))
    after = [torch.accelerator.memory_allocated(i) for i in range(2)]
    expect_equal(after[0], before[0], "device 0 memory_allocated")
    expect(after[1] >= before[1] + 2 * MiB, f"device 1 grew by {after[1] - before[1]}")
    expect_equal(ctx.module.memory_allocated(1), after[1], "device module memory_allocated(1)")
    del x


@check(T)
def record_stream_holds_block(ctx: Context) -> None:
    """A block used on a side stream and marked with record_stream is not handed out
    again while that stream's work is pending (checked whenever it still is)."""
    side = torch.Stream(device=ctx.name)
    x = torch.empty(8 * MiB, dtype=torch.uint8, device=ctx.name)
    side.wait_stream(torch.accelerator.current_stream())
    with side:
        ctx.busy(512, steps=16)
        x.fill_(1)
    x.record_stream(side)
    ptr = x.data_ptr()
    del x
    y = torch.empty(8 * MiB, dtype=torch.uint8, device=ctx.name)
    pending = not side.query()
    if pending:
        expect(y.data_ptr() != ptr, "the block was reused while the side stream still used it")
    side.synchronize()
    del y


@check(T)
def record_stream_type_check(ctx: Context) -> None:
    """record_stream with a stream of another device type raises (RuntimeError or TypeError)."""
    x = torch.empty(4, device=ctx.name)
    expect_raises(
        (RuntimeError, TypeError),
        lambda: x.record_stream(torch.Stream(device="cpu")),
        "record_stream(CPU stream)",
    )
