"""Device-side asserts as CUDA reports them (OPENREG_DEVICE_ASSERTS=cuda).

On CUDA an index out of range in embedding, gather, scatter, indexing or
index_put_, or a target out of range in nll_loss / cross_entropy, is a
device-side assert in the kernel (CUDA_KERNEL_ASSERT in
aten/src/ATen/native/cuda: Indexing.cu, ScatterGatherKernel.cu,
IndexKernel.cu, Loss.cu): nothing is raised at the call, the next
synchronization raises "CUDA error: device-side assert triggered", and the
context stays unusable until the process ends; with CUDA_LAUNCH_BLOCKING=1 the
error comes at the call. The CPU raises an IndexError at the call, so code
that catches it there passes on the CPU and crashes on a GPU. openreg
follows CUDA here by default (core/OpenRegDeviceAsserts.h).

Each buggy program runs in a fresh process (the device stays unusable), with
its fixed twin, in both launch modes and with both drivers; the in-process
suite runs with OPENREG_DEVICE_ASSERTS=cpu (conftest.py).
"""

import textwrap

import pytest
from conftest import describe, run_python

# The buggy programs: each "handles" a bad index at the call, as CPU code may.
BUGGY = {
    "embedding": (
        "aten::index_select",
        """
        emb = torch.nn.Embedding(10, 4).to(d)
        out = emb(torch.tensor([1, 10], device=d))  # 10 is out of range
        """,
    ),
    "gather": (
        "aten::gather",
        """
        x = torch.arange(6.0, device=d).reshape(2, 3)
        out = torch.gather(x, 1, torch.tensor([[0, 3], [1, 2]], device=d))
        """,
    ),
    "cross_entropy": (
        "aten::nll_loss_forward",
        """
        logits = torch.randn(4, 5, device=d)
        out = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 5, 2], device=d))
        """,
    ),
    "indexing": (
        "aten::index",
        """
        x = torch.arange(4.0, device=d)
        out = x[torch.tensor([1, 7], device=d)]
        """,
    ),
    "index_put_": (
        "aten::_index_put_impl_",
        """
        x = torch.zeros(4, device=d)
        x[torch.tensor([0, 9], device=d)] = 1.0
        out = x
        """,
    ),
    "scatter_": (
        "aten::scatter_",
        """
        x = torch.zeros(3, device=d)
        out = x.scatter_(0, torch.tensor([0, 4], device=d), torch.ones(2, device=d))
        """,
    ),
    # The same bug on a signature learnt before: the call is queued, and its
    # kernel fails on the device.
    "queued index_select": (
        "aten::index_select",
        """
        w = torch.randn(10, 4, device=d)
        w.index_select(0, torch.tensor([1, 2], device=d)).sum().item()
        out = w.index_select(0, torch.tensor([1, 12], device=d))
        """,
    ),
}

RUN_BUGGY = """
import torch
d = torch.device("openreg:0")
try:
{body}
    print("call: returned")
except torch.AcceleratorError as e:
    print("call: AcceleratorError", "device-side assert triggered" in str(e),
          {op!r} in str(e))
except (IndexError, RuntimeError) as e:
    print("call: CPU error", type(e).__name__)  # what the CPU does
try:
    torch.openreg.synchronize(0)
    print("sync: no error")
except torch.AcceleratorError as e:
    text = str(e)
    print("sync: AcceleratorError", "device-side assert triggered" in text,
          {op!r} in text)
try:
    torch.ones(2, device=d).sum().item()
    print("later: no error")
except torch.AcceleratorError as e:
    print("later: AcceleratorError", "device-side assert triggered" in str(e))
print("other device:", torch.ones(2, device="openreg:1").sum().item())
"""

