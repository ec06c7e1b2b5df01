"""The PyTorch layer on the process driver (OPENREG_DRIVER=process, issue 29).

Each device then runs in a process of its own: queued fallback calls cross
to it as serialized boxed calls, synchronous ones (first runs) as described
calls whose answer tells the host their results, and a device whose process
dies is lost without taking the program with it. Every test runs a fresh
interpreter with that driver (the suite itself runs with the default one,
the process driver since issue 62, and a slice of it with the thread driver)
and compares values with the CPU. What the driver does not run yet raises NotImplementedError
(docs/process-driver.md, "Where it stands").
"""

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import clean_env, describe, device_pids

# The tests here choose their mode: they check what is queued, and where
# errors surface, so they never take the suite's blocking launches.
PROCESS = {
    "OPENREG_DRIVER": "process",
    "OPENREG_FALLBACK_WARNINGS": "0",
    "OPENREG_LAUNCH_BLOCKING": None,
}

# The source of conftest.device_pids, for the scripts these tests run.
DEVICE_PIDS = "\nimport os\n" + inspect.getsource(device_pids) + "\n"

# For the scripts that kill a device while it computes: kill_when_computing
# waits until the device process has used ``cpu_s`` seconds of CPU since the
# call, then sends SIGKILL. A wall-clock delay is not enough: on a loaded
# machine, or with a cold page cache, the host may not have sent the work yet
# when any fixed delay ends (or the device may have finished it). The caller
# first lets the device go idle (its OpenMP team spins for a while after
# the last command), so the CPU counted is the work's.
KILL_WHEN_COMPUTING = """
import os, signal, threading, time
def _device_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
def kill_when_computing(pid, cpu_s=0.3):
    start = _device_cpu_s(pid)
    def kill():
        deadline = time.monotonic() + 60
        while _device_cpu_s(pid) < start + cpu_s and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
    threading.Thread(target=kill, daemon=True).start()
"""


def gone(pid, within_s=5.0, zombie_ok=False):
    """True once ``pid`` no longer exists (reaped), within ``within_s``.

    ``zombie_ok``: a dead process not yet reaped counts too. The devices of
    a program that exits are reaped by the runtime; those of a program
    killed with SIGKILL die with it (PR_SET_PDEATHSIG) as orphans, which
    only init can reap, and a container's init may not.
    """
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if zombie_ok and state == "Z":
            return True
        time.sleep(0.05)
    return False


