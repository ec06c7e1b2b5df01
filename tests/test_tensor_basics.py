"""Tensor basics on openreg: factories, views, in-place ops, out=, resize_, set_, printing."""

import warnings

import pytest
import torch
from conftest import DEVICE, assert_close_cpu, check_against_cpu

ALL_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]

# ---------------------------------------------------------------------------
# Factories


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_empty_zeros_ones_full(dtype):
    e = torch.empty(2, 3, dtype=dtype, device=DEVICE)
    assert (e.shape, e.dtype, e.device) == ((2, 3), dtype, torch.device("openreg:0"))
    for make in (
        lambda device: torch.zeros(2, 3, dtype=dtype, device=device),
        lambda device: torch.ones(4, dtype=dtype, device=device),
        lambda device: torch.full((3, 2), 1, dtype=dtype, device=device),
        lambda device: torch.zeros_like(torch.empty(2, 2, dtype=dtype, device=device)),
        lambda device: torch.ones_like(torch.empty(2, 2, dtype=dtype, device=device)),
    ):
        actual = make(DEVICE)
        assert actual.device.type == "openreg" and actual.dtype == dtype
        assert torch.equal(actual.cpu(), make("cpu"))


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.full((2, 2), 3.5, device=d),
        lambda d: torch.full((2,), 7, dtype=torch.int64, device=d),
        lambda d: torch.arange(10, device=d),
        lambda d: torch.arange(0, 10, 3, device=d),
        lambda d: torch.arange(0.0, 1.0, 0.125, device=d),
        lambda d: torch.arange(5, dtype=torch.float64, device=d),
        lambda d: torch.linspace(-1, 1, 7, device=d),
        lambda d: torch.logspace(0, 2, 5, device=d),
        lambda d: torch.eye(3, device=d),
        lambda d: torch.eye(2, 4, dtype=torch.int32, device=d),
        lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
        lambda d: torch.tensor([1.5, -2.25], dtype=torch.float16, device=d),
        lambda d: torch.tensor([True, False, True], device=d),
        lambda d: torch.tensor([1 + 2j, -3j], device=d),
        lambda d: torch.tensor(3.25, device=d),
        lambda d: torch.tensor([], device=d),
        lambda d: torch.empty(0, 3, device=d),
        lambda d: torch.zeros(2, 3, device=d).new_ones(3, 1),
        lambda d: torch.zeros(2, device=d).new_tensor([4, 5]),
        lambda d: torch.ones(1, 1, device=d).new_full((2, 2), -1.0),
        lambda d: torch.tril_indices(3, 3, device=d),
    ],
    ids=[
        "full",
        "full_int",
        "arange",
        "arange_step",
        "arange_float",
        "arange_f64",
        "linspace",
        "logspace",
        "eye",
        "eye_rect_int",
        "tensor_2d",
        "tensor_half",
        "tensor_bool",
        "tensor_complex",
        "tensor_0d",
        "tensor_empty",
        "empty_0x3",
        "new_ones",
        "new_tensor",
        "new_full",
        "tril_indices",
    ],
)
def test_factory_values_match_cpu(make):
    actual = make(DEVICE)
    expected = make("cpu")
    assert actual.device == torch.device("openreg:0")
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.cpu(), expected)


def test_factory_on_second_device():
    x = torch.arange(6, device="openreg:1").reshape(2, 3)
    assert x.device == torch.device("openreg:1")
    assert torch.equal(x.cpu(), torch.arange(6).reshape(2, 3))


@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_randn_shapes_and_dtypes(shape, dtype):
    x = torch.randn(shape, dtype=dtype, device=DEVICE)
    assert x.shape == shape and x.dtype == dtype and x.device.type == "openreg"
    assert torch.isfinite(x).all().item()
    assert torch.isfinite(x.cpu()).all()


def test_randn_statistics():
    x = torch.randn(20000, device=DEVICE).cpu()
    assert abs(x.mean().item()) < 0.05
    assert abs(x.std().item() - 1.0) < 0.05
    assert x.unique().numel() > 19000  # not a constant or a short cycle


def test_rand_and_randint_ranges():
    r = torch.rand(1000, device=DEVICE).cpu()
    assert (r >= 0).all() and (r < 1).all()
    i = torch.randint(3, 9, (1000,), device=DEVICE).cpu()
    assert i.dtype == torch.int64
    assert set(i.tolist()) == set(range(3, 9))
    p = torch.randperm(50, device=DEVICE).cpu()
    assert sorted(p.tolist()) == list(range(50))


