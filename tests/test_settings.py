"""Settings that change a CPU kernel between two calls of one signature (issue 27).

openreg learns what an operator call does from the first call of its
signature and queues the later ones (docs/operators.md, launch plans). A
process-wide or thread-local setting that changes what the CPU kernel checks,
warns about, or returns is part of the plan's key. Each setting here is
turned on between calls of the same signature, and every call, before,
under and after it, is compared with the same call on the CPU: exception type
and message, warnings, values and dtypes. The file also runs with
OPENREG_LAUNCH_BLOCKING=1 (the last test).

Identical calls also give identical bits (a kernel's thread count depends on
the sizes and torch.get_num_threads() only, never on whether the call is the
first of its signature).
"""

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_same_observation,
    describe,
    observe,
    rerun_file_in_blocking_mode,
    run_python,
)

D = "openreg"
BLOCKING = os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1"


@contextlib.contextmanager
def default_dtype(dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


@contextlib.contextmanager
def deterministic(warn_only=False):
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def warn_always():
    torch.set_warn_always(True)
    try:
        yield
    finally:
        torch.set_warn_always(False)


@contextlib.contextmanager
def matmul_precision(value):
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def _ints(d):
    return torch.arange(1, 5, device=d)


def _put(d):
    x = torch.zeros(5, device=d)
    return x.put_(torch.tensor([0, 3], device=d), torch.tensor([1.0, 2.0], device=d))


def _flags(t):
    return t, t.is_inference(), t.requires_grad


def _filled(t):
    """Uninitialized memory: its values only where deterministic mode fills it."""
    if torch.are_deterministic_algorithms_enabled():
        return t
    return tuple(t.shape), t.dtype


# setting -> calls whose result, checks or warnings depend on it
CASES = {
    "default dtype": (
        lambda: default_dtype(torch.float64),
        {
            "int / int": lambda d: _ints(d) / _ints(d),
            "int + float scalar": lambda d: _ints(d) + 1.5,
            "int * complex scalar": lambda d: _ints(d) * 1j,
            "true_divide by a scalar": lambda d: torch.true_divide(_ints(d), 3),
            "int tensor ** float": lambda d: _ints(d) ** 0.5,
        },
    ),
    "deterministic": (
        deterministic,
        {
            "put_": _put,
            "empty is filled": lambda d: _filled(torch.empty(3, 2, device=d)),
            "empty_strided is filled": lambda d: _filled(
                torch.empty_strided((2, 3), (1, 2), device=d)
            ),
            "int empty is filled": lambda d: _filled(torch.empty(4, dtype=torch.int32, device=d)),
            "resize_ fills what it adds": lambda d: _filled(torch.ones(2, device=d).resize_(5)),
            "index_add_": lambda d: torch.zeros(3, device=d).index_add_(
                0, torch.tensor([0, 0], device=d), torch.ones(2, device=d)
            ),
        },
    ),
    "deterministic, warn_only": (
        lambda: deterministic(warn_only=True),
        {"put_": _put},
    ),
    "no_grad": (
        torch.no_grad,
        {"add of a leaf": lambda d: _flags(torch.ones(3, device=d, requires_grad=True) + 1)},
    ),
    "inference_mode": (
        torch.inference_mode,
        {"add": lambda d: _flags(torch.ones(3, device=d) + 1)},
    ),
    "mkldnn disabled": (
        lambda: torch.backends.mkldnn.flags(enabled=False),
        {
            "conv2d": lambda d: F.conv2d(
                torch.linspace(-1, 1, 2 * 3 * 8 * 8, device=d).reshape(2, 3, 8, 8),
                torch.linspace(-1, 1, 4 * 3 * 3 * 3, device=d).reshape(4, 3, 3, 3),
            ),
        },
    ),
    "float32 matmul precision": (
        lambda: matmul_precision("medium"),
        {
            "mm": lambda d: (
                torch.linspace(-1, 1, 64 * 64, device=d).reshape(64, 64)
                @ torch.linspace(1, 2, 64 * 64, device=d).reshape(64, 64)
            ),
        },
    ),
}

CALLS = [(setting, call) for setting, (_, calls) in CASES.items() for call in calls]


@pytest.mark.parametrize("setting,call", CALLS, ids=[f"{s}-{c}" for s, c in CALLS])
def test_setting_between_calls_of_one_signature(setting, call):
    enter, calls = CASES[setting]
    fn = calls[call]

    def sequence(device):
        seen = [observe(fn, device)]  # learnt without the setting
        with enter():
            seen += [observe(fn, device), observe(fn, device)]
        seen.append(observe(fn, device))  # and back
        return seen

    # Values within the CPU's tolerance (the kernels are the CPU's); dtypes,
    # errors and warnings exactly.
    for cpu, dev in zip(sequence("cpu"), sequence(D), strict=True):
        assert_same_observation(cpu, dev, D)


# TORCH_WARN_ONCE: the first call in the process warns, later ones do not,
# unless warn-always is on. The CPU kernel's "once" flag is shared by the CPU
# and openreg calls of a process, so each device runs in a fresh one.
WARN_ONCE = """
import sys, warnings, torch
import torch_openreg
d = sys.argv[1]
s = torch.arange(10.0, device=d)
v = torch.rand(4, 3, device=d).t()  # non-contiguous values: a once-warning
counts = []
for always in (False, False, True, True, False):
    torch.set_warn_always(always)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = torch.searchsorted(s, v)
        if d != "cpu":
            torch.openreg.synchronize()
    counts.append(len(w))
print(counts)
"""


def test_warn_once_and_warn_always():
    seen = {}
    for d in ("cpu", D):
        proc = run_python(WARN_ONCE, args=[d])
        assert proc.returncode == 0, describe(proc)
        seen[d] = proc.stdout.strip()
    assert seen["cpu"] == "[1, 0, 1, 1, 0]"
    assert seen[D] == seen["cpu"]


def test_flush_denormal_does_not_change_device_kernels():
    # torch.set_flush_denormal sets the calling CPU thread's floating-point
    # mode; device kernels ignore it, as CUDA's do, and the first call of a
    # signature (run synchronously) and the queued ones agree.
    tiny = torch.tensor([1e-39, 2e-39], dtype=torch.float32)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        x = tiny.to(D)
        results = [(x * 1.0).cpu() for _ in range(3)]
        assert torch.equal((tiny * 1.0), torch.zeros(2))  # the CPU thread flushes
    finally:
        torch.set_flush_denormal(False)
    for r in results:
        assert torch.equal(r, tiny * 1.0)  # not flushed, like the unflushed CPU


# --- identical calls, identical bits ------------------------------------------


def test_identical_layer_norm_gradients_are_bitwise_equal():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, dtype=torch.float64, device=D, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, device=D, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, device=D, requires_grad=True)
    y = F.layer_norm(x, (4,), w, b)
    g = torch.randn_like(y)
    grads = [torch.autograd.grad(y, (x, w, b), g, retain_graph=True) for _ in range(20)]
    for later in grads[1:]:
        for first, other in zip(grads[0], later, strict=True):
            assert torch.equal(first.cpu(), other.cpu())


def test_transformer_layer_backward_is_reentrant():
    # gradcheck's reentrancy check runs the backward twice and wants equal
    # bits: PyTorch's test_grad of TransformerEncoderLayer failed it.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    layer = layer.to(device=D, dtype=torch.float64).train()
    x = torch.randn(2, 3, 8, dtype=torch.float64, device=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: layer(t), (x,), nondet_tol=0.0, fast_mode=True)


def test_whole_file_in_blocking_mode():
    if BLOCKING:
        pytest.skip("this is the blocking run")
    rerun_file_in_blocking_mode(__file__, timeout=170)
