"""Operators: a fixed slice of PyTorch's OpInfo database, device against CPU.

For each operator below, the first ``SAMPLES`` float32 samples of its OpInfo
are made on the CPU (seeded, so every run sees the same values), copied to
the device, and the op's device result (moved back) must match its CPU
result under ``torch.testing.assert_close``'s float32 tolerances. An error
on the device where the CPU succeeds is a failure; an error the CPU raises
too must be raised on the device as well, with the same exception type.
A few hand-written checks cover what OpInfo samples do not: shape errors
and the validation of ``out=``.
"""

from __future__ import annotations

import functools

import torch

from .core import (
    Context,
    Failure,
    Skip,
    check,
    expect,
    expect_close,
    expect_equal,
    expect_raises,
    topic,
)

T = topic("operators", "Operators (OpInfo slice)")

SAMPLES = 3

# Full OpInfo names (name.variant): elementwise, reductions, linear algebra,
# neural-network functions, shape and indexing ops.
OPS = (
    "add",
    "sub",
    "mul",
    "div.no_rounding_mode",
    "pow",
    "abs",
    "neg",
    "exp",
    "log",
    "sin",
    "tanh",
    "sigmoid",
    "sqrt",
    "clamp",
    "where",
    "eq",
    "maximum",
    "sum",
    "mean",
    "amax",
    "argmax",
    "std",
    "cumsum",
    "matmul",
    "mm",
    "addmm",
    "bmm",
    "softmax",
    "log_softmax",
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.linear",
    "nn.functional.layer_norm",
    "nn.functional.conv2d",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "cat",
    "stack",
    "index_select",
    "gather",
    "masked_fill",
    "transpose",
    "reshape",
    "sort",
    "topk",
    "nonzero",
)


@functools.lru_cache(maxsize=1)
def _op_db() -> dict | str:
    """OpInfos by full name, or the reason they cannot be loaded."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception as e:  # e.g. expecttest (a PyTorch test dependency) missing
        return f"PyTorch's OpInfo database cannot be imported ({type(e).__name__}: {e})"
    return {
        (f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name): o for o in op_db
    }


def _map(fn, obj):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(fn, v) for k, v in obj.items()}
    return obj


def _run(op, sample, convert):
    args = _map(convert, sample.args)
    kwargs = _map(convert, sample.kwargs)
    return op(
        convert(sample.input)
        if isinstance(sample.input, torch.Tensor)
        else _map(convert, sample.input),
        *args,
        **kwargs,
    )


def _check_op(ctx: Context, name: str) -> None:
    db = _op_db()
    if isinstance(db, str):
        raise Skip(db)
    op = db.get(name)
    if op is None:
        raise Skip(f"this PyTorch has no OpInfo named {name!r}")
    torch.manual_seed(0)
    samples = list(op.sample_inputs("cpu", torch.float32))[:SAMPLES]
    if not samples:
        raise Skip(f"{name} has no float32 samples")
    to_dev = lambda t: t.to(ctx.name)  # noqa: E731
    same = lambda t: t  # noqa: E731
    for i, sample in enumerate(samples):
        try:
            expected = _run(op, sample, same)
        except Exception as cpu_error:
            try:
                _run(op, sample, to_dev)
            except Exception as dev_error:
                expect_equal(
                    type(dev_error).__name__,
                    type(cpu_error).__name__,
                    f"sample {i}: exception type (the CPU raised {str(cpu_error)[:80]!r})",
                )
                continue
            raise Failure(
                f"sample {i}: the CPU raised {type(cpu_error).__name__}, the device did not"
            ) from None
        try:
            actual = _run(op, sample, to_dev)
            torch.accelerator.synchronize()
        except Exception as e:
            raise Failure(
                f"sample {i} ({sample.summary() if hasattr(sample, 'summary') else ''}"
                f"): the device raised {type(e).__name__}: {str(e)[:200]}"
            ) from None
        placed = [t.device.type for t in _tensors(actual)]
        expect(all(d == ctx.name for d in placed), f"sample {i}: results on {placed}")
        expect_close(actual, expected, f"sample {i}")


def _tensors(obj) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map(lambda t: found.append(t) or t, obj)
    return found


def _register(name: str) -> None:
    def fn(ctx: Context) -> None:
        _check_op(ctx, name)

    fn.__name__ = name.replace(".", "_")
    fn.__doc__ = f"OpInfo {name}: the first {SAMPLES} float32 samples match the CPU."
    check(T)(fn)


for _name in OPS:
    _register(_name)


@check(T)
def matmul_64(ctx: Context) -> None:
    """A 64x64 matrix product and a ReLU-sum chain match the CPU."""
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    d = x.to(ctx.name)
    expect_close(
        (d @ d.T).relu().sum(dim=1), (x @ x.T).relu().sum(dim=1), "(x @ x.T).relu().sum(1)"
    )


@check(T)
def shape_error_like_cpu(ctx: Context) -> None:
    """A matmul of mismatched shapes raises RuntimeError on the device as on the CPU."""
    a, b = torch.ones(3, 4), torch.ones(5, 6)
    expect_raises(RuntimeError, lambda: a @ b, "(3x4) @ (5x6) on the CPU")
    expect_raises(
        RuntimeError, lambda: a.to(ctx.name) @ b.to(ctx.name), "(3x4) @ (5x6) on the device"
    )


@check(T)
def out_argument(ctx: Context) -> None:
    """out= of the right size is written in place; out= of another dtype that cannot hold
    the result raises RuntimeError as on the CPU."""
    a = torch.arange(6.0, device=ctx.name)
    out = torch.empty(6, device=ctx.name)
    ptr = out.data_ptr()
    torch.add(a, 1, out=out)
    expect_equal(out.data_ptr(), ptr, "out= was reallocated")
    expect_close(out, torch.arange(6.0) + 1, "out= values")
    bad = torch.empty(6, dtype=torch.int64, device=ctx.name)
    try:
        torch.add(a, 0.5, out=bad)
    except RuntimeError:
        return
    raise Failure("adding floats into an int64 out= tensor did not raise")


@check(T)
def item_and_nonzero_sync(ctx: Context) -> None:
    """Data-dependent results (item(), nonzero, masked_select) see queued work."""
    out = ctx.busy(256)
    expect_equal(out[0, 0].item(), 1.0 / 256, "item() of queued work")
    expect_equal(tuple(torch.nonzero(out > 0).shape), (256 * 256, 2), "nonzero of queued work")
