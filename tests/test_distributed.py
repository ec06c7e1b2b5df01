"""torch.distributed on openreg: the orccl backend (Gloo over device memory).

Every check runs in spawned processes (tests/dist_helpers.py) joined through
a file in tmp_path, Gloo on the loopback interface. Each collective on
openreg tensors is compared with the same collective on CPU tensors through
plain Gloo in the same process group.
"""

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from conftest import run_in_own_network
from dist_helpers import run_ranks

# OPENREG_LAUNCH_BLOCKING=1 makes every launch wait for the device (as
# CUDA_LAUNCH_BLOCKING=1 does): the tests of what does not wait skip there.
ASYNC_ONLY = pytest.mark.skipif(
    os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1",
    reason="checks that the host does not wait; OPENREG_LAUNCH_BLOCKING=1 makes every launch wait",
)

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
]


# How the ranks' devices run and how Gloo reaches their memory: the thread
# driver (in place, through the kernel view), the process driver with a NIC
# that reaches device memory (OPENREG_NIC_DMA=1, the default: in place,
# through orMemGetDmaPointer) and without one (staged through pinned host
# copies). docs/distributed.md, "How Gloo reaches device memory".
DRIVERS = {
    "thread": {"OPENREG_DRIVER": "thread"},
    "process": {"OPENREG_DRIVER": "process"},
    "process-staged": {"OPENREG_DRIVER": "process", "OPENREG_NIC_DMA": "0"},
}


def _dev(rank):
    return torch.device("openreg", rank)


def _values(rank, shape, dtype, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(1, 5, shape, generator=g).to(dtype)


def _check_close(got, want, what):
    got = got.cpu() if isinstance(got, torch.Tensor) else got
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}", atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------------------
# Collectives: one job, one process group (init_process_group() with no
# backend: cpu:gloo for the CPU twins, orccl for openreg tensors).


