"""Operators on openreg compared with the same computation on the CPU.

Most operators reach the device through the CPU fallback (OpenRegFallback.cpp),
so these tests check the fallback's argument wrapping, device checks and the
mapping of results (new tensors, views, in-place and out= results).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close_cpu, assert_on_device, check_against_cpu, describe, to_device

DEVICES = ["openreg:0", "openreg:1"]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=_gen(seed)).to(dtype)


def pos(*shape, seed=0):
    return torch.rand(shape, generator=_gen(seed)) + 0.1


def ints(*shape, lo=-10, hi=10, seed=0, dtype=torch.int64):
    return torch.randint(lo, hi, shape, generator=_gen(seed), dtype=dtype)


def bools(*shape, seed=0):
    return torch.rand(shape, generator=_gen(seed)) > 0.5


def special():
    return torch.tensor([0.0, -0.0, 1.5, -2.5, float("nan"), float("inf"), -float("inf")])


# name -> (function, input factory). Inputs are built on the CPU, then copied
# to the device; the function must only use its arguments.
OPS = {
    # --- unary
    "abs": (torch.abs, lambda: (randn(4, 5),)),
    "neg": (torch.neg, lambda: (randn(4, 5),)),
    "exp": (torch.exp, lambda: (randn(4, 5),)),
    "log": (torch.log, lambda: (pos(4, 5),)),
    "sqrt": (torch.sqrt, lambda: (pos(4, 5),)),
    "rsqrt": (torch.rsqrt, lambda: (pos(4, 5),)),
    "sin_cos": (lambda x: (torch.sin(x), torch.cos(x)), lambda: (randn(4, 5),)),
    "tanh": (torch.tanh, lambda: (randn(4, 5),)),
    "sigmoid": (torch.sigmoid, lambda: (randn(4, 5),)),
    "relu": (F.relu, lambda: (randn(4, 5),)),
    "gelu": (F.gelu, lambda: (randn(4, 5),)),
    "silu": (F.silu, lambda: (randn(4, 5),)),
    "floor_round_trunc": (
        lambda x: (x.floor(), x.round(), x.trunc(), x.round(decimals=1)),
        lambda: (randn(4, 5) * 3,),
    ),
    "sign": (torch.sign, lambda: (special(),)),
    "reciprocal": (torch.reciprocal, lambda: (pos(4, 5),)),
    "erf": (torch.erf, lambda: (randn(4, 5),)),
    "isnan_isinf_isfinite": (
        lambda x: (x.isnan(), x.isinf(), x.isfinite(), x.nan_to_num()),
        lambda: (special(),),
    ),
    "unary_noncontiguous": (lambda x: torch.exp(x.t()[::2]), lambda: (randn(6, 5),)),
    "unary_float64": (torch.sin, lambda: (randn(4, 5, dtype=torch.float64),)),
    "unary_half": (torch.exp, lambda: (randn(4, 5, dtype=torch.float16),)),
    "unary_bfloat16": (torch.tanh, lambda: (randn(4, 5, dtype=torch.bfloat16),)),
    # --- binary, with broadcasting
    "add_broadcast": (torch.add, lambda: (randn(4, 5), randn(5, seed=1))),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=-2.5), lambda: (randn(4, 5), randn(4, 1))),
    "sub_outer_broadcast": (torch.sub, lambda: (randn(4, 1), randn(1, 5, seed=1))),
    "mul_python_scalar": (lambda a: a * 3.5, lambda: (randn(4, 5),)),
    "div": (torch.div, lambda: (randn(4, 5), pos(5, seed=1))),
    "div_floor": (
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        lambda: (randn(4, 5) * 5, pos(4, 5, seed=1)),
    ),
    "pow_scalar_and_tensor": (
        lambda a, b: (torch.pow(a, 2.5), torch.pow(a, b)),
        lambda: (pos(4, 5), randn(5, seed=1)),
    ),
    "maximum_minimum": (
        lambda a, b: (torch.maximum(a, b), torch.minimum(a, b)),
        lambda: (randn(3, 4), randn(4, seed=1)),
    ),
    "remainder_fmod": (
        lambda a, b: (torch.remainder(a, b), torch.fmod(a, b)),
        lambda: (randn(4, 5) * 5, pos(4, 5, seed=1)),
    ),
    "atan2": (torch.atan2, lambda: (randn(4, 5), randn(4, 5, seed=1))),
    "lerp_addcmul": (
        lambda a, b, c: (torch.lerp(a, b, 0.3), torch.addcmul(a, b, c, value=2)),
        lambda: (randn(4, 5), randn(4, 5, seed=1), randn(5, seed=2)),
    ),
    "type_promotion_int_float": (
        lambda i, f: (i + f, i * 2.5, i / 4),
        lambda: (ints(4, 5), randn(4, 5)),
    ),
    # --- comparisons
    "comparisons": (
        lambda a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b),
        lambda: (ints(4, 5, lo=0, hi=3).float(), ints(5, lo=0, hi=3, seed=1).float()),
    ),
    "comparison_with_scalar": (lambda a: (a > 0, a.eq(1), a.lt(-0.5)), lambda: (randn(4, 5),)),
    "isclose_allclose": (
        lambda a, b: (torch.isclose(a, b), torch.allclose(a, a + 1e-9), torch.allclose(a, b)),
        lambda: (randn(4, 5), randn(4, 5, seed=1)),
    ),
    "equal": (
        lambda a, b: (a, torch.equal(a, a.clone()), torch.equal(a, b)),
        lambda: (randn(4, 5), randn(4, 5, seed=1)),
    ),
    # --- integer and bool dtypes
    "int_arith": (
        lambda a, b: (
            a + b,
            a - b,
            a * b,
            torch.floor_divide(a, 3),
            torch.remainder(a, 3),
            a.abs(),
        ),
        lambda: (ints(4, 5), ints(5, seed=1)),
    ),
    "int32_int64_promotion": (
        lambda a, b: a + b,
        lambda: (ints(4, 5, dtype=torch.int32), ints(4, 5, seed=1)),
    ),
    "int_bitwise": (
        lambda a, b: (a & b, a | b, a ^ b, ~a, a << 2, a >> 1),
        lambda: (ints(4, 5, lo=0, hi=100), ints(4, 5, lo=0, hi=100, seed=1)),
    ),
    "uint8_int8": (
        lambda a, b: (a + a, a * 3, b - 100, b.abs()),
        lambda: (
            ints(10, lo=0, hi=255, dtype=torch.uint8),
            ints(10, lo=-128, hi=127, dtype=torch.int8),
        ),
    ),
    "int_reductions": (
        lambda a: (a.sum(), a.sum(1), a.prod(0), a.max(), a.argmax(), a.cumsum(1), a.min(1)),
        lambda: (ints(4, 5, lo=-3, hi=4, dtype=torch.int32),),
    ),
    "bool_ops": (
        lambda a, b: (a & b, a | b, ~a, a ^ b, torch.logical_not(a), torch.logical_or(a, b)),
        lambda: (bools(4, 5), bools(4, 5, seed=1)),
    ),
    "bool_reductions": (
        lambda a: (a.any(), a.all(), a.any(1), a.all(0), a.sum(), a.sum(1), a.float().mean()),
        lambda: (bools(4, 5),),
    ),
    # --- reductions with dim / keepdim
    "sum": (
        lambda x: (x.sum(), x.sum(1), x.sum((0, 2), keepdim=True), x.sum(-1, dtype=torch.float64)),
        lambda: (randn(3, 4, 5),),
    ),
    "mean": (lambda x: (x.mean(), x.mean(0), x.mean(2, keepdim=True)), lambda: (randn(3, 4, 5),)),
    "prod": (lambda x: (x.prod(), x.prod(1, keepdim=True)), lambda: (pos(3, 4),)),
    "amax_amin": (
        lambda x: (x.amax(), x.amax((0, 1)), x.amin(1, keepdim=True)),
        lambda: (randn(3, 4, 5),),
    ),
    "max_min_dim": (
        lambda x: (x.max(1), x.min(0, keepdim=True), x.max(), x.aminmax()),
        lambda: (randn(4, 5),),
    ),
    "std_var": (
        lambda x: (x.std(), x.var(1), x.std(0, correction=0, keepdim=True), torch.var_mean(x, 1)),
        lambda: (randn(4, 5),),
    ),
    "norm": (
        lambda x: (x.norm(), x.norm(p=1, dim=1), torch.linalg.vector_norm(x, 3, dim=0)),
        lambda: (randn(4, 5),),
    ),
    "logsumexp": (lambda x: (x.logsumexp(1), x.logsumexp(0, keepdim=True)), lambda: (randn(4, 5),)),
    "argmax_argmin": (
        lambda x: (x.argmax(), x.argmax(1), x.argmin(0, keepdim=True)),
        lambda: (randn(4, 5),),
    ),
    "median_mode": (
        lambda x: (x.median(), x.median(1), torch.mode(x, 1)),
        lambda: (ints(4, 7, lo=0, hi=4).float(),),
    ),
    "count_nonzero": (
        lambda x: (x.count_nonzero(), x.count_nonzero(1)),
        lambda: (ints(4, 5, lo=0, hi=3),),
    ),
    "empty_reduction": (
        lambda x: (x.sum(), x.sum(0), x.prod(1), x.mean(1)),
        lambda: (torch.empty(0, 3),),
    ),
    # --- linear algebra and nn
    "matmul_batched_broadcast": (torch.matmul, lambda: (randn(2, 3, 4), randn(4, 5, seed=1))),
    "mm": (torch.mm, lambda: (randn(3, 4), randn(4, 5, seed=1))),
    "mm_transposed_inputs": (
        lambda a, b: a.t() @ b.t(),
        lambda: (randn(4, 3), randn(5, 4, seed=1)),
    ),
    "bmm": (torch.bmm, lambda: (randn(2, 3, 4), randn(2, 4, 5, seed=1))),
    "addmm": (
        lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2),
        lambda: (randn(5), randn(3, 4, seed=1), randn(4, 5, seed=2)),
    ),
    "mv_dot_outer": (
        lambda m, v: (torch.mv(m, v), torch.dot(v, v), torch.outer(v, v)),
        lambda: (randn(3, 4), randn(4, seed=1)),
    ),
    "einsum": (
        lambda a, b: torch.einsum("bij,bjk->bik", a, b),
        lambda: (randn(2, 3, 4), randn(2, 4, 2)),
    ),
    "linear": (F.linear, lambda: (randn(2, 3, 4), randn(5, 4, seed=1), randn(5, seed=2))),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1),
        lambda: (randn(2, 3, 8, 8), randn(4, 3, 3, 3, seed=1), randn(4, seed=2)),
    ),
    "conv2d_strided_no_bias": (
        lambda x, w: F.conv2d(x, w, stride=2),
        lambda: (randn(1, 2, 7, 7), randn(3, 2, 3, 3, seed=1)),
    ),
    "conv1d": (
        lambda x, w: F.conv1d(x, w, padding=2),
        lambda: (randn(2, 3, 10), randn(4, 3, 5, seed=1)),
    ),
    "max_pool2d": (
        lambda x: (
            F.max_pool2d(x, 2),
            F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True),
        ),
        lambda: (randn(2, 3, 8, 8),),
    ),
    "avg_adaptive_pool2d": (
        lambda x: (F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, (3, 3))),
        lambda: (randn(2, 3, 8, 8),),
    ),
    "softmax_log_softmax": (
        lambda x: (F.softmax(x, dim=1), F.log_softmax(x, dim=-1), F.softmax(x, dim=0)),
        lambda: (randn(4, 5),),
    ),
    "layer_norm": (
        lambda x, w, b: (F.layer_norm(x, (5,), w, b), F.layer_norm(x, (4, 5))),
        lambda: (randn(3, 4, 5), randn(5, seed=1), randn(5, seed=2)),
    ),
    "group_norm": (lambda x: F.group_norm(x, 2), lambda: (randn(2, 4, 3, 3),)),
    "batch_norm_eval": (
        lambda x, m, v: F.batch_norm(x, m, v, training=False),
        lambda: (randn(4, 3, 2, 2), randn(3, seed=1), pos(3, seed=2)),
    ),
    "batch_norm_train_updates_running_stats": (
        lambda x, m, v: (F.batch_norm(x, m, v, training=True, momentum=0.5), m, v),
        lambda: (randn(4, 3, 2, 2), torch.zeros(3), torch.ones(3)),
    ),
    "embedding": (
        lambda idx, w: (F.embedding(idx, w), F.embedding(idx, w, padding_idx=0)),
        lambda: (ints(2, 5, lo=0, hi=7), randn(7, 3)),
    ),
    "losses": (
        lambda x, t, y: (
            F.cross_entropy(x, t),
            F.nll_loss(F.log_softmax(x, 1), t),
            F.mse_loss(x, y),
        ),
        lambda: (randn(4, 5), ints(4, lo=0, hi=5), randn(4, 5, seed=1)),
    ),
    "interpolate": (
        lambda x: (
            F.interpolate(x, scale_factor=2),
            F.interpolate(x, size=(5, 7), mode="bilinear"),
        ),
        lambda: (randn(1, 2, 3, 4),),
    ),
    "pad_one_hot": (
        lambda x, i: (F.pad(x, (1, 2, 0, 1), value=-1.0), F.one_hot(i, 6)),
        lambda: (randn(3, 4), ints(5, lo=0, hi=6)),
    ),
    # --- indexing
    "advanced_index": (
        lambda x, i: (x[i], x[:, i[:2]], x[i, i]),
        lambda: (randn(5, 5), torch.tensor([4, 0, 2, 2])),
    ),
    "bool_mask_index": (lambda x, m: x[m], lambda: (randn(4, 5), bools(4, 5))),
    "index_put_": (
        lambda x, i, v: (x.index_put_((i,), v), x.clone().index_put_((i,), v, accumulate=True)),
        lambda: (randn(5, 3), torch.tensor([0, 2, 2]), randn(3, 3, seed=1)),
    ),
    "setitem_advanced": (
        lambda x, i, v: x.__setitem__((i, slice(None)), v) or x,
        lambda: (randn(5, 3), torch.tensor([4, 1]), randn(2, 3, seed=1)),
    ),
    "scatter_scatter_add": (
        lambda x, i, s: (
            x.clone().scatter_(1, i, s),
            x.clone().scatter_add_(0, i, s),
            torch.scatter_reduce(x, 1, i, s, "amax"),
        ),
        lambda: (randn(3, 5), ints(3, 4, lo=0, hi=3), randn(3, 4, seed=1)),
    ),
    "gather": (lambda x, i: torch.gather(x, 1, i), lambda: (randn(3, 5), ints(3, 4, lo=0, hi=5))),
    "index_select_take": (
        lambda x, i: (x.index_select(0, i), x.index_select(1, i), torch.take(x, i)),
        lambda: (randn(4, 4), torch.tensor([3, 0, 3])),
    ),
    "masked_fill_index_fill": (
        lambda x, m: (x.masked_fill(m, -1.0), x.index_fill(1, torch.arange(2, device=x.device), 9)),
        lambda: (randn(4, 5), bools(4, 5)),
    ),
    "index_add_index_copy": (
        lambda x, i, s: (x.index_add(0, i, s), x.index_copy(0, i[:2], s[:2])),
        lambda: (randn(4, 3), torch.tensor([0, 3, 0]), randn(3, 3, seed=1)),
    ),
    # --- shape, joining, selection
    "cat_stack": (
        lambda a, b: (
            torch.cat([a, b]),
            torch.cat([a, b], 1),
            torch.stack([a, b], 1),
            torch.hstack([a, b]),
        ),
        lambda: (randn(2, 3), randn(2, 3, seed=1)),
    ),
    "cat_mixed_dtypes_and_empty": (
        lambda a, b, e: torch.cat([a, b, e]),
        lambda: (randn(2, 3), ints(1, 3), torch.empty(0, 3)),
    ),
    "split_chunk_unbind": (
        lambda x: (x.split(2), x.split([1, 3], 1), x.chunk(3), x.unbind(1), x.tensor_split(3)),
        lambda: (randn(5, 4),),
    ),
    "flip_roll_repeat_tile": (
        lambda x: (
            x.flip(0),
            x.roll(2, 1),
            x.repeat(2, 1),
            x.tile((1, 2)),
            x.repeat_interleave(2, 0),
        ),
        lambda: (randn(3, 4),),
    ),
    "tril_triu_diag_trace": (
        lambda x: (x.tril(), x.triu(1), torch.diag(x), torch.diag(x[0]), x.trace()),
        lambda: (randn(4, 4),),
    ),
    "where": (
        lambda c, a, b: (torch.where(c, a, b), torch.where(c, a, 0.0), torch.where(c)),
        lambda: (bools(4, 5), randn(4, 5), randn(5, seed=1)),
    ),
    "sort": (
        lambda x: (x.sort(), x.sort(0, descending=True), x.sort(stable=True), x.argsort(1)),
        lambda: (ints(4, 6, lo=0, hi=4).float(),),
    ),
    "topk_kthvalue": (
        lambda x: (x.topk(3), x.topk(2, dim=0, largest=False), x.kthvalue(2, 1)),
        lambda: (randn(4, 6),),
    ),
    "cumsum_cumprod_cummax": (
        lambda x: (x.cumsum(1), x.cumsum(0, dtype=torch.float64), x.cumprod(1), x.cummax(1)),
        lambda: (randn(4, 5),),
    ),
    "clamp": (
        lambda x, lo, hi: (x.clamp(-0.5, 0.5), x.clamp(min=0.0), x.clamp(lo, hi), x.clip(max=hi)),
        lambda: (randn(4, 5), -pos(5), pos(4, 1, seed=1)),
    ),
    "nonzero": (
        lambda x: (x.nonzero(), torch.nonzero(x, as_tuple=True), torch.argwhere(x)),
        lambda: (ints(4, 5, lo=0, hi=2),),
    ),
    "masked_select": (lambda x, m: torch.masked_select(x, m), lambda: (randn(4, 5), bools(5))),
    "unique": (
        lambda x: (
            torch.unique(x),
            torch.unique(x, return_inverse=True, return_counts=True),
            torch.unique(x, dim=0),
            torch.unique_consecutive(x.flatten()),
        ),
        lambda: (ints(6, 3, lo=0, hi=3),),
    ),
    "foreach_add": (
        lambda a, b, c: (
            torch._foreach_add([a, b], [c, c]),
            torch._foreach_mul([a, b], 2.0),
            torch._foreach_add([a, b], 1.5),
        ),
        lambda: (randn(3), randn(3, seed=1), randn(3, seed=2)),
    ),
    "foreach_add_inplace": (
        lambda a, b, c: torch._foreach_add_([a, b], [c, c], alpha=2) or [a, b],
        lambda: (randn(3), randn(3, seed=1), randn(3, seed=2)),
    ),
    "searchsorted_bucketize_bincount_histc": (
        lambda s, v, i: (
            torch.searchsorted(s, v),
            torch.bucketize(v, s),
            torch.bincount(i),
            torch.histc(v, bins=4, min=-2, max=2),
        ),
        lambda: (torch.tensor([-1.0, 0.0, 0.5, 2.0]), randn(6), ints(8, lo=0, hi=5)),
    ),
    "diff_cross_cdist_tensordot": (
        lambda a, b: (
            torch.diff(a, dim=1),
            torch.linalg.cross(a, b),
            torch.cdist(a, b),
            torch.tensordot(a, b.t(), 1),
        ),
        lambda: (randn(4, 3), randn(4, 3, seed=1)),
    ),
    "reshape_copy_of_noncontiguous": (lambda x: x.t().reshape(-1), lambda: (randn(3, 4),)),
    "contiguous_channels_last": (
        lambda x: x.contiguous(memory_format=torch.channels_last) * 2,
        lambda: (randn(2, 3, 4, 5),),
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(OPS))
def test_op_matches_cpu(name, device):
    fn, make_inputs = OPS[name]
    inputs = make_inputs()
    check_against_cpu(fn, *inputs, device=device)
    assert torch.openreg.current_device() == 0


@pytest.mark.parametrize("name", list(OPS))
def test_op_warnings_match_cpu(name):
    """The device emits the same Python warnings as the CPU (no spurious ones)."""
    fn, make_inputs = OPS[name]

    def warnings_of(args):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn(*args)
            except Exception as e:  # errors are test_op_matches_cpu's business
                return [f"raised {type(e).__name__}"]
        return [f"{w.category.__name__}: {w.message}" for w in caught]

    expected = warnings_of(make_inputs())
    if expected and expected[0].startswith("raised"):
        pytest.skip("the CPU computation itself fails")
    actual = warnings_of(to_device(make_inputs()))
    if actual and actual[0].startswith("raised"):
        pytest.skip("the device computation fails: reported by test_op_matches_cpu")
    assert actual == expected


def test_op_results_keep_device_memory_semantics():
    # A result of the fallback is ordinary device memory that further
    # operators and views accept.
    x = torch.randn(4, 5, device="openreg:1")
    y = torch.sort(x, 1).values
    assert y.device == torch.device("openreg:1")
    v = y[:, 1:]
    v.mul_(0)
    assert y.cpu()[:, 1:].eq(0).all()
    assert torch.equal(y[:, 0].cpu(), x.cpu().sort(1).values[:, 0])


def test_view_returning_fallback_ops_alias_input():
    # Ops that return a view of their input through the fallback must return
    # a device view of the same storage, not a copy.
    x = torch.arange(12.0, device="openreg").reshape(3, 4)
    for v in (
        x.unfold(1, 2, 2),
        x.diagonal(),
        torch.view_as_real(x.to(torch.complex64)).select(-1, 0),
    ):
        assert v.device.type == "openreg"
    d = x.diagonal()
    d.fill_(-1)
    assert x.cpu().diagonal().eq(-1).all()


# ---------------------------------------------------------------------------
# Mixing devices


SCALAR_MIXES = {
    "add": lambda x, s: x + s,
    "radd": lambda x, s: s + x,
    "mul_int_scalar": lambda x, s: x * s.long(),
    "sub_": lambda x, s: x.clone().sub_(s),
    "div": lambda x, s: torch.div(x, s),
    "pow": lambda x, s: torch.pow(x.abs(), s),
    "where": lambda x, s: torch.where(x > 0, x, s),
    "maximum": lambda x, s: torch.maximum(x, s),
    "lerp": lambda x, s: torch.lerp(x, x * 2, s / 4),
}


@pytest.mark.parametrize("name", list(SCALAR_MIXES))
def test_device_tensor_with_cpu_zero_dim_scalar(name):
    fn = SCALAR_MIXES[name]
    x = randn(3, 4)
    s = torch.tensor(2.0)
    expected = fn(x, s)
    actual = fn(x.to("openreg"), s)  # s stays on the CPU
    assert_on_device(actual, "openreg:0")
    assert_close_cpu(actual, expected)


# Python numbers in arithmetic: the host may send them to the device in the
# dtype the kernel computes in (doc:wrapped-number-dtype): every bit and every
# error as on the CPU, for numbers a float cannot hold exactly or at all.
PYTHON_NUMBERS = [
    1,
    3,
    -(2**40) + 1,
    2**62 + 1,
    2**60 + 2**36 + 1,
    16777217,
    0.1,
    1e300,
    -1e-320,
    float("nan"),
]
PYTHON_NUMBER_OPS = {
    "add": lambda x, s: x + s,
    "radd": lambda x, s: s + x,
    "sub": lambda x, s: x - s,
    "rsub": lambda x, s: s - x,
    "mul": lambda x, s: x * s,
    "div": lambda x, s: x / s,
    "rdiv": lambda x, s: s / x,
    "add_alpha": lambda x, s: torch.add(x, s, alpha=3),
    "add_": lambda x, s: x.clone().add_(s),
    "div_out": lambda x, s: torch.div(x, s, out=torch.empty_like(x, dtype=torch.float64)),
}


def _bits(t):
    return t.view(torch.uint8) if t.dtype != torch.bool else t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int32])
@pytest.mark.parametrize("op", list(PYTHON_NUMBER_OPS))
def test_python_numbers_in_arithmetic_match_cpu_bits(dtype, op):
    fn = PYTHON_NUMBER_OPS[op]
    x = torch.cat([randn(61) * 1e3, special()]).to(dtype)
    for s in [*PYTHON_NUMBERS, True]:
        try:
            expected, error = fn(x, s), None
        except RuntimeError as e:
            expected, error = None, str(e)
        for _ in range(3):  # the first call learns the signature, then queued
            if error is not None:
                with pytest.raises(RuntimeError) as info:
                    fn(x.to("openreg"), s).cpu()
                assert str(info.value).split("\n")[0] == error.split("\n")[0]
                continue
            actual = fn(x.to("openreg"), s).cpu()
            assert actual.dtype == expected.dtype, (s, actual.dtype, expected.dtype)
            assert torch.equal(_bits(actual), _bits(expected)), (s, actual, expected)


def test_cpu_scalar_on_second_device():
    x = randn(3, 4)
    actual = x.to("openreg:1") * torch.tensor(3.0)
    assert actual.device == torch.device("openreg:1")
    torch.testing.assert_close(actual.cpu(), x * 3)


NONSCALAR_MIXES = {
    "add": lambda d, c: d + c,
    "radd": lambda d, c: c + d,
    "add_": lambda d, c: d.add_(c),
    "cpu_add_": lambda d, c: c.add_(d),
    "cpu_add_device_scalar": lambda d, c: c.add_(d[0, 0]),
    "mul": lambda d, c: torch.mul(d, c),
    "mm": lambda d, c: torch.mm(d, c.t()),
    "cat": lambda d, c: torch.cat([d, c]),
    "where": lambda d, c: torch.where(d > 0, d, c),
    "index_select": lambda d, c: torch.index_select(d, 0, c[0].long().abs().clamp(max=1)),
    "gather": lambda d, c: torch.gather(d, 1, c.long().abs().clamp(max=1)),
}


@pytest.mark.parametrize("name", list(NONSCALAR_MIXES))
def test_device_tensor_with_cpu_tensor_raises(name):
    d = randn(2, 3).to("openreg")
    c = randn(2, 3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        NONSCALAR_MIXES[name](d, c)


CROSS_DEVICE = {
    "add": lambda a, b: a + b,
    "add_0d": lambda a, b: a + b[0, 0],
    "mul_": lambda a, b: a.mul_(b),
    "mm": lambda a, b: torch.mm(a, b.t()),
    "cat": lambda a, b: torch.cat([a, b]),
    "stack": lambda a, b: torch.stack([a, b]),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "index_select": lambda a, b: torch.index_select(a, 0, b[0].long().abs().clamp(max=1)),
    "foreach_add": lambda a, b: torch._foreach_add([a], [b]),
}


@pytest.mark.parametrize("name", list(CROSS_DEVICE))
def test_mixing_openreg_devices_raises(name):
    a = randn(2, 3).to("openreg:0")
    b = randn(2, 3).to("openreg:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        CROSS_DEVICE[name](a, b)
    assert torch.openreg.current_device() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_indexing_device_tensor_with_cpu_indices(device):
    x_cpu = randn(5, 4)
    x = x_cpu.to(device)
    i = torch.tensor([4, 0, 0, 2])
    j = torch.tensor([1, 3, 2, 0])
    m = bools(5)

    for idx in ((i,), (i, j), (m,), (slice(None), j[:2]), (x_cpu > 0,)):
        got = x[idx]
        assert got.device == torch.device(device)
        assert torch.equal(got.cpu(), x_cpu[idx])

    # Writes with CPU indices (index_put_), with CPU and device values.
    y_cpu = x_cpu.clone()
    y = x.clone()
    y_cpu[i, j] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y[i, j] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y_cpu[m] = 0.5
    y[m] = torch.tensor(0.5)
    y_cpu[i[:2]] = -x_cpu[:2]
    y[i[:2]] = -x[:2]
    assert torch.equal(y.cpu(), y_cpu)
    y.index_put_((j,), torch.ones(4, 4, device=device), accumulate=True)
    y_cpu.index_put_((j,), torch.ones(4, 4), accumulate=True)
    assert torch.equal(y.cpu(), y_cpu)


def test_indexing_with_device_indices_of_other_device_raises():
    x = torch.ones(3, device="openreg:1")
    with pytest.raises(RuntimeError, match="device"):
        x[torch.tensor([0, 2], device="openreg:0")]
    with pytest.raises(RuntimeError, match="device"):
        torch.ones(3)[torch.tensor([0], device="openreg")]


def test_out_of_range_index_raises_cleanly():
    """A bad index raises, at the latest at the next synchronization (kernels
    may run asynchronously, as on a GPU), names the problem, and leaves the
    device usable."""
    x = torch.arange(4.0, device="openreg")
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        x[torch.tensor([7])]
        torch.openreg.synchronize()
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(x, 0, torch.tensor([9], device="openreg")).cpu()
    # The device is still usable afterwards.
    assert (x + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_kernel_error_is_deferred_to_synchronization_and_names_the_op():
    """An error inside a queued kernel surfaces at the next synchronization,
    naming the op; the device stays usable."""
    x = torch.arange(4.0, device="openreg")
    idx = torch.tensor([0, 1, 2, 9], device="openreg")
    src = torch.ones(4, device="openreg")
    # index_add_ with an out-of-range index fails inside the CPU kernel.
    try:
        x.index_add_(0, idx, src)
        torch.openreg.synchronize()
    except (IndexError, RuntimeError) as e:
        assert "index" in str(e)
    else:
        raise AssertionError("no error")
    torch.openreg.synchronize()  # the error was reported once
    assert (x[:3] * 0 + 1).cpu().tolist() == [1.0, 1.0, 1.0]


def test_out_of_range_index_raises_at_launch_in_blocking_mode(py):
    out = py(
        """
        import torch
        x = torch.arange(4.0, device="openreg")
        try:
            x[torch.tensor([7])]
        except (IndexError, RuntimeError) as e:
            print("raised:", e)
        """,
        OPENREG_LAUNCH_BLOCKING="1",
    )
    assert out.returncode == 0, describe(out)
    assert "raised:" in out.stdout and "out of bounds" in out.stdout


def test_foreach_list_over_devices_runs_per_tensor():
    """A _foreach_ list whose tensors live on different devices works as on
    CUDA (one operator per tensor, each on its own device); a list on one
    device is one kernel (tests/test_profiler.py)."""
    cpu = [randn(3), randn(2, seed=1), randn(4, seed=2)]
    mixed = [cpu[0].to("openreg:0"), cpu[1].clone(), cpu[2].to("openreg:1")]
    for _ in range(2):  # the first call of a signature and a later one
        torch._foreach_mul_(mixed, 2.0)
        torch._foreach_mul_(cpu, 2.0)
    sums = torch._foreach_add(mixed, 1.5)
    assert [t.device for t in sums] == [t.device for t in mixed]
    assert [t.device.type for t in mixed] == ["openreg", "cpu", "openreg"]
    for got, want in zip(mixed + list(sums), cpu + list(torch._foreach_add(cpu, 1.5)), strict=True):
        assert torch.equal(got.cpu(), want)


def test_foreach_errors_at_the_call_as_on_the_cpu():
    for device in ["cpu", "openreg"]:
        a = [torch.zeros(2, device=device), torch.zeros(3, device=device)]
        b = [torch.zeros(2, device=device), torch.zeros(2, device=device)]
        for _ in range(2):
            with pytest.raises(RuntimeError, match=r"size of tensor a \(3\) must match"):
                torch._foreach_add_(a, b)
        with pytest.raises(RuntimeError, match="same number of tensors, got 2 and 1"):
            torch._foreach_add_(a, b[:1])
        with pytest.raises(RuntimeError, match="same number of elements as scalar list"):
            torch._foreach_div_(a, [1.0, 2.0, 3.0])


def test_large_elementwise_and_reduction():
    x = randn(512, 513)
    check_against_cpu(lambda t: (t * 2 + 1).sum(0), x)
    check_against_cpu(lambda t: torch.softmax(t, 1).max(1), x)


def test_to_device_helper_roundtrip():
    nested = {"a": [randn(2), (randn(3),)], "b": 1}
    moved = to_device(nested)
    assert moved["a"][0].device.type == "openreg" and moved["b"] == 1


@pytest.mark.parametrize("out", [False, True])
def test_lu_solve_right_side_keeps_the_conjugate_bit(out):
    """linalg_lu_solve(left=False) returns its out= result as a conjugate view
    (the CPU kernel solves A^H X^H = B^H in place and flips the bit); the
    fallback must carry the bit to the device tensor, on every call (also
    once the signature is cached, and for shapes that broadcast like an
    elementwise op)."""
    for n, rhs in [(3, 4), (1, 4)]:
        a = torch.randn(n, n, generator=_gen(n), dtype=torch.complex128)
        lu, piv = torch.linalg.lu_factor(a)
        b = torch.randn(rhs, n, generator=_gen(rhs), dtype=torch.complex128)
        expected = torch.linalg.lu_solve(lu, piv, b, left=False)
        dev = to_device((lu, piv, b))
        for _ in range(3):
            if out:
                result = torch.empty(rhs, n, dtype=torch.complex128, device="openreg")
                torch.linalg.lu_solve(*dev, left=False, out=result)
            else:
                result = torch.linalg.lu_solve(*dev, left=False)
            assert result.is_conj() == expected.is_conj()
            assert_close_cpu(result, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_group_norm_and_addr_run_the_cpu_kernel_in_half_precision(dtype):
    """native_group_norm and addr have CompositeExplicitAutograd decompositions
    that round half-precision intermediates separately; openreg sends them to
    the CPU kernel, so results (and group norm's gradients) match bit for bit."""
    x = randn(2, 6, 3, dtype=dtype, seed=1).requires_grad_()
    w = randn(6, dtype=dtype, seed=2).requires_grad_()
    b = randn(6, dtype=dtype, seed=3).requires_grad_()

    def group_norm(x, w, b):
        y = F.group_norm(x, 2, w, b, eps=0.5)
        return y, torch.autograd.grad(y.sum(), (x, w, b))

    check_against_cpu(group_norm, x, w, b, compare_kwargs={"rtol": 0, "atol": 0})
    s, v1, v2 = (
        randn(5, 5, dtype=dtype, seed=4),
        randn(5, dtype=dtype, seed=5),
        randn(5, dtype=dtype, seed=6),
    )
    check_against_cpu(
        lambda s, v1, v2: torch.addr(s, v1, v2, beta=0.3, alpha=1.7),
        s,
        v1,
        v2,
        compare_kwargs={"rtol": 0, "atol": 0},
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_relu_is_the_cpu_composition(dtype):
    # relu is registered as the CPU's own composition (clamp_min), so it runs
    # queued on device outputs with the CPU's values, NaN and -0.0 included.
    x = torch.tensor([float("nan"), -0.0, 0.0, -1.5, 2.5, 7.0]).to(dtype)
    d = x.to("openreg")

    def same(a, b):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        if dtype.is_floating_point:
            assert torch.equal(a.signbit(), b.signbit())

    same(torch.relu(d).cpu(), torch.relu(x))
    y = d.clone()
    assert y.relu_() is y
    same(y.cpu(), torch.relu(x))
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        torch.relu(torch.ones(2, dtype=torch.bool, device="openreg"))


# Structured operators that are not pointwise: once the first call of a
# signature showed that the out= variant writes the same bytes in place, later
# calls are queued through it, writing device memory directly. mse_loss.out,
# which uses its out as scratch of the unreduced shape, must keep the copy.
STRUCTURED = {
    "mm": (lambda a, b: a @ b, lambda: (randn(6, 5), randn(5, 4, seed=1))),
    "mm_transposed": (lambda a, b: a.t() @ b.t(), lambda: (randn(5, 6), randn(4, 5, seed=1))),
    "addmm": (
        lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
        lambda: (randn(4), randn(6, 5, seed=1), randn(5, 4, seed=2)),
    ),
    "bmm": (torch.bmm, lambda: (randn(3, 4, 5), randn(3, 5, 2, seed=1))),
    "sum_dim": (lambda x: x.sum(dim=1), lambda: (randn(7, 9),)),
    "mean_keepdim": (lambda x: x.mean(dim=0, keepdim=True), lambda: (randn(7, 9),)),
    "log_softmax": (lambda x: torch.log_softmax(x, dim=-1), lambda: (randn(4, 10),)),
    "softmax_channels_last": (
        lambda x: torch.softmax(x, dim=1),
        lambda: (randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),),
    ),
    "max_dim": (lambda x: torch.max(x, dim=1), lambda: (randn(6, 5),)),
    "sort": (lambda x: torch.sort(x, dim=0, stable=True), lambda: (randn(8, 3),)),
    "topk": (lambda x: torch.topk(x, 3), lambda: (randn(4, 9),)),
    "cumsum": (lambda x: torch.cumsum(x, 1), lambda: (randn(4, 6),)),
    "cat": (lambda a, b: torch.cat([a, b], dim=1), lambda: (randn(3, 2), randn(3, 4, seed=1))),
    "gather": (
        lambda x, i: torch.gather(x, 1, i),
        lambda: (randn(4, 5), ints(4, 3, lo=0, hi=5)),
    ),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), lambda: (randn(2, 3, 6, 6),)),
    "upsample_nearest": (
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
        lambda: (randn(1, 2, 3, 3),),
    ),
    "nll_loss": (
        lambda x, t: F.nll_loss(torch.log_softmax(x, 1), t),
        lambda: (randn(5, 4), ints(5, lo=0, hi=4)),
    ),
    "mse_loss_mean": (lambda a, b: F.mse_loss(a, b), lambda: (randn(4, 5), randn(4, 5, seed=1))),
    "mse_loss_sum": (
        lambda a, b: F.mse_loss(a, b, reduction="sum"),
        lambda: (randn(4, 5), randn(4, 5, seed=1)),
    ),
    "mse_loss_none": (
        lambda a, b: F.mse_loss(a, b, reduction="none"),
        lambda: (randn(4, 5), randn(4, 5, seed=1)),
    ),
}


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_structured_ops_queued_match_cpu(name):
    fn, make_inputs = STRUCTURED[name]
    inputs = make_inputs()
    expected = fn(*inputs)
    dev_inputs = to_device(inputs, "openreg")
    # The first call learns the signature; the later ones are queued.
    results = [fn(*dev_inputs) for _ in range(3)]
    torch.openreg.synchronize()
    for actual in results:
        assert_on_device(actual, "openreg")
        assert_close_cpu(actual, expected)


