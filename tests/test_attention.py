"""scaled_dot_product_attention through the overrideable path: the backend
choice comes from openreg's DispatchStub, the fused kernels give the CPU's
results bit for bit, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

D = "openreg"


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_forward_and_backward_equal_cpu(causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    qd, kd, vd = (t.detach().to(D).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out_d = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)
    assert torch.equal(out_d.cpu(), out)
    out.pow(2).sum().backward()
    out_d.pow(2).sum().backward()
    for a, b in ((q, qd), (k, kd), (v, vd)):
        assert torch.equal(b.grad.cpu(), a.grad)


def test_sdpa_reports_the_overrideable_backend():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q = torch.randn(1, 2, 4, 8, device=D)
    with Log():
        F.scaled_dot_product_attention(q, q, q)
    assert any("_scaled_dot_product_fused_attention_overrideable" in s for s in seen)


def test_sdpa_with_mask_and_with_dropout():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    mask = torch.randn(8, 8)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out_d = F.scaled_dot_product_attention(q.to(D), k.to(D), v.to(D), attn_mask=mask.to(D))
    torch.testing.assert_close(out_d.cpu(), out)
    dropped = F.scaled_dot_product_attention(q.to(D), k.to(D), v.to(D), dropout_p=0.5)
    assert dropped.shape == out.shape and torch.isfinite(dropped.cpu()).all()


@pytest.mark.parametrize("layout", ["contiguous", "heads_inner"])
def test_sdpa_results_have_the_cpu_layout_and_run_queued(layout):
    # The fused kernels are queued with results laid out as the CPU's (the
    # output like the query, gradients from (batch, length, heads, dim)), so
    # the operators after attention see the same strides as on the CPU.
    g = torch.Generator().manual_seed(1)

    def make(length):
        if layout == "contiguous":
            return torch.randn(2, 4, length, 16, generator=g)
        return torch.randn(2, length, 4, 16, generator=g).transpose(1, 2)

    q, k, v = make(8), make(10), make(10)
    grad = torch.randn(2, 4, 8, 16, generator=g)
    results = {}
    for device in ("cpu", "openreg"):
        qd, kd, vd = (t.detach().to(device).requires_grad_() for t in (q, k, v))
        assert qd.stride() == q.stride() and kd.stride() == k.stride()
        out = F.scaled_dot_product_attention(qd, kd, vd)
        out.backward(grad.to(device))
        results[device] = (out, qd.grad, kd.grad, vd.grad)
    for c, d in zip(results["cpu"], results["openreg"], strict=True):
        assert d.stride() == c.stride()
        assert torch.equal(d.cpu(), c)
