"""Device memory: isolation from the host, out-of-memory errors, accounting, pinned memory."""

import inspect
import json

import pytest
import torch
from conftest import describe, device_pids

D = "openreg"

# ---------------------------------------------------------------------------
# Host code must not touch device memory


@pytest.mark.parametrize("index", [0, 1])
def test_host_access_to_device_memory_kills_process_with_diagnostic(py, index):
    proc = py(
        f"""
        import ctypes, torch
        x = torch.ones(4, device="openreg:{index}")
        print("allocated", flush=True)
        ctypes.c_float.from_address(x.data_ptr()).value
        print("survived", flush=True)
        """,
        timeout=60,
    )
    assert proc.returncode != 0, describe(proc)
    assert proc.returncode < 0 or proc.returncode >= 128, describe(proc)  # killed by a signal
    assert "allocated" in proc.stdout and "survived" not in proc.stdout, describe(proc)
    assert "host code accessed device memory" in proc.stderr, describe(proc)
    assert f"device {index}" in proc.stderr, describe(proc)
    assert "tensor.cpu()" in proc.stderr  # the hint how to do it right


def test_device_pointer_is_not_host_memory():
    x = torch.ones(4, device=D)
    assert x.data_ptr() != 0
    # The PyTorch layer knows the pointer is device memory.
    assert not x.is_pinned()
    assert x.untyped_storage().device == torch.device("openreg:0")


@pytest.mark.parametrize(
    "convert",
    [lambda x: x.numpy(), lambda x: __import__("numpy").asarray(x)],
    ids=["numpy", "np.asarray"],
)
def test_numpy_of_device_tensor_raises(convert):
    x = torch.ones(4, device=D)
    with pytest.raises((TypeError, RuntimeError), match=r"cpu\(\)|openreg"):
        convert(x)
    # The safe way works.
    assert x.cpu().numpy().tolist() == [1.0] * 4


# ---------------------------------------------------------------------------
# Out of memory


def test_out_of_memory(py):
    proc = py(
        """
        import torch
        props = torch.openreg.get_device_properties(0)
        print("total", props.total_memory)
        try:
            torch.empty(100 * 2**20, dtype=torch.uint8, device="openreg")
        except torch.OutOfMemoryError as e:
            print("oom1", str(e).replace("\\n", " "))
        else:
            print("oom1 none")
        # After the error, smaller allocations work.
        small = torch.ones(1000, device="openreg")
        print("small", small.sum().item())
        a = torch.empty(40 * 2**20, dtype=torch.uint8, device="openreg")
        try:
            b = torch.empty(40 * 2**20, dtype=torch.uint8, device="openreg")
        except torch.OutOfMemoryError as e:
            print("oom2", isinstance(e, RuntimeError))
        else:
            print("oom2 none")
        # Freeing and retrying succeeds.
        del a
        b = torch.empty(40 * 2**20, dtype=torch.uint8, device="openreg")
        b.fill_(3)
        print("retry", b[-1].item(), b.numel())
        # Each device has its own memory.
        c = torch.empty(40 * 2**20, dtype=torch.uint8, device="openreg:1")
        print("device1", c.device)
        print("num_ooms", torch.accelerator.memory_stats(0)["num_ooms"])
        """,
        OPENREG_DEVICE_MEMORY="64M",
    )
    assert proc.returncode == 0, describe(proc)
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert out["total"] == str(64 * 2**20)
    msg = out["oom1"]
    assert msg != "none", describe(proc)
    assert "100.00 MiB" in msg, msg  # the requested size
    assert "64.00 MiB" in msg, msg  # the capacity
    assert "Device 0" in msg or "device 0" in msg, msg
    assert out["small"] == "1000.0"
    assert out["oom2"] == "True"
    assert out["retry"] == f"3 {40 * 2**20}"
    assert out["device1"] == "openreg:1"
    assert out["num_ooms"] == "2"


