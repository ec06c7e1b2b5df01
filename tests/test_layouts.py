"""Layouts beyond strided on openreg (issue 28): nested tensors (the
Transformer fast path) and sparse COO / compressed (CSR, CSC, BSR) tensors.

Every case runs the same function on the CPU and on openreg and compares what
it observes (value, dtype, exception type and message, warnings) with
conftest.observe; sparse results are compared as sparse tensors, nested ones
padded. The file also runs with OPENREG_LAUNCH_BLOCKING=1 (the last test).
"""

import io
import os
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import (
    assert_same_observation,
    describe,
    observe,
    rerun_file_in_blocking_mode,
    run_python,
)

D = "openreg"
BLOCKING = os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1"


# PyTorch warns once per process that sparse CSR is in beta, that sparse
# invariant checks are off and that nested tensors are a prototype: whichever
# device ran first would see those. They are spent here, before any test.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.eye(2).to_sparse_csr()
    torch.sparse_coo_tensor([[0]], [1.0], (2,))
    torch.nested.nested_tensor([torch.ones(1)])


def same_on_both(fn, exact=False):
    """fn(device) observed on the CPU and on openreg agree."""
    torch.manual_seed(0)
    cpu = observe(fn, "cpu")
    torch.manual_seed(0)
    dev = observe(fn, D)
    assert_same_observation(cpu, dev, exact=exact)
    return dev


def padded(t):
    return torch.nested.to_padded_tensor(t, 0.0) if t.is_nested else t


def assert_where(t, device=D):
    """A result of any layout lives on `device`, every part of it too."""
    assert t.device.type == D and str(t.device).startswith(device)
    if t.layout == torch.sparse_coo:
        parts = [t._indices(), t._values()]
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = [t.crow_indices(), t.col_indices(), t.values()]
    elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = [t.ccol_indices(), t.row_indices(), t.values()]
    else:
        parts = [t]
    for p in parts:
        assert p.device == t.device, (t.layout, p.device)


# --- the Transformer fast path ---------------------------------------------


def encoder(device):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2).eval().to(device)
    x = torch.randn(3, 10, 64).to(device)
    mask = torch.zeros(3, 10, dtype=torch.bool)
    mask[0, 6:] = True
    mask[2, 3:] = True
    with torch.no_grad():
        return enc(x, src_key_padding_mask=mask.to(device))


def test_encoder_fast_path_with_padding_mask_equals_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constructor's enable_nested_tensor note
        torch.manual_seed(0)
        cpu = encoder("cpu")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            dev = encoder(D)
    names = {e.name for e in prof.events()}
    # The batch became a nested tensor and ran through the fused layer.
    assert "aten::_nested_tensor_from_mask" in names
    assert "aten::_transformer_encoder_layer_fwd" in names
    assert dev.device == torch.device(D, 0) and not dev.is_nested
    torch.testing.assert_close(dev.cpu(), cpu)
    # The padded positions are zeros as on the CPU.
    assert torch.equal(dev.cpu()[0, 6:], torch.zeros(4, 64))


def test_encoder_warnings_are_the_cpus():
    same_on_both(encoder)


def test_multihead_attention_fast_path_equals_cpu():
    def run(device):
        torch.manual_seed(0)
        mha = nn.MultiheadAttention(32, 4, batch_first=True).eval().to(device)
        x = torch.randn(2, 5, 32).to(device)
        mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2]).to(device)
        with torch.no_grad():
            return mha(x, x, x, key_padding_mask=mask, need_weights=False)[0]

    same_on_both(run)


# --- nested tensors ----------------------------------------------------------


def nested(device, *shapes, requires_grad=False):
    torch.manual_seed(0)
    parts = [torch.randn(*s) for s in shapes]
    return torch.nested.nested_tensor(parts, device=device, requires_grad=requires_grad)


NESTED_OPS = {
    "to_padded": lambda d: torch.nested.to_padded_tensor(nested(d, (2, 4), (3, 4)), -1.0),
    "relu": lambda d: padded(nested(d, (2, 4), (3, 4)).relu()),
    "add": lambda d: padded(nested(d, (2, 4), (3, 4)) + nested(d, (2, 4), (3, 4)) * 2),
    "softmax": lambda d: padded(nested(d, (2, 4), (3, 4)).softmax(-1)),
    "matmul": lambda d: padded(
        nested(d, (2, 4), (3, 4)) @ nested(d, (2, 4), (3, 4)).transpose(-1, -2)
    ),
    "linear": lambda d: padded(
        nn.functional.linear(nested(d, (2, 4), (3, 4)), torch.ones(5, 4, device=d))
    ),
    "unbind": lambda d: list(nested(d, (2, 4), (1, 4)).unbind()),
    "sizes": lambda d: [t.shape for t in nested(d, (2, 4), (3, 4), (1, 4)).unbind()],
    "from_mask": lambda d: padded(
        torch._nested_tensor_from_mask(
            torch.arange(24.0, device=d).view(2, 3, 4),
            torch.tensor([[True, True, False], [True, True, True]], device=d),
        )
    ),
    "mismatched add": lambda d: nested(d, (2, 4), (3, 4)) + nested(d, (2, 4)),
    "strided op refused as on the CPU": lambda d: nested(d, (2, 4), (3, 4)).view(-1),
}


