"""Copies in every direction (CPU -> device, device -> CPU, within a device,
between devices), with ``non_blocking``, dtype conversion, non-contiguous
sources and destinations, broadcasting, and the usual ``.to()`` spellings.
Values must equal the CPU's exactly (a copy does no arithmetic).
"""

from __future__ import annotations

import torch

from .core import Context, check, expect, expect_equal, topic

T = topic("copies", "Copies")


def _exact(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    a = actual.cpu()
    expect_equal((a.dtype, tuple(a.shape)), (expected.dtype, tuple(expected.shape)), what)
    expect(torch.equal(a, expected), f"{what}: values differ from the CPU's")


def _sample(dtype: torch.dtype, shape=(6, 7)) -> torch.Tensor:
    base = torch.arange(-21, 21, dtype=torch.float64).reshape(shape) * 0.75
    if dtype == torch.bool:
        return base > 0
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype)
    return base.to(dtype)


DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
)


@check(T)
def cpu_to_device_every_dtype(ctx: Context) -> None:
    """CPU -> device keeps values and dtype for float32/64/16, bfloat16, int8/uint8/32/64,
    bool and complex64."""
    for dtype in DTYPES:
        src = _sample(dtype)
        dev = src.to(ctx.name)
        expect_equal((dev.device.type, dev.dtype), (ctx.name, dtype), f"{dtype} placement")
        _exact(dev, src, f"{dtype} round trip")


@check(T)
def device_to_cpu(ctx: Context) -> None:
    """Device -> CPU through .cpu(), .to("cpu") and copy_ into a CPU tensor."""
    src = _sample(torch.float32)
    dev = src.to(ctx.name)
    _exact(dev.cpu(), src, ".cpu()")
    _exact(dev.to("cpu"), src, '.to("cpu")')
    dst = torch.empty_like(src)
    dst.copy_(dev)
    _exact(dst, src, "copy_ into a CPU tensor")


@check(T)
def within_device(ctx: Context) -> None:
    """Device -> same device copies (clone, copy_) are deep and exact."""
    src = _sample(torch.float32)
    a = src.to(ctx.name)
    b = a.clone()
    c = torch.empty_like(a)
    c.copy_(a)
    a.zero_()
    _exact(b, src, "clone")
    _exact(c, src, "copy_")


@check(T, devices=2)
def between_devices(ctx: Context) -> None:
    """NAME:0 -> NAME:1 -> NAME:0 copies are exact, with either device current."""
    src = _sample(torch.float64)
    a = src.to(ctx.device(0))
    b = a.to(ctx.device(1))
    expect_equal(b.device, ctx.device(1), "device of the copy")
    _exact(b, src, "NAME:0 -> NAME:1")
    with ctx.module.device(1):
        c = torch.empty_like(a)
        c.copy_(b)
    _exact(c, src, "NAME:1 -> NAME:0 with device 1 current")


@check(T)
def dtype_conversion_on_upload(ctx: Context) -> None:
    """.to(NAME, dtype) converts as the CPU does (float -> int truncates, -> bool, -> half)."""
    src = _sample(torch.float32)
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool, torch.float16, torch.float64):
        _exact(src.to(ctx.name, dtype), src.to(dtype), f"float32 -> {dtype} on upload")


@check(T)
def dtype_conversion_on_device(ctx: Context) -> None:
    """dtype conversions between device tensors equal the CPU's."""
    for src_dtype, dst_dtype in [
        (torch.float32, torch.float16),
        (torch.float16, torch.float32),
        (torch.float32, torch.bfloat16),
        (torch.int64, torch.float32),
        (torch.float64, torch.int32),
        (torch.bool, torch.float32),
        (torch.float32, torch.complex64),
        (torch.int32, torch.int8),
    ]:
        src = _sample(src_dtype)
        _exact(src.to(ctx.name).to(dst_dtype), src.to(dst_dtype), f"{src_dtype} -> {dst_dtype}")


@check(T)
def dtype_conversion_on_download(ctx: Context) -> None:
    """copy_ from a device tensor into a CPU tensor of another dtype converts as the CPU."""
    src = _sample(torch.float64)
    dev = src.to(ctx.name)
    for dtype in (torch.float32, torch.int16, torch.bool):
        dst = torch.empty(src.shape, dtype=dtype)
        dst.copy_(dev)
        _exact(dst, src.to(dtype), f"float64 device -> {dtype} CPU")


@check(T)
def non_contiguous_source(ctx: Context) -> None:
    """Non-contiguous CPU and device sources (transpose, step slices, expand) copy exactly."""
    base = torch.arange(120.0).reshape(4, 5, 6)
    views = {
        "transpose": base.transpose(0, 2),
        "step slice": base[::2, 1:, ::3],
        "expand": torch.arange(5.0).reshape(5, 1).expand(5, 4),
        "permute": base.permute(2, 0, 1),
    }
    for name, view in views.items():
        _exact(view.to(ctx.name), view.contiguous(), f"CPU {name} -> device")
    dev_base = base.to(ctx.name)
    _exact(
        dev_base.transpose(0, 2).cpu(), base.transpose(0, 2).contiguous(), "device transpose -> CPU"
    )
    _exact(
        dev_base[::2, 1:, ::3].clone(), base[::2, 1:, ::3].contiguous(), "device step slice clone"
    )