# ---------------------------------------------------------------------------
# Views: share storage with the base, exactly as on the CPU

VIEWS = {
    "view": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b.view(6, 4)),
    "view_flat": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b.view(-1)),
    "view_dtype": (lambda: torch.arange(6.0), lambda b: b.view(torch.int32)),
    "reshape": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b.reshape(2, 3, 4)),
    "transpose": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b.transpose(0, 1)),
    "t": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b.t()),
    "permute": (lambda: torch.arange(24.0).reshape(2, 3, 4), lambda b: b.permute(2, 0, 1)),
    "slice": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b[1:3, ::2]),
    "slice_neg": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b[-2:, 1:-1]),
    "select": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b.select(1, 4)),
    "index_int": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b[2]),
    "narrow": (lambda: torch.arange(24.0).reshape(4, 6), lambda b: b.narrow(1, 2, 3)),
    "expand": (lambda: torch.arange(4.0).reshape(4, 1), lambda b: b.expand(4, 5)),
    "unsqueeze": (lambda: torch.arange(6.0).reshape(2, 3), lambda b: b.unsqueeze(1)),
    "squeeze": (lambda: torch.arange(6.0).reshape(2, 1, 3), lambda b: b.squeeze(1)),
    "diagonal": (lambda: torch.arange(16.0).reshape(4, 4), lambda b: b.diagonal()),
    "diagonal_offset": (lambda: torch.arange(20.0).reshape(4, 5), lambda b: b.diagonal(1)),
    "unfold": (lambda: torch.arange(10.0), lambda b: b.unfold(0, 3, 2)),
    "view_as_real": (
        lambda: torch.complex(torch.arange(4.0), -torch.arange(4.0)),
        lambda b: torch.view_as_real(b),
    ),
    "view_as_complex": (
        lambda: torch.arange(8.0).reshape(4, 2),
        lambda b: torch.view_as_complex(b),
    ),
    "real": (lambda: torch.complex(torch.arange(4.0), torch.ones(4)), lambda b: b.real),
    "as_strided": (lambda: torch.arange(12.0), lambda b: b.as_strided((3, 2), (1, 4), 2)),
    "unbind": (lambda: torch.arange(12.0).reshape(3, 4), lambda b: b.unbind(1)[2]),
    "split": (lambda: torch.arange(12.0).reshape(6, 2), lambda b: b.split(4)[1]),
    "chunk": (lambda: torch.arange(12.0).reshape(3, 4), lambda b: b.chunk(2, dim=1)[1]),
    "movedim": (lambda: torch.arange(24.0).reshape(2, 3, 4), lambda b: b.movedim(0, -1)),
    "flatten": (lambda: torch.arange(24.0).reshape(2, 3, 4), lambda b: b.flatten(1)),
    "detach": (lambda: torch.arange(5.0), lambda b: b.detach()),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view_shares_storage(name):
    make_base, view_fn = VIEWS[name]
    base_cpu = make_base().clone()  # a fresh tensor, like the device copy
    base_dev = base_cpu.to(DEVICE)
    v_cpu = view_fn(base_cpu)
    v_dev = view_fn(base_dev)

    assert v_dev.device == base_dev.device
    assert (v_dev._base is base_dev) == (v_cpu._base is base_cpu)
    assert v_dev.untyped_storage().data_ptr() == base_dev.untyped_storage().data_ptr()
    assert v_dev.data_ptr() - base_dev.data_ptr() == v_cpu.data_ptr() - base_cpu.data_ptr()
    assert v_dev.shape == v_cpu.shape
    assert v_dev.stride() == v_cpu.stride()
    assert v_dev.storage_offset() == v_cpu.storage_offset()
    assert torch.equal(v_dev.cpu(), v_cpu)

    # Writing through the base is visible in the view ...
    base_cpu.mul_(2).add_(1)
    base_dev.mul_(2).add_(1)
    assert torch.equal(v_dev.cpu(), v_cpu)

    # ... and writing through the view changes the base (when the view does
    # not alias one element several times).
    if v_cpu.is_complex() or not torch._debug_has_internal_overlap(v_cpu) == 1:
        v_cpu.mul_(-3)
        v_dev.mul_(-3)
        assert torch.equal(base_dev.cpu(), base_cpu)
        assert torch.equal(v_dev.cpu(), v_cpu)