@pytest.mark.parametrize("case", NESTED_OPS, ids=list(NESTED_OPS))
def test_nested_op_equals_cpu(case):
    same_on_both(NESTED_OPS[case])


def test_nested_tensor_stays_on_its_device():
    nt = nested(f"{D}:1", (2, 4), (3, 4))
    assert nt.device == torch.device(f"{D}:1") and nt.is_nested
    out = (nt.relu() + 1).softmax(-1)
    assert out.device == torch.device(f"{D}:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        nt + nested(f"{D}:0", (2, 4), (3, 4))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        nt + nested("cpu", (2, 4), (3, 4))


def test_jagged_layout_eager_and_compiled(inductor_cache):
    def fn(x):
        return (x.sin() + 1).relu() * 2

    parts = [torch.randn(2, 4), torch.randn(3, 4)]
    cpu = torch.nested.nested_tensor(parts, layout=torch.jagged)
    dev = torch.nested.nested_tensor([p.to(D) for p in parts], layout=torch.jagged)
    torch.testing.assert_close(fn(dev).values().cpu(), fn(cpu).values())
    out = torch.compile(fn)(dev)
    assert out.device.type == D
    torch.testing.assert_close(out.values().cpu(), fn(cpu).values())


# --- sparse COO --------------------------------------------------------------

IDX = [[0, 1, 1, 0], [2, 0, 2, 2]]
VAL = [3.0, 4.0, 5.0, 1.0]


def coo(device, coalesced=False):
    s = torch.sparse_coo_tensor(torch.tensor(IDX), torch.tensor(VAL), (2, 3)).to(device)
    return s.coalesce() if coalesced else s


def dense(device, *shape):
    torch.manual_seed(1)
    return torch.randn(*shape).to(device)


COO_OPS = {
    "create on device": lambda d: torch.sparse_coo_tensor(
        torch.tensor(IDX, device=d), torch.tensor(VAL, device=d), (2, 3)
    ),
    "create with device=": lambda d: torch.sparse_coo_tensor(IDX, VAL, (2, 3), device=d),
    "to": lambda d: coo(d),
    "to_dense": lambda d: coo(d).to_dense(),
    "coalesce": lambda d: coo(d).coalesce(),
    "indices": lambda d: coo(d, True).indices(),
    "values": lambda d: coo(d, True).values(),
    "nnz and dims": lambda d: (coo(d)._nnz(), coo(d).sparse_dim(), coo(d).dense_dim()),
    "to_sparse": lambda d: dense(d, 3, 4).relu().to_sparse(),
    "to_sparse hybrid": lambda d: dense(d, 3, 4, 2).relu().to_sparse(2),
    "sparse.mm": lambda d: torch.sparse.mm(coo(d), dense(d, 3, 4)),
    "addmm": lambda d: torch.addmm(dense(d, 2, 4), coo(d), dense(d, 3, 4), beta=0.5),
    "matmul": lambda d: coo(d) @ dense(d, 3, 4),
    "sparse @ sparse": lambda d: coo(d) @ coo(d).t(),
    "sum": lambda d: torch.sparse.sum(coo(d)),
    "sum dim": lambda d: torch.sparse.sum(coo(d), dim=1),
    "sum dense": lambda d: coo(d).sum(),
    "mul scalar": lambda d: coo(d) * 2.5,
    "mul sparse": lambda d: coo(d, True) * coo(d, True),
    "add": lambda d: coo(d) + coo(d),
    "add dense": lambda d: coo(d) + dense(d, 2, 3),
    "neg, abs, sqrt": lambda d: (-coo(d)).abs().sqrt(),
    "transpose": lambda d: coo(d).t().coalesce(),
    "softmax": lambda d: torch.sparse.softmax(coo(d, True), 1),
    "index_select": lambda d: coo(d).index_select(1, torch.tensor([2, 0], device=d)),
    "clone, zero_": lambda d: coo(d).clone().zero_(),
    "dtype change": lambda d: coo(d).double(),
    "sizes mismatch": lambda d: coo(d) + torch.sparse_coo_tensor([[0]], [1.0], (3,)).to(d),
    "index out of range": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[5]], device=d), torch.ones(1, device=d), (3,), check_invariants=True
    ),
    "negative index": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[-1]], device=d), torch.ones(1, device=d), (3,), check_invariants=True
    ),
    "nnz mismatch": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[0, 1]], device=d), torch.ones(3, device=d), (3,)
    ),
    "mm shapes": lambda d: torch.sparse.mm(coo(d), dense(d, 4, 4)),
}