# The first call of a signature runs the CPU kernel synchronously; what it
# allocates is device memory, so a result the device cannot hold is refused
# before anything computes it (issue 27): with the thread driver when the
# kernel allocates it, with the process driver before the launch, from the
# Meta kernel's sizes. The peak resident memory of the process that computes
# tells: a result computed first in host memory would add its size.
FIRST_CALL_OOM = (
    "import os, resource, sys, torch\n"
    + inspect.getsource(device_pids)
    + """
def peak_mb():
    # This process, or with the process driver device 0's own process.
    if not torch.openreg._named_kernels_only():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    with open(f"/proc/{device_pids()[0]}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) // 1024
n = int(sys.argv[1])
a = torch.randn(n, device="openreg")
i = torch.arange(n, device="openreg")
before = peak_mb()
held = torch.openreg.memory_allocated()
for name, fn in [
    ("outer", lambda: torch.outer(a, a)),
    ("broadcast add", lambda: a[:, None] + a[None, :]),
    ("broadcast or", lambda: i[:, None] | i[None, :]),
]:
    try:
        fn()
        print(name, "no error")
    except torch.OutOfMemoryError as e:
        print(name, "oom", "Tried to allocate" in str(e))
print("growth", peak_mb() - before)
print("allocated", torch.openreg.memory_allocated() == held)
b = torch.randn(1000, device="openreg")  # the device still computes
print("after", torch.allclose(torch.outer(b, b).cpu(), torch.outer(b.cpu(), b.cpu())))
"""
)


@pytest.mark.parametrize(
    "memory,n", [("256M", 12_000), (None, 40_000)], ids=["256M device", "default device"]
)
def test_first_call_out_of_memory_before_host_work(py, memory, n):
    env = {"OPENREG_DEVICE_MEMORY": memory} if memory else {}
    proc = py(FIRST_CALL_OOM, args=[n], **env)
    assert proc.returncode == 0, describe(proc)
    out = dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines())
    for name in ("outer oom", "broadcast add oom", "broadcast or oom"):
        assert out[name] == "True", describe(proc)
    # The results are 550 MB (n = 12,000) and 6.4 GB (n = 40,000) of floats.
    assert int(out["growth"]) < 100, describe(proc)
    assert out["allocated"] == "True" and out["after"] == "True", describe(proc)


# An operator the device lacks (a CPU kernel written in Python) runs staged
# with the process driver: the host computes, then copies the results to the
# device. Its result's device memory is reserved from its Meta kernel first,
# so a result the device cannot hold raises before the host computes it (the
# thread driver's kernel allocates device memory: the same error, as early).
STAGED_OOM = """
import json, resource, torch
lib = torch.library.Library("stagedoom", "DEF")
lib.define("outer(Tensor a, Tensor b) -> Tensor")
lib.impl("outer", lambda a, b: torch.outer(a, b), "CPU")
lib.impl("outer", lambda a, b: a.new_empty(a.shape[0], b.shape[0]), "Meta")
outer = torch.ops.stagedoom.outer
b = torch.randn(300)
ok = torch.equal(outer(b.to("openreg"), b.to("openreg")).cpu(), torch.outer(b, b))
a = torch.randn(12_000, device="openreg")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
try:
    outer(a, a)
    error = None
except torch.OutOfMemoryError as e:
    error = str(e)
growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before
ok = ok and torch.equal(outer(b.to("openreg"), b.to("openreg")).cpu(), torch.outer(b, b))
stats = torch.openreg._launch_stats()
print(json.dumps({"error": error, "growth": growth, "ok": ok,
                  "staged": stats["staged_by_op"].get("stagedoom::outer", 0)}))
"""


@pytest.mark.parametrize("driver", ["thread", "process"])
def test_staged_call_out_of_memory_before_host_work(py, driver):
    proc = py(STAGED_OOM, OPENREG_DRIVER=driver, OPENREG_DEVICE_MEMORY="256M")
    assert proc.returncode == 0, describe(proc)
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["error"] is not None and "Tried to allocate" in out["error"], out
    assert out["growth"] < 100, out  # the result is 550 MB of floats
    assert out["ok"], out
    if driver == "process":
        assert out["staged"] == 3, out  # the device lacks the operator


