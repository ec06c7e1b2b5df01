"""Fidelity with the CPU and CUDA where a user can tell (issue 10).

Every case runs the same code on the CPU and on openreg and compares what a
user sees: the exception type and message, the number of warnings and their
text, and the values. Each case runs twice, because the first call of a
signature runs synchronously and later ones are queued: both must behave
like the CPU. The suite also runs with OPENREG_LAUNCH_BLOCKING=1.
"""

import warnings

import pytest
import torch
from conftest import assert_same_observation, observe

D = "openreg"


def _same_as_cpu(fn, *, repeat=2):
    for _ in range(repeat):
        assert_same_observation(observe(fn, "cpu"), observe(fn, D), D)


# --- argument errors at the call ------------------------------------------


def _t(*shape, d, dtype=torch.float32, value=1):
    return torch.full(shape, value, dtype=dtype, device=d)


ERROR_CASES = {
    "div into an int64 out": lambda d: torch.div(
        _t(4, d=d, dtype=torch.int64),
        _t(4, d=d, dtype=torch.int64),
        out=_t(4, d=d, dtype=torch.int64),
    ),
    "heaviside with mixed dtypes": lambda d: torch.heaviside(
        _t(4, d=d), _t(4, d=d, dtype=torch.float64)
    ),
    "index_fill with float indices": lambda d: _t(4, d=d).index_fill(
        0, torch.tensor([0.0, 1.0], device=d), 2.0
    ),
    "float & float": lambda d: _t(4, d=d) & _t(4, d=d),
    "gcd of floats": lambda d: torch.gcd(_t(4, d=d), _t(4, d=d)),
    "shift of halves": lambda d: _t(4, d=d, dtype=torch.half) << 1,
    "bitwise_or of bfloat16": lambda d: (
        _t(4, d=d, dtype=torch.bfloat16) | _t(4, d=d, dtype=torch.bfloat16)
    ),
    "complex atan2": lambda d: torch.atan2(
        _t(4, d=d, dtype=torch.cfloat), _t(4, d=d, dtype=torch.cfloat)
    ),
    "complex fmod": lambda d: torch.fmod(_t(4, d=d, dtype=torch.cfloat), 2),
    "ldexp with a bool exponent": lambda d: torch.ldexp(_t(4, d=d), _t(4, d=d, dtype=torch.bool)),
    "add with partial overlap": lambda d: (lambda a: torch.add(a[3], _t(5, 5, d=d)[2, 3], out=a))(
        _t(5, 5, d=d)
    ),
    "internal overlap in out": lambda d: torch.add(_t(4, d=d), 1, out=_t(1, d=d).expand(4)),
    "broadcast mismatch": lambda d: torch.add(_t(3, d=d), _t(4, d=d), out=_t(4, d=d)),
    "copy_ into an empty destination": lambda d: torch.empty(1, 0, device=d).copy_(
        torch.ones(7, 4)
    ),
    "integer to a negative power": lambda d: _t(3, d=d, dtype=torch.int64) ** -1,
}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_errors_at_the_call(name):
    _same_as_cpu(ERROR_CASES[name])


def test_error_is_raised_at_the_call_not_later():
    a = _t(4, d=D, dtype=torch.int64)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            torch.div(a, a, out=torch.empty(4, dtype=torch.int64, device=D))
    # Nothing is left pending for the next synchronization or the next op.
    torch.openreg.synchronize()
    assert (a + 1).cpu().tolist() == [2, 2, 2, 2]


# --- out= resizing and warnings ---------------------------------------------

RESIZE_CASES = {
    "sum into a wrong-shaped out": lambda d: torch.sum(_t(4, 5, d=d), 0, out=_t(4, 5, d=d)),
    "mm into a wrong-shaped out": lambda d: torch.mm(
        _t(4, 5, d=d), _t(5, 4, d=d), out=_t(4, 5, d=d)
    ),
    "exp into a too small out": lambda d: torch.exp(_t(4, d=d), out=_t(2, d=d)),
    "amax into its own input": lambda d: (lambda a: torch.amax(a, 0, out=a))(_t(4, 4, d=d)),
    "eq into a float out": lambda d: torch.eq(_t(4, d=d), _t(4, d=d), out=_t(4, d=d, value=7)),
    "where into its input": lambda d: (lambda a: torch.where(a > 0, a, a * 2, out=a))(_t(4, d=d)),
    "empty out": lambda d: torch.mul(_t(3, 2, d=d), 2, out=torch.empty(0, device=d)),
}


