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


def test_fused_sdp_choice_reports_the_backend_openreg_takes():
    from torch.nn.attention import SDPBackend

    q = torch.randn(1, 2, 8, 16)
    assert torch._fused_sdp_choice(q, q, q) == SDPBackend.FLASH_ATTENTION.value
    qd = q.to(D)
    assert torch._fused_sdp_choice(qd, qd, qd) == SDPBackend.OVERRIDEABLE.value
    # A mask that needs a gradient takes the math backend, as on the CPU.
    mask = torch.zeros(8, 8, device=D, requires_grad=True)
    assert torch._fused_sdp_choice(qd, qd, qd, mask) == SDPBackend.MATH.value


@pytest.mark.parametrize("causal", [False, True])
def test_fused_backward_returns_the_mask_gradient_when_asked(causal):
    # Called directly with grad_input_mask[3]: the gradient of the additive
    # mask, compared with the math formulation's autograd on the CPU.
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 8, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    mask = torch.randn(8, 6)
    m = mask.clone().requires_grad_()
    scores = q @ k.transpose(-2, -1) / 2.0 + m
    if causal:
        scores = scores.masked_fill(~torch.ones(8, 6, dtype=torch.bool).tril(), float("-inf"))
    out = torch.softmax(scores, -1) @ v
    grad = torch.randn_like(out)
    out.backward(grad)
    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_fused_attention_overrideable(
        q.to(D), k.to(D), v.to(D), mask.to(D), is_causal=causal
    )
    torch.testing.assert_close(fwd[0].cpu(), out.detach(), rtol=1e-5, atol=1e-5)
    grads = aten._scaled_dot_product_fused_attention_overrideable_backward(
        grad.to(D), q.to(D), k.to(D), v.to(D), mask.to(D), [True, True, True, True],
        *fwd[:6], 0.0, causal, fwd[6], fwd[7],
    )  # fmt: skip
    assert grads[3].shape == mask.shape
    torch.testing.assert_close(grads[3].cpu(), m.grad, rtol=1e-5, atol=1e-5)
    no_mask_grad = aten._scaled_dot_product_fused_attention_overrideable_backward(
        grad.to(D), q.to(D), k.to(D), v.to(D), mask.to(D), [True, True, True, False],
        *fwd[:6], 0.0, causal, fwd[6], fwd[7],
    )  # fmt: skip
    assert no_mask_grad[3] is None or not no_mask_grad[3].defined()
