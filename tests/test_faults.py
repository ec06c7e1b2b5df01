"""Faults on demand (torch.openreg.faults, OPENREG_FAULTS; issue 30).

Each fault is provoked on purpose and must reach the program the way the
real one would: the exception type and message, the allocator's statistics,
what still works afterwards. Faults that change the process for good (a
sticky error, a lost device) run in a subprocess. The file also runs with
OPENREG_LAUNCH_BLOCKING=1 (the last test).
"""

import os
import re
import textwrap

import pytest
import torch
from conftest import describe, rerun_file_in_blocking_mode

faults = torch.openreg.faults
D = "openreg"
BLOCKING = os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1"


@pytest.fixture(autouse=True)
def _no_faults_left():
    faults.clear()
    yield
    faults.clear()


# --- allocations ----------------------------------------------------------------


def test_fail_allocation_is_an_out_of_memory_error():
    torch.openreg.empty_cache()
    keep = torch.empty(1 << 20, device=D)
    del keep  # a cached block: the OOM path frees it first
    before = torch.openreg.memory_stats()
    with faults.fail_allocation(device=0, after=1, min_bytes=4096) as fault:
        small = torch.empty(8, device=D)  # below min_bytes: not counted
        first = torch.empty(4096, device=D)  # the first match: lets it pass
        with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 16\.00 KiB"):
            torch.empty(4096, device=D)
        again = torch.empty(4096, device=D)  # it fired once
    after = torch.openreg.memory_stats()
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
    assert torch.openreg.memory_reserved() > 0 and small.numel() + first.numel() + again.numel()
    (entry,) = faults.report()
    assert entry["id"] == fault.id and entry["fault"] == "fail_allocation"
    assert entry["surfaced"] == "torch.OutOfMemoryError at the allocation"


def test_training_loop_recovers_from_an_injected_oom_by_halving_its_batch():
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4).to(D)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(64, 32)
    batch, seen, oom_steps = 64, [], []
    # The 6th input batch copied to the device fails, as on a full GPU.
    with faults.fail_allocation(after=5, min_bytes=batch * 32 * 4):
        for step in range(8):
            try:
                x = data[:batch].to(D)
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append(batch)
            except torch.OutOfMemoryError:
                oom_steps.append(step)
                batch //= 2
    assert oom_steps == [5]
    assert seen == [64] * 5 + [32] * 2
    assert torch.isfinite(model.weight.detach().cpu()).all()


# --- kernels ---------------------------------------------------------------------


def test_fail_kernel_surfaces_at_the_next_synchronization():
    a = torch.ones(4, 4, device=D)
    a @ a  # learnt: later calls are queued
    with faults.fail_kernel(op="aten::mm", device=0, after=1):
        ok = a @ a
        with pytest.raises(torch.AcceleratorError, match=r"kernel 'aten::mm' failed on the device"):
            # The second matching launch fails on the device: raised at the
            # next synchronization (at the launch with OPENREG_LAUNCH_BLOCKING=1).
            a @ a
            torch.openreg.synchronize()
    # Not sticky: the device keeps working.
    assert torch.equal((a @ a).cpu(), torch.full((4, 4), 4.0))
    assert torch.equal(ok.cpu(), torch.full((4, 4), 4.0))
    (entry,) = faults.report()
    assert entry["fault"] == "fail_kernel" and "aten::mm" in entry["injected"]
    where = "the call (it runs synchronously)" if BLOCKING else "a device synchronization"
    assert entry["surfaced"] == where


def test_fail_kernel_of_another_op_or_device_does_not_fire():
    with faults.fail_kernel(op="aten::mm", device=1):
        a = torch.ones(3, 3, device=D)
        assert torch.equal((a @ a).cpu(), torch.full((3, 3), 3.0))
        assert torch.equal((a + a).cpu(), torch.full((3, 3), 2.0))
        torch.openreg.synchronize()
    assert faults.report() == []


STICKY = """
import torch
faults = torch.openreg.faults
a = torch.ones(4, device="openreg:0")
b = torch.ones(4, device="openreg:1")
faults.fail_kernel(op="aten::add.Tensor", device=0, sticky=True)
messages = []
for call in (lambda: (a + a, torch.openreg.synchronize(0)), lambda: a * 2, lambda: a.cpu(),
             lambda: torch.empty(10, device="openreg:0"), lambda: torch.openreg.synchronize(0)):
    try:
        call()
        messages.append("no error")
    except torch.AcceleratorError as e:
        messages.append(str(e).split("\\n")[0])
print(len(set(m for m in messages[1:])), all("illegal memory access" in m for m in messages))
print("aten::add.Tensor" in messages[0])
print((b + b).cpu().tolist(), (b @ b).item())  # the other device computes
"""


