"""Autocast: ``torch.autocast(NAME)`` follows CUDA's policy lists (lower
precision for matrix products and convolutions, float32 for reductions,
softmax and losses, the widest type for mixed-input ops), and
``torch.amp.GradScaler(NAME)`` scales, skips inf steps and updates its scale.
The policy lists are CUDA's (``aten/src/ATen/autocast_mode.cpp``).
"""

from __future__ import annotations

import torch

from .core import Context, Skip, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("autocast", "Autocast")

F = torch.nn.functional


def _inputs(ctx: Context, dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.randn(8, 8, device=ctx.name, dtype=dtype) for _ in range(3)]


def _dtypes_under(ctx: Context, dtype, ops: dict) -> dict:
    with torch.autocast(ctx.name, dtype=dtype):
        return {name: fn().dtype for name, fn in ops.items()}


@check(T)
def available(ctx: Context) -> None:
    """torch.amp.is_autocast_available(NAME) is True and autocast(NAME) turns
    is_autocast_enabled(NAME) on inside only."""
    expect_equal(torch.amp.is_autocast_available(ctx.name), True, "is_autocast_available")
    with torch.autocast(ctx.name):
        expect_equal(torch.is_autocast_enabled(ctx.name), True, "enabled inside")
    expect_equal(torch.is_autocast_enabled(ctx.name), False, "enabled after")


@check(T)
def default_dtype(ctx: Context) -> None:
    """autocast(NAME) without dtype uses torch.get_autocast_dtype(NAME), a 16-bit float
    type (float16 on CUDA)."""
    dtype = torch.get_autocast_dtype(ctx.name)
    expect(dtype in (torch.float16, torch.bfloat16), f"default autocast dtype {dtype}")
    a, b, _ = _inputs(ctx)
    with torch.autocast(ctx.name):
        expect_equal((a @ b).dtype, dtype, "mm under autocast(NAME)")


def _lower_precision(ctx: Context, dtype) -> None:
    a, b, c = _inputs(ctx)
    img = torch.randn(1, 2, 6, 6, device=ctx.name)
    w = torch.randn(3, 2, 3, 3, device=ctx.name)
    ops = {
        "mm": lambda: torch.mm(a, b),
        "matmul": lambda: a @ b,
        "linear": lambda: F.linear(a, b, c[0]),
        "addmm": lambda: torch.addmm(c, a, b),
        "bmm": lambda: torch.bmm(a[None], b[None]),
        "baddbmm": lambda: torch.baddbmm(c[None], a[None], b[None]),
        "conv2d": lambda: F.conv2d(img, w),
    }
    got = _dtypes_under(ctx, dtype, ops)
    wrong = {k: str(v) for k, v in got.items() if v != dtype}
    expect(not wrong, f"not {dtype}: {wrong}")


@check(T)
def lower_precision_float16(ctx: Context) -> None:
    """Under autocast(float16): mm, matmul, linear, addmm, bmm, baddbmm, conv2d give float16."""
    _lower_precision(ctx, torch.float16)


@check(T)
def lower_precision_bfloat16(ctx: Context) -> None:
    """Under autocast(bfloat16): the same ops give bfloat16."""
    _lower_precision(ctx, torch.bfloat16)


@check(T)
def float32_ops(ctx: Context) -> None:
    """Under autocast(float16), float16 inputs to softmax, log_softmax, exp, log, pow,
    sum, cumsum, layer_norm, mse_loss, cross_entropy... give float32 (CUDA's fp32 list)."""
    a, b, _ = _inputs(ctx, torch.float16)
    pos = a.abs() + 1
    target = torch.randint(0, 8, (8,), device=ctx.name)
    ops = {
        "softmax": lambda: torch.softmax(a, 1),
        "log_softmax": lambda: torch.log_softmax(a, 1),
        "exp": lambda: torch.exp(a),
        "log": lambda: torch.log(pos),
        "pow": lambda: torch.pow(pos, 2.5),
        "sum": lambda: torch.sum(a),
        "cumsum": lambda: torch.cumsum(a, 0),
        "layer_norm": lambda: F.layer_norm(a, (8,)),
        "mse_loss": lambda: F.mse_loss(a, b),
        "cross_entropy": lambda: F.cross_entropy(a, target),
        "norm": lambda: torch.norm(a),
        "cosine_similarity": lambda: F.cosine_similarity(a, b),
    }
    got = _dtypes_under(ctx, torch.float16, ops)
    wrong = {k: str(v) for k, v in got.items() if v != torch.float32}
    expect(not wrong, f"not float32: {wrong}")


@check(T)
def promote_ops(ctx: Context) -> None:
    """Under autocast, cat, stack, addcmul, addcdiv, atan2 and index_put of mixed
    float16/float32 inputs give float32 (CUDA's promote list)."""
    a32, b32, _ = _inputs(ctx)
    a16 = a32.half()
    idx = torch.tensor([0, 2], device=ctx.name)
    ops = {
        "cat": lambda: torch.cat([a16, b32]),
        "stack": lambda: torch.stack([a16, b32]),
        "addcmul": lambda: torch.addcmul(a32, a16, b32),
        "addcdiv": lambda: torch.addcdiv(a32, a16, b32.abs() + 1),
        "atan2": lambda: torch.atan2(a16, b32),
        "index_put": lambda: a16.index_put((idx,), b32[:2]),
    }
    got = _dtypes_under(ctx, torch.float16, ops)
    wrong = {k: str(v) for k, v in got.items() if v != torch.float32}
    expect(not wrong, f"not float32: {wrong}")


