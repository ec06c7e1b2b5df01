"""torch.distributed on openreg: the orccl backend (Gloo over device memory).

Every check runs in spawned processes (tests/dist_helpers.py) joined through
a file in tmp_path, Gloo on the loopback interface. Each collective on
openreg tensors is compared with the same collective on CPU tensors through
plain Gloo in the same process group.
"""

import time

import torch
import torch.distributed as dist
from dist_helpers import run_ranks

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

    # Non-contiguous input: refused with a clear message (like Gloo on CPU).
    nc = torch.ones(4, 4, device=d).t()[:, :2]
    try:
        dist.all_reduce(nc)
    except (RuntimeError, ValueError) as e:
        assert "contiguous" in str(e), e
    else:
        raise AssertionError("non-contiguous input accepted")
    return True


def test_collectives_match_cpu(tmp_path):
    run_ranks(_collectives, tmp_path, timeout=170)


def test_stream_ordering_async_and_errors(tmp_path):
    run_ranks(_stream_semantics, tmp_path, timeout=120)
