"""Differential OpInfo harness: every OpInfo sample on the CPU and on openreg.

For each OpInfo in PyTorch's ``op_db``, each CPU-supported dtype and each
sample from ``op.sample_inputs("openreg", dtype)`` (made on the device, as
PyTorch's device tests make them on CUDA), the op runs on openreg and on a
CPU twin of the sample (same values, sizes, strides and storage offsets); the
openreg result (moved back to the CPU) must match the CPU result
(``torch.testing.assert_close`` with the default tolerances for the dtype,
``equal_nan=True``). With ``--grad`` the gradients of the sum of the
floating/complex outputs w.r.t. the floating/complex inputs are compared too
(ops with ``supports_autograd``, the dtypes of
``supported_backward_dtypes("cpu")``). Every skipped sample has a reason.

Importable (``run_op``, ``select_ops``, ...; used by ``tests/test_opinfo_slice.py``)
and a CLI::

    .venv/bin/python -m tests.opinfo.harness --dtypes float32 --report r.md
    .venv/bin/python tests/opinfo/harness.py --ops softmax,conv --grad

The CLI runs the ops in a worker subprocess, so an op that kills or hangs the
interpreter is recorded as a failure and the run continues with the next op.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch

import torch_openreg  # noqa: F401

DEVICE = "openreg"

# OpInfos that draw random numbers: the CPU and the openreg generators
# differ, so values cannot be compared. (A name list, not substrings: "rand"
# would catch __rand__, "normal" nn.functional.normalize, "dropout"
# native_dropout_backward and "poisson" poisson_nll_loss, all deterministic.)
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "normal",
        "normal.in_place",
        "normal.number_mean",
        "uniform",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "nn.functional.alpha_dropout",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "nn.functional.rrelu",
        "pca_lowrank",
        "svd_lowrank",
    }
)
# OpInfos whose samples draw random numbers when they ask for dropout. The
# kernels draw from openreg's own random stream (counter-based, like CUDA's
# Philox), so those samples cannot be compared with the CPU.
DROPOUT_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    # multi_head_attention_forward(query, key, value, ..., dropout_p, ..., training=)
    "nn.functional.multi_head_attention_forward": lambda s: (
        s.args[9] > 0 and s.kwargs.get("training", True)
    ),
}


def sample_skip_reason(op, sample):
    """Why one sample is not compared, or None."""
    draws = DROPOUT_SAMPLES.get(full_name(op))
    if draws is not None and draws(sample):
        return "nondeterministic: dropout draws random numbers (CPU and openreg generators differ)"
    return None


# Results are uninitialised memory: never comparable.
UNINITIALIZED_OPS = (
    "empty",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "empty_strided",
    "empty_permuted",
)

# The cause of every failure that remains, by OpInfo: (short cause, explanation).
# The markdown report puts them beside the failures; a failing op missing here
# is reported as not investigated.
_LCE_CAUSE = (
    "PyTorch picks a different algorithm for non-CPU/CUDA devices",
    "`F.linear_cross_entropy` with `LinearCrossEntropyOptions` resolves "
    '`acc_policy="auto"` from `_AUTO_DEFAULTS[(device.type, dtype)]` '
    "(torch/nn/modules/linear_cross_entropy_options.py): the CPU gets "
    '`"accurate"` with float32 accumulation (`_resolve_auto_acc_dtype` answers '
    "float32 only for cpu and cuda); every other device type, openreg included, "
    'gets `_AUTO_FALLBACK` (`"compact"`), accumulating in the input dtype. In '
    "bfloat16/float16 the two algorithms round differently. Not an openreg bug: "
    'with `acc_policy="accurate", acc_dtype=torch.float32` passed explicitly, '
    "every one of these samples, forward and gradient, matches the CPU.",
)
KNOWN_CAUSES = {
    "nn.functional.linear_cross_entropy.chunked": _LCE_CAUSE,
    "nn.functional.linear_cross_entropy.chunked_none": _LCE_CAUSE,
    "nn.functional.mish": (
        "mish_backward has a CPU-only kernel; other devices run its decomposition",
        "`aten::mish_backward` is CompositeImplicitAutograd (math_mish_backward: "
        "sigmoid, tanh(softplus(x)) and the products rounded separately in float16) "
        "with a dedicated kernel for the CPU only; openreg, like CUDA, runs the "
        "decomposition. Checked: the openreg gradient equals math_mish_backward "
        "computed on the CPU bit for bit. Sending mish_backward to the fallback "
        "would need a kernel at AutogradPrivateUse1 and would lose double "
        "backward, so it stays.",
    ),
}

# An op whose single sample (CPU + openreg) takes longer than this is cut short.
SLOW_SAMPLE_S = 10.0

# An op still running after this many seconds has the rest of its samples skipped.
OP_BUDGET_S = 60.0


# ---------------------------------------------------------------------------
# Results


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def add(self, other: Counts) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped

    @property
    def ran(self) -> int:
        """Samples that ran on the CPU (and therefore were compared)."""
        return self.passed + self.failed


@dataclass
class OpResult:
    name: str
    forward: Counts = field(default_factory=Counts)
    grad: Counts = field(default_factory=Counts)
    # (mode, dtype, sample index, message)
    failures: list = field(default_factory=list)
    # reason -> number of samples (or op-level reasons with count 0)
    skips: dict = field(default_factory=dict)
    seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def skip(self, counts: Counts, reason: str, n: int = 1) -> None:
        counts.skipped += n
        self.skips[reason] = self.skips.get(reason, 0) + n

    def fail(self, counts: Counts, mode: str, dtype, index: int, message: str) -> None:
        counts.failed += 1
        self.failures.append((mode, str(dtype).replace("torch.", ""), index, message))

    @property
    def total(self) -> Counts:
        c = Counts()
        c.add(self.forward)
        c.add(self.grad)
        return c

    def line(self) -> str:
        c = self.total
        text = f"{self.name}: {c.passed} passed, {c.failed} failed, {c.skipped} skipped"
        if self.failures:
            mode, dtype, index, message = self.failures[0]
            text += f"  [first failure: {mode} {dtype} sample {index}: {message}]"
        return text

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "forward": vars(self.forward),
            "grad": vars(self.grad),
            "failures": [list(f) for f in self.failures],
            "skips": self.skips,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_json(cls, data: dict) -> OpResult:
        r = cls(data["name"], Counts(**data["forward"]), Counts(**data["grad"]))
        r.failures = [tuple(f) for f in data["failures"]]
        r.skips = dict(data["skips"])
        r.seconds = data.get("seconds", 0.0)
        return r


# ---------------------------------------------------------------------------
# Helpers


def op_db():
    from torch.testing._internal.common_methods_invocations import op_db as db

    return db


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select_ops(names=None, exact=False):
    """OpInfos whose full name contains (or, with exact, equals) one of names."""
    ops = op_db()
    if not names:
        return list(ops)
    if exact:
        wanted = set(names)
        return [op for op in ops if full_name(op) in wanted]
    return [op for op in ops if any(n in full_name(op) for n in names)]


def parse_dtypes(text):
    if not text:
        return None
    out = []
    for name in text.split(","):
        dtype = getattr(torch, name.strip(), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {name!r}")
        out.append(dtype)
    return out


def skip_reason(op):
    """Why the whole op is not compared, or None."""
    if full_name(op) in RANDOM_OPS:
        return "nondeterministic: draws random numbers (CPU and openreg generators differ)"
    if op.name in UNINITIALIZED_OPS:
        return "uninitialized output: the values are whatever memory held"
    return None


def tree_map(fn, obj):
    """fn applied to every tensor inside nested tuples/lists/dicts/namedtuples."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(tree_map(fn, o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(tree_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def tensors_in(obj):
    found = []
    tree_map(found.append, obj)
    return found


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def mismatch_text(exc: AssertionError) -> str:
    """assert_close's headline plus its mismatch statistics, on one line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "mismatch: " + "; ".join(lines[:4])[:400]


def synchronize():
    torch.openreg.synchronize()


def compare(actual, expected, path="result"):
    """Raises AssertionError when the openreg result differs from the CPU result."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{path}: expected a tensor, got {type(actual).__name__}")
        torch.testing.assert_close(
            actual.cpu(), expected, equal_nan=True, check_device=False, msg=None
        )
        return
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            raise AssertionError(f"{path}: expected a sequence of {len(expected)}, got {actual!r}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            compare(a, e, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise AssertionError(f"{path}: dict keys differ")
        for k in expected:
            compare(actual[k], expected[k], f"{path}[{k!r}]")
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) and math.isnan(actual):
            return
    if actual != expected:
        raise AssertionError(f"{path}: {actual!r} != {expected!r}")


