"""Sync debug mode reports what CUDA's reports, named as the program wrote it.

torch.cuda.set_sync_debug_mode("warn"/"error") reports every operation that
makes the host wait for the device: .item() and bool() of a tensor, printing
one, blocking copies to the host, and the operators whose results' sizes
depend on the data (nonzero, boolean-mask indexing, masked_select, unique).
openreg reports the same set, naming the Python-level call and the line
(torch_openreg/openreg/_sync_caller.py), and nothing for the first run of a
signature, which synchronizes only because openreg learns it.
"""

import warnings

import pytest
import torch

D = "openreg"


@pytest.fixture
def warn_mode():
    x = torch.arange(6.0, device=D)
    (x > 2).sum().item()  # learnt before the mode is on
    torch.openreg.synchronize()
    torch.openreg.set_sync_debug_mode("warn")
    try:
        yield x
    finally:
        torch.openreg.set_sync_debug_mode(0)


def _reports(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "called a synchronizing openreg" in str(w.message)]


CASES = [
    ("item", lambda x: x.max().item(), "Tensor.item()"),
    ("bool", lambda x: bool(x.sum() > 0), "bool() of a tensor"),
    ("float", lambda x: float(x.sum()), "float() of a tensor"),
    ("nonzero", lambda x: x.nonzero(), "aten::nonzero"),
    ("mask indexing", lambda x: x[x > 2], "aten::index.Tensor"),
    ("masked_select", lambda x: x.masked_select(x > 2), "aten::masked_select"),
    ("unique", lambda x: torch.unique(x), "aten::_unique2"),
    ("copy to the host", lambda x: x.cpu(), "a blocking copy"),
]


@pytest.mark.parametrize("name,fn,text", CASES, ids=[c[0] for c in CASES])
def test_each_synchronization_cuda_reports_is_reported(warn_mode, name, fn, text):
    reports = _reports(lambda: fn(warn_mode))
    assert reports, name
    assert any(text in r for r in reports), reports
    assert any("test_sync_debug.py" in r for r in reports), reports  # the line


def test_a_condition_on_a_tensor_names_tensor_bool(warn_mode):
    x = warn_mode

    def condition():
        if x.sum() > 0:
            pass

    reports = _reports(condition)
    assert any("Tensor.__bool__" in r and "if x.sum() > 0:" in r for r in reports), reports


def test_printing_names_the_print(warn_mode):
    reports = _reports(lambda: print(warn_mode))
    assert reports and all("printing a tensor" in r for r in reports), reports


def test_asynchronous_work_and_first_runs_are_not_reported(warn_mode):
    x = warn_mode
    assert _reports(lambda: (x * 3 + 1).exp_()) == []
    assert _reports(lambda: torch.atan2(x, x + 1)) == []  # a first run: learnt, not reported
    torch.openreg.synchronize()


def test_error_mode_raises_naming_the_call(warn_mode):
    torch.openreg.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match=r"aten::nonzero\) from Tensor.nonzero\(\)"):
        warn_mode.nonzero()