@check(T)
def non_contiguous_destination(ctx: Context) -> None:
    """copy_ into non-contiguous device destinations writes only the viewed elements."""
    expected = torch.zeros(6, 8)
    dst = torch.zeros(6, 8, device=ctx.name)
    src = torch.arange(12.0).reshape(3, 4)
    dst[::2, 1::2].copy_(src.to(ctx.name))
    expected[::2, 1::2].copy_(src)
    _exact(dst, expected, "copy into a step slice from the device")
    dst.t()[2:5].copy_(torch.full((3, 6), -1.0))
    expected.t()[2:5].copy_(torch.full((3, 6), -1.0))
    _exact(dst, expected, "copy from the CPU into a transposed slice")


@check(T)
def broadcasting_copy(ctx: Context) -> None:
    """copy_ broadcasts its source (CPU or device) into the destination's shape."""
    dst = torch.zeros(4, 3, device=ctx.name)
    dst.copy_(torch.tensor([1.0, 2.0, 3.0]))
    _exact(dst, torch.tensor([1.0, 2.0, 3.0]).expand(4, 3).contiguous(), "CPU row broadcast")
    dst.copy_(torch.tensor([[5.0], [6.0], [7.0], [8.0]], device=ctx.name))
    _exact(dst, torch.tensor([[5.0], [6.0], [7.0], [8.0]]).expand(4, 3).contiguous(), "column")


@check(T)
def non_blocking_pageable(ctx: Context) -> None:
    """non_blocking=True with pageable CPU memory is still correct (both directions)."""
    src = torch.randn(1000, 100)
    dev = src.to(ctx.name, non_blocking=True)
    back = dev.to("cpu", non_blocking=True)
    torch.accelerator.synchronize()
    _exact(back, src, "pageable round trip with non_blocking")


@check(T)
def download_waits_for_queued_work(ctx: Context) -> None:
    """A blocking download of a result of queued work waits for that work."""
    out = ctx.busy(256)
    _exact(out.cpu(), torch.full((256, 256), 1.0 / 256), "download of queued work")


@check(T)
def scalars_and_empty(ctx: Context) -> None:
    """0-dim tensors, empty tensors and single elements copy both ways; item() works."""
    s = torch.tensor(3.5).to(ctx.name)
    expect_equal((s.dim(), s.item()), (0, 3.5), "0-dim tensor")
    e = torch.empty(0, 3).to(ctx.name)
    expect_equal(tuple(e.cpu().shape), (0, 3), "empty tensor shape")
    one = torch.tensor([7], dtype=torch.int64).to(ctx.name)
    expect_equal(one.item(), 7, "single int64 item()")
    expect_equal(torch.tensor(True).to(ctx.name).item(), True, "bool item()")


@check(T)
def to_spellings(ctx: Context) -> None:
    """.to(other_tensor), .to(device=..., dtype=...), .to(torch.device) and
    Tensor.new_tensor on a device tensor all land on the device."""
    ref = torch.zeros(1, dtype=torch.float64, device=ctx.name)
    src = torch.arange(5.0)
    a = src.to(ref)
    expect_equal((a.device.type, a.dtype), (ctx.name, torch.float64), ".to(other)")
    b = src.to(device=ctx.device(0), dtype=torch.float16)
    expect_equal((b.device, b.dtype), (ctx.device(0), torch.float16), ".to(device=, dtype=)")
    c = ref.new_tensor([1.0, 2.0])
    expect_equal(c.device.type, ctx.name, "new_tensor device")
    _exact(a, src.double(), "values of .to(other)")


@check(T)
def same_device_to_is_noop(ctx: Context) -> None:
    """.to(its own device) returns the tensor itself; copy=True makes a copy."""
    a = torch.ones(3, device=ctx.name)
    expect(a.to(ctx.name) is a, ".to(NAME) of a NAME tensor is a new tensor")
    expect(a.to(ctx.name, copy=True).data_ptr() != a.data_ptr(), "copy=True shares memory")


@check(T)
def conj_and_neg_views(ctx: Context) -> None:
    """Conjugate and negative views are resolved by copies, as on the CPU."""
    z = torch.complex(torch.arange(4.0), torch.arange(4.0) + 1)
    dz = z.to(ctx.name)
    _exact(dz.conj().cpu(), z.conj().resolve_conj(), "conj view -> CPU")
    _exact(dz.conj().clone().cpu(), z.conj().resolve_conj(), "conj view clone")
    _exact(z.conj().to(ctx.name), z.conj().resolve_conj(), "CPU conj view -> device")


@check(T)
def storage_copies(ctx: Context) -> None:
    """UntypedStorage moves to the device and back with the same bytes."""
    src = torch.arange(16, dtype=torch.uint8)
    storage = src.untyped_storage().to(device=ctx.name)
    expect_equal(storage.device.type, ctx.name, "storage device")
    back = torch.empty(0, dtype=torch.uint8).set_(storage.cpu())
    _exact(back, src, "storage round trip")


@check(T)
def large_copy(ctx: Context) -> None:
    """A 64 MiB copy round trip is exact."""
    src = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8)
    back = src.to(ctx.name).cpu()
    expect(torch.equal(back, src), "64 MiB round trip differs")