def _call(op, sample_input, args, kwargs):
    return op(sample_input, *args, **kwargs)


# ---------------------------------------------------------------------------
# Samples: made on openreg, as PyTorch's device tests make them, and copied to
# the CPU with their layout


class Twin:
    """Copies the tensors of one sample to another device, layout and all.

    ``t.to(device)`` would copy only the elements a view shows, into a new
    dense tensor: an op that reads beyond the view (``as_strided`` with a
    storage offset) would see other memory, and a strided input would reach
    the kernel contiguous on one side only (GEMMs round differently for
    another leading dimension). A twin copies each storage whole, once, and
    recreates every tensor over the copy with the same sizes, strides and
    storage offset, so tensors that share memory still share it.
    Non-strided tensors (sparse) and conjugate/negative views are copied
    with ``.to``. Leaves that require grad get twins that are leaves too.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        self.storages = {}
        self.tensors = {}

    def __call__(self, t):
        key = id(t)
        if key not in self.tensors:
            self.tensors[key] = (t, self._copy(t))  # t kept alive: ids stay unique
        return self.tensors[key][1]

    def _copy(self, t):
        with torch.no_grad():
            if t.layout != torch.strided or t.is_conj() or t.is_neg():
                copy = t.detach().to(self.device, copy=True)
            else:
                storage = t.untyped_storage()
                skey = (t.device, storage.data_ptr(), storage.nbytes())
                base = self.storages.get(skey) if storage.nbytes() else None
                if base is None:
                    whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
                    base = whole.to(self.device, copy=True)
                    self.storages[skey] = base
                copy = torch.empty(0, dtype=t.dtype, device=self.device).set_(
                    base.untyped_storage(), t.storage_offset(), t.size(), t.stride()
                )
        if t.requires_grad:
            copy.requires_grad_(True)
        return copy


def _host_devices(obj):
    """obj with every openreg device argument ("openreg", torch.device) made the CPU."""
    if isinstance(obj, torch.device) and obj.type == DEVICE:
        return torch.device("cpu")
    if isinstance(obj, str) and (obj == DEVICE or obj.startswith(DEVICE + ":")):
        return "cpu"
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_host_devices(o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_host_devices(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _host_devices(v) for k, v in obj.items()}
    return obj


def cpu_twin(sample):
    """(input, args, kwargs) of the sample with every tensor copied to the CPU
    and every device argument naming openreg (``x.to("openreg")`` in a sample
    made on openreg: "the sample's device") naming the CPU."""
    return _host_devices(tree_map(Twin("cpu"), (sample.input, sample.args, sample.kwargs)))


# ---------------------------------------------------------------------------
# Forward


def check_forward(op, sample):
    """One sample (made on openreg). Returns ("pass"|"skip"|"fail", message)."""
    # CPU copies first: either call may modify its inputs in place.
    cpu = cpu_twin(sample)
    try:
        expected = _call(op, *cpu)
    except Exception as exc:  # noqa: BLE001
        return "skip", cpu_raises(exc)
    return run_and_compare(lambda: _call(op, sample.input, sample.args, sample.kwargs), expected)


def run_and_compare(run_device, expected, path="result"):
    """Runs the openreg side, waits for it, and compares with `expected`; a
    pending kernel error is drained on failure."""
    try:
        actual = run_device()
        synchronize()
    except Exception as exc:  # noqa: BLE001
        _drain()
        return "fail", first_line(exc)
    try:
        compare(actual, expected, path)
    except AssertionError as exc:
        return "fail", mismatch_text(exc)
    except Exception as exc:  # noqa: BLE001
        _drain()
        return "fail", f"comparing: {first_line(exc)}"
    return "pass", ""


def cpu_raises(exc):
    """The skip reason for a sample the CPU itself rejects."""
    return f"cpu raises {first_line(exc)[:120]}"


def _drain():
    """A kernel error left pending must not be blamed on the next sample."""
    for _ in range(3):
        try:
            synchronize()
            return
        except Exception:  # noqa: BLE001, S112
            continue


# ---------------------------------------------------------------------------
# Gradients


def _leaf(t):
    """The openreg side's input: a leaf over the sample tensor's memory."""
    leaf = t.detach()
    if t.requires_grad:
        leaf.requires_grad_(True)
    return leaf


def _differentiable(t):
    return t.is_floating_point() or t.is_complex()


def _real_sum(t):
    """A real scalar from one output: complex outputs contribute real + imaginary
    parts. complex32 is summed as complex64 (the CPU has no complex32 sum)."""
    s = (t.to(torch.complex64) if t.dtype == torch.complex32 else t).sum()
    return s.real + s.imag if s.is_complex() else s


def _grad_once(op, sample, inputs):
    """Gradients of the outputs' sum w.r.t. the inputs that require grad, or
    None when there are none."""
    wrt = [t for t in tensors_in(inputs) if t.requires_grad and _differentiable(t)]
    out = _call(op, *inputs)
    out = sample.output_process_fn_grad(out)
    outs = [t for t in tensors_in(out) if _differentiable(t) and t.requires_grad and t.grad_fn]
    if not wrt or not outs:
        return None
    total = sum(_real_sum(o) for o in outs)
    grads = torch.autograd.grad(total, wrt, allow_unused=True)
    return [g.detach() if g is not None else None for g in grads]


def check_grad(op, sample):
    cpu = cpu_twin(sample)
    dev = tree_map(_leaf, (sample.input, sample.args, sample.kwargs))
    try:
        expected = _grad_once(op, sample, cpu)
    except Exception as exc:  # noqa: BLE001
        return "skip", cpu_raises(exc)
    if expected is None:
        return "skip", (
            "no differentiable input/output: no floating/complex output with a grad_fn "
            "(it is an input itself, or integer/boolean)"
        )
    return run_and_compare(lambda: _grad_once(op, sample, dev), expected, "grad")


# ---------------------------------------------------------------------------
# One op


# Every (op, mode, dtype) starts from this seed: runs are reproducible, and a
# sample's values do not depend on which ops ran before it.
SEED = 0


# Sparse layouts an OpInfo may support, with the attribute that says so
# (``--sparse``: the samples of ``op.sample_inputs_sparse``).
SPARSE_LAYOUTS = {
    "sparse_coo": (torch.sparse_coo, "supports_sparse"),
    "sparse_csr": (torch.sparse_csr, "supports_sparse_csr"),
    "sparse_csc": (torch.sparse_csc, "supports_sparse_csc"),
    "sparse_bsr": (torch.sparse_bsr, "supports_sparse_bsr"),
    "sparse_bsc": (torch.sparse_bsc, "supports_sparse_bsc"),
}
# The layout whose samples _samples makes (None: the strided ones).
_SAMPLE_LAYOUT = None


def _samples(op, dtype, requires_grad, device=DEVICE):
    """The OpInfo's samples made on openreg, as PyTorch's device-generic tests
    make them on CUDA (index arguments an op wants on the host stay there)."""
    if _SAMPLE_LAYOUT is not None:
        return _sparse_samples(op, SPARSE_LAYOUTS[_SAMPLE_LAYOUT][0], dtype, requires_grad, device)
    return op.sample_inputs(device, dtype, requires_grad=requires_grad)


def _sparse_samples(op, layout, dtype, requires_grad, device):
    """op.sample_inputs_sparse; for an OpInfo that has none (unary ufuncs
    raise NotImplementedError), its strided samples with the input converted
    to `layout`, as PyTorch's sparse unary-ufunc tests make them."""
    try:
        samples = iter(op.sample_inputs_sparse(layout, device, dtype, requires_grad=requires_grad))
        first = next(samples)
    except StopIteration:
        return
    except NotImplementedError:
        yield from _converted_samples(op, layout, dtype, requires_grad, device)
        return
    yield first
    yield from samples


