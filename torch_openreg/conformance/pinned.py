"""Pinned (page-locked) host memory: ``pin_memory=True``, ``Tensor.pin_memory()``,
``is_pinned()``, asynchronous copies from and to it, the DataLoader's
``pin_memory=True``, and the host cache.

With one accelerator, PyTorch pins for it by default: ``is_pinned()`` and
``pin_memory()`` without a device argument ask the current accelerator's
host allocator (the backend's ``getPinnedMemoryAllocator`` hook).
"""

from __future__ import annotations

import torch

from .core import Context, check, expect, expect_close, expect_equal, topic

T = topic("pinned", "Pinned host memory")


@check(T)
def empty_pinned(ctx: Context) -> None:
    """torch.empty(..., pin_memory=True) gives a pinned CPU tensor; a plain one is not pinned."""
    t = torch.empty(1000, pin_memory=True)
    expect_equal(t.device, torch.device("cpu"), "device of a pinned tensor")
    expect_equal(t.is_pinned(), True, "is_pinned() of pin_memory=True")
    expect_equal(torch.empty(1000).is_pinned(), False, "is_pinned() of a plain tensor")


@check(T)
def pin_memory_copies(ctx: Context) -> None:
    """Tensor.pin_memory() returns a pinned copy with the same values; the source stays
    unpinned and pinning a pinned tensor returns it."""
    src = torch.randn(33, 17)
    p = src.pin_memory()
    expect_equal(p.is_pinned(), True, "result is_pinned()")
    expect_equal(src.is_pinned(), False, "source is_pinned()")
    expect(p.data_ptr() != src.data_ptr(), "pin_memory() did not copy")
    expect_close(p, src, "values")
    expect(p.pin_memory().data_ptr() == p.data_ptr(), "pinning a pinned tensor copied it")


@check(T)
def pin_memory_dtypes_and_views(ctx: Context) -> None:
    """pin_memory() works for several dtypes and for a non-contiguous view."""
    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        src = torch.arange(24).reshape(4, 6).to(dtype)
        expect_close(src.pin_memory(), src, f"pin_memory() of {dtype}")
    view = torch.arange(60.0).reshape(6, 10)[::2, 1::3]
    p = view.pin_memory()
    expect_equal(p.is_pinned(), True, "pinned non-contiguous view")
    expect_close(p, view, "values of the pinned view")


@check(T)
def pinned_storage(ctx: Context) -> None:
    """UntypedStorage.pin_memory() is pinned."""
    s = torch.UntypedStorage(256).pin_memory()
    expect_equal(s.is_pinned(), True, "storage is_pinned()")


@check(T)
def async_upload_from_pinned(ctx: Context) -> None:
    """A non_blocking copy from pinned memory to the device has the right values once
    the stream is synchronized."""
    src = torch.randn(1 << 18).pin_memory()
    dst = src.to(ctx.name, non_blocking=True)
    torch.accelerator.current_stream().synchronize()
    expect_close(dst, src, "uploaded values")


@check(T)
def async_download_to_pinned(ctx: Context) -> None:
    """A non_blocking copy from the device into pinned memory has the right values once
    the stream is synchronized."""
    src_cpu = torch.randn(1 << 18)
    src = src_cpu.to(ctx.name) * 2
    dst = torch.empty(src.shape, pin_memory=True)
    dst.copy_(src, non_blocking=True)
    torch.accelerator.current_stream().synchronize()
    expect_close(dst, src_cpu * 2, "downloaded values")


@check(T)
def async_download_after_queued_work(ctx: Context) -> None:
    """A non_blocking download into pinned memory is ordered after the work queued
    before it on the stream."""
    out = ctx.busy(512)
    dst = torch.empty(out.shape, pin_memory=True)
    dst.copy_(out, non_blocking=True)
    torch.accelerator.current_stream().synchronize()
    expect_close(dst, torch.full((512, 512), 1.0 / 512), "downloaded result of queued work")


@check(T)
def device_result_pinned(ctx: Context) -> None:
    """.cpu().pin_memory() of a device tensor is pinned and holds the device's values."""
    src = torch.arange(10.0, device=ctx.name)
    p = src.cpu().pin_memory()
    expect_equal(p.is_pinned(), True, "is_pinned()")
    expect_close(p, torch.arange(10.0), "values")


@check(T)
def dataloader_pins(ctx: Context) -> None:
    """DataLoader(pin_memory=True) yields pinned batches (for the current accelerator)."""
    data = torch.utils.data.TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    batches = list(loader)
    expect_equal(len(batches), 3, "number of batches")
    for x, y in batches:
        expect_equal((x.is_pinned(), y.is_pinned()), (True, True), "batch is_pinned()")
    expect_close(torch.cat([b[0] for b in batches]), data.tensors[0], "batch values")


@check(T)
def empty_host_cache_keeps_live_tensors(ctx: Context) -> None:
    """torch.accelerator.empty_host_cache() releases cached pinned blocks but leaves live
    pinned tensors intact."""
    keep = torch.arange(1000.0).pin_memory()
    tmp = torch.empty(1 << 20, pin_memory=True)
    del tmp
    torch.accelerator.empty_host_cache()
    expect_equal(keep.is_pinned(), True, "live tensor still pinned")
    expect_close(keep, torch.arange(1000.0), "live tensor values")
    again = torch.empty(1 << 20, pin_memory=True)
    expect_equal(again.is_pinned(), True, "new pinned tensor after empty_host_cache()")


@check(T)
def pinned_round_trip_many_sizes(ctx: Context) -> None:
    """Pinned -> device -> pinned round trips (non_blocking both ways) are exact for
    sizes from 1 element to 4 MiB."""
    for n in (1, 7, 4096, 100_003, 1 << 20):
        src = torch.randint(-1000, 1000, (n,), dtype=torch.int32).pin_memory()
        dev = src.to(ctx.name, non_blocking=True)
        back = torch.empty(n, dtype=torch.int32, pin_memory=True)
        back.copy_(dev, non_blocking=True)
        torch.accelerator.current_stream().synchronize()
        expect(torch.equal(back, src), f"round trip of {n} int32 values differs")