def test_view_of_view_and_setitem_through_views():
    def mutate(x):
        x[1].fill_(5)
        x.t()[2].add_(1)
        x.diagonal().mul_(2)
        x[:, 1:3][0] = -1
        x.view(-1)[-1] = 42
        return x

    check_against_cpu(mutate, torch.zeros(3, 4))


def test_contiguous_of_views():
    b = torch.arange(24.0).reshape(2, 3, 4)
    for fn in (lambda t: t.permute(2, 0, 1), lambda t: t[:, ::2], lambda t: t.transpose(0, 2)):
        actual = fn(b.to(DEVICE)).contiguous()
        assert actual.is_contiguous()
        assert torch.equal(actual.cpu(), fn(b).contiguous())


# ---------------------------------------------------------------------------
# In-place operations

INPLACE = {
    "add_": lambda x: x.add_(2),
    "add_tensor_alpha": lambda x: x.add_(torch.ones_like(x), alpha=3),
    "sub_": lambda x: x.sub_(0.5),
    "mul_": lambda x: x.mul_(x),
    "div_": lambda x: x.div_(4),
    "pow_": lambda x: x.pow_(2),
    "neg_": lambda x: x.neg_(),
    "exp_": lambda x: x.exp_(),
    "clamp_": lambda x: x.clamp_(1, 4),
    "fill_": lambda x: x.fill_(9),
    "zero_": lambda x: x.zero_(),
    "copy_": lambda x: x.copy_(x.flip(0)),
    "masked_fill_": lambda x: x.masked_fill_(x > 2, -1),
    "index_add_": lambda x: x.index_add_(0, torch.tensor([0, 0], device=x.device), x[:2].clone()),
    "index_fill_": lambda x: x.index_fill_(1, torch.tensor([1], device=x.device), 7),
    "addcmul_": lambda x: x.addcmul_(x, x, value=0.5),
    "lerp_": lambda x: x.lerp_(torch.zeros_like(x), 0.25),
    "relu_": lambda x: x.sub_(2).relu_(),
    "sigmoid_": lambda x: x.sigmoid_(),
    "floor_divide_": lambda x: x.floor_divide_(2),
    "t_": lambda x: x.t_(),
    "unsqueeze_": lambda x: x.unsqueeze_(0),
    "transpose_": lambda x: x.transpose_(0, 1),
    "slice_add_": lambda x: x[:, 1].add_(10),
    "setitem_scalar": lambda x: x.__setitem__((0, 1), 3.0),
    "setitem_tensor": lambda x: x.__setitem__(1, torch.arange(3.0, device=x.device)),
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace(name):
    fn = INPLACE[name]
    x_cpu = torch.arange(6.0).reshape(2, 3)
    x_dev = x_cpu.to(DEVICE)
    ptr = x_dev.data_ptr()
    r_cpu = fn(x_cpu)
    r_dev = fn(x_dev)
    if r_cpu is x_cpu:
        assert r_dev is x_dev  # in-place ops return self
    assert x_dev.data_ptr() == ptr  # and really work in place
    assert x_dev.device == torch.device("openreg:0")
    assert x_dev.shape == x_cpu.shape and x_dev.stride() == x_cpu.stride()
    assert_close_cpu(x_dev, x_cpu)


def test_inplace_integer_and_bool():
    def f(x):
        x.add_(3).mul_(2).bitwise_and_(6)
        return x

    check_against_cpu(f, torch.arange(10, dtype=torch.int32))
    check_against_cpu(lambda m: m.logical_not_(), torch.tensor([True, False, True]))
    check_against_cpu(
        lambda a, b: a.bitwise_xor_(b),
        torch.tensor([3, 2, 1], dtype=torch.uint8),
        torch.tensor([1, 1, 0], dtype=torch.uint8),
    )


def test_inplace_on_second_device():
    x = torch.arange(4.0, device="openreg:1")
    x.mul_(3).add_(1)
    assert x.device == torch.device("openreg:1")
    assert x.cpu().tolist() == [1.0, 4.0, 7.0, 10.0]


# ---------------------------------------------------------------------------
# out= arguments


def test_out_correct_size():
    out = torch.empty(2, 3, device=DEVICE)
    ptr = out.data_ptr()
    a = torch.arange(6.0).reshape(2, 3)
    r = torch.add(a.to(DEVICE), 1, out=out)
    assert r is out and out.data_ptr() == ptr
    assert torch.equal(out.cpu(), a + 1)


@pytest.mark.parametrize("initial", [(0,), (1,), (10,), (2, 2, 2)], ids=str)
def test_out_wrong_size_is_resized(initial):
    a = torch.arange(6.0).reshape(2, 3)
    b = torch.arange(3.0)
    out_cpu = torch.zeros(initial)
    out_dev = torch.zeros(initial, device=DEVICE)
    with_warning = out_cpu.numel() != 0
    ctx = pytest.warns(UserWarning, match="resized") if with_warning else _no_warning()
    with ctx:
        torch.mul(a, b, out=out_cpu)
    ctx = pytest.warns(UserWarning, match="resized") if with_warning else _no_warning()
    with ctx:
        r = torch.mul(a.to(DEVICE), b.to(DEVICE), out=out_dev)
    assert r is out_dev
    assert out_dev.device == torch.device("openreg:0")
    assert out_dev.shape == (2, 3) and out_dev.stride() == out_cpu.stride()
    assert torch.equal(out_dev.cpu(), out_cpu)
    # The resized tensor is still ordinary device memory.
    assert torch.equal((out_dev + 1).cpu(), out_cpu + 1)


class _no_warning:
    """Fails on any UserWarning inside the block."""

    def __enter__(self):
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error", UserWarning)
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b, out: torch.mm(a, b, out=out),
        lambda a, b, out: torch.matmul(a, b, out=out),
        lambda a, b, out: torch.cat([a, b.t()], out=out),
        lambda a, b, out: torch.sum(a, 1, out=out),
        lambda a, b, out: torch.exp(a, out=out),
    ],
    ids=["mm", "matmul", "cat", "sum", "exp"],
)
def test_out_grows_from_empty(fn):
    a = torch.randn(3, 4)
    b = torch.randn(4, 3)
    out_cpu = torch.empty(0)
    out_dev = torch.empty(0, device=DEVICE)
    fn(a, b, out_cpu)
    r = fn(a.to(DEVICE), b.to(DEVICE), out_dev)
    assert r is out_dev
    assert out_dev.shape == out_cpu.shape
    assert_close_cpu(out_dev, out_cpu)


