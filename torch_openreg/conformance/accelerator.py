"""The ``torch.accelerator`` API: every function answers for the backend and
accepts the device spellings PyTorch documents (int, "NAME:i", torch.device).

Device-agnostic code (``torch.accelerator.*``) reaches the backend through its
C++ registrations only (guard, hooks, device allocator), not through the
device module, so these checks see what such code sees.
"""

from __future__ import annotations

import torch

from .core import Context, Skip, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("accelerator", "torch.accelerator API")


def _forms(ctx: Context, index: int) -> list:
    return [index, f"{ctx.name}:{index}", ctx.device(index)]


@check(T)
def get_device_module(ctx: Context) -> None:
    """torch.get_device_module(NAME) and (torch.device(NAME)) are torch.NAME."""
    expect(torch.get_device_module(ctx.name) is getattr(torch, ctx.name, None), "by name")
    expect(torch.get_device_module(ctx.device()) is ctx.module, "by torch.device")


@check(T)
def current_accelerator_checked(ctx: Context) -> None:
    """current_accelerator(check_available=True) is torch.device(NAME)."""
    expect_equal(
        torch.accelerator.current_accelerator(check_available=True), ctx.device(), "result"
    )


@check(T)
def device_index_round_trip(ctx: Context) -> None:
    """set_device_index(i) / current_device_index() round trip for every device, and the
    deprecated *_idx aliases agree."""
    for i in range(ctx.count):
        torch.accelerator.set_device_index(i)
        expect_equal(torch.accelerator.current_device_index(), i, "current_device_index()")
        expect_equal(torch.accelerator.current_device_idx(), i, "current_device_idx()")
    torch.accelerator.set_device_idx(0)
    expect_equal(torch.accelerator.current_device_index(), 0, "after set_device_idx(0)")


@check(T)
def synchronize_forms(ctx: Context) -> None:
    """synchronize() accepts None, an int, "NAME:i" and torch.device for every device."""
    torch.accelerator.synchronize()
    for i in range(ctx.count):
        for form in _forms(ctx, i):
            torch.accelerator.synchronize(form)


@check(T)
def synchronize_rejects_other_type(ctx: Context) -> None:
    """synchronize("cpu") raises ValueError (not the current accelerator)."""
    expect_raises(ValueError, lambda: torch.accelerator.synchronize("cpu"), 'synchronize("cpu")')


@check(T)
def current_stream_per_device(ctx: Context) -> None:
    """current_stream(i) is a stream of device i, for every device and spelling."""
    for i in range(ctx.count):
        for form in _forms(ctx, i):
            s = torch.accelerator.current_stream(form)
            expect_equal(s.device, ctx.device(i), f"current_stream({form!r}).device")


@check(T)
def memory_functions_forms(ctx: Context) -> None:
    """memory_allocated/reserved and their max_ accept every device spelling and agree."""
    x = torch.empty(1 << 20, dtype=torch.uint8, device=ctx.name)
    for fn in (
        "memory_allocated",
        "memory_reserved",
        "max_memory_allocated",
        "max_memory_reserved",
    ):
        values = {str(f): getattr(torch.accelerator, fn)(f) for f in [None, *_forms(ctx, 0)]}
        expect_equal(len(set(values.values())), 1, f"{fn} by spelling {values}")
    del x


@check(T)
def memory_stats_per_device(ctx: Context) -> None:
    """memory_stats(i) is a dict with allocated_bytes.all.current for every device."""
    for i in range(ctx.count):
        stats = torch.accelerator.memory_stats(i)
        expect(isinstance(stats, dict), f"memory_stats({i}) is a {type(stats).__name__}")
        expect("allocated_bytes.all.current" in stats, f"memory_stats({i}) lacks the counter")


@check(T)
def get_memory_info(ctx: Context) -> None:
    """get_memory_info(i) is (free, total) ints with 0 <= free <= total for every device."""
    for i in range(ctx.count):
        info = torch.accelerator.get_memory_info(i)
        expect(
            isinstance(info, tuple) and len(info) == 2 and all(isinstance(v, int) for v in info),
            f"get_memory_info({i}) is {info!r}",
        )
        expect(0 <= info[0] <= info[1] and info[1] > 0, f"get_memory_info({i}) is {info}")


@check(T)
def reset_functions(ctx: Context) -> None:
    """reset_peak_memory_stats(i) and reset_accumulated_memory_stats(i) work per device."""
    for i in range(ctx.count):
        torch.accelerator.reset_peak_memory_stats(i)
        torch.accelerator.reset_accumulated_memory_stats(i)
        stats = torch.accelerator.memory_stats(i)
        expect_equal(stats["allocated_bytes.all.allocated"], 0, f"device {i} allocated counter")
        expect_equal(
            stats["allocated_bytes.all.peak"],
            stats["allocated_bytes.all.current"],
            f"device {i} peak after reset",
        )


@check(T)
def empty_caches(ctx: Context) -> None:
    """empty_cache() and empty_host_cache() run and leave live tensors intact."""
    keep = torch.arange(100.0, device=ctx.name)
    pinned = torch.arange(10.0).pin_memory()
    torch.accelerator.empty_cache()
    torch.accelerator.empty_host_cache()
    expect_close(keep, torch.arange(100.0), "device tensor after empty_cache()")
    expect_close(pinned, torch.arange(10.0), "pinned tensor after empty_host_cache()")


@check(T)
def device_capability(ctx: Context) -> None:
    """get_device_capability(i) has supported_dtypes, a set of torch.dtype, for every device."""
    for i in range(ctx.count):
        cap = torch.accelerator.get_device_capability(i)
        dtypes = cap.get("supported_dtypes") if isinstance(cap, dict) else None
        expect(isinstance(dtypes, set) and dtypes, f"get_device_capability({i}) is {cap!r}")
        expect(all(isinstance(d, torch.dtype) for d in dtypes), "non-dtype entries")


@check(T, devices=2)
def device_index_context_with_streams(ctx: Context) -> None:
    """Inside device_index(1), current_stream() is device 1's and new tensors go there."""
    with torch.accelerator.device_index(1):
        expect_equal(torch.accelerator.current_stream().device, ctx.device(1), "stream device")
        expect_equal(torch.ones(1, device=ctx.name).device, ctx.device(1), "tensor device")


@check(T)
def graph_capture(ctx: Context) -> None:
    """torch.accelerator.Graph captures and replays work (values checked), or refuses at
    construction with a RuntimeError naming the device (then skipped with its message)."""
    try:
        g = torch.accelerator.Graph()
    except RuntimeError as e:
        if ctx.name in str(e):
            raise Skip(f"graphs not supported: {e}") from None
        raise
    static_in = torch.ones(4, device=ctx.name)
    s = torch.Stream(device=ctx.name)
    with s:
        with g:
            static_out = static_in * 2
    static_in.fill_(3)
    g.replay()
    torch.accelerator.synchronize()
    expect_close(static_out, torch.full((4,), 6.0), "replayed result")
