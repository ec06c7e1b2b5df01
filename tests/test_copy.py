"""Copies between the CPU and openreg devices (OpenRegCopy.cpp: _copy_from)."""

import pytest
import torch
from conftest import describe

D0 = "openreg:0"
D1 = "openreg:1"

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


def sample(dtype=torch.float32, shape=(3, 5)):
    """Deterministic data that survives every dtype conversion checked here."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(shape, generator=g) * 10
    if dtype.is_complex:
        return torch.complex(x, -x / 3).to(dtype)
    return x.to(dtype)


# ---------------------------------------------------------------------------
# Directions, same dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_to_device_to_cpu_roundtrip_is_exact(dtype):
    src = sample(dtype)
    dev = src.to(D0)
    assert dev.device == torch.device(D0) and dev.dtype == dtype
    back = dev.cpu()
    assert back.device.type == "cpu"
    assert torch.equal(back, src)
    # Bit-exact, including the sign of zero and NaN payloads.
    special = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-45, 3.4e38])
    assert torch.equal(special.to(D0).cpu().view(torch.int32), special.view(torch.int32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device_to_device_same_device(dtype):
    src = sample(dtype)
    a = src.to(D0)
    b = a.clone()
    assert b.data_ptr() != a.data_ptr() and b.device == a.device
    c = torch.empty_like(a).copy_(a)
    assert torch.equal(b.cpu(), src) and torch.equal(c.cpu(), src)
    # The copy is independent of its source.
    a.zero_()
    assert torch.equal(b.cpu(), src)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device0_to_device1(dtype):
    src = sample(dtype)
    a = src.to(D0)
    b = a.to(D1)
    assert b.device == torch.device(D1)
    assert torch.equal(b.cpu(), src)
    # And back, through copy_ into an existing tensor.
    c = torch.empty(src.shape, dtype=dtype, device=D0).copy_(b)
    assert torch.equal(c.cpu(), src)
    assert torch.openreg.current_device() == 0


def test_cross_device_copy_sees_pending_work_of_source_device():
    a = torch.zeros(256, 256, device=D1)
    for _ in range(3):
        a = a + 1  # work queued on openreg:1
    b = torch.empty(256, 256, device=D0)
    b.copy_(a)
    assert b.cpu().eq(3).all()


# ---------------------------------------------------------------------------
# dtype conversion in every direction

CONVERSIONS = [
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
    (torch.float32, torch.int64),
    (torch.int64, torch.float32),
    (torch.float32, torch.bool),
    (torch.bool, torch.float32),
    (torch.float32, torch.float16),
    (torch.float16, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float64),
    (torch.float32, torch.complex64),
    (torch.complex64, torch.complex128),
    (torch.int64, torch.uint8),
    (torch.int32, torch.int8),
]


@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d", "d0d1"])
def test_copy_with_dtype_conversion(src_dtype, dst_dtype, direction):
    src_cpu = sample(src_dtype)
    expected = src_cpu.to(dst_dtype)
    if direction == "h2d":
        out = src_cpu.to(D0, dst_dtype)
        assert out.device == torch.device(D0)
    elif direction == "d2h":
        out = src_cpu.to(D0).to("cpu", dst_dtype)
        assert out.device.type == "cpu"
    elif direction == "d2d":
        out = src_cpu.to(D0).to(dst_dtype)
        assert out.device == torch.device(D0)
    else:
        out = src_cpu.to(D0).to(D1, dst_dtype)
        assert out.device == torch.device(D1)
    assert out.dtype == dst_dtype
    assert torch.equal(out.cpu(), expected)
    # copy_ into an existing tensor of the other dtype converts as well.
    dst = torch.empty(src_cpu.shape, dtype=dst_dtype, device=D0)
    dst.copy_(src_cpu if direction == "h2d" else src_cpu.to(D1 if direction == "d0d1" else D0))
    assert torch.equal(dst.cpu(), expected)


# ---------------------------------------------------------------------------
# Layouts: non-contiguous, broadcasting, slices


NONCONTIG = {
    "transpose": lambda t: t.t(),
    "step_slice": lambda t: t[::2, 1::2],
    "permute3d": lambda t: t.reshape(3, 5, 1).permute(2, 1, 0),
    "column": lambda t: t[:, 3],
    "expand": lambda t: t[:1].expand(4, 5),
}


@pytest.mark.parametrize("view", list(NONCONTIG))
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d", "d0d1"])
def test_noncontiguous_source(view, direction):
    base = sample()
    src_cpu = NONCONTIG[view](base)
    if direction == "h2d":
        src, dst = src_cpu, torch.empty(src_cpu.shape, device=D0)
    elif direction == "d2h":
        src, dst = NONCONTIG[view](base.to(D0)), torch.empty(src_cpu.shape)
    elif direction == "d2d":
        src, dst = NONCONTIG[view](base.to(D0)), torch.empty(src_cpu.shape, device=D0)
    else:
        src, dst = NONCONTIG[view](base.to(D0)), torch.empty(src_cpu.shape, device=D1)
    assert not src.is_contiguous()
    dst.copy_(src)
    assert torch.equal(dst.cpu(), src_cpu)
    # .to() / .cpu() of a non-contiguous tensor keeps values (and layout).
    moved = src.to(D1) if direction != "h2d" else src.to(D0)
    assert torch.equal(moved.cpu(), src_cpu)


@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d", "d0d1"])
def test_noncontiguous_destination(direction):
    src_cpu = sample(shape=(5, 3))
    expected = torch.zeros(3, 5)
    expected.t().copy_(src_cpu)
    if direction == "h2d":
        dst_base, src = torch.zeros(3, 5, device=D0), src_cpu
    elif direction == "d2h":
        dst_base, src = torch.zeros(3, 5), src_cpu.to(D0)
    elif direction == "d2d":
        dst_base, src = torch.zeros(3, 5, device=D0), src_cpu.to(D0)
    else:
        dst_base, src = torch.zeros(3, 5, device=D1), src_cpu.to(D0)
    dst_base.t().copy_(src)
    assert torch.equal(dst_base.cpu(), expected)


@pytest.mark.parametrize(
    "src_shape", [(5,), (1, 5), (3, 1), (), (1, 1)], ids=lambda s: "x".join(map(str, s)) or "0d"
)
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d", "d0d1"])
def test_broadcasting_copy(src_shape, direction):
    src_cpu = torch.arange(float(torch.Size(src_shape).numel())).reshape(src_shape) + 1
    expected = torch.zeros(3, 5)
    expected.copy_(src_cpu)
    if direction == "h2d":
        dst, src = torch.zeros(3, 5, device=D0), src_cpu
    elif direction == "d2h":
        dst, src = torch.zeros(3, 5), src_cpu.to(D0)
    elif direction == "d2d":
        dst, src = torch.zeros(3, 5, device=D0), src_cpu.to(D0)
    else:
        dst, src = torch.zeros(3, 5, device=D1), src_cpu.to(D0)
    dst.copy_(src)
    assert torch.equal(dst.cpu(), expected)


def test_broadcasting_copy_with_conversion():
    dst = torch.zeros(2, 4, dtype=torch.int32, device=D0)
    dst.copy_(torch.tensor([1.7, -2.2, 3.9, 0.1], dtype=torch.float64, device=D0))
    assert dst.cpu().tolist() == [[1, -2, 3, 0]] * 2


def test_copy_into_slices_of_device_tensor():
    def fill(x, dev):
        x[1:3, 1:3].copy_(torch.ones(2, 2))  # from the CPU
        x[0].copy_(torch.arange(4.0).to(dev))  # from the same device
        x[:, 3] = torch.tensor([9.0, 8.0, 7.0, 6.0])  # setitem from the CPU
        x[3, :2] = torch.tensor([5.0, 4.0]).to(D1 if dev != "cpu" else "cpu")  # other device
        return x

    expected = fill(torch.zeros(4, 4), "cpu")
    actual = fill(torch.zeros(4, 4, device=D0), D0)
    assert torch.equal(actual.cpu(), expected)


def test_copy_from_device_slice_to_cpu_slice():
    src = torch.arange(20.0).reshape(4, 5)
    dst_cpu = torch.zeros(5, 4)
    dst_cpu[1:4, :].copy_(src[:, 1:4].t())
    dst = torch.zeros(5, 4)
    dst[1:4, :].copy_(src.to(D0)[:, 1:4].t())
    assert torch.equal(dst, dst_cpu)


def test_copy_rejects_overlapping_destination():
    dst = torch.zeros(4, device=D0).expand(3, 4)
    with pytest.raises(RuntimeError, match="single memory location"):
        dst.copy_(torch.ones(3, 4))


@pytest.mark.parametrize(
    "copy",
    [
        lambda x: x[1:].copy_(x[:-1]),
        lambda x: x.view(2, 4)[:, 1:].copy_(x.view(2, 4)[:, :-1]),
        lambda x: x.view(2, 4)[:, :2].copy_(x.view(2, 4)[:, 1:3].double()),
        lambda x: x[:4].view(2, 2).copy_(x[:4].view(2, 2).t()),
    ],
    ids=[
        "shifted_1d",
        "shifted_2d",
        "shifted_2d_with_conversion",
        "self_transpose",
    ],
)
def test_partially_overlapping_copy_matches_cpu(copy):
    """Source and destination share memory: same result or same error as the CPU."""
    x_cpu = torch.arange(1.0, 9.0)
    x_dev = x_cpu.to(D0)
    try:
        copy(x_cpu)
    except RuntimeError as e:
        assert "single memory location" in str(e) or "unsupported operation" in str(e)
        with pytest.raises(RuntimeError, match="unsupported operation"):
            copy(x_dev)
    else:
        copy(x_dev)
        assert torch.equal(x_dev.cpu(), x_cpu)


# ---------------------------------------------------------------------------
# to(), non_blocking, pinned memory, empty tensors


def test_to_same_device_is_a_noop_and_copy_true_copies():
    x = torch.ones(3, device=D0)
    assert x.to(D0) is x
    assert x.to("openreg") is x  # current device is 0
    y = x.to(D0, copy=True)
    assert y is not x and y.data_ptr() != x.data_ptr() and torch.equal(y.cpu(), x.cpu())


def test_to_with_device_and_dtype_keywords():
    x = torch.arange(4.0, device=D0)
    y = x.to(device=D1, dtype=torch.int32)
    assert (y.device, y.dtype) == (torch.device(D1), torch.int32)
    assert y.cpu().tolist() == [0, 1, 2, 3]
    z = torch.arange(4.0).to(torch.device("openreg", 1))
    assert z.device == torch.device(D1)
    assert torch.equal(z.to(x).cpu(), torch.arange(4.0))  # to(other tensor)


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_non_blocking_copies(pinned):
    src = sample(shape=(64, 64))
    if pinned:
        src = src.pin_memory()
    dev = src.to(D0, non_blocking=True)
    dev2 = dev.to(D1, non_blocking=True)
    back = torch.empty(64, 64, pin_memory=pinned)
    back.copy_(dev2, non_blocking=True)
    torch.accelerator.synchronize(0)
    torch.accelerator.synchronize(1)
    assert torch.equal(back, src)
    out = dev.to("cpu", non_blocking=True)
    torch.accelerator.synchronize()
    assert torch.equal(out, src)


def test_cpu_roundtrip_exact_large():
    src = torch.arange(300_000, dtype=torch.float64).sin()
    assert torch.equal(src.to(D0).cpu(), src)
    assert torch.equal(src.to(D0).to(D1).cpu(), src)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)], ids=str)
def test_empty_tensors(shape):
    e = torch.empty(shape)
    d = e.to(D0)
    assert d.shape == shape and d.device == torch.device(D0)
    assert d.cpu().shape == shape
    assert d.to(D1).shape == shape
    assert d.to(torch.float64).dtype == torch.float64
    dst = torch.empty(shape, device=D1)
    dst.copy_(d)
    dst.copy_(e)
    assert torch.empty(shape).copy_(d).shape == shape


def test_storage_level_copies():
    data = torch.tensor([1, 2, 3, 250], dtype=torch.uint8)
    s = torch.UntypedStorage(4, device=D0)
    s.copy_(data.untyped_storage())
    assert s.device == torch.device(D0)
    assert s.cpu().tolist() == [1, 2, 3, 250]
    assert torch.ones(2, device=D0).untyped_storage().cpu().nbytes() == 8


# ---------------------------------------------------------------------------
# Conjugate / negative views (lazy bits that copies must resolve). They run
# in a subprocess: a failure here has been seen to crash the interpreter.


@pytest.mark.parametrize(
    "expr",
    [
        "c.to(D).conj().cpu()",
        "c.to(D).conj().resolve_conj().cpu()",
        "(c.to(D).conj() * 1).cpu()",
        "c.to(D).conj().imag.cpu()",
        "c.conj().to(D).cpu()",
    ],
    ids=["cpu", "resolve_conj", "mul", "imag_neg_view", "cpu_conj_to_dev"],
)
def test_conjugate_and_negative_views(py, expr):
    proc = py(
        f"""
        import torch
        D = "openreg"
        c = torch.complex(torch.arange(4.0), torch.arange(4.0) + 1)
        expected = eval({expr!r}.replace("c.to(D)", "c").replace(".to(D)", ""))
        got = eval({expr!r})
        assert got.device.type == "cpu"
        plain = lambda t: t.resolve_conj().resolve_neg()
        assert torch.equal(plain(got), plain(expected)), (got, expected)
        print("ok")
        """,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", describe(proc)
