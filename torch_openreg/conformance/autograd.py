"""Autograd on the device: gradients equal the CPU's, the engine's device
threads and stream synchronisation work (backward on a side stream), double
backward, hooks, optimizers, gradients through device transfers.
"""

from __future__ import annotations

import torch

from .core import Context, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("autograd", "Autograd")


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().cpu() for p in model.parameters()]


def _train_both(ctx: Context, steps: int, make_opt) -> tuple[list, list]:
    cpu = _mlp()
    dev = _mlp().to(ctx.name)
    opt_c, opt_d = make_opt(cpu.parameters()), make_opt(dev.parameters())
    torch.manual_seed(1)
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(steps)]
    for x, y in data:
        for model, opt, dx, dy in (
            (cpu, opt_c, x, y),
            (dev, opt_d, x.to(ctx.name), y.to(ctx.name)),
        ):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(dx), dy).backward()
            opt.step()
    return [p.detach() for p in cpu.parameters()], [p.detach().cpu() for p in dev.parameters()]


@check(T)
def mlp_gradients(ctx: Context) -> None:
    """The gradients of a small MLP's loss equal the CPU's."""
    cpu, dev = _mlp(), _mlp().to(ctx.name)
    torch.manual_seed(1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    torch.nn.functional.mse_loss(cpu(x), y).backward()
    torch.nn.functional.mse_loss(dev(x.to(ctx.name)), y.to(ctx.name)).backward()
    for p in dev.parameters():
        expect_equal(p.grad.device.type, ctx.name, "gradient device")
    expect_close(_grads(dev), _grads(cpu), "gradients", rtol=1e-4, atol=1e-5)


@check(T)
def sgd_training(ctx: Context) -> None:
    """Five SGD steps (momentum) give the CPU's parameters."""
    a, b = _train_both(ctx, 5, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    expect_close(b, a, "parameters after SGD", rtol=1e-4, atol=1e-5)


@check(T)
def adam_training(ctx: Context) -> None:
    """Five Adam steps (foreach implementation on the device) give the CPU's parameters."""
    a, b = _train_both(ctx, 5, lambda p: torch.optim.Adam(p, lr=0.01))
    expect_close(b, a, "parameters after Adam", rtol=1e-4, atol=1e-5)


@check(T)
def backward_on_side_stream(ctx: Context) -> None:
    """Forward and backward under a side stream give the CPU's gradients, usable on the
    default stream after the stream is waited for."""
    cpu, dev = _mlp(), _mlp().to(ctx.name)
    torch.manual_seed(2)
    x = torch.randn(64, 16)
    side = torch.Stream(device=ctx.name)
    side.wait_stream(torch.accelerator.current_stream())
    with side:
        dx = x.to(ctx.name)
        dev(dx).pow(2).sum().backward()
    torch.accelerator.current_stream().wait_stream(side)
    cpu(x).pow(2).sum().backward()
    grads = [p.grad * 1 for p in dev.parameters()]  # used on the default stream
    expect_close(grads, _grads(cpu), "gradients", rtol=1e-4, atol=1e-4)


@check(T)
def autograd_grad_and_double_backward(ctx: Context) -> None:
    """torch.autograd.grad with create_graph gives the CPU's first and second derivatives."""
    x_cpu = torch.linspace(-2, 2, 9, requires_grad=True)
    x_dev = x_cpu.detach().to(ctx.name).requires_grad_()
    results = []
    for x in (x_cpu, x_dev):
        y = (x.sin() * x.pow(3)).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        results.append((g.detach().cpu(), gg.cpu()))
    expect_close(results[1], results[0], "first and second derivatives", rtol=1e-4, atol=1e-5)


@check(T)
def gradient_accumulation(ctx: Context) -> None:
    """Two backward passes accumulate into .grad; zeroing resets it."""
    w = torch.ones(3, device=ctx.name, requires_grad=True)
    (w * 2).sum().backward()
    (w * 3).sum().backward()
    expect_close(w.grad, torch.full((3,), 5.0), "accumulated gradient")
    w.grad = None
    (w * 4).sum().backward()
    expect_close(w.grad, torch.full((3,), 4.0), "gradient after reset")


@check(T)
def gradient_through_transfers(ctx: Context) -> None:
    """A CPU leaf used on the device gets its gradient on the CPU, and vice versa."""
    a = torch.arange(4.0, requires_grad=True)
    (a.to(ctx.name) * 3).sum().backward()
    expect_equal(a.grad.device, torch.device("cpu"), "CPU leaf gradient device")
    expect_close(a.grad, torch.full((4,), 3.0), "CPU leaf gradient")
    b = torch.arange(4.0, device=ctx.name, requires_grad=True)
    (b.cpu() ** 2).sum().backward()
    expect_equal(b.grad.device.type, ctx.name, "device leaf gradient device")
    expect_close(b.grad, 2 * torch.arange(4.0), "device leaf gradient")


@check(T)
def tensor_hooks(ctx: Context) -> None:
    """A tensor hook sees the device gradient and can replace it."""
    seen = []
    w = torch.ones(3, device=ctx.name, requires_grad=True)
    w.register_hook(lambda g: seen.append(g.device) or g * 10)
    (w * 2).sum().backward()
    expect_equal(seen, [ctx.device(0)], "devices the hook saw")
    expect_close(w.grad, torch.full((3,), 20.0), "gradient replaced by the hook")


@check(T)
def inplace_on_leaf_rejected(ctx: Context) -> None:
    """An in-place op on a leaf that requires grad raises RuntimeError, as on the CPU."""
    w = torch.ones(3, device=ctx.name, requires_grad=True)
    expect_raises(RuntimeError, lambda: w.add_(1), "in-place add on a leaf", ["leaf"])


@check(T)
def no_grad_and_views(ctx: Context) -> None:
    """no_grad results do not require grad; gradients flow through views and in-place
    ops on non-leaf views as on the CPU."""
    w = torch.ones(4, device=ctx.name, requires_grad=True)
    with torch.no_grad():
        expect_equal((w * 2).requires_grad, False, "requires_grad under no_grad")
    results = []
    for device in ("cpu", ctx.name):
        x = torch.arange(6.0, device=device, requires_grad=True)
        y = x * 1
        y.view(2, 3)[:, 1].mul_(5)
        y.sum().backward()
        results.append(x.grad.cpu())
    expect_close(results[1], results[0], "gradient through an in-place op on a view")


@check(T)
def cnn_gradients(ctx: Context) -> None:
    """The gradients of a small CNN (conv, batch norm, pooling) equal the CPU's."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 4 * 4, 5),
    )
    dev = _copy_module(net, ctx.name)
    x = torch.randn(4, 3, 8, 8)
    net(x).logsumexp(1).sum().backward()
    dev(x.to(ctx.name)).logsumexp(1).sum().backward()
    expect_close(_grads(dev), _grads(net), "CNN gradients", rtol=1e-4, atol=1e-4)
    expect_close(
        dev[1].running_mean, net[1].running_mean, "batch norm running mean", rtol=1e-5, atol=1e-6
    )


def _copy_module(module: torch.nn.Module, device: str) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module).to(device)


@check(T)
def retain_graph(ctx: Context) -> None:
    """backward twice needs retain_graph=True (RuntimeError otherwise), as on the CPU."""
    x = torch.ones(3, device=ctx.name, requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    y.backward()
    expect_close(x.grad, 4 * torch.ones(3).exp(), "gradient after two passes")
    z = (x.exp() * 2).sum()
    z.backward()
    expect_raises(RuntimeError, z.backward, "second backward without retain_graph")
    expect(x.grad is not None, "gradient lost")