def test_first_call_result_is_computed_in_device_memory(py):
    # A 36 MB result of a first call: equal to the CPU's, in device memory
    # without a second copy of it on the device.
    proc = py(
        """
        import torch
        a = torch.randn(3000)
        d = a.to("openreg")
        torch.openreg.reset_peak_memory_stats()
        base = torch.openreg.memory_allocated()
        r = torch.outer(d, d)
        peak = torch.openreg.max_memory_allocated() - base
        print(torch.equal(r.cpu(), torch.outer(a, a)), peak <= r.nbytes + 2**20)
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["True", "True"], describe(proc)


def test_bad_device_memory_environment(py):
    proc = py(
        """
        import torch
        try:
            torch.ones(1, device="openreg")
        except RuntimeError as e:
            print("error", e)
        """,
        OPENREG_DEVICE_MEMORY="lots",
    )
    assert proc.returncode == 0, describe(proc)
    assert "OPENREG_DEVICE_MEMORY" in proc.stdout, describe(proc)
    assert "OPENREG_DEVICE_MEMORY='lots'" in proc.stderr, describe(proc)


# ---------------------------------------------------------------------------
# Allocation accounting


def test_memory_allocated_tracks_live_tensors():
    torch.accelerator.synchronize()
    before = torch.accelerator.memory_allocated(0)
    before1 = torch.accelerator.memory_allocated(1)
    x = torch.empty(1000, device="openreg:0")
    grown = torch.accelerator.memory_allocated(0) - before
    assert 4000 <= grown < 8192
    assert torch.accelerator.memory_allocated(1) == before1  # other device untouched
    assert torch.accelerator.max_memory_allocated(0) >= before + grown
    del x
    assert torch.accelerator.memory_allocated(0) == before
    free, total = torch.accelerator.get_memory_info(0)
    assert total == 4 * 2**30 and 0 < free <= total


# ---------------------------------------------------------------------------
# Pinned host memory


def test_pin_memory():
    x = torch.randn(100)
    assert x.is_pinned() is False
    p = x.pin_memory()
    assert p.is_pinned() is True
    assert p.device.type == "cpu"
    assert p.data_ptr() != x.data_ptr() and torch.equal(p, x)
    assert p.pin_memory().is_pinned()
    assert torch.empty(10, pin_memory=True).is_pinned()
    assert not torch.empty(10).is_pinned()
    assert not torch.ones(3, device=D).is_pinned()


def test_pinned_copies_roundtrip():
    src = torch.randn(64, 33).pin_memory()
    dev = src.to(D, non_blocking=True)
    dev1 = src.to("openreg:1", non_blocking=True)
    back = torch.empty(64, 33, pin_memory=True)
    back.copy_(dev, non_blocking=True)
    back1 = torch.empty(64, 33).pin_memory()
    back1.copy_(dev1, non_blocking=True)
    torch.accelerator.synchronize(0)
    torch.accelerator.synchronize(1)
    assert torch.equal(back, src) and torch.equal(back1, src)
    # Pinned memory is ordinary host memory: CPU ops work on it.
    assert torch.equal(back * 2, src * 2)


def test_pin_memory_of_device_tensor_raises():
    with pytest.raises(RuntimeError, match="pinned|pin"):
        torch.ones(2, device=D).pin_memory()
    with pytest.raises(RuntimeError, match="pinned"):
        torch.empty(2, device=D, pin_memory=True)


def test_dataloader_pin_memory():
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    sums = []
    for x, y in DataLoader(ds, batch_size=4, pin_memory=True):
        assert x.is_pinned() and y.is_pinned()
        sums.append(x.to(D, non_blocking=True).sum().item())
    assert sums == [28.0, 92.0, 70.0]
