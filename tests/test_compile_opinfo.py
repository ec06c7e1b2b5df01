"""torch.compile on openreg over a slice of PyTorch's OpInfo database: each op's
first sample (float32, and int64 for some) compiled by Inductor's openreg
backend vs run eagerly on openreg (``tests/opinfo/compiled.py``; the longer
run is ``make compile-zoo``)."""

import pytest
import torch
from opinfo import compiled, harness


@pytest.fixture(scope="module", autouse=True)
def _inductor_cache(inductor_cache):
    return inductor_cache


_OPS = {}


def _op(name):
    if not _OPS:
        _OPS.update((harness.full_name(op), op) for op in harness.op_db())
    return _OPS[name]


@pytest.mark.parametrize("name", compiled.SLICE)
def test_compiled_equals_eager(name):
    result = compiled.run_op(_op(name), compiled.dtypes_for(name), limit=1)
    assert result.ran > 0, f"{name}: no sample ran ({result.skips})"
    assert result.passed == result.ran, "\n".join([result.line(), *result.failures])
    torch.openreg.synchronize()