@pytest.mark.parametrize("name", sorted(RESIZE_CASES))
def test_out_resizing_and_warnings(name):
    _same_as_cpu(RESIZE_CASES[name], repeat=3)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, v: x.fill_(v),
        lambda x, v: x.masked_fill_(torch.tensor([True, False, True], device=x.device), v),
        lambda x, v: x.index_fill_(0, torch.tensor([0], device=x.device), v),
    ],
    ids=["fill_", "masked_fill_", "index_fill_"],
)
def test_scalar_that_does_not_fit_self_raises_at_the_call(call):
    # The first call of a signature runs synchronously; later ones are queued,
    # and still raise the CPU's overflow error at the call, leaving x as is.
    results = []
    for d in ("cpu", D):
        x = torch.zeros(3, dtype=torch.uint8, device=d)
        call(x, 1.5)
        call(x, 2.5)
        with pytest.raises(
            RuntimeError, match="cannot be converted to type uint8_t without overflow"
        ):
            call(x, -1.5)
        if d == D:
            torch.openreg.synchronize()  # nothing was deferred
        results.append(x.tolist())
    assert results[1] == results[0]


def test_uint8_mask_deprecation_reaches_python_once():
    def masked(d):
        x = torch.zeros(4, device=d)
        x[torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=d)] = 1.0
        return x

    _same_as_cpu(masked)


def test_ops_restricted_to_named_devices():
    def mode(d):
        values = torch.empty(0, device=d)
        indices = torch.empty(0, dtype=torch.long, device=d)
        torch.mode(torch.tensor([1.0, 2.0, 2.0], device=d), out=(values, indices))
        return torch.stack([values, indices.to(values.dtype)])

    _same_as_cpu(mode)


# --- aliasing: one alias per device tensor per call --------------------------


def test_inplace_on_permuted_tensor_does_not_write_outside():
    def tril(d):
        b = torch.arange(196.0, device=d).reshape(2, 7, 2, 7).permute(3, 2, 1, 0)
        victim = torch.full((1000,), 5.0, device=d)
        b.tril_()
        return torch.cat([b.reshape(-1), victim])

    _same_as_cpu(tril)

    def triu(d):
        x = torch.arange(196.0, device=d).reshape(2, 7, 2, 7).permute(3, 2, 1, 0)
        torch.triu(x, out=x)
        return x

    _same_as_cpu(triu)


def test_result_written_on_a_side_stream():
    for _ in range(5):
        side = torch.openreg.Stream()
        with torch.openreg.stream(side):
            out = torch.zeros(6, 4, device=D)[::2]
            with pytest.warns(UserWarning, match="resized"):
                torch.sum(torch.ones(5, 7, 2, device=D), 2, out=out)
        torch.openreg.synchronize()
        assert out.cpu().tolist() == [[2.0] * 7] * 5


# --- value-dependent errors are deferred and name the op ---------------------


def test_value_dependent_error_surfaces_at_the_next_sync():
    x = torch.zeros(4, device=D)
    index = torch.tensor([0, 1], device=D)
    x.index_add_(0, index, torch.ones(2, device=D))  # warm: signature known
    torch.openreg.synchronize()
    if torch.openreg.get_sync_debug_mode() != 0:
        pytest.skip("sync debug mode changes the timing")
    bad = torch.tensor([0, 9], device=D)
    try:
        x.index_add_(0, bad, torch.ones(2, device=D))
    except (IndexError, RuntimeError) as e:  # blocking mode raises at the call
        assert "index" in str(e).lower()
        return
    with pytest.raises(RuntimeError, match="index_add"):
        torch.openreg.synchronize()


# --- smaller gaps -------------------------------------------------------------


def test_storage_type_is_the_typed_storage_class():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation
        assert torch.ones(2, device=D).storage_type() is torch.openreg.FloatStorage
        assert (
            torch.ones(2, dtype=torch.int64, device=D).storage_type() is torch.openreg.LongStorage
        )
        assert torch.ones(2).storage_type() is torch.FloatStorage


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.quantize_per_tensor(torch.ones(3, device=D), 0.1, 0, torch.qint8),
        lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8).to(D),
    ],
    ids=["quantize on openreg", "quantized to openreg"],
)
def test_quantized_tensors_are_refused_clearly(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantization deprecation
        with pytest.raises(NotImplementedError, match="openreg does not support quantized tensors"):
            make()


@pytest.mark.parametrize(
    "call",
    [
        lambda x, i: x[i],
        lambda x, i: x.index_put_((i,), torch.ones(2, 3)),
        lambda x, i: x.__setitem__(i, 1.0),
    ],
    ids=["index", "index_put_", "setitem"],
)
def test_cpu_tensor_indexed_with_device_indices_raises(call):
    # As on CUDA: indices may stay on the CPU, the indexed tensor may not.
    x = torch.zeros(4, 3)
    with pytest.raises(
        RuntimeError, match=r"indices should be either on cpu or on the same device"
    ):
        call(x, torch.tensor([0, 2], device=D))
    assert torch.equal(x, torch.zeros(4, 3))
    # Device tensor, CPU indices: accepted, as on CUDA.
    y = torch.zeros(4, 3, device=D)
    call(y, torch.tensor([0, 2]))