def last_json(proc):
    assert proc.returncode == 0, describe(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_values_match_the_cpu(py):
    out = last_json(
        py(
            """
            import json, torch, torch_openreg
            torch.manual_seed(0)
            d = "openreg"
            a, b, m = torch.randn(6, 5), torch.randn(6, 5), torch.randn(5, 3)
            x, y, w = a.to(d), b.to(d), m.to(d)
            checks = {}
            def check(name, dev, cpu, exact=False):
                dev = dev.cpu()
                ok = dev.shape == cpu.shape and dev.dtype == cpu.dtype and (
                    torch.equal(dev, cpu) if exact else torch.allclose(dev, cpu, atol=1e-5))
                checks[name] = bool(ok)
            for i in range(3):  # the first call runs synchronously, later ones are queued
                check(f"add{i}", x + y * 2, a + b * 2)
                check(f"mm{i}", x @ w, a @ m)
                check(f"softmax{i}", torch.softmax(x, 1), torch.softmax(a, 1))
                check(f"sum{i}", x.sum(0), a.sum(0))
            xi, ai = x.clone(), a.clone()
            for i in range(3):
                xi.mul_(1.5); ai.mul_(1.5)
                xi[1:4, ::2].add_(1); ai[1:4, ::2].add_(1)
            check("in_place_views", xi, ai, exact=True)
            o, oc = torch.empty(0, device=d), torch.empty(0)
            for i in range(2):
                torch.add(x, y, out=o); torch.add(a, b, out=oc)
            check("out_resized", o, oc, exact=True)
            check("nonzero", (x > 0).nonzero(), (a > 0).nonzero(), exact=True)
            check("masked_select", x[x > 0], a[a > 0], exact=True)
            check("transpose_copy", x.t().contiguous(), a.t().contiguous(), exact=True)
            e = torch.empty(5, 6, dtype=torch.float64, device=d)
            e.copy_(x.t())
            check("converting_copy", e, a.t().double(), exact=True)
            check("cross_device", x.to("openreg:1").mul(2), a * 2, exact=True)
            check("view_result", x.view(30)[3:9], a.view(30)[3:9], exact=True)
            check("item", torch.tensor([x.sum().item()]), torch.tensor([a.sum().item()]))
            g = torch.tensor([[0, 1], [4, 2]])
            for i in range(2):
                check(f"gather{i}", torch.gather(x, 1, g.to(d)), torch.gather(a, 1, g), exact=True)
            bn, bnd = torch.nn.BatchNorm1d(5), torch.nn.BatchNorm1d(5).to(d)
            for i in range(2):  # the running statistics are written without annotation
                bn(a); bnd(x)
                check(f"running_mean{i}", bnd.running_mean, bn.running_mean)
            stats = torch.openreg._launch_stats()
            checks["queued"] = stats["queued"] > 0 and stats["captured"] == 0
            checks["named_only"] = torch.openreg._named_kernels_only()
            print(json.dumps(checks))
            """,
            **PROCESS,
        )
    )
    assert out and all(out.values()), out


def test_a_kernel_error_is_raised_at_the_next_synchronization_naming_the_op(py):
    out = last_json(
        py(
            """
            import json, torch, torch_openreg
            a = torch.randn(4, 5)
            x = a.to("openreg")
            good, bad = torch.tensor([[0, 1]]), torch.tensor([[0, 30]])
            torch.gather(x, 1, good.to("openreg"))  # learns the signature
            torch.openreg.synchronize()
            torch.gather(x, 1, bad.to("openreg"))  # queued: fails on the device
            try:
                torch.openreg.synchronize()
                error = None
            except torch.AcceleratorError as e:
                error = str(e)
            after = torch.equal((x + 1).cpu(), a + 1)
            print(json.dumps({"error": error, "after": after}))
            """,
            **PROCESS,
        )
    )
    assert "openreg kernel 'aten::gather" in out["error"], out
    assert "index 30 is out of bounds" in out["error"], out
    assert out["after"], out


@pytest.mark.parametrize("how", ["kill", "segfault", "abort"])
def test_a_dead_device_process_loses_its_device_and_not_the_program(py, how):
    proc = py(
        DEVICE_PIDS
        + f"""
import json, signal, sys, time, torch, torch_openreg
how = {how!r}
a = torch.randn(16, 16)
x0, x1 = a.to("openreg:0"), a.to("openreg:1")
(x1 + 1).cpu()
pids = device_pids()
if how == "kill":
    os.kill(pids[1], signal.SIGKILL)
else:
    torch.openreg.faults.crash_device(1, how)
errors = []
for call in (lambda: (x1 * 2).cpu(), lambda: torch.openreg.synchronize(1),
             lambda: torch.ones(3, device="openreg:1")):
    try:
        call()
        errors.append(None)
    except torch.AcceleratorError as e:
        errors.append(str(e))
ok0 = torch.allclose((x0 @ x0).cpu(), a @ a, atol=1e-4)
print(json.dumps({{"pids": pids, "errors": errors, "ok0": ok0}}))
sys.stdout.flush()
""",
        **PROCESS,
    )
    out = last_json(proc)  # exit code 0: the program went on and ended cleanly
    signal_name = {"kill": "SIGKILL", "segfault": "SIGSEGV", "abort": "SIGABRT"}[how]
    for error in out["errors"]:
        assert error is not None and "openreg:1" in error and signal_name in error, out
    if how != "kill":
        assert "openreg_fault_crash" in out["errors"][0], out
    assert out["ok0"], out
    for pid in out["pids"].values():
        assert gone(pid), f"device process {pid} outlived its program"


def test_a_device_lost_during_an_operator_names_the_operator(py):
    # Thirty queued 1536x1536 matrix products keep device 1 busy for seconds:
    # killed once it has computed for 0.3 s of CPU, it is running one of them.
    proc = py(
        DEVICE_PIDS
        + KILL_WHEN_COMPUTING
        + """
import json, signal, sys, time, torch, torch_openreg
a = torch.randn(1536, 1536, device="openreg:1")
b = a @ a
b = b @ a  # the loop's signature (two distinct tensors): its first call
torch.openreg.synchronize(1)  # is described, and runs at once
time.sleep(0.5)  # the device idle: its OpenMP team no longer spins
kill_when_computing(device_pids()[1])
for _ in range(30):
    b = b @ a
try:
    torch.openreg.synchronize(1)
    error = None
except torch.AcceleratorError as e:
    error = str(e)
print(json.dumps({"error": error}))
sys.stdout.flush()
""",
        **PROCESS,
    )
    error = last_json(proc)["error"]
    assert error is not None and "SIGKILL" in error, error
    assert "while running kernel 'openreg_boxed_call' (aten::mm.out)" in error, error


@pytest.mark.parametrize("driver", ["thread", "process"])
def test_first_runs_run_on_the_device_and_are_described(py, driver):
    """The first run of a signature, and data-dependent operators, run on
    the device (in the device's process with the process driver): the host
    learns the results' metadata, warnings and errors from the device's
    answer (docs/process-driver.md, "described calls"), with either driver;
    nothing is staged through host memory."""
    out = last_json(
        py(
            """
            import json, warnings, torch, torch_openreg
            torch.manual_seed(0)
            d = "openreg"
            a = torch.randn(6, 5)
            x = a.to(d)
            checks = {}
            def check(name, dev, cpu):
                dev = dev.cpu()
                checks[name] = bool(dev.shape == cpu.shape and dev.dtype == cpu.dtype
                                    and dev.stride() == cpu.stride() and torch.equal(dev, cpu))
            torch.openreg._reset_launch_stats()
            check("functional", x * 3 - 1, a * 3 - 1)
            check("reduction", x.sum(1), a.sum(1))
            check("data_dependent", (x > 0).nonzero(), (a > 0).nonzero())
            check("view_of_input", x.t().unsqueeze(0).squeeze(0), a.t())
            check("list_result", torch.stack(x.split(2)), torch.stack(a.split(2)))
            vals, idx = x.topk(2)
            cvals, cidx = a.topk(2)
            check("tuple_values", vals, cvals)
            check("tuple_indices", idx, cidx)
            # two new results of one size: each gets a block of its own
            (lo, hi), (clo, chi) = torch.aminmax(x, dim=0), torch.aminmax(a, dim=0)
            check("same_size_results", torch.stack([lo, hi]), torch.stack([clo, chi]))
            xi, ai = x.clone(), a.clone()
            xi.add_(2); ai.add_(2)
            check("in_place", xi, ai)
            # an out= argument the kernel grows: its storage moves to a new block
            o, oc = torch.empty(2, device=d), torch.empty(2)
            with warnings.catch_warnings(record=True) as w_dev:
                warnings.simplefilter("always")
                torch.exp(x, out=o)
            with warnings.catch_warnings(record=True) as w_cpu:
                warnings.simplefilter("always")
                torch.exp(a, out=oc)
            check("out_grown", o, oc)
            checks["warning_as_cpu"] = [str(w.message) for w in w_dev] == [
                str(w.message) for w in w_cpu] and len(w_cpu) == 1
            checks["scalar"] = x.sum().item() == a.sum().item()
            checks["bool_result"] = torch.equal(x, x.clone()) is True
            try:
                x[torch.tensor([9])]
                checks["index_error"] = False
            except IndexError as e:
                checks["index_error"] = "out of bounds" in str(e)
            try:
                torch.linalg.cholesky(-torch.eye(3, device=d))
                checks["linalg_error"] = False
            except torch.linalg.LinAlgError as e:
                checks["linalg_error"] = "not positive-definite" in str(e)
            stats = torch.openreg._launch_stats()
            checks["described"] = stats["described"] >= 12
            checks["not_staged"] = stats["staged"] == 0
            # later calls of the same signatures are queued
            torch.openreg._reset_launch_stats()
            check("queued", x * 3 - 1, a * 3 - 1)
            stats = torch.openreg._launch_stats()
            checks["then_queued"] = stats["queued"] >= 2 and stats["described"] == 0
            print(json.dumps(checks))
            """,
            **dict(PROCESS, OPENREG_DRIVER=driver),
        )
    )
    assert out and all(out.values()), out


@pytest.mark.parametrize("driver", ["thread", "process"])
def test_a_first_run_out_of_memory_is_raised_before_its_results_exist(py, driver):
    out = last_json(
        py(
            """
            import json, torch, torch_openreg
            d = "openreg"
            x = torch.ones(6 * 2**20, device=d)  # 24 MiB of the device's 64
            torch.openreg.synchronize()
            before = torch.openreg.memory_allocated(0)
            try:
                torch.cat([x, x, x])  # a first run: 72 MiB more does not fit
                error = None
            except torch.OutOfMemoryError as e:
                error = str(e)
            after = torch.openreg.memory_allocated(0)
            ok = torch.equal((x[:4] + 1).cpu(), torch.full((4,), 2.0))
            print(json.dumps({"error": error, "same": before == after, "ok": ok}))
            """,
            OPENREG_DEVICE_MEMORY="64M",
            **dict(PROCESS, OPENREG_DRIVER=driver),
        )
    )
    assert out["error"] is not None and "out of memory" in out["error"].lower(), out
    assert out["same"] and out["ok"], out


def test_a_device_lost_during_a_first_run_names_the_operator(py):
    # A 4096x4096 matrix product takes about 1.6 s of CPU: its first run is
    # on the device, so killing the device while it computes loses the
    # device, and the host, which computes nothing, raises.
    proc = py(
        DEVICE_PIDS
        + KILL_WHEN_COMPUTING
        + """
import json, signal, sys, time, torch, torch_openreg
a = torch.ones(4096, 4096, device="openreg:1")
torch.openreg.synchronize(1)
time.sleep(0.5)  # the device idle: its OpenMP team no longer spins
kill_when_computing(device_pids()[1])
try:
    (a @ a).cpu()
    error = None
except torch.AcceleratorError as e:
    error = str(e)
ok0 = torch.equal((torch.ones(3, device="openreg:0") * 2).cpu(), torch.full((3,), 2.0))
print(json.dumps({"error": error, "ok0": ok0}))
sys.stdout.flush()
""",
        **PROCESS,
    )
    out = last_json(proc)
    assert out["error"] is not None and "SIGKILL" in out["error"], out
    assert "while running kernel 'openreg_describe_call' (aten::mm)" in out["error"], out
    assert out["ok0"], out


def test_an_operator_the_device_lacks_runs_staged_on_the_host(py):
    """A CPU kernel written in Python exists in the user's process only: the
    device answers that it lacks the operator, and its calls run staged on
    the host, every time (never queued to the device)."""
    out = last_json(
        py(
            """
            import json, torch, torch_openreg
            lib = torch.library.Library("describedtest", "DEF")
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x * 2, "CPU")
            a = torch.randn(5)
            x = a.to("openreg")
            torch.openreg._reset_launch_stats()
            ok = [torch.equal(torch.ops.describedtest.twice(x).cpu(), a * 2) for _ in range(3)]
            torch.openreg.synchronize()
            stats = torch.openreg._launch_stats()
            print(json.dumps({"ok": ok, "staged": stats["staged_by_op"],
                              "queued": stats["queued"]}))
            """,
            **PROCESS,
        )
    )
    assert out["ok"] == [True, True, True], out
    assert out["staged"].get("describedtest::twice") == 3, out


def test_the_program_killed_leaves_no_device_process(tmp_path):
    script = DEVICE_PIDS + textwrap.dedent(
        """
        import json, sys, time, torch, torch_openreg
        (torch.ones(4, device="openreg:0") + 1).cpu()
        (torch.ones(4, device="openreg:1") + 1).cpu()
        print(json.dumps(device_pids()), flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=clean_env(**PROCESS),
    )
    try:
        pids = json.loads(child.stdout.readline())
        assert len(pids) == 2, pids
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.communicate(timeout=30)
    for pid in pids.values():
        assert gone(int(pid), zombie_ok=True), f"device process {pid} outlived its killed program"


def test_openreg_kernels_match_the_cpu(py):
    """openreg's own kernels on a device process: dropout is a kernel of the
    kernel library, and so is the example custom operator's kernel
    (openreg_scaled_abs); attention, convolution and same-device copies are
    the CPU's operators run from bytes (serialized boxed calls); all queued,
    never staged on the host. All with the CPU's values, gradients included
    (in deterministic mode, so that the reductions of the backward passes keep
    the CPU's thread count: doc:fewer-threads in aten/fallback/OpenRegOpTraits.cpp)."""
    out = last_json(
        py(
            """
            import json, torch, torch_openreg
            import torch.nn.functional as F
            torch.manual_seed(0)
            torch.use_deterministic_algorithms(True)
            d = "openreg"
            checks = {}
            def close(a, b):
                return torch.allclose(a.cpu(), b, atol=1e-5)
            def forward_backward(fn, *cpu):
                dev = [t.detach().to(d).requires_grad_() for t in cpu]
                for args in (cpu, dev):
                    fn(*args).square().sum().backward()
                return close(fn(*dev).detach(), fn(*cpu).detach()) and all(
                    close(a.grad, b.grad) for a, b in zip(dev, cpu))
            q, k, v = (torch.randn(2, 3, 8, 4, requires_grad=True) for _ in range(3))
            checks["attention"] = forward_backward(
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
            img, w, b = (torch.randn(*s, requires_grad=True)
                         for s in ((2, 3, 9, 9), (4, 3, 3, 3), (4,)))
            checks["convolution"] = forward_backward(
                lambda img, w, b: F.conv2d(img, w, b, stride=2, padding=1), img, w, b)
            u = torch.randn(5, 7, requires_grad=True)
            checks["custom op"] = forward_backward(
                lambda u: torch.ops.openreg.scaled_abs(u, 2.5), u)
            x = torch.randn(64, 32)
            y, mask = torch.ops.aten.native_dropout(x.to(d), 0.5, True)
            mask = mask.cpu()
            kept = int(mask.sum())
            checks["dropout"] = torch.equal(y.cpu(), x * mask * 2.0) and 0 < kept < 64 * 32
            xs = x.to(d)
            xs[::2].copy_(xs[1::2])  # a same-device copy
            xc = x.clone(); xc[::2].copy_(xc[1::2])
            checks["copy"] = torch.equal(xs.cpu(), xc)
            # A transposing, converting copy between two storages: queued as
            # a named kernel (a serialized aten::copy_), not staged.
            staged_before = torch.openreg._launch_stats()["staged"]
            yt = torch.empty(32, 64, dtype=torch.float64, device=d)
            yt.copy_(xs.t())
            checks["copy queued"] = torch.openreg._launch_stats()["staged"] == staged_before
            checks["converting copy"] = torch.equal(yt.cpu(), xc.t().double())
            stats = torch.openreg._launch_stats()
            staged = stats["staged_by_op"]
            ours = ("dropout", "attention", "convolution", "copy", "scaled_abs")
            checks["nothing staged"] = not [
                op for op in staged if any(k in op for k in ours)]
            checks["staged"] = sorted(staged)
            print(json.dumps(checks))
            """,
            **PROCESS,
        )
    )
    staged = out.pop("staged")
    assert out and all(out.values()), (out, staged)


DROPOUT_BITS = """
import hashlib, json, torch, torch_openreg
def digest(t):
    return hashlib.sha256(str(t.detach().float().cpu().tolist()).encode()).hexdigest()
torch.openreg.manual_seed(7)
out = {}
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(300, 257, generator=torch.Generator().manual_seed(1)).to(dtype)
    x = x.to("openreg").requires_grad_()
    for step in range(3):
        y = torch.nn.functional.dropout(x, 0.3)
        y.backward(torch.full_like(y, 0.5))
        out[f"{dtype} y{step}"] = digest(y)
    out[f"{dtype} grad"] = digest(x.grad)
    out[f"{dtype} kept"] = (y != 0).float().mean().item()
out["staged"] = sorted(torch.openreg._launch_stats()["staged_by_op"])
print(json.dumps(out))
"""


def test_dropout_is_a_named_kernel_with_the_thread_drivers_bits(py):
    # The same device-side function (engine/kernels/OpenRegDropout.cpp) from a host
    # closure and from the kernel library: the same draws, the same bits.
    thread = last_json(py(DROPOUT_BITS, OPENREG_FALLBACK_WARNINGS="0"))
    process = last_json(py(DROPOUT_BITS, **PROCESS))
    staged = process.pop("staged")
    assert not [op for op in staged if "dropout" in op], staged
    thread.pop("staged")
    assert process == thread
    assert 0.65 < process["torch.float32 kept"] < 0.75, process


COMPILED_STEP = """
import copy, json, torch, torch_openreg
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
x, y = torch.randn(8, 16), torch.randn(8, 4)

def step(m, x, y):
    loss = torch.nn.functional.mse_loss(m(x).sin() * 2 + 1, y)
    loss.backward()
    return loss

ref = step(model, x, y).detach()
ref_grads = [p.grad.clone() for p in model.parameters()]
dev = copy.deepcopy(model).to("openreg")
dev.zero_grad(set_to_none=True)
loss = torch.compile(step)(dev, x.to("openreg"), y.to("openreg"))
out = {
    "loss": torch.allclose(loss.cpu(), ref, atol=1e-5),
    "grads": all(torch.allclose(p.grad.cpu(), g, atol=1e-5)
                 for p, g in zip(dev.parameters(), ref_grads)),
    "staged": sorted(torch.openreg._launch_stats()["staged_by_op"]),
}
# The device process loaded Inductor's libraries itself.
maps = open(f"/proc/{device_pids()[0]}/maps").read()
out["libraries in the device"] = sorted(
    {line.split()[-1].rsplit("/", 1)[-1] for line in maps.splitlines()
     if "inductor" in line and line.endswith(".so")})
print(json.dumps(out))
"""


def test_compiled_kernels_run_in_the_device_process(py, tmp_path):
    out = last_json(
        py(
            DEVICE_PIDS + COMPILED_STEP,
            timeout=300,
            TORCHINDUCTOR_CACHE_DIR=tmp_path / "inductor",
            **PROCESS,
        )
    )
    assert out["loss"] and out["grads"], out
    assert out["libraries in the device"], out
    assert not [op for op in out["staged"] if op.startswith("cpp_")], out


def test_a_compiled_kernel_that_faults_loses_the_device_only(py, tmp_path):
    # A bad Inductor kernel (here one writing through a null pointer) kills
    # its device process: the program gets an AcceleratorError naming the
    # kernel, and the other device still computes.
    out = last_json(
        py(
            """
            import json, torch, torch_openreg
            from torch._inductor.async_compile import AsyncCompile
            from torch_openreg.compile import inductor, kernels
            source = 'extern "C" void kernel(float* out) { *(volatile int*)0 = out != 0; }'
            source += inductor.launch_entry(["float*"])
            k = kernels.compile_kernel(AsyncCompile(), "bad_kernel", "p", source)
            k = k.result() if hasattr(k, "result") else k
            k(torch.zeros(4, device="openreg:1"))
            try:
                torch.openreg.synchronize(1)
                error = None
            except torch.AcceleratorError as e:
                error = str(e)
            other = (torch.arange(4.0, device="openreg:0") * 2).cpu().tolist()
            print(json.dumps({"error": error, "other": other}))
            """,
            timeout=300,
            TORCHINDUCTOR_CACHE_DIR=tmp_path / "inductor",
            **PROCESS,
        )
    )
    error = out["error"]
    assert error is not None and "SIGSEGV" in error, out
    assert "openreg_compiled_kernel' (bad_kernel)" in error, error
    assert out["other"] == [0.0, 2.0, 4.0, 6.0], out


@pytest.mark.parametrize("setting", [None, "", "process", "thread"])
def test_the_default_driver_is_the_process_driver(py, setting):
    # Unset or empty: each device a process of its own (issue 62), as with
    # OPENREG_DRIVER=process; =thread: no device process at all.
    out = py(
        DEVICE_PIDS
        + """
import torch
x = torch.arange(6.0, device="openreg:1") * 2
print(torch.openreg._named_kernels_only(), sorted(device_pids()), x.cpu().tolist())
""",
        OPENREG_DRIVER=setting,
    )
    assert out.returncode == 0, describe(out)
    processes = setting != "thread"
    expected = f"{processes} {[0, 1] if processes else []} [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]"
    assert out.stdout.strip() == expected, describe(out)


def test_crash_device_refuses_the_thread_driver():
    import torch

    if torch.openreg._named_kernels_only():
        pytest.skip("the suite itself runs with OPENREG_DRIVER=process")
    with pytest.raises(RuntimeError, match="OPENREG_DRIVER=process"):
        torch.openreg.faults.crash_device(0)


# TORCH_WARN_ONCE in a CPU kernel: once per program on the CPU. On openreg a
# signature's first call is run synchronously and its warnings raised at the
# call, later calls are queued. With the thread driver that first call runs
# in the user's process, which shares the CPU's once-flags; with the process
# driver it runs in the device's process, with once-flags of its own: it
# warns once per device process, whichever ran first (docs/process-driver.md,
# "Warnings").
WARN_ONCE = """
import json, warnings, torch, torch_openreg
def caught(device):
    b = torch.arange(20.0, device=device)[::2]  # non-contiguous: warns once
    v = torch.tensor([3.5, 7.0, 12.5], device=device)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.searchsorted(b, v).cpu().tolist()
        torch.openreg.synchronize()
    assert out == [2, 4, 7], out
    return [str(m.message) for m in w if "searchsorted" in str(m.message)]
order = ORDER
print(json.dumps({d: [caught(d) for _ in range(3)] for d in order}))
"""


@pytest.mark.parametrize("driver", ["thread", "process"])
@pytest.mark.parametrize("first", ["openreg", "cpu"])
def test_a_once_warning_of_a_cpu_kernel_is_raised_once(py, driver, first):
    other = "cpu" if first == "openreg" else "openreg"
    env = dict(PROCESS, OPENREG_DRIVER=driver)
    out = last_json(py(WARN_ONCE.replace("ORDER", repr([first, other])), **env))
    counts = {d: [len(w) for w in calls] for d, calls in out.items()}
    if driver == "thread":
        assert counts == {first: [1, 0, 0], other: [0, 0, 0]}, out
    else:
        assert counts == {first: [1, 0, 0], other: [1, 0, 0]}, out
        assert "non-contiguous" in out[other][0][0], out
    assert "non-contiguous" in out[first][0][0], out


@pytest.mark.parametrize("driver", ["thread", "process"])
def test_a_device_warning_is_raised_at_the_next_synchronization(py, driver):
    out = last_json(
        py(
            """
            import json, warnings, torch, torch_openreg
            from torch.openreg.faults import warn_on_device
            def caught(f):
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    f()
                return [(m.category.__name__, str(m.message)) for m in w]
            x = torch.ones(4, device="openreg:1")
            out = {"launch": caught(lambda: warn_on_device("hot spot", 1))}
            out["other_device"] = caught(lambda: torch.openreg.synchronize(0))
            out["device"] = caught(lambda: torch.openreg.synchronize(1))
            out["again"] = caught(lambda: torch.openreg.synchronize(1))
            warn_on_device("via stream", 1)
            stream = torch.openreg.current_stream(1)
            out["stream"] = caught(lambda: stream.synchronize())
            warn_on_device("via item", 1)
            out["item"] = caught(lambda: x.sum().item())
            print(json.dumps(out))
            """,
            **dict(PROCESS, OPENREG_DRIVER=driver),
        )
    )
    assert out["launch"] == [] and out["other_device"] == [] and out["again"] == [], out
    for key, text in [("device", "hot spot"), ("stream", "via stream"), ("item", "via item")]:
        assert len(out[key]) == 1, out
        category, message = out[key][0]
        assert category == "UserWarning" and message.startswith(text), out


STREAM_WORKERS = """
import json, os, torch, torch_openreg

def threads():
    return len(os.listdir(f"/proc/{device_pids()[0]}/task"))

x = torch.randn(256, 256)
d = x.to("openreg")
(d @ d).sum().item()  # the device's pools exist, its OpenMP threads too
before = threads()
unused = [torch.openreg.Stream() for _ in range(8)]
torch.openreg.synchronize()
after_create = threads()
side = torch.openreg.Stream()
with torch.openreg.stream(side):
    y = (d @ d).relu()
side.synchronize()
print(json.dumps({
    "before": before, "after_create": after_create, "after_use": threads(),
    "values": torch.allclose(y.cpu(), (x @ x).relu(), atol=1e-4),
}))
"""


def test_a_stream_has_a_worker_in_the_device_process_once_it_is_used(py):
    # The PyTorch layer makes its pools' streams at the device's first use
    # (72 a device); the device process runs a worker only for those that
    # received a command.
    # OPENREG_TEAM_SPIN=long: no idle team of the short spin beside them
    # (tests/test_team_spin.py counts that one).
    out = last_json(py(DEVICE_PIDS + STREAM_WORKERS, OPENREG_TEAM_SPIN="long", **PROCESS))
    assert out["values"], out
    assert out["before"] < 16, out  # the default stream's, not the pools'
    assert out["after_create"] == out["before"], out
    # The used stream's worker, with the OpenMP team its kernels start (one
    # thread per further core).
    assert out["before"] < out["after_use"] <= out["before"] + os.cpu_count(), out


IDLE_WAKEUPS = """
import json, os, time, torch, torch_openreg

def switches():
    pid = device_pids()[0]
    total = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                lines = f.read().splitlines()
        except OSError:  # the thread ended meanwhile
            continue
        # voluntary_ctxt_switches and nonvoluntary_ctxt_switches
        total[tid] = sum(int(line.split()[1]) for line in lines if "ctxt_switches:" in line)
    return total

x = torch.randn(256, 256)
d = x.to("openreg")
side = torch.openreg.Stream()
with torch.openreg.stream(side):
    y = (d @ d).relu()
z = (d @ d).sum()
torch.openreg.synchronize()
time.sleep(0.3)  # past the workers' spin after their last command
# Up to three windows of a second: on a loaded machine (a build beside the
# test) the OpenMP team's spin after its last region lasts longer than on an
# idle one. Idle workers that wake on a timer wake in every window.
for _ in range(3):
    before = switches()
    time.sleep(1.0)
    after = switches()
    woken = {t: after[t] - before[t] for t in after if t in before}
    if sum(woken.values()) <= 4:
        break
print(json.dumps({
    "woken": woken,
    "values": torch.allclose(y.cpu(), (x @ x).relu(), atol=1e-4)
    and torch.allclose(z.cpu(), (x @ x).sum(), rtol=1e-4),
}))
"""


def test_idle_stream_workers_of_a_device_process_sleep_until_a_command(py):
    # Two used streams (their workers and OpenMP teams) and the process's
    # main thread, idle for a second: the workers sleep without a timeout
    # (each used to wake every 100 ms to look for a stop), the main thread
    # waits for requests with a 1 s timeout.
    out = last_json(py(DEVICE_PIDS + IDLE_WAKEUPS, **PROCESS))
    assert out["values"], out
    assert len(out["woken"]) >= 3, out
    assert sum(out["woken"].values()) <= 4, out
