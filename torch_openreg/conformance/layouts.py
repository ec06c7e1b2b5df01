"""Layouts beyond strided: sparse COO and compressed (CSR) tensors, nested
tensors, and the Transformer fast path that makes nested tensors from a
padding mask.

Each check compares with the same computation on the CPU. A backend may
refuse a layout, as long as it says so: a ``NotImplementedError`` of its own
makes the check skipped with that message. PyTorch's raw dispatcher error
("Could not run 'aten::...' with arguments from the 'Sparse<NAME>' backend")
is no such refusal: it names an internal operator and says nothing to the
user, so it fails the check.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .core import Context, Failure, Skip, check, expect, expect_close, expect_equal, topic

T = topic("layouts", "Sparse and nested layouts")


def _on_device(ctx: Context, layout: str, fn: Callable[[], Any]) -> Any:
    """fn(), with a clear refusal of `layout` turned into a skip."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # beta/prototype notes of PyTorch
            return fn()
    except NotImplementedError as e:
        message = str(e).split("\n")[0]
        if "Could not run" in message:
            raise Failure(
                f"{layout} tensors reach PyTorch's raw dispatcher error ({message[:200]!r}): "
                f"register kernels or a fallback that refuses them clearly"
            ) from None
        raise Skip(f"the backend refuses {layout} tensors: {message[:200]}") from None


def _parts_on(t: torch.Tensor, device: torch.device, what: str) -> None:
    expect_equal(t.device, device, f"{what}: device")
    if t.layout == torch.sparse_coo:
        parts = [t._indices(), t._values()]
    elif t.layout == torch.sparse_csr:
        parts = [t.crow_indices(), t.col_indices(), t.values()]
    else:
        parts = []
    for p in parts:
        expect_equal(p.device, device, f"{what}: device of a part")


@check(T)
def sparse_coo_create_convert_matmul(ctx: Context) -> None:
    """A COO tensor made on the device (and moved there) coalesces, converts to dense,
    multiplies a dense matrix (torch.sparse.mm, addmm) and sums as on the CPU; its
    indices and values live on the device."""
    g = torch.Generator().manual_seed(0)
    i = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])
    v = torch.tensor([3.0, 4.0, 5.0, 1.0])
    d = torch.randn(3, 4, generator=g)
    cpu = torch.sparse_coo_tensor(i, v, (2, 3))
    dev0 = ctx.device(0)

    def run():
        s = torch.sparse_coo_tensor(i.to(dev0), v.to(dev0), (2, 3))
        c = s.coalesce()
        return (
            c,
            s.to_dense(),
            torch.sparse.mm(s, d.to(dev0)),
            torch.addmm(torch.ones(2, 4, device=dev0), s, d.to(dev0), beta=0.5),
            torch.sparse.sum(s),
            cpu.to(dev0).coalesce(),
        )

    c, dense, mm, addmm, total, moved = _on_device(ctx, "sparse COO", run)
    _parts_on(c, dev0, "coalesce()")
    _parts_on(moved, dev0, ".to(device)")
    expect_close(c.indices(), cpu.coalesce().indices(), "coalesced indices")
    expect_close(c.values(), cpu.coalesce().values(), "coalesced values")
    expect_close(dense, cpu.to_dense(), "to_dense()")
    expect_close(mm, torch.sparse.mm(cpu, d), "torch.sparse.mm")
    expect_close(addmm, torch.addmm(torch.ones(2, 4), cpu, d, beta=0.5), "addmm")
    expect_close(total, torch.sparse.sum(cpu), "torch.sparse.sum")
    expect_close(moved.to_dense(), cpu.to_dense(), "a COO tensor moved to the device")


