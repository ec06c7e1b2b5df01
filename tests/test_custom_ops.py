"""The example custom operator openreg::scaled_abs (csrc/engine/ops/OpenRegCustomOps.cpp):
CPU and openreg kernels, autograd, and a Meta kernel for torch.compile."""

import torch

D = "openreg"


def test_forward_matches_cpu_kernel():
    x = torch.randn(4, 5)
    torch.testing.assert_close(
        torch.ops.openreg.scaled_abs(x.to(D), 2.5).cpu(), torch.ops.openreg.scaled_abs(x, 2.5)
    )
    torch.testing.assert_close(torch.ops.openreg.scaled_abs(x, 2.5), x.abs() * 2.5)


def test_views_and_dtypes_match_cpu_kernel():
    # The device kernel runs over dense memory: a strided view is made
    # contiguous first; a dense permutation keeps its layout.
    x = torch.randn(6, 8, dtype=torch.float64)
    for view in (lambda t: t.t()[::2], lambda t: t.t(), lambda t: t[:, 1:5]):
        out = torch.ops.openreg.scaled_abs(view(x.to(D)), -1.5)
        expected = torch.ops.openreg.scaled_abs(view(x), -1.5)
        assert out.shape == expected.shape
        torch.testing.assert_close(out.cpu(), expected)
    h = torch.randn(33).to(torch.bfloat16)
    torch.testing.assert_close(
        torch.ops.openreg.scaled_abs(h.to(D), 0.5).cpu(), torch.ops.openreg.scaled_abs(h, 0.5)
    )


def test_gradient_on_openreg_equals_cpu():
    x = torch.randn(6, requires_grad=True)
    xd = x.detach().to(D).requires_grad_()
    torch.ops.openreg.scaled_abs(x, 3.0).pow(2).sum().backward()
    torch.ops.openreg.scaled_abs(xd, 3.0).pow(2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_meta_kernel_gives_shapes():
    m = torch.ops.openreg.scaled_abs(torch.empty(3, 7, device="meta"), 1.0)
    assert m.shape == (3, 7) and m.device.type == "meta"


def test_torch_compile_aot_eager():
    def fn(t):
        return torch.ops.openreg.scaled_abs(t, 3.0) + t

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    x = torch.randn(8).to(D)
    torch.testing.assert_close(compiled(x).cpu(), fn(x.cpu()))
