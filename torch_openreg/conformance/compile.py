"""torch.compile: the graph-capturing backends that need nothing from the
device (``eager``, ``aot_eager``) run device tensors now; the default backend
(Inductor) needs the device to be registered with Dynamo and Inductor.

Whether Inductor works is found by trying: the kit compiles a tiny function
with the default backend (Inductor's code cache goes to the run's temporary
directory unless TORCHINDUCTOR_CACHE_DIR is set).
If that fails and Dynamo has no device interface for the device type, the
Inductor checks are skipped with both errors; if an interface is registered,
the error is a failure.
"""

from __future__ import annotations

import torch

from .core import Context, Failure, Skip, check, expect, expect_close, expect_equal, topic

T = topic("compile", "torch.compile")


def _first_line(e: BaseException) -> str:
    text = [line.strip() for line in str(e).strip().splitlines() if line.strip()][:2]
    return f"{type(e).__name__}: {' '.join(text)}"[:240]


def _f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.sin() * b + 1).relu().sum(dim=0)


def _inductor_probe(ctx: Context) -> dict:
    """Compiles with the default backend in this process (once per run): forward,
    backward and dynamic shapes, each result or error recorded."""
    if "inductor" in ctx.scratch:
        return ctx.scratch["inductor"]
    out: dict = {}
    try:
        from torch._dynamo.device_interface import get_interface_for_device

        get_interface_for_device(ctx.name)
        out["interface"] = None
    except Exception as e:
        out["interface"] = _first_line(e)
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    try:
        r = torch.compile(_f)(x.to(ctx.name), y.to(ctx.name))
        close = torch.allclose(r.cpu(), _f(x, y), atol=1e-5)
        out["forward"] = {"device": r.device.type, "close": close}
    except Exception as e:
        out["forward"] = {"error": _first_line(e)}
    if "error" not in out["forward"]:
        try:
            w = torch.randn(8, 4, device=ctx.name, requires_grad=True)
            loss = torch.compile(lambda a, w: (a @ w).tanh().pow(2).sum())(x.to(ctx.name), w)
            loss.backward()
            w_cpu = w.detach().cpu().requires_grad_()
            (x @ w_cpu).tanh().pow(2).sum().backward()
            out["backward"] = {"close": torch.allclose(w.grad.cpu(), w_cpu.grad, atol=1e-4)}
        except Exception as e:
            out["backward"] = {"error": _first_line(e)}
        try:
            g = torch.compile(lambda a: a.cos() * 2 - a, dynamic=True)
            ok = []
            for n in (5, 9, 13):
                a = torch.randn(n, 3)
                ok.append(torch.allclose(g(a.to(ctx.name)).cpu(), a.cos() * 2 - a, atol=1e-5))
            out["dynamic"] = {"close": all(ok)}
        except Exception as e:
            out["dynamic"] = {"error": _first_line(e)}
    torch._dynamo.reset()
    ctx.scratch["inductor"] = out
    return out


# [doc:conformance-detect-by-trying]
def _inductor(ctx: Context, key: str) -> dict:
    probe = _inductor_probe(ctx)
    forward = probe["forward"]
    if "error" in forward:
        if probe["interface"] is not None:
            raise Skip(
                f"the default backend (Inductor) does not support {ctx.name!r}: "
                f"{forward['error']}; Dynamo has no device interface for it "
                f"({probe['interface']})"
            )
        raise Failure(f"Dynamo has a device interface for {ctx.name!r}, but: {forward['error']}")
    result = probe.get(key, forward)
    if "error" in result:
        raise Failure(result["error"])
    return result


# [/doc:conformance-detect-by-trying]
@check(T)
def dynamo_device_interface(ctx: Context) -> None:
    """Dynamo has a device interface for NAME whose device_count() is the backend's."""
    probe = _inductor_probe(ctx)
    if probe["interface"] is not None:
        raise Skip(f"no Dynamo device interface: {probe['interface']}")
    from torch._dynamo.device_interface import get_interface_for_device

    expect_equal(get_interface_for_device(ctx.name).device_count(), ctx.count, "device_count()")


@check(T)
def inductor_forward(ctx: Context) -> None:
    """torch.compile(fn) (Inductor) of an elementwise-and-reduction function gives the
    CPU's values on the device."""
    result = _inductor(ctx, "forward")
    expect_equal(result["device"], ctx.name, "result device")
    expect(result["close"], "compiled result differs from the CPU's")


@check(T)
def inductor_backward(ctx: Context) -> None:
    """A compiled loss (Inductor) backpropagates the CPU's gradients."""
    expect(_inductor(ctx, "backward")["close"], "gradients differ from the CPU's")


@check(T)
def inductor_dynamic(ctx: Context) -> None:
    """torch.compile(dynamic=True) (Inductor) is right for three input sizes."""
    expect(_inductor(ctx, "dynamic")["close"], "results differ from the CPU's")


def _fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.sin() * b).softmax(dim=-1) @ b.T


@check(T)
def aot_eager_forward(ctx: Context) -> None:
    """torch.compile(backend="aot_eager", fullgraph=True) gives the CPU's values."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    out = torch.compile(_fn, backend="aot_eager", fullgraph=True)(a.to(ctx.name), b.to(ctx.name))
    expect_equal(out.device.type, ctx.name, "result device")
    expect_close(out, _fn(a, b), "result", rtol=1e-4, atol=1e-5)


@check(T)
def aot_eager_backward(ctx: Context) -> None:
    """Gradients through torch.compile(backend="aot_eager") equal the CPU's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    grads = []
    for dev in ("cpu", ctx.name):
        x = a.detach().to(dev).requires_grad_()
        fn = torch.compile(_fn, backend="aot_eager") if dev != "cpu" else _fn
        fn(x, b.to(dev)).sum().backward()
        grads.append(x.grad.cpu())
    expect_close(grads[1], grads[0], "gradient", rtol=1e-4, atol=1e-5)


@check(T)
def eager_backend_module(ctx: Context) -> None:
    """torch.compile(module, backend="eager") of an nn.Module on the device equals the
    module's own output."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to(ctx.name)
    x = torch.randn(4, 8, device=ctx.name)
    expect_close(torch.compile(model, backend="eager")(x), model(x), "compiled module output")


@check(T)
def dynamo_guards_on_device(ctx: Context) -> None:
    """A compiled function (aot_eager) recompiles for CPU inputs after device inputs and
    gives each device's result on that device."""
    torch._dynamo.reset()
    fn = torch.compile(lambda a: a * 2 + 1, backend="aot_eager")
    d = fn(torch.ones(3, device=ctx.name))
    c = fn(torch.ones(3))
    expect_equal((d.device.type, c.device.type), (ctx.name, "cpu"), "result devices")
    expect_close(d, c, "values")