def test_out_wider_dtype_works():
    a = torch.arange(6.0).reshape(2, 3)
    out_cpu = torch.empty(2, 3, dtype=torch.float64)
    out_dev = torch.empty(2, 3, dtype=torch.float64, device=DEVICE)
    torch.add(a, 0.5, out=out_cpu)
    torch.add(a.to(DEVICE), 0.5, out=out_dev)
    assert out_dev.dtype == torch.float64
    assert torch.equal(out_dev.cpu(), out_cpu)
    # Integer inputs into a float out tensor.
    i = torch.arange(5)
    out_dev = torch.empty(5, device=DEVICE)
    torch.mul(i.to(DEVICE), 3, out=out_dev)
    assert torch.equal(out_dev.cpu(), (i * 3).float())


def test_out_wrong_dtype_raises_like_cpu():
    a = torch.arange(6.0).reshape(2, 3)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(a, 1, out=torch.empty(2, 3, dtype=torch.int64))
    out = torch.full((2, 3), 5, dtype=torch.int64, device=DEVICE)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(a.to(DEVICE), 1, out=out)
    assert out.cpu().eq(5).all()  # untouched


def test_out_on_cpu_for_device_inputs_raises():
    a = torch.arange(6.0, device=DEVICE)
    with pytest.raises(RuntimeError, match="same device|device"):
        torch.add(a, 1, out=torch.empty(6))


