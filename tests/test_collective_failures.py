"""A peer that dies or hangs in the middle of training never goes unnoticed.

On CUDA a collective that does not complete stops the job: NCCL's kernel
never finishes, and ProcessGroupNCCL's watchdog takes the process down
("subsequent GPU operations might run on corrupted/incomplete data",
TORCH_NCCL_ASYNC_ERROR_HANDLING); on the CPU, Gloo raises at the call. DDP's
reducer and FSDP2 wait on the collective's *future*, completed at launch and
waited for through stream events only, so an error kept on the
communication stream would never reach them: the surviving rank trained on,
with gradients that were never averaged. openreg aborts the device instead
(csrc/distributed/OpenRegProcessGroup.cpp, "c10d-abort"): every later call
on it raises c10d's DistBackendError naming the collective.

Each case runs two fresh ranks on a file store (nothing listens beyond
loopback); rank 1 leaves after three steps by os._exit, SIGKILL or by
hanging, and rank 0 must raise within a few steps, or within the group's
timeout for the hang, with either driver.
"""

import subprocess
import sys
import textwrap

import pytest
from conftest import clean_env

TIMEOUT_S = 3  # the process group's; the hang case waits for it

RANK = """
import datetime, os, signal, sys, time
import torch, torch.distributed as dist

rank, init, death, workload = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
torch.openreg.set_device(rank)
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=init,
                        timeout=datetime.timedelta(seconds={timeout}))
d = torch.device("openreg", rank)
# Both ranks connected before anyone leaves (a peer gone during the first
# collective would fail init instead).
dist.all_reduce(torch.ones(1, device=d))
torch.openreg.synchronize()

torch.manual_seed(0)
if workload == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4).to(d))
elif workload == "fsdp2":
    from torch.distributed.fsdp import fully_shard
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).to(d)
    for part in (model[0], model[2], model):
        fully_shard(part)
if workload != "future":
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

def step(i):
    if workload == "future":
        # What DDP's reducer does with a bucket: the future's value, used on
        # the current stream without a host synchronization.
        t = torch.full((4,), float(rank + 1), device=d)
        got = dist.all_reduce(t, async_op=True).get_future().wait()[0]
        return got.sum() / 12  # 1.0 once reduced (3 * 4 / 12)
    opt.zero_grad()
    loss = model(torch.randn(8, 8, device=d)).square().mean()
    loss.backward()
    opt.step()
    return loss

start = died = None
for i in range(1, 2000):
    if rank == 1 and i == 4:
        if death == "exit":
            os._exit(0)
        if death == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # alive, never joins again
        os._exit(0)
    if i == 4:
        died = time.monotonic()
    try:
        value = step(i)
        if i % 5 == 0 or i <= 3:
            value = value.item()  # a training loop's periodic loss print
            if workload == "future":
                assert value == 1.0, (i, value)
    except Exception as e:
        print("RAISED", i, round(time.monotonic() - died, 1), type(e).__name__,
              str(e).replace("\\n", " ")[:400], flush=True)
        break
else:
    print("NO ERROR", flush=True)
os._exit(0)
"""


@pytest.mark.parametrize(
    "driver,death,workload",
    [
        ("thread", "exit", "future"),
        ("thread", "kill", "ddp"),
        ("thread", "hang", "fsdp2"),
        ("thread", "exit", "fsdp2"),
        ("process", "kill", "future"),
        ("process", "exit", "ddp"),
        ("process", "hang", "ddp"),
    ],
)
def test_a_lost_peer_stops_training_with_a_distributed_error(tmp_path, driver, death, workload):
    init = f"file://{tmp_path}/init"
    env = clean_env(GLOO_SOCKET_IFNAME="lo", OPENREG_FALLBACK_WARNINGS="0", OPENREG_DRIVER=driver)
    code = textwrap.dedent(RANK).replace("{timeout}", str(TIMEOUT_S))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), init, death, workload],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        for r in range(2)
    ]
    try:
        out, err = procs[0].communicate(timeout=90)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    line = out.strip().splitlines()[-1] if out.strip() else ""
    assert line.startswith("RAISED"), (out, err)
    _, step, seconds, kind, message = line.split(" ", 4)
    # The surviving rank never completes a step with gradients that were not
    # averaged, and hears of it at once: within a few steps of the death
    # (Gloo sees the closed connection at once), or within the group's
    # timeout when the peer hangs.
    assert kind == "DistBackendError", line
    assert int(step) >= 4, line
    if death == "hang":
        assert float(seconds) <= TIMEOUT_S + 8, line
        assert "imed out" in message, line
    else:
        assert int(step) <= 4 + 5 and float(seconds) <= 8, line
        assert "closed by peer" in message or "Connection" in message, line
    assert "did not complete" in message or "failed" in message, line
    assert any(op in message for op in ("allreduce", "allgather", "reduce_scatter")), line