def _converted_samples(op, layout, dtype, requires_grad, device):
    from torch.testing._internal.opinfo.core import SampleInput

    for s in op.sample_inputs(device, dtype, requires_grad=False):
        t = s.input
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            continue
        if layout == torch.sparse_coo:
            if t.dim() < 1:
                continue
            converted = t.to_sparse()
        elif layout in (torch.sparse_csr, torch.sparse_csc):
            if t.dim() != 2:
                continue
            converted = t.to_sparse(layout=layout)
        else:  # block layouts: a 2x2 block where the sizes allow it
            if t.dim() != 2 or t.shape[0] % 2 or t.shape[1] % 2 or t.numel() == 0:
                continue
            converted = t.to_sparse(layout=layout, blocksize=(2, 2))
        yield SampleInput(converted.requires_grad_(requires_grad), args=s.args, kwargs=s.kwargs)


def sparse_entries(names=None):
    """(OpInfo, layout name) for every sparse layout an OpInfo supports, whose
    "name [layout]" contains one of names (all if none)."""
    out = []
    for op in op_db():
        for layout, (_, attr) in SPARSE_LAYOUTS.items():
            label = f"{full_name(op)} [{layout}]"
            if getattr(op, attr, False) and (not names or any(n in label for n in names)):
                out.append((op, layout))
    return out