@pytest.mark.parametrize("case", COO_OPS, ids=list(COO_OPS))
def test_sparse_coo_equals_cpu(case):
    same_on_both(COO_OPS[case])


def test_sparse_results_live_on_their_device():
    d1 = f"{D}:1"
    s = coo(d1)
    for t in (s, s.coalesce(), s * 2, s + s, dense(d1, 3, 3).to_sparse()):
        assert_where(t, d1)
    assert_where(torch.sparse.mm(s, dense(d1, 3, 2)), d1)
    before = torch.openreg.memory_allocated(1)
    big = dense(d1, 256, 256).to_sparse()
    assert torch.openreg.memory_allocated(1) > before  # its parts are device memory
    with pytest.raises(TypeError, match="can't convert openreg:1 device type tensor to numpy"):
        big._values().numpy()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(s, dense(f"{D}:0", 3, 2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(s, dense("cpu", 3, 2))


def test_sparse_to_cpu_is_a_copy():
    s = coo(D, True)
    host = s.cpu()
    assert host.device.type == "cpu" and host.is_sparse
    s.values().mul_(0)  # the device tensor changes; the copy keeps its values
    assert host.values().tolist() == [1.0 + 3.0, 4.0, 5.0]


def test_sparse_result_too_large_for_the_device_raises_oom():
    script = """
import torch
s = torch.sparse_coo_tensor([[0], [0]], [1.0], (20000, 20000), device="openreg")
try:
    s.to_dense()  # 1.6 GB on a 256 MB device
except torch.OutOfMemoryError as e:
    print("oom", "openreg" in str(e) or "device" in str(e))
"""
    proc = run_python(script, env={"OPENREG_DEVICE_MEMORY": "256M"}, timeout=60)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["oom", "True"], describe(proc)


# --- sparse compressed ---------------------------------------------------------


COMPRESSED_OPS = {
    "to_sparse_csr": lambda d: dense(d, 4, 6).relu().to_sparse_csr(),
    "to_sparse_csc": lambda d: dense(d, 4, 6).relu().to_sparse_csc(),
    "to_sparse_bsr": lambda d: dense(d, 4, 6).relu().to_sparse_bsr((2, 2)),
    "csr to": lambda d: dense("cpu", 4, 6).relu().to_sparse_csr().to(d),
    "csr parts": lambda d: (lambda c: (c.crow_indices(), c.col_indices(), c.values()))(
        dense(d, 4, 6).relu().to_sparse_csr()
    ),
    "csr to_dense": lambda d: dense(d, 4, 6).relu().to_sparse_csr().to_dense(),
    "csr to coo": lambda d: dense(d, 4, 6).relu().to_sparse_csr().to_sparse(),
    "csr @ dense": lambda d: dense(d, 4, 6).relu().to_sparse_csr() @ dense(d, 6, 3),
    "addmm csr": lambda d: torch.addmm(
        dense(d, 4, 3), dense(d, 4, 6).relu().to_sparse_csr(), dense(d, 6, 3)
    ),
    "csr sum": lambda d: dense(d, 4, 6).relu().to_sparse_csr().sum(),
    "csr mul": lambda d: (
        dense(d, 4, 6).relu().to_sparse_csr() * dense(d, 4, 6).exp().to_sparse_csr()
    ),
    "csr add": lambda d: dense(d, 4, 6).relu().to_sparse_csr() + dense(d, 4, 6).to_sparse_csr(),
    "csr unary": lambda d: dense(d, 4, 6).relu().to_sparse_csr().sin(),
    "csr transpose": lambda d: dense(d, 4, 6).to_sparse_csr().t(),
    "csr bad crow": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 1, 5], device=d),
        torch.tensor([0, 1], device=d),
        torch.ones(2, device=d),
        (2, 2),
        check_invariants=True,
    ),
    "csr col out of range": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 1, 2], device=d),
        torch.tensor([0, 7], device=d),
        torch.ones(2, device=d),
        (2, 2),
        check_invariants=True,
    ),
    "csr @ wrong shape": lambda d: dense(d, 4, 6).to_sparse_csr() @ dense(d, 5, 3),
    "bsr bad blocksize": lambda d: dense(d, 4, 6).to_sparse_bsr((3, 4)),
}