# The structured operators reach the fallback through unboxed entries
# (csrc/engine/fallback/OpenRegUnboxedEntry.cpp) whose stack borrows the tensor
# arguments instead of counting references to them. Every path (the first,
# synchronous call of a signature, the queued calls, an error at the call)
# must leave the arguments' reference counts as they were and give the CPU's
# values.
def test_unboxed_entries_borrow_arguments_and_match_cpu():
    for op in ("aten::add.Tensor", "aten::add_.Tensor", "aten::mul.Tensor", "aten::addmm"):
        [kernel] = [
            line
            for line in torch._C._dispatch_dump(op).splitlines()
            if line.startswith("PrivateUse1:")
        ]
        assert "unboxed" in kernel, kernel
    a, b, c = randn(6, 5), randn(6, 5, seed=1), randn(5, 4, seed=2)
    da, db, dc = (t.to("openreg") for t in (a, b, c))
    counts = [t._use_count() for t in (da, db, dc)]
    for _ in range(3):  # learned, then queued
        assert_close_cpu(da + db, a + b)
        assert_close_cpu(torch.mul(da, db), a * b)
        assert_close_cpu(
            torch.addmm(db[:, :4], da, dc, beta=0.5, alpha=2.0),
            torch.addmm(b[:, :4], a, c, beta=0.5, alpha=2.0),
        )
        out = da.clone()
        assert out.add_(db, alpha=3.0) is out
        assert_close_cpu(out, a + 3.0 * b)
        with pytest.raises(RuntimeError, match="same device"):
            da + b  # a CPU tensor that is not a scalar
        with pytest.raises(RuntimeError, match="alpha must not be a floating point"):
            torch.add(da.long(), db.long(), alpha=1.5)
        assert [t._use_count() for t in (da, db, dc)] == counts
    torch.openreg.synchronize()
    assert [t._use_count() for t in (da, db, dc)] == counts