def test_out_noncontiguous_and_view_of_larger_tensor():
    a = torch.arange(6.0).reshape(3, 2)
    base_cpu = torch.zeros(2, 3)
    base_dev = torch.zeros(2, 3, device=DEVICE)
    torch.mul(a, 2, out=base_cpu.t())
    torch.mul(a.to(DEVICE), 2, out=base_dev.t())
    assert torch.equal(base_dev.cpu(), base_cpu)

    big_cpu = torch.zeros(4, 3)
    big_dev = torch.zeros(4, 3, device=DEVICE)
    torch.sub(a.t(), 1, out=big_cpu[1:3])
    torch.sub(a.t().to(DEVICE), 1, out=big_dev[1:3])
    assert torch.equal(big_dev.cpu(), big_cpu)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: torch.mul(x[:-1], 2, out=x[1:]),
        lambda x: torch.cumsum(x[:-1], 0, out=x[1:]),
        lambda x: torch.index_select(x[:-1], 0, torch.arange(7, device=x.device), out=x[1:]),
        lambda x: torch.cat([x[:2], x[2:4]], out=x[1:5]),
        lambda x: x[1:].add_(x[:-1]),
    ],
    ids=["mul", "cumsum", "index_select", "cat", "inplace_add_"],
)
def test_out_partially_overlapping_an_input_raises_like_cpu(call):
    x_cpu = torch.arange(1.0, 9.0)
    x_dev = x_cpu.to(DEVICE)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        call(x_cpu)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        call(x_dev)
    assert torch.equal(x_dev.cpu(), torch.arange(1.0, 9.0))  # nothing was written


def test_out_multiple_outputs():
    x = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    v_cpu, i_cpu = torch.empty(0), torch.empty(0, dtype=torch.long)
    v_dev = torch.empty(0, device=DEVICE)
    i_dev = torch.empty(0, dtype=torch.long, device=DEVICE)
    torch.max(x, 1, out=(v_cpu, i_cpu))
    r = torch.max(x.to(DEVICE), 1, out=(v_dev, i_dev))
    assert r[0] is v_dev and r[1] is i_dev
    assert torch.equal(v_dev.cpu(), v_cpu) and torch.equal(i_dev.cpu(), i_cpu)
    for t in (v_cpu, i_cpu, v_dev, i_dev):
        t.resize_(0)
    torch.sort(x, dim=1, descending=True, out=(v_cpu, i_cpu))
    torch.sort(x.to(DEVICE), dim=1, descending=True, out=(v_dev, i_dev))
    assert torch.equal(v_dev.cpu(), v_cpu) and torch.equal(i_dev.cpu(), i_cpu)


# ---------------------------------------------------------------------------
# resize_ and set_