def test_sticky_error_poisons_its_device_and_spares_the_other(py):
    for blocking in ("0", "1"):
        proc = py(STICKY, OPENREG_LAUNCH_BLOCKING=blocking)
        assert proc.returncode == 0, describe(proc)
        lines = proc.stdout.splitlines()
        assert lines[0] == "1 True", describe(proc)  # the same error every time
        assert lines[1] == "True"
        assert lines[2] == "[2.0, 2.0, 2.0, 2.0] 4.0"


LOST = """
import os, torch
faults = torch.openreg.faults
a = torch.ones(1000, device="openreg:1")
pending = a * 3  # queued when the device is lost
faults.lose_device(1)
errors = []
for call in (lambda: torch.openreg.synchronize(1), lambda: a + 1, lambda: a.cpu(),
             lambda: torch.empty(4, device="openreg:1")):
    try:
        call()
        errors.append("no error")
    except torch.AcceleratorError as e:
        errors.append(type(e).__name__ + ": " + str(e).split(". ")[0])
print(len(errors), len(set(errors)), errors[0])
b = torch.arange(4.0, device="openreg:0")
print((b * 2).cpu().tolist())
"""


def test_lost_device_fails_every_call_and_the_program_exits_cleanly(py):
    proc = py(LOST)
    assert proc.returncode == 0, describe(proc)
    first, other = proc.stdout.splitlines()
    how = ""
    if torch.openreg._named_kernels_only():
        # The device's process is killed: the error also says how it ended.
        how = r" \(device 1 was lost: its process \(pid \d+\) ended with signal 9 \(SIGKILL\)\)"
    lost = re.escape(
        "4 1 AcceleratorError: openreg device lost: openreg:1 "
        "(lost (torch.openreg.faults.lose_device)"
    )
    assert re.fullmatch(lost + how + r"\)", first), describe(proc)
    assert other == "[0.0, 2.0, 4.0, 6.0]"
    assert "Traceback" not in proc.stderr, describe(proc)


# --- delays: the race amplifier ------------------------------------------------

RACE = """
import sys, time, torch
faults = torch.openreg.faults
wait = sys.argv[1] == "wait"
amplify = sys.argv[2] == "amplify"
side = torch.openreg.Stream()
src = torch.arange(1 << 16, dtype=torch.float32, device="openreg")
src + 1  # learn the signatures outside the measured part
with torch.openreg.stream(side):
    dst = torch.empty_like(src)
    dst.copy_(src)
torch.openreg.synchronize()
bad = 0
fault = faults.delay_kernels(stream=side, max_us=200_000, seed=7) if amplify else None
for trial in range(10):
    with torch.openreg.stream(side):
        dst.fill_(float(trial))
    time.sleep(0.02)  # the host is far slower than the kernel: the race hides
    if wait:
        torch.openreg.current_stream().wait_stream(side)
    out = dst + 0  # on the default stream
    bad += int(not torch.equal(out.cpu(), torch.full_like(src.cpu(), float(trial))))
print(bad)
"""


@pytest.mark.skipif(BLOCKING, reason="launches run in order at the call in blocking mode")
def test_delay_makes_a_missing_wait_stream_fail_reproducibly(py):
    runs = {}
    for wait in ("nowait", "wait"):
        for amplify in ("plain", "amplify"):
            results = []
            for _ in range(2):
                proc = py(RACE, args=[wait, amplify])
                assert proc.returncode == 0, describe(proc)
                results.append(int(proc.stdout.strip()))
            runs[wait, amplify] = results
    assert runs["nowait", "plain"] == [0, 0]  # the bug hides
    bad = runs["nowait", "amplify"]
    assert bad[0] > 0 and bad[0] == bad[1]  # found, the same way every time
    assert runs["wait", "amplify"] == [0, 0]  # and the fix is seen to work


def test_delay_changes_no_value():
    x = torch.randn(256, 256)
    with faults.delay_kernels(device=0, max_us=300, seed=1):
        y = (x.to(D) @ x.to(D)).relu().sum(0)
    torch.testing.assert_close(y.cpu(), (x @ x).relu().sum(0))


