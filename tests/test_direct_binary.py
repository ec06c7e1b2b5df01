"""The direct binary path (doc:direct-binary in csrc/engine/ops/OpenRegDirectBinary.cpp).

add and sub with alpha 1, mul and true division of dense float or double
device tensors of one shape, or of one and a Python number, launch openreg's
own kernel instead of the generic fallback. Its values must be the CPU's bit
for bit (NaN payloads, signed zeros, denormals, infinities included), and
every call it does not take (broadcasting, type promotion, alpha, strides,
large tensors, errors) must behave as before, through the fallback.
"""

import json
import math

import pytest
import torch

DEV = "openreg"
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}
OPS = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
}
NUMBERS = [1, -3, 0, 2**60 + 2**36 + 1, 0.1, 2.5, -0.0, 1e300, 1e-310, math.inf, math.nan]


def _operands(n, dtype):
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=g, dtype=dtype)
    b = torch.randn(n, generator=g, dtype=dtype)
    special = [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, -1e-310, 3.0e38]
    for i, v in enumerate(special[: n // 2]):
        a[i] = v
        b[-1 - i] = v
    if n >= 4 * len(special):  # every pair of special values, NaNs of both signs together
        for i, (u, v) in enumerate((u, v) for u in special for v in special):
            if len(special) + i < n - len(special):
                a[len(special) + i], b[len(special) + i] = u, v
    return a, b


def assert_same_bits(cpu, dev):
    got = dev.cpu()
    assert got.dtype == cpu.dtype and got.shape == cpu.shape
    assert torch.equal(cpu.view(BITS[cpu.dtype]), got.view(BITS[cpu.dtype])), (cpu, got)


FOUR = ["aten::add.Tensor", "aten::div.Tensor", "aten::mul.Tensor", "aten::sub.Tensor"]


def _fallback_ops_of(py, code, **env):
    """Which of the four operators ran through the fallback (its log names
    them) in a fresh process running `code` on x, y (n floats each)."""
    out = py(
        "import json, torch, torch_openreg\n"
        + code
        + "\ntorch.openreg.synchronize()\n"
        + f"print(json.dumps(sorted(set(torch.openreg.fallback_ops()) & set({FOUR!r}))))",
        OPENREG_FALLBACK_WARNINGS="0",
        **env,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 7, 64, 1000, 32768])
@pytest.mark.parametrize("op", sorted(OPS))
def test_two_tensors_match_the_cpu_bit_for_bit(op, n, dtype):
    a, b = _operands(n, dtype)
    assert_same_bits(OPS[op](a, b), OPS[op](a.to(DEV), b.to(DEV)))
    assert_same_bits(OPS[op](a, a), OPS[op](a.to(DEV), a.to(DEV)))  # aliased operands


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", sorted(OPS))
def test_python_numbers_match_the_cpu_bit_for_bit(op, dtype):
    a, _ = _operands(257, dtype)
    x = a.to(DEV)
    for number in NUMBERS:
        assert_same_bits(OPS[op](a, number), OPS[op](x, number))
        assert_same_bits(OPS[op](number, a), OPS[op](number, x))  # radd, rsub, ...


def test_views_with_an_offset_and_several_dimensions():
    a, b = _operands(1000, torch.float32)
    x, y = a.to(DEV), b.to(DEV)
    assert_same_bits(a[1:] + b[:-1], x[1:] + y[:-1])  # contiguous views off their storage's start
    assert_same_bits(a[10:] * a[:-10], x[10:] * x[:-10])  # one storage, two offsets
    r = x.view(10, 100) / y.view(10, 100)
    assert r.shape == (10, 100) and r.is_contiguous()
    assert_same_bits(a.view(10, 100) / b.view(10, 100), r)
    assert_same_bits(a.view(10, 10, 10)[3] - 2, x.view(10, 10, 10)[3] - 2)


def test_the_path_is_taken_and_the_result_is_a_new_dense_tensor(py):
    code = """
x, y = torch.randn(64).to("openreg"), torch.randn(64).to("openreg")
results = [x + y, x - 1, x * y, x / 3.0, torch.add(x, y, alpha=1.0)]
assert all(r.is_contiguous() and r.device == x.device for r in results)
assert all(r.data_ptr() not in (x.data_ptr(), y.data_ptr()) for r in results)
"""
    assert _fallback_ops_of(py, code) == []
    assert _fallback_ops_of(py, code, OPENREG_DIRECT_BINARY="0") == FOUR


@pytest.mark.parametrize(
    "case",
    [
        ("broadcast", lambda x, y: x + y[:1]),
        ("float + double", lambda x, y: x + y.double()),
        ("float + int tensor", lambda x, y: x * y.int()),
        ("alpha", lambda x, y: torch.add(x, y, alpha=2)),
        ("strided", lambda x, y: x[::2] - y[::2]),
        ("transposed", lambda x, y: x.view(8, 8).t() / y.view(8, 8)),
        ("neg view", lambda x, y: torch._neg_view(x) * y),
        ("bool number", lambda x, y: x * True),
        ("complex number", lambda x, y: x + 1j),
        ("half", lambda x, y: x.half() + y.half()),
        ("0-dim device tensor", lambda x, y: x * y[0]),
        ("0-dim CPU tensor", lambda x, y: x + torch.tensor(2.0)),
        ("empty", lambda x, y: x[:0] + y[:0]),
    ],
    ids=lambda c: c[0],
)
def test_calls_it_does_not_take_still_match_the_cpu(case):
    _, fn = case
    a, b = _operands(64, torch.float32)
    expected = fn(a, b)
    got = fn(a.to(DEV), b.to(DEV))
    assert got.device.type == DEV and got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True, rtol=0, atol=0)


def test_large_tensors_take_the_fallback(py):
    a, b = _operands(32769, torch.float32)
    assert_same_bits(a * b, a.to(DEV) * b.to(DEV))
    code = "x = torch.ones(32769, device='openreg'); x * x"
    assert _fallback_ops_of(py, code) == ["aten::mul.Tensor"]


def test_mixed_devices_raise_as_before():
    if torch.openreg.device_count() < 2:
        pytest.skip("needs two openreg devices")
    x = torch.ones(4, device="openreg:0")
    y = torch.ones(4, device="openreg:1")
    with pytest.raises(RuntimeError, match="same device|openreg:0|openreg:1"):
        x + y
    with pytest.raises(RuntimeError):
        x + torch.ones(4)  # a CPU tensor that is not a number


def test_the_result_is_on_the_operands_device_and_stream_ordered():
    n = torch.openreg.device_count()
    dev = torch.device(DEV, n - 1)
    a, b = _operands(1000, torch.float64)
    x = a.to(dev)
    s = torch.openreg.Stream(device=dev)
    s.wait_stream(torch.openreg.current_stream(dev))
    with torch.openreg.stream(s):
        x.mul_(2)  # queued through the fallback on s
        y = x + b.to(dev)  # the direct path, after it on s
        z = y / x
    s.synchronize()
    assert y.device == dev and z.device == dev
    assert_same_bits(a * 2 + b, y)
    assert_same_bits((a * 2 + b) / (a * 2), z)