def test_resize_grows_and_keeps_data():
    x = torch.arange(4.0, device=DEVICE)
    x.resize_(3, 5)
    assert x.shape == (3, 5) and x.is_contiguous()
    assert x.untyped_storage().nbytes() >= 15 * 4
    assert x.view(-1)[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    # The new part is writable device memory.
    x.view(-1)[4:] = 7.0
    assert x.view(-1).cpu().tolist() == [0.0, 1.0, 2.0, 3.0] + [7.0] * 11


def test_resize_shrink_then_grow_keeps_data():
    def f(x):
        x.resize_(2)
        x.resize_(2, 3)
        return x

    check_against_cpu(f, torch.arange(6.0))


def test_resize_variants():
    x = torch.arange(6.0, device=DEVICE)
    assert x.resize_(0).shape == (0,)
    y = torch.arange(3.0, device=DEVICE).resize_as_(torch.empty(2, 2))
    assert y.shape == (2, 2) and y.view(-1)[:3].cpu().tolist() == [0.0, 1.0, 2.0]
    z = torch.empty(0, device=DEVICE).resize_(1, 2, 3, 4, memory_format=torch.channels_last)
    assert z.stride() == torch.empty(1, 2, 3, 4).to(memory_format=torch.channels_last).stride()
    with pytest.raises(RuntimeError, match="negative"):
        torch.empty(2, device=DEVICE).resize_(-1)


def test_untyped_storage_resize_keeps_data():
    x = torch.arange(4.0, device=DEVICE)
    s = x.untyped_storage()
    s.resize_(64)
    assert s.nbytes() == 64 and s.device == torch.device("openreg:0")
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_set_tensor():
    src = torch.arange(6.0, device=DEVICE)
    y = torch.empty(0, device=DEVICE)
    y.set_(src)
    assert y.data_ptr() == src.data_ptr() and y.shape == src.shape
    y[0] = 100.0
    assert src.cpu().tolist() == [100.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    "call",
    [
        lambda y, s: y.set_(s.untyped_storage()),
        lambda y, s: y.set_(s.untyped_storage(), 2, (2, 2), (1, 2)),
        lambda y, s: y.set_(s.untyped_storage(), 1, (3,)),
        lambda y, s: y.set_(s[1:].t() if s.dim() == 2 else s[2:]),
        lambda y, s: y.set_(),
    ],
    ids=["storage", "storage_offset_stride", "storage_offset_contig", "tensor_view", "empty"],
)
def test_set_overloads_match_cpu(call):
    src_cpu = torch.arange(8.0)
    src_dev = src_cpu.to(DEVICE)
    y_cpu = torch.empty(0)
    y_dev = torch.empty(0, device=DEVICE)
    call(y_cpu, src_cpu)
    call(y_dev, src_dev)
    assert y_dev.device == torch.device("openreg:0")
    assert (y_dev.shape, y_dev.stride(), y_dev.storage_offset()) == (
        y_cpu.shape,
        y_cpu.stride(),
        y_cpu.storage_offset(),
    )
    assert torch.equal(y_dev.cpu(), y_cpu)
    if y_cpu.numel():
        assert y_dev.untyped_storage().data_ptr() == src_dev.untyped_storage().data_ptr()


def test_set_rejects_storage_of_other_device():
    with pytest.raises(RuntimeError, match="different device"):
        torch.empty(0, device="openreg:0").set_(torch.ones(3).untyped_storage())
    with pytest.raises(RuntimeError, match="different device"):
        torch.empty(0, device="openreg:0").set_(torch.ones(3, device="openreg:1").untyped_storage())


# ---------------------------------------------------------------------------
# Scalars and printing


def test_item_and_python_conversions():
    assert torch.tensor(3.5, device=DEVICE).item() == 3.5
    assert int(torch.tensor(-4, device=DEVICE)) == -4
    assert float(torch.tensor(0.25, dtype=torch.float16, device=DEVICE)) == 0.25
    assert torch.tensor(2.5, dtype=torch.bfloat16, device=DEVICE).item() == 2.5
    assert torch.tensor(1 - 2j, device=DEVICE).item() == 1 - 2j
    assert bool(torch.tensor([True], device=DEVICE)) is True
    assert torch.tensor([[1, 2], [3, 4]], device=DEVICE).tolist() == [[1, 2], [3, 4]]
    # A non-contiguous element on the second device.
    x = torch.arange(6.0, device="openreg:1").reshape(2, 3).t()
    assert x[2, 1].item() == 5.0
    with pytest.raises(RuntimeError, match="elements cannot be converted"):
        torch.ones(2, device=DEVICE).item()


def test_repr_of_ones():
    r = repr(torch.ones(2, 3, device="openreg"))
    assert "device='openreg:0'" in r
    assert r == "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='openreg:0')"
    assert str(torch.tensor([1.5], device="openreg:1")) == "tensor([1.5000], device='openreg:1')"


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(2000.0),  # summarised with "..."
        lambda: torch.tensor([float("nan"), float("inf"), 1e10, 1e-10]),
        lambda: torch.randn(3, 4, dtype=torch.float64).mul(100).round(),
        lambda: torch.arange(5),
        lambda: torch.tensor(2.5),
        lambda: torch.tensor([True, False]),
    ],
    ids=["summarized", "special", "float64", "int64", "scalar", "bool"],
)
def test_repr_values_match_cpu(make):
    t = make()
    r_dev = repr(t.to(DEVICE))
    r_cpu = repr(t)
    # Same text, with the device inserted before the closing parenthesis
    # (or before ", dtype=..." for non-default dtypes).
    if ", dtype=" in r_cpu:
        head, tail = r_cpu.split(", dtype=")
        expected = f"{head}, device='openreg:0', dtype={tail}"
    else:
        expected = r_cpu[:-1] + ", device='openreg:0')"
    assert r_dev == expected


def test_type_strings():
    assert torch.ones(1, device=DEVICE).type() == "torch.openreg.FloatTensor"
    assert torch.ones(1, dtype=torch.int64, device=DEVICE).type() == "torch.openreg.LongTensor"


# ---------------------------------------------------------------------------
# The done criterion


def test_matmul_64x64_matches_cpu():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=g)
    b = torch.randn(64, 64, generator=g)
    result = a.to(DEVICE) @ b.to(DEVICE)
    assert result.device == torch.device("openreg:0")
    assert result.shape == (64, 64)
    torch.testing.assert_close(result.cpu(), a @ b)


def test_matmul_of_device_randn_matches_cpu_on_same_data():
    a = torch.randn(64, 64, device=DEVICE)
    b = torch.randn(64, 64, device=DEVICE)
    torch.testing.assert_close((a @ b).cpu(), a.cpu() @ b.cpu())