# The fixed twin of each: the indices are checked before the kernel sees them,
# and the results equal the CPU's.
FIXED = """
import torch
def run(d):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4).to(d)
    idx = torch.tensor([1, 10], device=d)
    idx = idx.clamp(0, emb.num_embeddings - 1)  # fixed: clamp before the lookup
    a = emb(idx)
    x = torch.arange(6.0, device=d).reshape(2, 3)
    g = torch.tensor([[0, 3], [1, 2]], device=d)
    b = torch.gather(x, 1, g.remainder(x.shape[1]))
    t = torch.tensor([0, 1, 5, 2], device=d)
    logits = torch.arange(20.0, device=d).reshape(4, 5) / 7
    c = torch.nn.functional.cross_entropy(logits, t, ignore_index=5)
    y = torch.zeros(4, device=d)
    i = torch.tensor([0, 9], device=d)
    y[i[i < y.numel()]] = 1.0
    return [v.detach().cpu() for v in (a, b, c, y)]
for want, got in zip(run("cpu"), run("openreg"), strict=True):
    torch.testing.assert_close(got, want)
torch.openreg.synchronize()
print("fixed: same as the CPU")
"""


def _run(body, op, driver, blocking):
    code = RUN_BUGGY.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "), op=op)
    return run_python(
        code,
        env={
            "OPENREG_DEVICE_ASSERTS": "cuda",
            "OPENREG_DRIVER": driver,
            "OPENREG_LAUNCH_BLOCKING": "1" if blocking else "0",
        },
        timeout=120,
    )


def _check(proc, op, blocking):
    lines = dict(line.split(": ", 1) for line in proc.stdout.strip().splitlines())
    assert proc.returncode == 0, describe(proc)
    if blocking:
        # As with CUDA_LAUNCH_BLOCKING=1: raised at the call.
        assert lines["call"] == "AcceleratorError True True", describe(proc)
    else:
        # Nothing at the call; the next synchronization names the operator.
        assert lines["call"] == "returned", describe(proc)
        assert lines["sync"] == "AcceleratorError True True", describe(proc)
    # The device stays unusable; the other device works.
    assert lines["later"] == "AcceleratorError True", describe(proc)
    assert lines["other device"] == "2.0", describe(proc)


@pytest.mark.parametrize("name", sorted(BUGGY))
def test_a_bad_index_is_a_device_side_assert(name):
    op, body = BUGGY[name]
    proc = _run(body, op, "thread", blocking=False)
    _check(proc, op, blocking=False)


@pytest.mark.parametrize(
    "name,driver,blocking",
    [
        ("embedding", "process", False),
        ("queued index_select", "process", False),
        ("cross_entropy", "thread", True),
        ("queued index_select", "thread", True),
        ("gather", "process", True),
    ],
)
def test_device_side_asserts_in_each_mode(name, driver, blocking):
    op, body = BUGGY[name]
    proc = _run(body, op, driver, blocking)
    _check(proc, op, blocking)


@pytest.mark.parametrize("driver", ["thread", "process"])
@pytest.mark.parametrize("blocking", [False, True])
def test_the_fixed_programs_match_the_cpu(driver, blocking):
    proc = run_python(
        FIXED,
        env={
            "OPENREG_DEVICE_ASSERTS": "cuda",
            "OPENREG_DRIVER": driver,
            "OPENREG_LAUNCH_BLOCKING": "1" if blocking else "0",
        },
        timeout=120,
    )
    assert "fixed: same as the CPU" in proc.stdout, describe(proc)


def test_cpu_mode_raises_the_cpu_error_at_the_call():
    op, body = BUGGY["gather"]
    code = RUN_BUGGY.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "), op=op)
    proc = run_python(code, env={"OPENREG_DEVICE_ASSERTS": "cpu", "OPENREG_LAUNCH_BLOCKING": "0"})
    lines = dict(line.split(": ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["call"] == "CPU error RuntimeError", describe(proc)  # as on the CPU
    assert lines["later"] == "no error", describe(proc)


def test_a_bad_setting_is_refused():
    proc = run_python(
        "import torch; torch.ones(1, device='openreg').add(1).cpu()",
        env={"OPENREG_DEVICE_ASSERTS": "gpu"},
    )
    assert "OPENREG_DEVICE_ASSERTS='gpu'" in proc.stderr, describe(proc)
