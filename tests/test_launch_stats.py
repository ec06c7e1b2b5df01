"""torch.openreg._launch_stats: how operators ran (a profiling aid)."""

import os
import subprocess
import sys

import torch

D = "openreg:0"


def test_counts_queued_learned_and_synchronous_calls():
    x = torch.randn(100, device=D)
    y = torch.randn(100, device=D)
    torch.openreg.synchronize()
    torch.openreg._reset_launch_stats()
    z = torch.atan2(x, y)  # first call of this signature: learnt synchronously
    for _ in range(5):
        z = torch.atan2(x, y)  # then queued
    nz = torch.nonzero(z > 0)  # data-dependent result shape: synchronous
    value = z.sum().item()  # a host wait
    s = torch.openreg._launch_stats()
    torch.testing.assert_close(value, torch.atan2(x.cpu(), y.cpu()).sum().item())
    # The same with OPENREG_LAUNCH_BLOCKING=1: blocking launches are learnt
    # and queued alike, and each launch waits.
    assert (
        s["learned_by_op"].get("aten::atan2", 0) + s["learned_by_op"].get("aten::atan2.out", 0) >= 1
    ), s
    assert s["queued"] >= 5, s
    assert s["synchronous"] >= 1 and any("nonzero" in op for op in s["synchronous_by_op"]), s
    assert s["host_waits"] >= 1 and s["launches"] >= s["queued"], s
    torch.testing.assert_close(value, torch.atan2(x.cpu(), y.cpu()).sum().item())
    assert nz.shape[0] == int((torch.atan2(x.cpu(), y.cpu()) > 0).sum())
    torch.openreg._reset_launch_stats()
    s = torch.openreg._launch_stats()
    assert s["queued"] == s["synchronous"] == s["learned"] == s["host_waits"] == 0
    assert s["synchronous_by_op"] == {} and s["learned_by_op"] == {}


def _queued_twice(fn):
    """Runs fn three times (learnt, then queued) and returns the last result
    and the statistics of the queued calls."""
    fn()
    torch.openreg.synchronize()
    torch.openreg._reset_launch_stats()
    fn()
    out = fn()
    torch.openreg.synchronize()
    return out, torch.openreg._launch_stats()


def test_queued_calls_go_to_the_device_as_bytes():
    # Tensors, Python numbers, lists, optional tensor lists, strings, a
    # generator and aliasing views: all in the serialized call, none captured.
    x = torch.randn(6, 5, device=D)
    idx = torch.tensor([4, 0, 2], device=D)
    gen = torch.Generator(device=D)

    def calls():
        a = (x * 2.5 + 1).clamp(-1, 1) * torch.tensor(2.0)
        b = torch.index_put(x, (idx,), torch.ones(5, device=D))
        c = torch.div(x, 3, rounding_mode="floor").sum([0, 1])
        d = x[1:].add(x[:-1])
        e = torch.bernoulli(torch.full((64,), 0.5, device=D), generator=gen.manual_seed(3))
        return a, b, c, d, e

    out, s = _queued_twice(calls)
    xc = x.cpu()
    bc = xc.clone()
    bc[idx.cpu()] = 1
    expected = (
        (xc * 2.5 + 1).clamp(-1, 1) * 2.0,
        bc,
        torch.div(xc, 3, rounding_mode="floor").sum([0, 1]),
        xc[1:] + xc[:-1],
    )
    for got, want in zip(out[:4], expected, strict=True):
        torch.testing.assert_close(got.cpu(), want)
    assert set(out[4].cpu().unique().tolist()) <= {0.0, 1.0}
    assert s["queued"] >= 10 and s["captured"] == 0, s


def test_captured_calls_compute_the_same(tmp_path):
    # OPENREG_SERIALIZED_CALLS=0 captures every queued call as host objects
    # (the path a call the bytes cannot carry takes): same values. A device
    # process cannot run host objects, so the process driver still sends
    # every call as bytes (none captured).
    script = tmp_path / "captured.py"
    script.write_text(
        "import torch, torch_openreg\n"
        "x = torch.arange(12.0, device='openreg').view(3, 4)\n"
        "for _ in range(3):\n"
        "    y = (x * torch.tensor(2.0) + 1).sum(0)\n"
        "torch.openreg.synchronize()\n"
        "s = torch.openreg._launch_stats()\n"
        "print(y.cpu().tolist(), s['queued'], s['captured'])\n"
    )
    env = dict(os.environ, OPENREG_SERIALIZED_CALLS="0")
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    x = torch.arange(12.0).view(3, 4)
    assert out.stdout.split("]")[0] + "]" == str((x * 2 + 1).sum(0).tolist())
    queued, captured = map(int, out.stdout.split("]")[1].split())
    if torch.openreg._named_kernels_only():
        assert queued > 0 and captured == 0, out.stdout
    else:
        assert queued > 0 and captured == queued, out.stdout


def test_results_written_in_place_through_out_variants_of_any_name():
    # A queued functional call writes its results straight into device memory
    # through its out= variant, found by schema whatever its overload name
    # (sum.dim_IntList -> sum.IntList_out, gelu_backward -> .grad_input), and
    # for pointwise operators that are not structured (where) once the
    # signature's first call showed the out= kernel writes the same bytes.
    # Other operators copy their results and are counted: without a CPU out=
    # kernel (native_layer_norm), or not structured (index_select). Values
    # must equal the CPU's bit for bit.
    torch.manual_seed(0)
    xc, gc = torch.randn(16, 8, 33), torch.randn(16, 8, 33)
    idx = torch.tensor([3, 0, 3, 7])
    calls = {
        "aten::sum.dim_IntList": lambda x, g, i: x.sum([0, 2]),
        "aten::gelu_backward": lambda x, g, i: torch.ops.aten.gelu_backward(g, x),
        "aten::silu_backward": lambda x, g, i: torch.ops.aten.silu_backward(g, x),
        "aten::where.self": lambda x, g, i: torch.where(x > g, x, g),
        "aten::index_select": lambda x, g, i: x.index_select(1, i),
        "aten::native_layer_norm": lambda x, g, i: torch.ops.aten.native_layer_norm(
            x, [33], None, None, 1e-5
        )[0],
    }
    x, g, i = xc.to(D), gc.to(D), idx.to(D)
    for op, fn in calls.items():
        for _ in range(2):  # the first call learns the signature
            fn(x, g, i)
        torch.openreg.synchronize()
        torch.openreg._reset_launch_stats()
        got = fn(x, g, i).cpu()
        s = torch.openreg._launch_stats()
        assert torch.equal(got, fn(xc, gc, idx)), op
        assert s["queued"] >= 1, (op, s)
        if op in ("aten::native_layer_norm", "aten::index_select"):
            assert s["copied_by_op"] == {op: 1} and s["copied"] == 1, s
        else:
            assert s["copied"] == 0 and s["copied_by_op"] == {}, (op, s)