# --- the specification string ---------------------------------------------------

SPEC = """
import torch
a = torch.ones(2, 2, device="openreg")
a @ a
try:
    (a @ a).cpu()
    print("no error")
except torch.AcceleratorError as e:
    print("kernel", "aten::mm" in str(e))
try:
    torch.empty(1 << 20, device="openreg")
    print("no error")
except torch.OutOfMemoryError:
    print("oom")
print(len(torch.openreg.faults.report()))
"""


def test_faults_for_a_whole_run_from_the_environment(py):
    spec = "fail_kernel:op=aten::mm,after=1 ; fail_allocation:min_bytes=1M"
    proc = py(SPEC, OPENREG_FAULTS=spec)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["kernel", "True", "oom", "2"], describe(proc)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("fail_alloc:after=1", "unknown fault 'fail_alloc'"),
        ("fail_kernel:op=aten::mm,stiky=1", "bad argument 'stiky=1'"),
        ("fail_allocation:min_bytes=lots", "expected a non-negative integer, got 'lots'"),
        ("fail_kernel:sticky=maybe", "expected true or false, got 'maybe'"),
        ("fail_collective:mode=sometimes", "mode must be 'error' or 'hang'"),
        ("lose_device:device=1", "lose_device cannot be armed for a whole run"),
    ],
)
def test_bad_specifications_name_the_bad_part(spec, message):
    with pytest.raises(ValueError, match="OPENREG_FAULTS") as info:
        for fn, kwargs in faults.parse_spec(spec):
            faults.clear()
            try:
                fn(**kwargs)
            except ValueError as e:
                raise ValueError(f"OPENREG_FAULTS: {e}") from None
    assert message in str(info.value)


def test_bad_specification_fails_at_import(py):
    proc = py("import torch_openreg", OPENREG_FAULTS="fail_kernel:op")
    assert proc.returncode != 0
    assert "OPENREG_FAULTS" in proc.stderr and "bad argument 'op'" in proc.stderr, describe(proc)


def test_bad_arguments():
    with pytest.raises(ValueError, match="after must be an integer >= 0"):
        faults.fail_allocation(after=-1)
    with pytest.raises(ValueError, match="max_us must be an integer"):
        faults.delay_kernels(max_us=0)
    with pytest.raises(ValueError, match="expected an openreg device"):
        faults.fail_kernel(device=torch.device("cpu"))
    assert faults.report() == []


# --- collectives --------------------------------------------------------------

DDP_HANG = """
import datetime, os, sys, time, torch, torch.distributed as dist
rank = int(sys.argv[1])
torch.openreg.set_device(rank)
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=sys.argv[2],
                        timeout=datetime.timedelta(seconds=5))
torch.openreg.faults.fail_collective(op="allreduce", rank=1, mode=sys.argv[3])
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2).to("openreg"))
start = time.monotonic()
try:
    model(torch.randn(4, 8, device="openreg")).sum().backward()
    torch.openreg.synchronize()
    print("no error")
except Exception as e:
    print(type(e).__name__, round(time.monotonic() - start), str(e).split("\\n")[0][:200])
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize("mode", ["hang", "error"])
def test_ddp_step_with_a_faulty_rank_raises_on_the_other_within_its_timeout(tmp_path, mode):
    import subprocess
    import sys

    from conftest import clean_env

    # A file store: a TCPStore would listen on every interface.
    init = f"file://{tmp_path}/init"
    env = clean_env(GLOO_SOCKET_IFNAME="lo", OPENREG_FALLBACK_WARNINGS="0")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(DDP_HANG), str(r), init, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    rank0, rank1 = (o[0].strip() for o in outs)
    assert rank0 and rank0 != "no error", outs
    assert rank0.split()[0] in ("DistBackendError", "RuntimeError", "AcceleratorError"), outs
    assert int(rank0.split()[1]) <= 12, outs  # within the group's 5 s timeout (and slack)
    assert "no error" not in rank1, outs
    if mode == "error":
        assert "allreduce on rank 1 failed" in rank1, outs
    else:
        assert "never arrived" in rank1, outs


def test_whole_file_in_blocking_mode():
    if BLOCKING:
        pytest.skip("this is the blocking run")
    rerun_file_in_blocking_mode(__file__, timeout=170)