@pytest.mark.parametrize("case", COMPRESSED_OPS, ids=list(COMPRESSED_OPS))
def test_sparse_compressed_equals_cpu(case):
    same_on_both(COMPRESSED_OPS[case])


def test_two_compressed_operands_are_not_confused():
    # The kernel sees each operand's own parts (crow_indices() hands out a new
    # alias each call: two operands once got the same kernel view).
    a, b = dense("cpu", 30, 30), dense("cpu", 30, 30).exp()
    a, b = a.to_sparse_csr(), b.to_sparse_csr()
    for op in (torch.mul, torch.add):
        out = op(a.to(D), b.to(D))
        assert_where(out)
        torch.testing.assert_close(out.cpu().to_dense(), op(a, b).to_dense())


# --- training with sparse gradients ------------------------------------------


def sparse_embedding_training(device, optimizer):
    torch.manual_seed(0)
    emb = nn.Embedding(50, 8, sparse=True)
    head = nn.Linear(8, 2)
    model = nn.Sequential(emb, nn.Flatten(0, -2), head).to(device)
    if optimizer == "sgd":
        opts = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0)]
    else:
        opts = [
            torch.optim.SparseAdam(emb.parameters(), lr=0.01),
            torch.optim.Adam(head.parameters()),
        ]
    torch.manual_seed(1)
    batches = [(torch.randint(0, 50, (6,)), torch.randn(6, 2)) for _ in range(8)]
    losses = []
    for ids, target in batches:
        for o in opts:
            o.zero_grad()
        loss = nn.functional.mse_loss(model(ids.to(device)), target.to(device))
        loss.backward()
        assert emb.weight.grad.is_sparse and emb.weight.grad.device.type == device
        for o in opts:
            o.step()
        losses.append(loss.detach())
    return torch.stack(losses), emb.weight.detach()


@pytest.mark.parametrize("optimizer", ["sgd", "sparse_adam"])
def test_sparse_embedding_training_equals_cpu(optimizer):
    cpu_losses, cpu_weight = sparse_embedding_training("cpu", optimizer)
    dev_losses, dev_weight = sparse_embedding_training(D, optimizer)
    torch.testing.assert_close(dev_losses.cpu(), cpu_losses)
    torch.testing.assert_close(dev_weight.cpu(), cpu_weight)


def test_sparse_autograd_through_sparse_mm():
    def run(device):
        s = coo(device, True).requires_grad_(True)
        d = dense(device, 3, 4).requires_grad_(True)
        torch.sparse.mm(s, d).sum().backward()
        return s.grad, d.grad

    same_on_both(run)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_mm_reduce_backward(reduce):
    # The CPU kernel computes the argmax indices its backward reads only for an
    # input that requires grad: the kernel's twins require grad as the inputs do.
    def run(device):
        a = dense("cpu", 5, 5).relu().to_sparse_csr().to(device).requires_grad_(True)
        w = dense(device, 5, 3).requires_grad_(True)
        torch.sparse.mm(a, w, reduce).sum().backward()
        return a.grad.to_dense(), w.grad

    same_on_both(run)


# --- serialization -------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: coo(D, True),
        lambda: dense(D, 4, 6).relu().to_sparse_csr(),
        lambda: dense(D, 4, 6).relu().to_sparse_bsr((2, 2)),
    ],
    ids=["coo", "csr", "bsr"],
)
def test_sparse_save_load(make):
    t = make()
    buffer = io.BytesIO()
    torch.save({"t": t}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["t"]
    assert_where(loaded)
    assert loaded.layout == t.layout
    torch.testing.assert_close(loaded.cpu().to_dense(), t.cpu().to_dense())
    buffer.seek(0)
    on_cpu = torch.load(buffer, weights_only=True, map_location="cpu")["t"]
    assert on_cpu.device.type == "cpu" and on_cpu.layout == t.layout


def test_nested_save_load():
    nt = nested(D, (2, 4), (3, 4))
    buffer = io.BytesIO()
    torch.save(nt, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded.is_nested and loaded.device.type == D
    torch.testing.assert_close(padded(loaded).cpu(), padded(nt).cpu())


# --- quantized stays refused ----------------------------------------------------


def test_quantized_is_still_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match="openreg does not support quantized"):
            torch.quantize_per_tensor(torch.ones(3, device=D), 0.1, 0, torch.qint8)


def test_whole_file_in_blocking_mode():
    if BLOCKING:
        pytest.skip("this is the blocking run")
    rerun_file_in_blocking_mode(__file__, timeout=300, args=["-k", "not jagged"])
