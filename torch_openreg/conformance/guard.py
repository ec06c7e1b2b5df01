"""Device guard: ops, factories and contexts switch to a tensor's device and
restore the current device afterwards, also after an exception.

PyTorch reaches the backend's ``DeviceGuardImplInterface`` from every op
(``DeviceGuard`` around the kernel), from ``torch.accelerator.device_index``
and from the device module's ``device`` context.
"""

from __future__ import annotations

import torch

from .core import Context, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("guard", "Device guard")


@check(T, devices=2)
def op_runs_on_its_tensors_device(ctx: Context) -> None:
    """An op on NAME:1 tensors while device 0 is current computes on NAME:1 (values as
    on the CPU) and leaves device 0 current."""
    a_cpu = torch.arange(12.0).reshape(3, 4)
    a = a_cpu.to(ctx.device(1))
    out = (a * 2 + 1).sum(dim=0)
    expect_equal(out.device, ctx.device(1), "result device")
    expect_close(out, (a_cpu * 2 + 1).sum(dim=0), "result")
    expect_equal(ctx.module.current_device(), 0, "current device after the op")


@check(T, devices=2)
def factory_with_index(ctx: Context) -> None:
    """Factories with device=NAME:1 allocate there and leave the current device alone."""
    for make in (
        lambda: torch.zeros(3, device=ctx.device(1)),
        lambda: torch.empty(3, device=f"{ctx.name}:1"),
        lambda: torch.full((2,), 7.0, device=ctx.device(1)),
    ):
        t = make()
        expect_equal(t.device, ctx.device(1), "factory result device")
    expect_equal(ctx.module.current_device(), 0, "current device after the factories")


@check(T, devices=2)
def accelerator_device_index_context(ctx: Context) -> None:
    """torch.accelerator.device_index(1) makes 1 current inside and restores 0 after."""
    with torch.accelerator.device_index(1):
        expect_equal(torch.accelerator.current_device_index(), 1, "index inside")
        expect_equal(torch.empty(1, device=ctx.name).device.index, 1, "new tensor inside")
    expect_equal(torch.accelerator.current_device_index(), 0, "index after")


@check(T, devices=2)
def nested_contexts_restore(ctx: Context) -> None:
    """Nested device contexts restore each previous device in turn."""
    with ctx.module.device(1):
        expect_equal(ctx.module.current_device(), 1, "outer")
        with torch.accelerator.device_index(0):
            expect_equal(ctx.module.current_device(), 0, "inner")
            with ctx.module.device(1):
                expect_equal(ctx.module.current_device(), 1, "innermost")
            expect_equal(ctx.module.current_device(), 0, "back in inner")
        expect_equal(ctx.module.current_device(), 1, "back in outer")
    expect_equal(ctx.module.current_device(), 0, "after")


@check(T, devices=2)
def restored_after_exception(ctx: Context) -> None:
    """A device context left by an exception restores the previous device."""
    for enter in (ctx.module.device, torch.accelerator.device_index):
        try:
            with enter(1):
                raise KeyError("inside")
        except KeyError:
            pass
        expect_equal(ctx.module.current_device(), 0, f"device after an exception in {enter}")


@check(T, devices=2)
def failing_op_restores_device(ctx: Context) -> None:
    """An op on NAME:1 that raises (shape mismatch, as on the CPU) leaves device 0 current."""
    a = torch.ones(3, device=ctx.device(1))
    b = torch.ones(4, device=ctx.device(1))
    expect_raises(RuntimeError, lambda: a + b, "adding shapes 3 and 4")
    expect_equal(ctx.module.current_device(), 0, "current device after the failed op")


@check(T)
def none_index_is_noop(ctx: Context) -> None:
    """torch.accelerator.device_index(None) and device(-1)/device(None) change nothing."""
    before = ctx.module.current_device()
    with torch.accelerator.device_index(None):
        expect_equal(ctx.module.current_device(), before, "inside device_index(None)")
    with ctx.module.device(None):
        expect_equal(ctx.module.current_device(), before, "inside device(None)")
    with ctx.module.device(-1):
        expect_equal(ctx.module.current_device(), before, "inside device(-1)")


@check(T, devices=2)
def to_without_index_uses_current(ctx: Context) -> None:
    """.to(NAME) and factories without an index follow the current device."""
    with ctx.module.device(1):
        expect_equal(torch.ones(2).to(ctx.name).device, ctx.device(1), ".to(NAME) inside device(1)")
        expect_equal(torch.ones(2, device=ctx.name).device, ctx.device(1), "ones inside device(1)")
    expect_equal(torch.ones(2).to(ctx.name).device, ctx.device(0), ".to(NAME) after")


@check(T, devices=2)
def mixed_devices_rejected(ctx: Context) -> None:
    """An op mixing NAME:0 and NAME:1 tensors raises RuntimeError (as CUDA: "Expected all
    tensors to be on the same device")."""
    a = torch.ones(3, device=ctx.device(0))
    b = torch.ones(3, device=ctx.device(1))
    expect_raises(RuntimeError, lambda: a + b, "NAME:0 + NAME:1", contains=["device"])


@check(T)
def cpu_tensor_mix_rejected(ctx: Context) -> None:
    """An op mixing a device tensor with a CPU tensor (not a 0-dim scalar) raises
    RuntimeError; a CPU 0-dim tensor is accepted as a scalar."""
    a = torch.ones(3, device=ctx.name)
    expect_raises(
        RuntimeError, lambda: a + torch.ones(3), "device + CPU tensor", contains=["device"]
    )
    out = a + torch.tensor(2.0)
    expect_equal(out.device.type, ctx.name, "device + CPU 0-dim tensor result device")
    expect_close(out, torch.full((3,), 3.0), "device + CPU 0-dim tensor")


@check(T, devices=2)
def device_of_tensor(ctx: Context) -> None:
    """device_of(t) makes t's device current inside and restores after."""
    t = torch.ones(1, device=ctx.device(1))
    with ctx.module.device_of(t):
        expect_equal(ctx.module.current_device(), 1, "inside device_of(NAME:1 tensor)")
    expect_equal(ctx.module.current_device(), 0, "after")


@check(T, devices=2)
def backward_on_second_device(ctx: Context) -> None:
    """backward() of a graph on NAME:1 puts gradients on NAME:1 and leaves device 0 current."""
    w = torch.randn(4, 3, device=ctx.device(1), requires_grad=True)
    (w * w).sum().backward()
    expect(w.grad is not None, "no gradient")
    expect_equal(w.grad.device, ctx.device(1), "gradient device")
    expect_close(w.grad, (2 * w).detach(), "gradient")
    expect_equal(ctx.module.current_device(), 0, "current device after backward")


@check(T, devices=2)
def cross_device_copy_keeps_current(ctx: Context) -> None:
    """Copies NAME:0 -> NAME:1 -> NAME:0 keep the values and the current device."""
    src = torch.arange(10.0)
    a = src.to(ctx.device(0))
    b = a.to(ctx.device(1))
    c = b.to(ctx.device(0))
    expect_equal((b.device, c.device), (ctx.device(1), ctx.device(0)), "devices")
    expect_close(c, src, "round trip")
    expect_equal(ctx.module.current_device(), 0, "current device after the copies")