@check(T)
def sparse_csr_convert_and_matmul(ctx: Context) -> None:
    """to_sparse_csr() on the device gives the CPU's crow/col indices and values, on the
    device; CSR @ dense and to_dense() equal the CPU's."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 6, generator=g).relu()
    b = torch.randn(6, 3, generator=g)
    ref = a.to_sparse_csr()
    dev0 = ctx.device(0)

    def run():
        csr = a.to(dev0).to_sparse_csr()
        return csr, csr @ b.to(dev0), csr.to_dense()

    csr, product, back = _on_device(ctx, "sparse CSR", run)
    _parts_on(csr, dev0, "to_sparse_csr()")
    expect_equal(csr.layout, torch.sparse_csr, "layout")
    expect_close(csr.crow_indices(), ref.crow_indices(), "crow_indices")
    expect_close(csr.col_indices(), ref.col_indices(), "col_indices")
    expect_close(csr.values(), ref.values(), "values")
    expect_close(product, ref @ b, "CSR @ dense")
    expect_close(back, a, "to_dense()")


@check(T)
def sparse_embedding_training_step(ctx: Context) -> None:
    """nn.Embedding(sparse=True) gives a sparse gradient on the device; three SGD steps
    leave the weights the CPU's steps leave."""

    def train(device: Any) -> torch.Tensor:
        torch.manual_seed(0)
        emb = torch.nn.Embedding(20, 4, sparse=True).to(device)
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        for ids in ([1, 2, 1], [3, 19, 0], [2, 2, 5]):
            opt.zero_grad()
            (emb(torch.tensor(ids, device=device)) ** 2).sum().backward()
            expect(emb.weight.grad.is_sparse, "the embedding's gradient is sparse")
            opt.step()
        return emb.weight.detach()

    expected = train("cpu")
    weights = _on_device(ctx, "sparse COO", lambda: train(ctx.device(0)))
    expect_equal(weights.device, ctx.device(0), "weights' device")
    expect_close(weights, expected, "weights after three sparse SGD steps")


@check(T)
def sparse_save_load(ctx: Context) -> None:
    """torch.save / torch.load(weights_only=True) of a sparse COO tensor on the device
    gives it back on the device with its values."""
    cpu = torch.eye(3).to_sparse()

    def run():
        buf = io.BytesIO()
        torch.save(cpu.to(ctx.device(0)), buf)
        buf.seek(0)
        return torch.load(buf, weights_only=True)

    back = _on_device(ctx, "sparse COO", run)
    _parts_on(back, ctx.device(0), "loaded")
    expect_close(back.to_dense(), torch.eye(3), "loaded values")


@check(T)
def nested_tensor_ops(ctx: Context) -> None:
    """torch.nested.nested_tensor on the device: relu, softmax and a linear layer run on
    it and to_padded_tensor gives the CPU's values."""
    g = torch.Generator().manual_seed(2)
    parts = [torch.randn(2, 4, generator=g), torch.randn(3, 4, generator=g)]
    w = torch.randn(5, 4, generator=g)

    def f(nt: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.linear(nt.relu().softmax(-1), weight)
        return torch.nested.to_padded_tensor(out, 0.0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = f(torch.nested.nested_tensor(parts), w)
    out = _on_device(
        ctx,
        "nested",
        lambda: f(torch.nested.nested_tensor(parts, device=ctx.device(0)), w.to(ctx.device(0))),
    )
    expect_equal(out.device, ctx.device(0), "result's device")
    expect_close(out, expected, "padded result")


@check(T)
def transformer_fast_path_with_padding_mask(ctx: Context) -> None:
    """nn.TransformerEncoder in eval mode under no_grad with a src_key_padding_mask (the
    nested-tensor fast path) gives the CPU's output, zeros at padded positions."""

    def run(device: Any) -> torch.Tensor:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
        enc = torch.nn.TransformerEncoder(layer, 2).eval().to(device)
        x = torch.randn(2, 6, 32)
        mask = torch.zeros(2, 6, dtype=torch.bool)
        mask[0, 4:] = True
        with torch.no_grad():
            return enc(x.to(device), src_key_padding_mask=mask.to(device))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = run("cpu")
    out = _on_device(ctx, "nested", lambda: run(ctx.device(0)))
    expect_equal(out.device, ctx.device(0), "output's device")
    expect_close(out, expected, "encoder output")