def _collectives(rank, world):
    d = _dev(rank)
    pg = dist.group.WORLD
    assert pg._get_backend(torch.device("openreg")).name() == "orccl"
    assert pg._get_backend(torch.device("cpu")).name() == "gloo"

    # all_reduce: every op Gloo supports, every dtype.
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    int_ops = [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    for dtype in DTYPES:
        for i, op in enumerate(ops + (int_ops if not dtype.is_floating_point else [])):
            cpu = _values(rank, (5, 3), dtype, salt=i)
            dev = cpu.to(d)
            dist.all_reduce(cpu, op=op)
            dist.all_reduce(dev, op=op)
            _check_close(dev, cpu, f"all_reduce {op} {dtype}")
        if dtype.is_floating_point:
            cpu = _values(rank, (5, 3), dtype, salt=9)
            dev = cpu.to(d)
            dist.all_reduce(cpu, op=dist.ReduceOp.AVG)
            dist.all_reduce(dev, op=dist.ReduceOp.AVG)
            _check_close(dev, cpu, f"all_reduce AVG {dtype}")

    # broadcast, reduce from both roots.
    for root in range(world):
        cpu = _values(rank, (4, 4), torch.float32, salt=root)
        dev = cpu.to(d)
        dist.broadcast(cpu, src=root)
        dist.broadcast(dev, src=root)
        _check_close(dev, cpu, "broadcast")
        cpu = _values(rank, (7,), torch.float64, salt=root)
        dev = cpu.to(d)
        dist.reduce(cpu, dst=root, op=dist.ReduceOp.MAX)
        dist.reduce(dev, dst=root, op=dist.ReduceOp.MAX)
        _check_close(dev, cpu, "reduce")

    # all_gather (list and into one tensor), gather, scatter.
    x = _values(rank, (3, 2), torch.float32)
    outs_cpu = [torch.empty(3, 2) for _ in range(world)]
    outs_dev = [torch.empty(3, 2, device=d) for _ in range(world)]
    dist.all_gather(outs_cpu, x)
    dist.all_gather(outs_dev, x.to(d))
    for a, b in zip(outs_dev, outs_cpu, strict=True):
        _check_close(a, b, "all_gather")
    big_cpu = torch.empty(world * 3, 2)
    big_dev = torch.empty(world * 3, 2, device=d)
    dist.all_gather_into_tensor(big_cpu, x)
    dist.all_gather_into_tensor(big_dev, x.to(d))
    _check_close(big_dev, big_cpu, "all_gather_into_tensor")
    gather_cpu = [torch.empty(3, 2) for _ in range(world)] if rank == 0 else None
    gather_dev = [torch.empty(3, 2, device=d) for _ in range(world)] if rank == 0 else None
    dist.gather(x, gather_cpu, dst=0)
    dist.gather(x.to(d), gather_dev, dst=0)
    if rank == 0:
        for a, b in zip(gather_dev, gather_cpu, strict=True):
            _check_close(a, b, "gather")
    chunks = [_values(9, (2, 2), torch.float32, salt=i) for i in range(world)]
    sc_cpu = torch.empty(2, 2)
    sc_dev = torch.empty(2, 2, device=d)
    dist.scatter(sc_cpu, chunks if rank == 1 else None, src=1)
    dist.scatter(sc_dev, [c.to(d) for c in chunks] if rank == 1 else None, src=1)
    _check_close(sc_dev, sc_cpu, "scatter")

    # reduce_scatter (list and tensor).
    parts = [_values(rank, (4,), torch.float32, salt=i) for i in range(world)]
    rs_cpu = torch.empty(4)
    rs_dev = torch.empty(4, device=d)
    dist.reduce_scatter(rs_cpu, parts)
    dist.reduce_scatter(rs_dev, [p.to(d) for p in parts])
    _check_close(rs_dev, rs_cpu, "reduce_scatter")
    inp = _values(rank, (world * 4,), torch.float32, salt=5)
    dist.reduce_scatter_tensor(rs_cpu, inp)
    dist.reduce_scatter_tensor(rs_dev, inp.to(d))
    _check_close(rs_dev, rs_cpu, "reduce_scatter_tensor")

    # all_to_all (list) and all_to_all_single (even and uneven splits).
    ins = [_values(rank, (2, 3), torch.float32, salt=i) for i in range(world)]
    a2a_cpu = [torch.empty(2, 3) for _ in range(world)]
    a2a_dev = [torch.empty(2, 3, device=d) for _ in range(world)]
    dist.all_to_all(a2a_cpu, ins)
    dist.all_to_all(a2a_dev, [t.to(d) for t in ins])
    for a, b in zip(a2a_dev, a2a_cpu, strict=True):
        _check_close(a, b, "all_to_all")
    single = _values(rank, (world * 2, 3), torch.float32, salt=7)
    s_cpu = torch.empty(world * 2, 3)
    s_dev = torch.empty(world * 2, 3, device=d)
    dist.all_to_all_single(s_cpu, single)
    dist.all_to_all_single(s_dev, single.to(d))
    _check_close(s_dev, s_cpu, "all_to_all_single")
    in_splits = [1, 3] if rank == 0 else [2, 2]
    out_splits = [1, 2] if rank == 0 else [3, 2]
    uneven = _values(rank, (4, 3), torch.float32, salt=8)
    u_cpu = torch.empty(sum(out_splits), 3)
    u_dev = torch.empty(sum(out_splits), 3, device=d)
    dist.all_to_all_single(u_cpu, uneven, out_splits, in_splits)
    dist.all_to_all_single(u_dev, uneven.to(d), out_splits, in_splits)
    _check_close(u_dev, u_cpu, "all_to_all_single uneven")

    # send/recv, isend/irecv, batch_isend_irecv (both directions at once).
    peer = 1 - rank
    msg = _values(rank, (6,), torch.float32, salt=11)
    got = torch.empty(6, device=d)
    if rank == 0:
        dist.send(msg.to(d), dst=peer)
        dist.recv(got, src=peer)
    else:
        dist.recv(got, src=peer)
        dist.send(msg.to(d), dst=peer)
    _check_close(got, _values(peer, (6,), torch.float32, salt=11), "send/recv")
    big = torch.full((1 << 20,), float(rank), device=d)  # 4 MB each way
    got_big = torch.empty(1 << 20, device=d)
    reqs = [dist.isend(big, dst=peer), dist.irecv(got_big, src=peer)]
    for r in reqs:
        r.wait()
    assert torch.equal(got_big.cpu(), torch.full((1 << 20,), float(peer)))
    ops_p2p = [
        dist.P2POp(dist.isend, msg.to(d) * 2, peer),
        dist.P2POp(dist.irecv, got, peer),
    ]
    for r in dist.batch_isend_irecv(ops_p2p):
        r.wait()
    _check_close(got, _values(peer, (6,), torch.float32, salt=11) * 2, "batch_isend_irecv")

    # Coalesced variants.
    ts_cpu = [_values(rank, (3,), torch.float32, salt=20 + i) for i in range(3)]
    ts_dev = [t.to(d) for t in ts_cpu]
    dist.all_reduce_coalesced(ts_cpu)
    dist.all_reduce_coalesced(ts_dev)
    for a, b in zip(ts_dev, ts_cpu, strict=True):
        _check_close(a, b, "all_reduce_coalesced")
    outs_cpu = [[torch.empty(3) for _ in range(world)] for _ in range(2)]
    outs_dev = [[torch.empty(3, device=d) for _ in range(world)] for _ in range(2)]
    dist.all_gather_coalesced(outs_cpu, ts_cpu[:2])
    dist.all_gather_coalesced(outs_dev, ts_dev[:2])
    for la, lb in zip(outs_dev, outs_cpu, strict=True):
        for a, b in zip(la, lb, strict=True):
            _check_close(a, b, "all_gather_coalesced")

    dist.barrier()
    return True


def _stream_semantics(rank, world):
    d = _dev(rank)
    # The collective sees the kernels queued before it and later kernels see
    # its result, with the host never synchronizing in between.
    x = torch.zeros(1 << 16, device=d)
    for _ in range(20):
        x.add_(1)
    dist.all_reduce(x)
    y = x * 2
    assert torch.equal(y.cpu(), torch.full((1 << 16,), 80.0))

    # async_op: is_completed() is truthful, wait() orders the current stream.
    t = torch.full((1 << 18,), float(rank + 1), device=d)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    z = t + 0
    assert torch.equal(z.cpu(), torch.full((1 << 18,), 3.0))
    for _ in range(200):
        if work.is_completed():
            break
        time.sleep(0.05)
    assert work.is_completed() and work.is_success()
    fut = dist.all_reduce(torch.ones(4, device=d), async_op=True).get_future()
    assert torch.equal(fut.wait()[0].cpu(), torch.full((4,), 2.0))

    # On a side stream: the collective is ordered with that stream.
    s = torch.Stream(device=d)
    with torch.openreg.stream(s):
        u = torch.ones(8, device=d) * (rank + 1)
        dist.all_reduce(u)
        v = u * 10
    s.synchronize()
    assert torch.equal(v.cpu(), torch.full((8,), 30.0))

    # Two groups, collectives launched in opposite orders on the two ranks:
    # rank 1 finishes the second group's collective before it joins the
    # first's, so rank 0 must have issued its second collective while its
    # first still waits for rank 1 (NCCL runs each group on its own stream;
    # a launch that blocked until the previous collective finished would
    # time out here).
    # The same through the second collective's future (what DDP's reducer
    # uses): rank 0 reads its result before rank 1 joins the first group's
    # collective, so the future must not wait for that one.
    # With OPENREG_LAUNCH_BLOCKING=1 every launch waits for its kernel, so
    # rank 0's first collective cannot return before rank 1 joins it: the
    # opposite orders deadlock, as NCCL's do under CUDA_LAUNCH_BLOCKING=1.
    blocking = os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1"
    other = dist.new_group([0, 1], timeout=timedelta(seconds=20))
    for through_future in () if blocking else (False, True):
        a = torch.full((1 << 10,), float(rank + 1), device=d)
        b = torch.full((1 << 10,), float(10 * (rank + 1)), device=d)
        if rank == 0:
            first = dist.all_reduce(a, async_op=True)
            second = dist.all_reduce(b, group=other, async_op=True)
            if through_future:
                got = second.get_future().wait()[0] * 2
                assert torch.equal(got.cpu(), torch.full((1 << 10,), 60.0))
                dist.barrier(group=other)  # rank 1 joins `first` after this
            else:
                second.wait()
            first.wait()
        else:
            dist.all_reduce(b, group=other, async_op=True).wait(timedelta(seconds=20))
            if through_future:
                dist.barrier(group=other)
            dist.all_reduce(a)
        assert torch.equal(a.cpu(), torch.full((1 << 10,), 3.0))
        assert torch.equal(b.cpu(), torch.full((1 << 10,), 30.0))
    # The group is used at least once before it is destroyed, also with
    # OPENREG_LAUNCH_BLOCKING=1 where the loop above does not run: new_group()
    # makes no barrier (TORCH_DIST_INIT_BARRIER=0), so a rank destroying the
    # group at once could close a socket its peer is still connecting.
    dist.barrier(group=other)
    dist.destroy_process_group(other)

    # Non-contiguous input: refused with a clear message (like Gloo on CPU).
    nc = torch.ones(4, 4, device=d).t()[:, :2]
    try:
        dist.all_reduce(nc)
    except (RuntimeError, ValueError) as e:
        assert "contiguous" in str(e), e
    else:
        raise AssertionError("non-contiguous input accepted")
    return True


@pytest.mark.parametrize("driver", [None, "process-staged"])
def test_collectives_match_cpu(tmp_path, driver):
    run_ranks(_collectives, tmp_path, timeout=170, env=DRIVERS.get(driver))


def _received_values(rank):
    return _values(rank, (64, 33), torch.float32, salt=5)


def _collective_on_received_memory(rank, world, tensors):
    # tensors[rank] is the parent's device memory, opened here (docs/ipc.md):
    # Gloo reaches it through this process's view of it, or stages it.
    t = tensors[rank]
    assert t.device == _dev(rank), t.device
    want = sum(_received_values(r) for r in range(world))
    pinned = torch.openreg.host_memory_stats()["allocated_bytes.allocated"]
    dist.all_reduce(t)
    _check_close(t, want, "all_reduce on memory received from another process")
    outs = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(outs, t * (rank + 1))
    for r, out in enumerate(outs):
        _check_close(out, want * (r + 1), "all_gather of received memory")
    torch.openreg.synchronize()
    # Pinned host bytes the collectives took: staging copies, or none.
    staged = torch.openreg.host_memory_stats()["allocated_bytes.allocated"] - pinned
    return staged >= t.nbytes


@pytest.mark.parametrize("driver", [None, "process-staged"])
def test_collectives_on_memory_received_from_another_process(tmp_path, driver):
    tensors = [_received_values(r).to(_dev(r)) for r in range(2)]
    staged = run_ranks(_collective_on_received_memory, tmp_path, tensors, env=DRIVERS.get(driver))
    # In place with either driver (the process driver through its view of the
    # received memory, orMemGetDmaPointer); staged only without that view.
    assert staged == [driver == "process-staged"] * 2, staged
    # The ranks wrote the parent's memory in place.
    want = _received_values(0) + _received_values(1)
    for t in tensors:
        _check_close(t, want, "the sender's memory after the ranks' all_reduce")


@pytest.mark.parametrize("driver", [None, "process-staged"])
def test_stream_ordering_async_and_errors(tmp_path, driver):
    run_ranks(_stream_semantics, tmp_path, timeout=120, env=DRIVERS.get(driver))


# ---------------------------------------------------------------------------
# A collective's call does not make the host wait for the device, with either
# driver. On CUDA, ProcessGroupNCCL queues the collective on its own stream
# after an event of the current stream, and sync debug mode reports nothing
# for it. With the process driver (device memory the host cannot reach) the
# tensors are staged through pinned host memory: the staging copies are
# queued on the current stream, and the group's issue thread hands them to
# Gloo once they have run (docs/distributed.md, "Staged through pinned host
# memory"). Until issue 62 the call copied them with a blocking copy.


def _calls_without_host_waits(rank, world):
    from torch.openreg import faults

    d = _dev(rank)
    peer = 1 - rank
    base = _values(rank, (64, 64), torch.float32)
    gathered_cpu = [torch.empty(64, 64) for _ in range(world)]
    want = base @ base
    for _ in range(3):
        want = want @ base / 64
    want_sum = [want.clone()]
    dist.all_reduce(want_sum[0].view(-1), group=None)  # CPU twin through Gloo
    dist.all_gather(gathered_cpu, want)
    rs_parts = [want * (r + 1) for r in range(world)]
    rs_cpu = torch.empty(64, 64)
    dist.reduce_scatter(rs_cpu, rs_parts)

    x = base.to(d)
    torch.openreg.synchronize()
    # While the fault is armed, each kernel starts up to 0.3 s late (seeded),
    # so the device is still busy when the calls return unless a call waited
    # for it.
    stream = torch.openreg.current_stream()
    torch.openreg.set_sync_debug_mode("error")
    try:
        with faults.delay_kernels(d, max_us=300_000, seed=rank):
            y = x @ x
            for _ in range(3):
                y = y @ x / 64
            summed = y.clone()
            w1 = dist.all_reduce(summed, async_op=True)
            gathered = [torch.empty_like(y) for _ in range(world)]
            w2 = dist.all_gather(gathered, y, async_op=True)
            rs = torch.empty_like(y)
            w3 = dist.reduce_scatter(rs, [y * (r + 1) for r in range(world)], async_op=True)
            got = torch.empty_like(y)
            if rank == 0:
                w4 = dist.isend(y, dst=peer)
                w5 = dist.irecv(got, src=peer)
            else:
                w5 = dist.irecv(got, src=peer)
                w4 = dist.isend(y, dst=peer)
            busy = not stream.query()
        for w in (w1, w2, w3, w4, w5):
            w.wait()
    finally:
        torch.openreg.set_sync_debug_mode("default")
    assert busy, "a collective's call waited for the device"
    _check_close(summed, want_sum[0], "all_reduce")
    for r in range(world):
        _check_close(gathered[r], gathered_cpu[r], f"all_gather[{r}]")
    _check_close(rs, rs_cpu, "reduce_scatter")
    _check_close(got, gathered_cpu[peer], "irecv")
    return True


@ASYNC_ONLY
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_collective_calls_do_not_wait_for_the_device(tmp_path, driver):
    assert run_ranks(_calls_without_host_waits, tmp_path, env=DRIVERS[driver], timeout=120) == [
        True,
        True,
    ]


# ---------------------------------------------------------------------------
# Waiting for a collective does not make the host wait either: Work.wait()
# and the future's wait() order the caller's stream after the collective
# (as ProcessGroupNCCL's do on CUDA), so DDP's backward queues on while its
# buckets are reduced. Rank 0 waits on its all_reduce before rank 1 has even
# called it: a wait that blocked the host would never return. With the
# process driver the collective is staged and its outputs copied back on the
# group's completion stream behind a pinned semaphore the host sets when
# Gloo has finished (orStreamWaitValue32); until issue 62 the waits blocked.


def _waits_without_host_waits(rank, world):
    d = _dev(rank)
    store = dist.distributed_c10d._get_default_store()
    x = (torch.arange(8.0) + 10 * rank).to(d)
    # The group's first collective on a device checks, on the host, that no
    # other rank uses it (NCCL's "Duplicate GPU detected"): both ranks.
    dist.all_reduce(torch.zeros(1, device=d))
    # An operator's first run with a signature runs synchronously (openreg
    # learns its results' metadata from the device): warm both up.
    _ = x * 2 + 1
    torch.openreg.synchronize()
    if rank == 0:
        torch.openreg.set_sync_debug_mode("error")
        try:
            work = dist.all_reduce(x, async_op=True)
            work.wait()
            y = x * 2  # queued after the collective's copy-back
            fut = dist.all_reduce(y, async_op=True).get_future()
            fut.wait()
            z = fut.value()[0] + 1
            completed = work.is_completed()
        finally:
            torch.openreg.set_sync_debug_mode("default")
        store.set("rank0_waited", "1")
        assert not completed, "a collective completed before its peer called it"
    else:
        store.wait(["rank0_waited"], timedelta(seconds=60))
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        y = x * 2
        dist.all_reduce(y)
        z = y + 1
    total = torch.arange(8.0) * 2 + 10
    _check_close(x, total, "all_reduce")
    _check_close(z, total * 4 + 1, "all_reduce of its double, plus one")
    work.wait()
    assert work.is_completed()
    return True


@ASYNC_ONLY
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_waiting_for_a_collective_does_not_wait_for_it_on_the_host(tmp_path, driver):
    assert run_ranks(_waits_without_host_waits, tmp_path, env=DRIVERS[driver], timeout=120) == [
        True,
        True,
    ]


# ---------------------------------------------------------------------------
# Training end to end: DDP, FSDP2, DTensor, each compared with one process
# training on the whole batch on the CPU.


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batches(steps=3, batch=8):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g))
        for _ in range(steps)
    ]