# --- what NCCL checks ---------------------------------------------------------

CHECKS = """
import datetime, sys, time, torch, torch.distributed as dist
rank, init, case = int(sys.argv[1]), sys.argv[2], sys.argv[3]
timeout = datetime.timedelta(seconds=3)
if case == "same device":
    torch.openreg.set_device(0)  # both ranks on openreg:0
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=init, timeout=timeout)
    try:
        t = torch.ones(2, device="openreg:0")
        dist.all_reduce(t)
        t.cpu()
        print("RESULT no error")
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\\n", " ")[:300])
elif case == "cpu tensor under the shim":
    import torch_openreg.transfer_to_openreg  # noqa: F401  (the CUDA program as written)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, init_method=init, timeout=timeout)
    try:
        dist.all_reduce(torch.ones(2))  # a CPU tensor: NCCL has no backend for it
        print("RESULT no error")
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\\n", " ")[:300])
    t = torch.ones(2, device="cuda")
    dist.all_reduce(t)
    print("CUDA", t.cpu().tolist())
elif case == "skipped collective":
    torch.openreg.set_device(rank)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=init, timeout=timeout)
    d = torch.device("openreg", rank)
    dist.all_reduce(torch.ones(1, device=d))
    torch.openreg.synchronize()
    try:
        t = torch.ones(4, device=d)
        if rank == 0:  # rank 1 skips this one
            dist.all_reduce(t)
        t.cpu()
        print("RESULT no error")
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\\n", " ")[:300])
    if rank == 1:
        time.sleep(6)
sys.stdout.flush()
import os
os._exit(0)
"""


def _two_ranks(tmp_path, case, driver="thread"):
    init = f"file://{tmp_path}/init"
    env = clean_env(GLOO_SOCKET_IFNAME="lo", OPENREG_FALLBACK_WARNINGS="0", OPENREG_DRIVER=driver)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHECKS), str(r), init, case],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        for r in range(2)
    ]
    try:
        return [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill()


def _result(out):
    lines = [line for line in out[0].splitlines() if line.startswith("RESULT")]
    assert lines, out
    return lines[0][len("RESULT ") :]


@pytest.mark.parametrize("driver", ["thread", "process"])
def test_two_ranks_on_one_device_are_refused_as_nccl_does(tmp_path, driver):
    outs = _two_ranks(tmp_path, "same device", driver)
    for out in outs:
        result = _result(out)
        assert result.startswith("DistBackendError"), out
        assert "both use openreg:0" in result and "Duplicate GPU detected" in result, out


def test_a_cpu_tensor_in_a_nccl_group_raises_as_with_nccl(tmp_path):
    # Under the CUDA shim "nccl" is openreg's backend for openreg tensors only.
    outs = _two_ranks(tmp_path, "cpu tensor under the shim")
    for out in outs:
        assert _result(out).startswith(
            "RuntimeError No backend type associated with device type cpu"
        ), out
        assert "CUDA [2.0, 2.0]" in out[0], out  # the device collective works


def test_a_skipped_collective_reports_as_a_collective_error(tmp_path):
    outs = _two_ranks(tmp_path, "skipped collective")
    result = _result(outs[0])  # rank 0 waits for a peer that never comes
    assert result.startswith("DistBackendError"), outs[0]
    assert "c10d::allreduce" in result and "did not complete" in result, outs[0]
    assert "openreg kernel" not in result, outs[0]
