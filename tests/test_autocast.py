"""Autocast on openreg follows CUDA's policy; GradScaler trains end to end."""

import pytest
import torch

D = "openreg"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_casts_like_cuda(dtype):
    a = torch.randn(8, 8, device=D)
    b = torch.randn(8, 8, device=D)
    with torch.autocast("openreg", dtype=dtype):
        assert torch.openreg.is_autocast_enabled()
        assert torch.openreg.get_autocast_dtype() == dtype
        mm = a @ b  # lower_precision_fp
        lin = torch.nn.functional.linear(a, b)
        summed = mm.sum()  # fp32_set_opt_dtype: reduced in float32
        soft = torch.softmax(mm, 1)  # fp32 policy list (softmax.int)
        mixed = torch.addcmul(a, mm, a)  # promote: the wider dtype
    assert not torch.openreg.is_autocast_enabled()
    assert mm.dtype == dtype and lin.dtype == dtype
    assert summed.dtype == torch.float32
    assert soft.dtype == torch.float32
    assert mixed.dtype == torch.float32
    expected = (a.cpu().to(dtype) @ b.cpu().to(dtype)).float()
    torch.testing.assert_close(mm.cpu().float(), expected)


def test_amp_module_functions():
    assert torch.openreg.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    previous = torch.openreg.get_autocast_dtype()
    torch.openreg.set_autocast_dtype(torch.bfloat16)
    assert torch.openreg.get_autocast_dtype() == torch.bfloat16
    torch.openreg.set_autocast_dtype(previous)
    torch.openreg.set_autocast_enabled(True)
    assert torch.is_autocast_enabled("openreg")
    torch.openreg.set_autocast_enabled(False)


def test_grad_scaler_training_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = model.to(D)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("openreg", init_scale=2.0**10, growth_interval=2)
    x = torch.randn(64, 16).to(D)
    y = x[:, :1].clone() * 0.5
    losses = []
    for _ in range(30):
        opt.zero_grad()
        with torch.autocast("openreg", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert scaler.get_scale() > 2.0**10  # grew: no inf/nan seen

    # An inf gradient skips the step and halves the scale.
    scale = scaler.get_scale()
    before = [p.detach().cpu().clone() for p in model.parameters()]
    opt.zero_grad()
    with torch.autocast("openreg", dtype=torch.float16):
        loss = model(x).float().sum() * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == scale / 2
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach().cpu(), b)