def run_sparse_op(op, layout, dtypes=None, grad=False, limit_samples=None) -> OpResult:
    """run_op on the samples of one sparse layout; the result is named
    "name [layout]"."""
    global _SAMPLE_LAYOUT
    _SAMPLE_LAYOUT = layout
    try:
        result = run_op(op, dtypes, grad, limit_samples)
    finally:
        _SAMPLE_LAYOUT = None
    result.name = f"{full_name(op)} [{layout}]"
    return result


def _generation_failure(op, dtype, requires_grad, index, exc):
    """Why making samples on openreg raised at sample `index`.

    Returns (status, message, samples): the same samples made on the CPU
    decide whether openreg is at fault (status "fail") or the sample function
    itself raises ("skip").
    """
    torch.manual_seed(SEED)
    try:
        cpu_samples = list(_samples(op, dtype, requires_grad, "cpu"))
    except Exception as cpu_exc:  # noqa: BLE001
        return "skip", f"sample_inputs raises on the CPU too ({type(cpu_exc).__name__})", 1
    rest = max(len(cpu_samples) - index, 1)
    return "fail", f"making the sample on openreg: {first_line(exc)}", rest


def run_op(op, dtypes=None, grad=False, limit_samples=None, forward=True) -> OpResult:
    """Every (dtype, sample) of one OpInfo; returns the counts and messages.

    Warnings are silenced: samples deliberately hit deprecated or degenerate
    cases, and the same warning comes from the CPU and the openreg call.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run_op(op, dtypes, grad, limit_samples, forward)


def _run_op(op, dtypes, grad, limit_samples, forward) -> OpResult:
    result = OpResult(full_name(op))
    start = time.perf_counter()
    reason = skip_reason(op)
    supported = op.supported_dtypes("cpu")
    chosen = [d for d in (dtypes or sorted(supported, key=str)) if d in supported]
    # Gradients: only the dtypes the OpInfo declares backward support for on the CPU.
    backward = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
    if reason is not None:
        # Counted as one skipped entry per dtype (no sample was generated).
        if forward:
            result.skip(result.forward, reason, len(chosen))
        result.seconds = time.perf_counter() - start
        return result
    modes = []
    if forward:
        modes.append(("forward", result.forward, check_forward, False))
    if grad and op.supports_autograd:
        modes.append(("grad", result.grad, check_grad, True))
    jobs = [
        (mode, counts, check, requires_grad, dtype)
        for mode, counts, check, requires_grad in modes
        for dtype in chosen
        if mode != "grad" or dtype in backward
    ]
    slow = None
    for mode, counts, check, requires_grad, dtype in jobs:
        if slow is not None:
            # Too slow: the rest of this op is counted as skipped, not run.
            n = _count_samples(op, dtype, requires_grad, limit_samples)
            if n:
                result.skip(counts, slow, n)
            continue
        slow = _run_dtype(op, result, mode, counts, check, dtype, requires_grad, limit_samples)
    result.seconds = time.perf_counter() - start
    return result


def _count_samples(op, dtype, requires_grad, limit_samples, samples=None):
    """How many samples (of `samples`, or of a fresh generation) are left."""
    n = 0
    try:
        torch.manual_seed(SEED)
        for _ in samples if samples is not None else _samples(op, dtype, requires_grad):
            n += 1
            if limit_samples is not None and n >= limit_samples:
                break
    except Exception:  # noqa: BLE001
        _drain()
        n = max(n, 1)
    return n


def _record_generation_failure(op, result, mode, counts, dtype, requires_grad, index, exc):
    status, message, n = _generation_failure(op, dtype, requires_grad, index, exc)
    if status == "skip":
        result.skip(counts, message, n)
        return
    for i in range(index, index + n):
        result.fail(counts, mode, dtype, i, message)


def result_start(result):
    return result.started


def _run_dtype(op, result, mode, counts, check, dtype, requires_grad, limit_samples):
    """Returns the skip reason when the op turned out to be too slow to continue."""
    torch.manual_seed(SEED)
    index = 0
    try:
        samples = iter(_samples(op, dtype, requires_grad))
    except Exception as exc:  # noqa: BLE001
        _drain()
        _record_generation_failure(op, result, mode, counts, dtype, requires_grad, index, exc)
        return None
    while limit_samples is None or index < limit_samples:
        try:
            sample = next(samples)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001
            _drain()
            _record_generation_failure(op, result, mode, counts, dtype, requires_grad, index, exc)
            break
        t0 = time.perf_counter()
        skip = sample_skip_reason(op, sample)
        status, message = ("skip", skip) if skip is not None else check(op, sample)
        elapsed = time.perf_counter() - t0
        if status == "pass":
            counts.passed += 1
        elif status == "fail":
            result.fail(counts, mode, dtype, index, message)
        else:
            result.skip(counts, message)
        index += 1
        slow = None
        if time.perf_counter() - result_start(result) > OP_BUDGET_S:
            slow = f"slow: the op exceeded its {OP_BUDGET_S:.0f} s budget (samples not run)"
        elif elapsed > SLOW_SAMPLE_S:
            slow = f"slow: a {dtype} sample took more than {SLOW_SAMPLE_S:.0f} s (samples not run)"
        if slow is not None:
            left = None if limit_samples is None else limit_samples - index
            n = _count_samples(op, dtype, requires_grad, left, samples) if left != 0 else 0
            if n:
                result.skip(counts, slow, n)
            return slow
    return None


# ---------------------------------------------------------------------------
# Reports


def totals(results):
    fwd, grd = Counts(), Counts()
    for r in results:
        fwd.add(r.forward)
        grd.add(r.grad)
    return fwd, grd


def pct(counts: Counts) -> str:
    if counts.ran == 0:
        return "n/a (no sample ran on the CPU)"
    return f"{100.0 * counts.passed / counts.ran:.2f}% ({counts.passed}/{counts.ran})"


def write_report(path, results, command, elapsed, grad):
    """One run as JSON (``.json``) or markdown (any other suffix)."""
    fwd, grd = totals(results)
    if path.endswith(".json"):
        data = {
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "torch": torch.__version__,
            "seconds": round(elapsed, 1),
            "grad": vars(grd),
            "forward": vars(fwd),
            "with_grad": grad,
            "ops": [r.to_json() for r in results],
        }
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        return
    run = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seconds": elapsed,
        "with_grad": grad,
        "results": results,
    }
    with open(path, "w") as f:
        f.write(render_markdown([run]))


def load_run(path):
    """A run written by write_report(... .json), with OpResults."""
    with open(path) as f:
        data = json.load(f)
    data["results"] = [OpResult.from_json(o) for o in data.pop("ops")]
    data.setdefault("with_grad", data["grad"]["passed"] + data["grad"]["failed"] > 0)
    return data


def closing_line(counts: Counts) -> str:
    return f"{counts.passed} passed, {counts.failed} failed, {counts.skipped} skipped"


def _indices(indices):
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out, start, prev = [], None, None
    for i in sorted(indices):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(out)


def render_markdown(runs):
    """The report of one or more runs: totals, every failing sample group
    with its cause (KNOWN_CAUSES), every failure, every skip reason. The
    detailed sections come from the first run (the widest)."""
    lines = ["# OpInfo differential run (openreg vs CPU)", ""]
    lines += [
        f"torch {torch.__version__}. Pass rate = passed / samples that ran on the CPU "
        "(skipped samples, including those the CPU rejects, are not counted).",
        "",
    ]
    for run in runs:
        fwd, grd = totals(run["results"])
        total = Counts()
        total.add(fwd)
        total.add(grd)
        lines += [
            f"## `{run['command']}`",
            "",
            f"{run['date']}, {run['seconds'] / 60:.1f} min, {len(run['results'])} OpInfos.",
            "",
            f"- forward: {closing_line(fwd)}; pass rate {pct(fwd)}",
        ]
        if run["with_grad"]:
            lines.append(f"- gradient: {closing_line(grd)}; pass rate {pct(grd)}")
        lines += ["", "Closing line:", "", "```", closing_line(total), "```", ""]
    results = runs[0]["results"]
    failing = [r for r in results if r.failures]
    lines += [
        "## Failing sample groups and their causes",
        "",
        "| op | mode | dtype | failed | samples | cause |",
        "|---|---|---|---|---|---|",
    ]
    for r in failing:
        groups = {}
        for mode, dtype, index, _ in r.failures:
            groups.setdefault((mode, dtype), []).append(index)
        cause = KNOWN_CAUSES.get(r.name)
        cause = cause[0] if cause else "**not investigated**: see the failures below"
        for (mode, dtype), indices in groups.items():
            lines.append(
                f"| {r.name} | {mode} | {dtype} | {len(indices)} | {_indices(indices)} | {cause} |"
            )
    if not failing:
        lines.append("| (none) | | | | | |")
    explained = sorted({KNOWN_CAUSES[r.name] for r in failing if r.name in KNOWN_CAUSES})
    if explained:
        lines += ["", "### Causes", ""]
        for short, text in explained:
            lines += [f"- **{short}.** {text}", ""]
    lines += ["## Every failure", ""]
    for r in failing:
        lines += [f"### {r.name}", ""]
        lines += [f"- {m} {d} sample {i}: {msg}" for m, d, i, msg in r.failures]
        lines.append("")
    by_reason, ops_by_reason = {}, {}
    for r in results:
        for reason, n in r.skips.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
            ops_by_reason.setdefault(reason, []).append(r.name)
    lines += [
        "## Skip reasons",
        "",
        "| reason | samples | ops |",
        "|---|---|---|",
    ]
    for reason, n in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        names = ops_by_reason[reason]
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} ops)" if len(names) > 8 else "")
        lines.append(f"| {reason.replace('|', '/')} | {n} | {shown} |")
    lines += ["", "### Per op", "", "| op | reason | samples |", "|---|---|---|"]
    for r in results:
        for reason, n in sorted(r.skips.items()):
            lines.append(f"| {r.name} | {reason.replace('|', '/')} | {n} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# CLI: a worker subprocess runs the ops and streams one JSON line per op; the
# parent restarts it after the op that crashed or hung it.

HANG_TIMEOUT_S = 300.0


def _worker(args):
    names = [n for n in args.worker_ops.split("\n") if n]
    ops = {full_name(op): op for op in select_ops([n.split(" [")[0] for n in names], exact=True)}
    dtypes = parse_dtypes(args.dtypes)
    with open(args.worker_out, "a") as out:
        for name in names:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            if " [" in name:  # "op [layout]": a sparse layout's samples
                op_name, layout = name[:-1].split(" [")
                r = run_sparse_op(ops[op_name], layout, dtypes, args.grad, args.limit_samples)
            else:
                r = run_op(ops[name], dtypes, args.grad, args.limit_samples)
            out.write(json.dumps({"done": r.to_json()}) + "\n")
            out.flush()
    return 0


def _run_isolated(names, args):
    import tempfile

    results = {}
    remaining = list(names)
    here = os.path.abspath(__file__)
    while remaining:
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
            out_path = tmp.name
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as tmp:
            tmp.write("\n".join(remaining))
            ops_path = tmp.name
        cmd = [sys.executable, here, "--worker-ops-file", ops_path, "--worker-out", out_path]
        if args.dtypes:
            cmd += ["--dtypes", args.dtypes]
        if args.grad:
            cmd.append("--grad")
        if args.limit_samples is not None:
            cmd += ["--limit-samples", str(args.limit_samples)]
        # stderr (warnings, crash messages) goes to a file: a pipe nobody
        # reads until the end would fill up and block the worker.
        err_file = tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, text=True)
        seen, current, last_change = 0, None, time.monotonic()
        stderr_tail = ""
        while True:
            done = proc.poll() is not None
            with open(out_path) as f:
                lines = f.read().splitlines()
            for line in lines[seen:]:
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    break
                seen += 1
                last_change = time.monotonic()
                if "start" in msg:
                    current = msg["start"]
                else:
                    r = OpResult.from_json(msg["done"])
                    results[r.name] = r
                    remaining.remove(r.name)
                    current = None
                    print(r.line(), flush=True)
            if done:
                err_file.seek(0)
                stderr_tail = err_file.read().strip().splitlines()[-1:]
                break
            if current is not None and time.monotonic() - last_change > HANG_TIMEOUT_S:
                proc.kill()
                proc.wait()
                stderr_tail = [f"no progress for {HANG_TIMEOUT_S:.0f} s (killed)"]
                break
            time.sleep(0.2)
        err_file.close()
        os.unlink(out_path)
        os.unlink(ops_path)
        if current is not None:
            r = OpResult(current)
            detail = stderr_tail[0] if stderr_tail else ""
            r.fail(
                r.forward,
                "forward",
                "-",
                -1,
                f"worker process died (returncode {proc.returncode}) {detail}"[:300],
            )
            results[current] = r
            remaining.remove(current)
            print(r.line(), flush=True)
        elif remaining and proc.returncode != 0:
            # Died before starting an op (e.g. import error): give up.
            raise SystemExit(f"worker failed: returncode {proc.returncode} {stderr_tail}")
    return [results[n] for n in names if n in results]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", help="comma-separated name substrings")
    p.add_argument("--dtypes", help="comma-separated, e.g. float32,int64")
    p.add_argument("--grad", action="store_true", help="also compare gradients")
    p.add_argument("--report", help="write a report (.json, otherwise markdown)")
    p.add_argument("--limit-samples", type=int, default=None)
    p.add_argument(
        "--sparse",
        action="store_true",
        help="the sparse OpInfo samples (op.sample_inputs_sparse) of every layout an OpInfo "
        "supports, instead of the strided ones",
    )
    p.add_argument(
        "--in-process", action="store_true", help="no worker subprocess (a crash ends the run)"
    )
    p.add_argument(
        "--from-json",
        nargs="+",
        metavar="RUN.json",
        help="run nothing: write the markdown --report of runs saved with --report RUN.json "
        "(failures and skips listed from the first)",
    )
    p.add_argument("--worker-ops-file", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker_ops_file:
        with open(args.worker_ops_file) as f:
            args.worker_ops = f.read()
        return _worker(args)
    if args.from_json:
        if not args.report or args.report.endswith(".json"):
            p.error("--from-json needs a markdown --report")
        with open(args.report, "w") as f:
            f.write(render_markdown([load_run(path) for path in args.from_json]))
        print(f"report: {args.report}")
        return 0

    names = [n.strip() for n in args.ops.split(",")] if args.ops else None
    parse_dtypes(args.dtypes)  # validate early
    start = time.perf_counter()
    if args.sparse:
        entries = sparse_entries(names)
        labels = [f"{full_name(op)} [{layout}]" for op, layout in entries]
        if args.in_process:
            results = []
            for op, layout in entries:
                r = run_sparse_op(op, layout, parse_dtypes(args.dtypes), args.grad)
                print(r.line(), flush=True)
                results.append(r)
        else:
            results = _run_isolated(labels, args)
    elif args.in_process:
        results = []
        for op in select_ops(names):
            r = run_op(op, parse_dtypes(args.dtypes), args.grad, args.limit_samples)
            print(r.line(), flush=True)
            results.append(r)
    else:
        results = _run_isolated([full_name(op) for op in select_ops(names)], args)
    elapsed = time.perf_counter() - start

    fwd, grd = totals(results)
    print()
    print(f"ops: {len(results)}, time {elapsed:.1f} s")
    print(f"forward pass rate: {pct(fwd)}")
    if args.grad:
        print(f"gradient pass rate: {pct(grd)}")
    if args.report:
        command = "python -m tests.opinfo.harness " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        write_report(args.report, results, command.strip(), elapsed, args.grad)
        print(f"report: {args.report}")
    total = Counts()
    total.add(fwd)
    total.add(grd)
    # The closing summary line (read by CI): forward + gradient checks.
    print(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped")
    return 1 if total.failed else 0


if __name__ == "__main__":
    sys.exit(main())
