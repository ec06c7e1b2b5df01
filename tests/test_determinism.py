"""CUDA's determinism, as a user sees it (csrc/aten/fallback/OpenRegDeterminism.h).

With torch.use_deterministic_algorithms(True), CUDA raises for the operators
the docstring of use_deterministic_algorithms lists as throwing "when called
on a CUDA tensor" (PyTorch 2.13), and warns with warn_only=True; the CPU is
silent. openreg raises exactly there, with PyTorch's own message and CUDA's
name for the kernel. faults.shuffle_atomics() makes the atomic accumulations
(index_add_, scatter_add_, index_put_(accumulate=True)) add in a different
order at each call, as CUDA's atomics do from run to run.
"""

import warnings

import pytest
import torch

D = "openreg"


@pytest.fixture(autouse=True)
def _restore_determinism():
    yield
    torch.use_deterministic_algorithms(False)
    torch.openreg.faults.clear()


def _bilinear_backward(d):
    g = torch.ones(1, 1, 8, 8, device=d)
    return torch.ops.aten.upsample_bilinear2d_backward(g, [8, 8], [1, 1, 4, 4], False)


# (name, call on a device, CUDA's name in the message): each throws on CUDA.
THROWING = [
    ("cumsum float", lambda d: torch.arange(5.0, device=d).cumsum(0), "cumsum_cuda_kernel"),
    ("histc", lambda d: torch.histc(torch.arange(8.0, device=d), bins=4), "_histc_cuda"),
    (
        "bincount with weights",
        lambda d: torch.bincount(torch.tensor([0, 1, 1], device=d), torch.ones(3, device=d)),
        "_bincount_cuda",
    ),
    (
        "median with indices",
        lambda d: torch.arange(6.0, device=d).reshape(2, 3).median(1),
        "median CUDA with indices output",
    ),
    (
        "put_ accumulate",
        lambda d: torch.zeros(4, device=d).put_(
            torch.tensor([0, 0], device=d), torch.ones(2, device=d), accumulate=True
        ),
        "put_",
    ),
    (
        "scatter_reduce prod",
        lambda d: torch.ones(3, device=d).scatter_reduce(
            0, torch.tensor([0, 0], device=d), torch.full((2,), 2.0, device=d), "prod"
        ),
        "scatter_reduce_cuda",
    ),
    (
        "upsample_bilinear2d backward",
        _bilinear_backward,
        "upsample_bilinear2d_backward_out_cuda",
    ),
    (
        "adaptive_avg_pool2d backward",
        lambda d: torch.ops.aten._adaptive_avg_pool2d_backward(
            torch.ones(1, 1, 2, 2, device=d), torch.ones(1, 1, 4, 4, device=d)
        ),
        "adaptive_avg_pool2d_backward_cuda",
    ),
    (
        "reflection_pad2d backward",
        lambda d: torch.ops.aten.reflection_pad2d_backward(
            torch.ones(1, 1, 6, 6, device=d), torch.ones(1, 1, 4, 4, device=d), [1, 1, 1, 1]
        ),
        "reflection_pad2d_backward_cuda",
    ),
]

# The same operators where CUDA does not throw.
SILENT = [
    ("cumsum of integers", lambda d: torch.arange(5, device=d).cumsum(0)),
    ("bincount without weights", lambda d: torch.bincount(torch.tensor([0, 1, 1], device=d))),
    ("median without indices", lambda d: torch.arange(6.0, device=d).median()),
    (
        "scatter_reduce sum",
        lambda d: torch.ones(3, device=d).scatter_reduce(
            0, torch.tensor([0, 0], device=d), torch.full((2,), 2.0, device=d), "sum"
        ),
    ),
    (
        "index_add_",  # deterministic on CUDA in this mode
        lambda d: torch.zeros(3, device=d).index_add_(
            0, torch.tensor([0, 0], device=d), torch.ones(2, device=d)
        ),
    ),
]


@pytest.mark.parametrize("name,call,cuda_name", THROWING, ids=[t[0] for t in THROWING])
def test_raises_where_cuda_raises_and_the_cpu_is_silent(name, call, cuda_name):
    torch.use_deterministic_algorithms(True)
    call("cpu")  # the CPU's kernel is deterministic
    with pytest.raises(RuntimeError, match="does not have a deterministic implementation") as e:
        call(D)
        torch.openreg.synchronize()
    assert str(e.value).startswith(cuda_name), e.value
    torch.use_deterministic_algorithms(False)
    call(D)  # and runs again once the mode is off
    torch.openreg.synchronize()


@pytest.mark.parametrize("name,call", SILENT, ids=[t[0] for t in SILENT])
def test_silent_where_cuda_is_silent(name, call):
    torch.use_deterministic_algorithms(True)
    want = call("cpu")
    got = call(D)
    want = want if isinstance(want, torch.Tensor) else want[0]
    got = got if isinstance(got, torch.Tensor) else got[0]
    torch.testing.assert_close(got.cpu(), want)


def test_warn_only_warns_with_the_same_message():
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.arange(5.0, device=D).cumsum(0).cpu()
    assert got.tolist() == [0.0, 1.0, 3.0, 6.0, 10.0]
    messages = [str(w.message) for w in caught]
    assert any(m.startswith("cumsum_cuda_kernel does not have a deterministic") for m in messages)


def _accumulations(d, seed):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(4096, generator=g)
    index = torch.zeros(4096, dtype=torch.long)
    if seed is not None:
        torch.openreg.faults.shuffle_atomics(seed=seed)
    try:
        a = torch.zeros(2, device=d).index_add_(0, index.to(d), values.to(d))
        b = torch.zeros(2, device=d).scatter_add_(0, index.to(d), values.to(d))
        c = torch.zeros(2, device=d).index_put_((index.to(d),), values.to(d), accumulate=True)
        return [t[0].item() for t in (a, b, c)]
    finally:
        torch.openreg.faults.clear()


def test_shuffled_atomics_differ_between_seeds_and_stay_close_to_the_cpu():
    cpu = _accumulations("cpu", None)
    plain = _accumulations(D, None)
    assert plain == cpu  # the same order as the CPU's kernel when not armed
    runs = [_accumulations(D, seed) for seed in range(4)]
    for k in range(3):  # each operator's sum depends on the order
        assert len({r[k] for r in runs}) > 1, runs
        for r in runs:
            assert abs(r[k] - cpu[k]) < 1e-3 * max(1.0, abs(cpu[k])), (r, cpu)
    assert _accumulations(D, 7) == _accumulations(D, 7)  # a seed replays


def test_deterministic_mode_turns_shuffling_off():
    torch.use_deterministic_algorithms(True)
    cpu = _accumulations("cpu", None)
    assert _accumulations(D, 3)[0] == cpu[0]  # index_add_ as the CPU's
