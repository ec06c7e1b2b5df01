"""A representative slice of PyTorch's OpInfo database, openreg vs CPU.

Every sample of each listed OpInfo runs on the CPU and on openreg (forward
only, float32, plus int64 for some integer-capable ops) through the
differential harness in ``tests/opinfo/harness.py``; the full database run
is the harness CLI (see ``tests/opinfo/README.md``).
"""

import pytest
import torch
from opinfo import harness

FLOAT_OPS = [
    # elementwise unary
    "abs",
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "sin",
    "tanh",
    "sigmoid",
    "erf",
    "floor",
    "sign",
    "nan_to_num",
    # elementwise binary
    "add",
    "sub",
    "mul",
    "div.no_rounding_mode",
    "div.floor_rounding",
    "pow",
    "maximum",
    "atan2",
    "remainder",
    # reductions
    "sum",
    "mean",
    "amax",
    "prod",
    "var",
    "argmax",
    "logsumexp",
    "linalg.vector_norm",
    # matmul family
    "mm",
    "matmul",
    "bmm",
    "addmm",
    "einsum",
    # nn.functional
    "nn.functional.linear",
    "nn.functional.conv2d",
    "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d",
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "nn.functional.batch_norm",
    "nn.functional.group_norm",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "nn.functional.mse_loss",
    "nn.functional.nll_loss",
    "nn.functional.relu",
    "nn.functional.gelu",
    # indexing / scatter / gather
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "index_put",
    "masked_select",
    # joining / splitting
    "cat",
    "stack",
    "split",
    # sorting, scans, selection, comparison, conversions
    "sort",
    "topk",
    "cumsum",
    "where",
    "clamp",
    "eq",
    "lt",
    "isnan",
    "double",
    "long",
]

# Integer-capable ops also checked in int64.
INT64_OPS = {"abs", "add", "mul", "sum", "cumsum", "sort", "gather", "where", "clamp", "eq", "cat"}

_OPS = {}


def _op(name):
    if not _OPS:
        _OPS.update((harness.full_name(op), op) for op in harness.op_db())
    return _OPS[name]


def _dtypes(name):
    return [torch.float32, torch.int64] if name in INT64_OPS else [torch.float32]


@pytest.mark.parametrize("name", FLOAT_OPS)
def test_opinfo(name):
    op = _op(name)
    result = harness.run_op(op, dtypes=_dtypes(name))
    assert result.forward.ran > 0, f"{name}: no sample ran ({result.skips})"
    failures = "\n".join(
        f"  {dtype} sample {index}: {message}" for _, dtype, index, message in result.failures
    )
    assert result.forward.failed == 0, f"{result.line()}\n{failures}"
