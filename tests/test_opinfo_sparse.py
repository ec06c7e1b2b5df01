"""PyTorch's sparse OpInfo samples, openreg vs CPU (issue 28).

Every OpInfo with ``supports_sparse`` / ``supports_sparse_csr`` / ``_csc`` /
``_bsr`` / ``_bsc`` runs its samples of each such layout (float32, forward) on
the CPU and on openreg through the differential harness
(``tests/opinfo/harness.py --sparse``); every dtype with gradients is
``make opinfo-sparse``.
"""

import pytest
import torch
from opinfo import harness

ENTRIES = harness.sparse_entries()


def test_every_sparse_layout_has_entries():
    layouts = {layout for _, layout in ENTRIES}
    assert layouts == set(harness.SPARSE_LAYOUTS), layouts
    assert len(ENTRIES) > 150


@pytest.mark.parametrize(
    "op,layout", ENTRIES, ids=[f"{harness.full_name(op)}[{layout}]" for op, layout in ENTRIES]
)
def test_sparse_opinfo(op, layout):
    result = harness.run_sparse_op(op, layout, dtypes=[torch.float32])
    failures = "\n".join(
        f"  {dtype} sample {index}: {message}" for _, dtype, index, message in result.failures
    )
    assert result.forward.failed == 0, f"{result.line()}\n{failures}"
    if result.forward.ran == 0:
        # Only when the CPU cannot make the samples either, or the op draws
        # random numbers (the generators differ).
        allowed = ("on the CPU too", "nondeterministic")
        assert all(any(a in r for a in allowed) for r in result.skips), result.skips