@check(T)
def untouched_ops(ctx: Context) -> None:
    """Ops on no list (relu, add of float32 tensors) keep their input dtype."""
    a, b, _ = _inputs(ctx)
    got = _dtypes_under(ctx, torch.float16, {"relu": lambda: a.relu(), "add": lambda: a + b})
    expect_equal(got, {"relu": torch.float32, "add": torch.float32}, "dtypes")


@check(T)
def values_like_cpu_casts(ctx: Context) -> None:
    """An autocast float16 mm equals the CPU's mm of the inputs cast to float16."""
    a, b, _ = _inputs(ctx)
    with torch.autocast(ctx.name, dtype=torch.float16):
        out = a @ b
    expected = a.cpu().half() @ b.cpu().half()
    expect_close(out, expected, "float16 mm", rtol=1e-3, atol=1e-3)


@check(T)
def disabled_inside(ctx: Context) -> None:
    """autocast(NAME, enabled=False) nested inside autocast runs in full precision."""
    a, b, _ = _inputs(ctx)
    with torch.autocast(ctx.name, dtype=torch.float16):
        with torch.autocast(ctx.name, enabled=False):
            inner = a @ b
        outer = a @ b
    expect_equal((inner.dtype, outer.dtype), (torch.float32, torch.float16), "dtypes")


@check(T)
def cpu_autocast_independent(ctx: Context) -> None:
    """autocast(NAME) does not change CPU ops, and autocast("cpu") not device ops."""
    a, b, _ = _inputs(ctx)
    with torch.autocast(ctx.name, dtype=torch.float16):
        cpu = a.cpu() @ b.cpu()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dev = a @ b
    expect_equal((cpu.dtype, dev.dtype), (torch.float32, torch.float32), "dtypes")


@check(T)
def banned_binary_cross_entropy(ctx: Context) -> None:
    """binary_cross_entropy under autocast raises RuntimeError (CUDA's banned list: use
    binary_cross_entropy_with_logits)."""
    p = torch.rand(8, device=ctx.name)
    t = torch.rand(8, device=ctx.name)
    with torch.autocast(ctx.name, dtype=torch.float16):
        expect_raises(
            RuntimeError, lambda: F.binary_cross_entropy(p, t), "binary_cross_entropy", ["autocast"]
        )
        out = F.binary_cross_entropy_with_logits(p, t)
    expect_equal(out.dtype, torch.float32, "binary_cross_entropy_with_logits dtype")


@check(T)
def amp_dtype_functions(ctx: Context) -> None:
    """torch.set_autocast_dtype(NAME, ...) round trips; the device module lists float16
    or bfloat16 in get_amp_supported_dtype()."""
    before = torch.get_autocast_dtype(ctx.name)
    try:
        torch.set_autocast_dtype(ctx.name, torch.bfloat16)
        expect_equal(torch.get_autocast_dtype(ctx.name), torch.bfloat16, "after set")
    finally:
        torch.set_autocast_dtype(ctx.name, before)
    supported = getattr(ctx.module, "get_amp_supported_dtype", None)
    if supported is None:
        raise Skip("the device module has no get_amp_supported_dtype()")
    expect(
        {torch.float16, torch.bfloat16} & set(supported()),
        f"get_amp_supported_dtype() is {supported()}",
    )


def _scaler_setup(ctx: Context):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(ctx.name)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(ctx.name, init_scale=2.0**8, growth_interval=1)
    return model, opt, scaler


@check(T)
def grad_scaler_step(ctx: Context) -> None:
    """GradScaler(NAME) scales the loss by its scale and its step equals an unscaled
    SGD step; with finite gradients the scale grows."""
    model, opt, scaler = _scaler_setup(ctx)
    ref = torch.nn.Linear(4, 1)
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    loss = model(x.to(ctx.name)).pow(2).mean()
    scaled = scaler.scale(loss)
    expect_close(scaled, loss.detach() * 2.0**8, "scaled loss")
    scaled.backward()
    scaler.step(opt)
    scaler.update()
    ref(x).pow(2).mean().backward()
    ref_opt.step()
    expect_close(
        list(model.parameters()), list(ref.parameters()), "parameters", rtol=1e-4, atol=1e-5
    )
    expect_equal(scaler.get_scale(), 2.0**9, "scale after a finite step")


@check(T)
def grad_scaler_skips_inf(ctx: Context) -> None:
    """An inf gradient makes GradScaler skip the step and halve the scale."""
    model, opt, scaler = _scaler_setup(ctx)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    loss = model(torch.randn(8, 4, device=ctx.name)).sum() * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    expect_equal(scaler.get_scale(), 2.0**7, "scale after an inf step")
    for p, b in zip(model.parameters(), before, strict=False):
        expect(torch.equal(p.detach().cpu(), b), "parameters changed by a skipped step")
