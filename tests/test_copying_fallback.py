"""The copying fallback (OPENREG_FALLBACK=copy, csrc/aten/fallback/OpenRegCopyingFallback.cpp).

The fallback of a device whose memory the host cannot map: arguments copied
to the host through the runtime's copies, PyTorch's CPU kernel run there,
written arguments and results copied back. Each case runs in a fresh
interpreter (the setting is read once) with each driver, and compares
values with the same computation on the CPU; the launch statistics prove
that the copying fallback, not the engine, ran the calls. The conformance
kit passes under it (test_conformance_kit_passes_with_the_copying_fallback).
"""

import pytest
from conftest import describe, run_python

DRIVERS = ["thread", "process"]

CASES = r"""
import torch
o = torch.openreg
D = "openreg"
g = torch.Generator().manual_seed(0)
a = torch.randn(5, 7, generator=g)
b = torch.randn(5, 7, generator=g)
da, db = a.to(D), b.to(D)
close = torch.testing.assert_close
o._reset_launch_stats()

# Functional, with a CPU scalar (0-dim CPU tensors are allowed, as on CUDA).
close((torch.sin(da) * db + torch.tensor(2.0)).cpu(), torch.sin(a) * b + 2.0)
# A reduction and a product of non-contiguous views (views keep their strides
# and offsets on the host).
close(da.t()[1:].sum(dim=0).cpu(), a.t()[1:].sum(dim=0))
close((da[:, 1:4] @ db.t()[1:4]).cpu(), a[:, 1:4] @ b.t()[1:4])
# In place: the result is the device argument itself, written back.
x, dx = a.clone(), da.clone()
r = dx.mul_(3).add_(db)
x.mul_(3).add_(b)
assert r is dx
close(dx.cpu(), x)
# In place on a view: the base sees it.
base, dbase = a.clone(), da.clone()
dbase[1:3].sub_(1)
base[1:3].sub_(1)
close(dbase.cpu(), base)
# out= with a resize: the empty out takes the kernel's sizes on the device.
out = torch.empty(0, device=D)
torch.mul(da, db, out=out)
assert out.shape == (5, 7), out.shape
close(out.cpu(), a * b)
# A list argument written in place (the optimizers' foreach updates).
ps, dps = [a.clone(), b.clone()], [da.clone(), db.clone()]
torch._foreach_add_(ps, [b, a], alpha=0.5)
torch._foreach_add_(dps, [db, da], alpha=0.5)
for p, dp in zip(ps, dps):
    close(dp.cpu(), p)
# Several results, and integer ones.
v, i = torch.max(da, dim=1)
ev, ei = torch.max(a, dim=1)
close(v.cpu(), ev); close(i.cpu(), ei)
# Data-dependent shapes.
close(torch.nonzero(da > 0).cpu(), torch.nonzero(a > 0))
close(da[da > 0].cpu(), a[a > 0])
# Indexing with CPU indices.
idx = torch.tensor([4, 0, 2])
close(da[idx].cpu(), a[idx])
close(da.index_select(0, idx.to(D)).cpu(), a.index_select(0, idx))
# Training: autograd and an optimizer, the same steps on both devices.
torch.manual_seed(1)
m = torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
dm = torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
dm.load_state_dict(m.state_dict()); dm.to(D)
opt = torch.optim.AdamW(m.parameters(), lr=0.01)
dopt = torch.optim.AdamW(dm.parameters(), lr=0.01)
target = torch.randint(0, 3, (5,), generator=g)
for _ in range(3):
    for model, optim, inp, t in ((m, opt, a, target), (dm, dopt, da, target.to(D))):
        optim.zero_grad()
        torch.nn.functional.cross_entropy(model(inp), t).backward()
        optim.step()
for p, dp in zip(m.parameters(), dm.parameters()):
    close(dp.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
# Random operators draw from the device generator: reproducible by seed.
def draw():
    torch.manual_seed(7)
    return torch.bernoulli(torch.full((64,), 0.5, device=D)).cpu(), torch.multinomial(
        torch.ones(8, device=D), 4).cpu()
first, second = draw(), draw()
close(first[0], second[0]); close(first[1], second[1])
third = (torch.bernoulli(torch.full((64,), 0.5, device=D)).cpu(),)
assert not torch.equal(first[0], third[0])

stats = o._launch_stats()
assert stats["host_copied"] > 50, stats
assert stats["queued"] == 0 and stats["learned"] == 0, stats
assert "aten::mul.out" in o.fallback_ops(), o.fallback_ops()

# Mixed devices raise CUDA's error, before any copy.
if o.device_count() > 1:
    try:
        da + db.to("openreg:1")
        raise SystemExit("mixed devices ran")
    except RuntimeError as e:
        assert "Expected all tensors to be on the same device" in str(e), e
# A CPU tensor beside a device one raises too.
try:
    torch.atan2(da, b)
    raise SystemExit("a CPU tensor ran beside a device tensor")
except RuntimeError as e:
    assert "same device" in str(e), e
# A CPU kernel's error is raised at the call (every call synchronizes).
try:
    torch.mm(da, db)
    raise SystemExit("mm of 5x7 and 5x7 ran")
except RuntimeError as e:
    assert "cannot be multiplied" in str(e), e
# Out of memory: a result the device (64 MiB here) cannot hold, computed on
# the host, is refused when it is copied back.
try:
    torch.ones(1, device=D).expand(1 << 25).clone()
    raise SystemExit("a 128 MiB result fit in 64 MiB")
except torch.OutOfMemoryError as e:
    assert "Tried to allocate 128.00 MiB" in str(e), e
# The device is still usable.
close((da + 1).cpu(), a + 1)
print("OK", stats["host_copied"])
"""


@pytest.mark.parametrize("driver", DRIVERS)
def test_copying_fallback_computes_as_the_cpu(driver):
    proc = run_python(
        CASES,
        env={"OPENREG_FALLBACK": "copy", "OPENREG_DRIVER": driver, "OPENREG_DEVICE_MEMORY": "64M"},
        timeout=240,
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)


def test_the_engine_stays_the_default():
    proc = run_python(
        """
        import torch
        torch.openreg._reset_launch_stats()
        x = torch.ones(3, device="openreg")
        (x * 2 + 1).sum().item()
        s = torch.openreg._launch_stats()
        assert s["host_copied"] == 0 and s["queued"] + s["learned"] > 0, s
        print("OK")
        """,
        env={"OPENREG_FALLBACK": None},
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)


def test_a_bad_setting_is_refused_with_the_choices():
    proc = run_python(
        'import torch; print((torch.ones(2, device="openreg") * 2).cpu())',
        env={"OPENREG_FALLBACK": "fast"},
    )
    assert proc.returncode != 0, describe(proc)
    assert "OPENREG_FALLBACK must be 'engine'" in proc.stderr, describe(proc)
    assert "got 'fast'" in proc.stderr, describe(proc)


@pytest.mark.timeout(400)
def test_conformance_kit_passes_with_the_copying_fallback(tmp_path):
    report = tmp_path / "card.md"
    proc = run_python(
        None,
        cwd=tmp_path,
        env={"OPENREG_FALLBACK": "copy", "OPENREG_FALLBACK_WARNINGS": "0"},
        args=(
            "-m",
            "torch_openreg.conformance",
            "--device",
            "openreg",
            "--quiet",
            "--report",
            str(report),
        ),
        timeout=380,
    )
    assert proc.returncode == 0, describe(proc)
    card = report.read_text(encoding="utf-8")
    assert " 0 failed" in card or ", 0 failed" in card, card
