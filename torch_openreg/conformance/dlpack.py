"""DLPack: device tensors export as ``kDLExtDev`` (PyTorch's DLPack device type
for PrivateUse1) with their index, and ``torch.from_dlpack`` imports them
back without a copy, through the protocol (``__dlpack__``) and through
capsules (``torch.utils.dlpack``).
"""

from __future__ import annotations

import torch
from torch.utils.dlpack import DLDeviceType, from_dlpack, to_dlpack

from .core import Context, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("dlpack", "DLPack")


@check(T)
def dlpack_device(ctx: Context) -> None:
    """__dlpack_device__() of a NAME:0 tensor is (kDLExtDev, 0)."""
    t = torch.ones(3, device=ctx.name)
    expect_equal(t.__dlpack_device__(), (DLDeviceType.kDLExtDev, 0), "__dlpack_device__()")


@check(T, devices=2)
def dlpack_device_index(ctx: Context) -> None:
    """__dlpack_device__() of a NAME:1 tensor is (kDLExtDev, 1)."""
    t = torch.ones(3, device=ctx.device(1))
    expect_equal(t.__dlpack_device__(), (DLDeviceType.kDLExtDev, 1), "__dlpack_device__()")


@check(T)
def protocol_round_trip_shares(ctx: Context) -> None:
    """torch.from_dlpack(device tensor) shares its memory: same device, data_ptr and values,
    and writes are visible through both."""
    t = torch.arange(8.0, device=ctx.name)
    u = torch.from_dlpack(t)
    expect_equal((u.device, u.data_ptr()), (t.device, t.data_ptr()), "device and data_ptr")
    u[0] = 42
    expect_equal(t[0].item(), 42.0, "write through the import seen by the source")


@check(T)
def capsule_round_trip(ctx: Context) -> None:
    """to_dlpack/from_dlpack capsules round trip a device tensor without a copy."""
    t = torch.arange(6.0, device=ctx.name).reshape(2, 3)
    u = from_dlpack(to_dlpack(t))
    expect_equal(
        (u.device, u.data_ptr(), tuple(u.shape)), (t.device, t.data_ptr(), (2, 3)), "import"
    )
    expect_close(u, torch.arange(6.0).reshape(2, 3), "values")


@check(T, devices=2)
def round_trip_keeps_index(ctx: Context) -> None:
    """A NAME:1 tensor imported back lives on NAME:1."""
    t = torch.arange(4.0, device=ctx.device(1))
    expect_equal(torch.from_dlpack(t).device, ctx.device(1), "imported device")


@check(T)
def strides_and_offset(ctx: Context) -> None:
    """A non-contiguous view with a storage offset keeps its strides and data pointer."""
    base = torch.arange(24.0, device=ctx.name).reshape(4, 6)
    view = base[1:, ::2]
    u = torch.from_dlpack(view)
    expect_equal((u.stride(), u.data_ptr()), (view.stride(), view.data_ptr()), "strides, data_ptr")
    expect_close(u, torch.arange(24.0).reshape(4, 6)[1:, ::2], "values")


@check(T)
def dtypes(ctx: Context) -> None:
    """float16, bfloat16, int64, uint8, bool and complex64 tensors round trip."""
    for dtype in (
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ):
        src = torch.arange(6).to(dtype)
        u = torch.from_dlpack(src.to(ctx.name))
        expect_equal(u.dtype, dtype, "dtype")
        expect(torch.equal(u.cpu(), src), f"{dtype} values differ")


@check(T)
def requires_grad_refused(ctx: Context) -> None:
    """Exporting a tensor that requires grad through __dlpack__ (torch.from_dlpack)
    raises BufferError, as on the CPU."""
    t = torch.ones(3, device=ctx.name, requires_grad=True)
    expect_raises(BufferError, lambda: torch.from_dlpack(t), "from_dlpack(requires_grad)", ["grad"])


@check(T)
def cpu_import_stays_cpu(ctx: Context) -> None:
    """A CPU tensor's DLPack import stays on the CPU (kDLCPU) while the backend is loaded."""
    t = torch.arange(3.0)
    expect_equal(t.__dlpack_device__(), (DLDeviceType.kDLCPU, 0), "CPU __dlpack_device__()")
    expect_equal(torch.from_dlpack(t).device, torch.device("cpu"), "imported device")


@check(T)
def sees_queued_work(ctx: Context) -> None:
    """An import of a result of queued work reads the finished values."""
    out = ctx.busy(256)
    u = torch.from_dlpack(out)
    expect_close(u, torch.full((256, 256), 1.0 / 256), "values")
