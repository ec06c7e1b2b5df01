"""Error paths, provoked on purpose: a failing allocation, a kernel that fails
on the device (sticky or not), a lost device, late kernels.

A backend that can inject faults offers them as ``torch.<NAME>.faults``
with the interface of ``torch.openreg.faults`` (``fail_allocation``,
``fail_kernel``, ``lose_device``, ``delay_kernels``, ``clear``; each arming
function returns an object with ``disarm()`` that is also a context
manager). The checks then test what a program sees when the real fault
happens, as CUDA reports it: ``torch.OutOfMemoryError``, counted, the device
usable afterwards; ``torch.AcceleratorError`` at the next synchronization,
naming the kernel; a sticky error that every later call on its device
raises; a lost device that fails every call and spares the others. Without
``faults`` every check here is skipped, with that reason.
"""

from __future__ import annotations

import torch

from .core import Context, Skip, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("faults", "Error paths (injected faults)")


def _faults(ctx: Context):
    faults = getattr(ctx.module, "faults", None)
    if faults is None or not hasattr(faults, "fail_kernel"):
        raise Skip(f"torch.{ctx.name}.faults does not exist: the backend injects no faults")
    faults.clear()
    return faults


@check(T)
def injected_oom_is_an_out_of_memory_error(ctx: Context) -> None:
    """An allocation failed on purpose raises torch.OutOfMemoryError naming the requested
    size, adds one to memory_stats()["num_ooms"], and the next allocation works."""
    faults = _faults(ctx)
    before = torch.accelerator.memory_stats()["num_ooms"]
    with faults.fail_allocation(device=0, min_bytes=1 << 20):
        expect_raises(
            torch.OutOfMemoryError,
            lambda: torch.empty(1 << 19, device=ctx.device(0)),
            "the injected allocation failure",
            contains=["2.00 MiB"],
        )
    expect_equal(torch.accelerator.memory_stats()["num_ooms"] - before, 1, "num_ooms growth")
    x = torch.ones(1 << 18, device=ctx.device(0))
    expect_equal(x.sum().item(), float(1 << 18), "a later allocation's sum")


@check(T)
def injected_kernel_error_surfaces_at_synchronization(ctx: Context) -> None:
    """A kernel failed on purpose is reported as torch.AcceleratorError naming the op, at
    the next synchronization at the latest; the device stays usable (not sticky)."""
    faults = _faults(ctx)
    a = torch.ones(8, 8, device=ctx.device(0))
    a @ a
    with faults.fail_kernel(op="aten::mm", device=0):

        def run() -> None:
            a @ a
            torch.accelerator.synchronize(0)

        expect_raises(torch.AcceleratorError, run, "the injected kernel failure", ["aten::mm"])
    expect_close(a @ a, torch.full((8, 8), 8.0), "the next matmul")


@check(T, devices=2)
def sticky_error_poisons_its_device_only(ctx: Context) -> None:
    """After a sticky kernel error (CUDA's illegal memory access), every later launch,
    copy and synchronization on that device raises the same torch.AcceleratorError; the
    other device keeps computing (run in a fresh process: the error lasts)."""
    _faults(ctx)
    out = ctx.fresh(
        """
        a = torch.ones(4, device=f"{NAME}:0")
        b = torch.ones(4, device=f"{NAME}:1")
        mod.faults.fail_kernel(op="aten::add.Tensor", device=0, sticky=True)
        seen = []
        for call in (lambda: (a + a, torch.accelerator.synchronize(0)), lambda: a * 2,
                     lambda: a.cpu(), lambda: torch.accelerator.synchronize(0)):
            try:
                call()
                seen.append("no error")
            except Exception as e:
                seen.append(type(e).__name__ + ": " + str(e).split("\\n")[0])
        out["seen"] = seen
        out["other"] = (b + b).cpu().tolist()
        """
    )
    seen = out["seen"]
    expect(all(s.startswith("AcceleratorError") for s in seen), f"not all raised: {seen}")
    expect(len(set(seen[1:])) == 1, f"later calls raised different errors: {seen[1:]}")
    expect_equal(out["other"], [2.0] * 4, "the other device's result")


@check(T, devices=2)
def lost_device_fails_every_call(ctx: Context) -> None:
    """A lost device fails every call that uses it with torch.AcceleratorError naming it;
    the other device keeps computing and the program exits normally."""
    _faults(ctx)
    out = ctx.fresh(
        """
        a = torch.ones(4, device=f"{NAME}:1")
        mod.faults.lose_device(1)
        seen = []
        for call in (lambda: torch.accelerator.synchronize(1), lambda: a + 1, lambda: a.cpu()):
            try:
                call()
                seen.append("no error")
            except Exception as e:
                seen.append(type(e).__name__ + ": " + str(e).split("\\n")[0])
        out["seen"] = seen
        out["other"] = (torch.ones(4, device=f"{NAME}:0") * 3).cpu().tolist()
        """
    )
    seen = out["seen"]
    expect(
        all(s.startswith("AcceleratorError") and ":1" in s for s in seen),
        f"not all raised AcceleratorError naming device 1: {seen}",
    )
    expect_equal(out["other"], [3.0] * 4, "the other device's result")


@check(T)
def delayed_kernels_keep_their_values(ctx: Context) -> None:
    """Kernels started late on purpose (the race amplifier) compute what they compute
    without delays, in stream order."""
    faults = _faults(ctx)
    x = torch.randn(64, 64)
    with faults.delay_kernels(device=0, max_us=500, seed=3):
        y = (x.to(ctx.device(0)) @ x.to(ctx.device(0))).relu().sum(0)
    expect_close(y, (x @ x).relu().sum(0), "a delayed matmul chain")