def _reference():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _local(x, rank, world):
    n = x.shape[0] // world
    return x[rank * n : (rank + 1) * n]


def _train_ddp(rank, world, device_ids):
    from torch.nn.parallel import DistributedDataParallel as DDP

    d = _dev(rank)
    model = DDP(_mlp().to(d), device_ids=device_ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in _batches():
            opt.zero_grad()
            out = model(_local(x, rank, world).to(d))
            torch.nn.functional.mse_loss(out, _local(y, rank, world).to(d)).backward()
            opt.step()
    # As on CUDA: no warning, and DDP's runtime stats come from the device's
    # own timer (timing events on the stream).
    assert [str(w.message) for w in caught] == []
    stats = model._get_ddp_logging_data()
    for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert stats.get(key, 0) > 0, (key, stats)
    return [p.detach().cpu() for p in model.module.parameters()]


def _train_fsdp2(rank, world):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    d = _dev(rank)
    model = _mlp().to(d)
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _batches():
        opt.zero_grad()
        out = model(_local(x, rank, world).to(d))
        torch.nn.functional.mse_loss(out, _local(y, rank, world).to(d)).backward()
        opt.step()
    params = []
    for p in model.parameters():
        assert isinstance(p, DTensor) and p.device.type == "openreg"
        params.append(p.full_tensor().detach().cpu())
    return params


def _train_dtensor(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("openreg", (world,))
    assert mesh.device_type == "openreg"
    d = _dev(rank)
    model = parallelize_module(_mlp().to(d), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _batches():  # tensor parallel: every rank sees the whole batch
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(d)), y.to(d)).backward()
        opt.step()
    return [p.full_tensor().detach().cpu() for p in model.parameters()]


def _training(rank, world):
    ref = _reference()
    results = {
        "ddp device_ids=[rank]": _train_ddp(rank, world, [rank]),
        "ddp device_ids=None": _train_ddp(rank, world, None),
        "fsdp2": _train_fsdp2(rank, world),
        "dtensor": _train_dtensor(rank, world),
    }
    for name, params in results.items():
        assert len(params) == len(ref), name
        for got, want in zip(params, ref, strict=True):
            torch.testing.assert_close(got, want, msg=lambda m, n=name: f"{n}: {m}")
    return sorted(results)


def test_ddp_fsdp2_dtensor_match_single_process(tmp_path):
    names = run_ranks(_training, tmp_path, timeout=170)
    assert (
        names[0] == names[1] == ["ddp device_ids=None", "ddp device_ids=[rank]", "dtensor", "fsdp2"]
    )


TRAIN_SCRIPT = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, {tests!r})
from test_distributed import _batches, _local, _mlp
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ["LOCAL_RANK"])
torch.openreg.set_device(local)
d = torch.device("openreg", local)
model = DDP(_mlp().to(d), device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in _batches():
    opt.zero_grad()
    out = model(_local(x, rank, world).to(d))
    torch.nn.functional.mse_loss(out, _local(y, rank, world).to(d)).backward()
    opt.step()
assert next(model.parameters()).device == d
torch.save([p.detach().cpu() for p in model.module.parameters()], {out!r} + f"/rank{{rank}}.pt")
dist.destroy_process_group()
"""


def test_torchrun_trains_with_ddp(tmp_path):
    script = tmp_path / "train.py"
    tests = os.path.dirname(os.path.abspath(__file__))
    script.write_text(TRAIN_SCRIPT.format(tests=tests, out=str(tmp_path)))
    # torchrun's rendezvous and master stores listen on every interface,
    # whatever --rdzv-endpoint or --master-addr says: its own network.
    proc = run_in_own_network(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script],
        tmp_path,
        timeout=170,
        GLOO_SOCKET_IFNAME="lo",
        OPENREG_FALLBACK_WARNINGS="0",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ref = _reference()
    for r in range(2):
        for got, want in zip(torch.load(tmp_path / f"rank{r}.pt"), ref, strict=True):
            torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------
# Backend strings and faults.


def _backend_strings(rank, world):
    d = _dev(rank)
    # init_process_group("gloo") (run_ranks' backend): openreg tensors work.
    t = torch.full((3,), float(rank + 1), device=d)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((3,), 3.0))
    assert dist.group.WORLD._get_backend(torch.device("openreg")).name() == "orccl"
    for backend in ("cpu:gloo,openreg:gloo", "cpu:gloo,openreg:orccl", "orccl"):
        g = dist.new_group(backend=backend)
        u = torch.ones(2, device=d)
        dist.all_reduce(u, group=g)
        c = torch.ones(2)
        dist.all_reduce(c, group=g)
        assert torch.equal(u.cpu(), c) and torch.equal(c, torch.full((2,), 2.0)), backend
    try:
        dist.new_group(backend="cpu:gloo,nosuchdevice:orccl")
    except ValueError as e:
        assert "nosuchdevice" in str(e), e
    else:
        raise AssertionError("unknown device accepted")
    return True


def test_backend_strings(tmp_path):
    run_ranks(_backend_strings, tmp_path, backend="gloo", timeout=120)


def _init(rank, world, seconds):
    dist.init_process_group(
        backend="cpu:gloo,openreg:orccl",
        init_method=os.environ["OPENREG_TEST_INIT"],
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=seconds),
    )


def _mismatch(rank, world):
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: PyTorch's collective checks (which need
    # the backend's sequence numbers) name the mismatch before Gloo runs.
    d = _dev(rank)
    errors = []
    for shape, dtype in (
        ((4,) if rank == 0 else (8,), torch.float32),
        ((4,), torch.float32 if rank == 0 else torch.int64),
    ):
        try:
            dist.all_reduce(torch.ones(shape, dtype=dtype, device=d))
        except RuntimeError as e:
            errors.append(str(e))
    assert len(errors) == 2, errors
    assert all("mismatch between collectives" in e for e in errors), errors
    assert "TensorShape=[8]" in errors[0] or "TensorShape=[4]" in errors[0]
    assert "Long" in errors[1] or "Float" in errors[1]
    return True


def test_mismatched_shapes_and_dtypes_detail_mode(tmp_path):
    run_ranks(_mismatch, tmp_path, backend="orccl", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


MISMATCH_SCRIPT = """
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("orccl", init_method={init!r}, rank=rank, world_size=2)
t = torch.ones(4 if rank == 0 else 8, device=torch.device("openreg", rank))
dist.all_reduce(t)
t.cpu()
"""


def test_mismatched_shapes_default_mode_abort_with_message(tmp_path, py):
    # Without the debug mode Gloo itself finds the size mismatch and aborts
    # the process with its message, exactly as for CPU tensors: an error, not
    # a hang.
    script = MISMATCH_SCRIPT.format(init=f"file://{tmp_path}/init")
    with ThreadPoolExecutor(2) as pool:  # the two ranks run at the same time
        procs = list(
            pool.map(
                lambda r: py(
                    script,
                    GLOO_SOCKET_IFNAME="lo",
                    OPENREG_FALLBACK_WARNINGS="0",
                    RANK=str(r),
                ),
                range(2),
            )
        )
    assert all(p.returncode != 0 for p in procs)
    errs = [p.stderr for p in procs]
    assert any("collective mismatch" in e for e in errs), errs


def _stuck_peer(rank, world):
    _init(rank, world, seconds=3)
    if rank == 1:
        time.sleep(10)  # alive but never joins the collective
        return None
    t = torch.ones(4, device=_dev(rank))
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        t.cpu()  # the collective's error is raised at the synchronization
    except RuntimeError as e:
        return str(e), time.monotonic() - start
    raise AssertionError("no timeout")


def _dead_peer(rank, world):
    _init(rank, world, seconds=30)
    # One collective on each backend first: init_process_group returns on a
    # rank once its own meshes are connected, and a peer that died before
    # rank 0 finished connecting would fail init instead of the collective.
    dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1, device=_dev(rank)))
    torch.openreg.synchronize(_dev(rank))
    if rank == 1:
        os._exit(0)  # dies without a word
    time.sleep(2)
    t = torch.ones(4, device=_dev(rank))
    start = time.monotonic()
    try:
        dist.all_reduce(t, async_op=True).wait(timedelta(seconds=30))
    except RuntimeError as e:
        return str(e), time.monotonic() - start
    raise AssertionError("no error")


def test_stuck_peer_times_out(tmp_path):
    init = {"OPENREG_TEST_INIT": f"file://{tmp_path}/init"}
    (msg, seconds), _ = run_ranks(_stuck_peer, tmp_path, backend="none", env=init)
    # Queued, the failure is raised at the wait naming the collective; under
    # OPENREG_LAUNCH_BLOCKING=1 Gloo's own error is raised at the call.
    blocking = os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1"
    assert "imed out" in msg and (blocking or "c10d::allreduce" in msg), msg
    assert seconds < 9, seconds


def test_dead_peer_raises(tmp_path):
    init = {"OPENREG_TEST_INIT": f"file://{tmp_path}/init"}
    out = run_ranks(_dead_peer, tmp_path, backend="none", env=init, world_size=2, allow_exit=(1,))
    msg, seconds = out[0]
    assert "closed by peer" in msg or "Connection" in msg, msg
    assert seconds < 30, seconds
