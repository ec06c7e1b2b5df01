"""Distributed: ``torch.distributed`` collectives on device tensors.

Whether the backend has a c10d backend is found by trying: a one-rank group
(``init_process_group()`` with no backend, as device-agnostic code calls it)
runs an ``all_reduce`` on a device tensor. If that fails and PyTorch has no
c10d backend registered for the device type
(``torch.distributed.Backend.default_device_backend_map``), every check here
is skipped with the error; if a backend is registered, the error is a
failure. When the probe works, two processes on 127.0.0.1 (Gloo's transport
pinned to the loopback interface, a file store in a temporary directory)
run real collectives with a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import torch

from .core import Context, Failure, Skip, check, expect, expect_equal, topic

T = topic("distributed", "Distributed (c10d)")

TIMEOUT_S = 90


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _probe(ctx: Context) -> None:
    """Raises Skip (no capability) or Failure (registered but broken); caches success."""
    if "distributed_probe" not in ctx.scratch:
        ctx.scratch["distributed_probe"] = _run_probe(ctx)
    kind, message = ctx.scratch["distributed_probe"]
    if kind == "skip":
        raise Skip(message)
    if kind == "fail":
        raise Failure(message)


def _run_probe(ctx: Context) -> tuple[str, str]:
    import torch.distributed as dist

    if not dist.is_available():
        return "skip", "torch.distributed is not available in this PyTorch build"
    registered = dist.Backend.default_device_backend_map.get(ctx.name)
    saved = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
        try:
            t = torch.full((4,), 3.0, device=ctx.name)
            dist.all_reduce(t)
            got = t.cpu().tolist()
        finally:
            dist.destroy_process_group()
    except Exception as e:
        if registered is None:
            return "skip", (
                f"no c10d backend for {ctx.name!r} (none registered in "
                f"Backend.default_device_backend_map); a one-rank all_reduce failed with "
                f"{_first_line(e)}"
            )
        return (
            "fail",
            f"backend {registered!r} is registered, but a one-rank all_reduce: {_first_line(e)}",
        )
    finally:
        if saved is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = saved
    if got != [3.0] * 4:
        return "fail", f"a one-rank all_reduce changed the values to {got}"
    return "ok", ""


_RANK_PROGRAM = r"""
import importlib, json, sys, datetime
import torch
import torch.distributed as dist
for m in IMPORTS:
    importlib.import_module(m)
rank, world, store_path, name = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3]
mod = torch.get_device_module(name)
dev = torch.device(name, rank % mod.device_count())
mod.set_device(dev.index)
dist.init_process_group(init_method="file://" + store_path, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
out = {}
def record(key, fn):
    try:
        out[key] = fn()
    except Exception as e:
        out[key] = "error: %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
def all_reduce():
    t = torch.full((5,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    return [t.device.type, t.cpu().tolist()]
def broadcast():
    t = torch.arange(4.0, device=dev) * (10 if rank == 0 else -1)
    dist.broadcast(t, src=0)
    return t.cpu().tolist()
def all_gather():
    t = torch.full((2,), float(rank), device=dev)
    o = torch.empty(4, device=dev)
    dist.all_gather_into_tensor(o, t)
    return o.cpu().tolist()
def cpu_in_same_group():
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    return t.tolist()
def async_op():
    t = torch.full((3,), float(rank + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    return (t * 2).cpu().tolist()
record("all_reduce", all_reduce)
record("broadcast", broadcast)
record("all_gather", all_gather)
record("cpu_in_same_group", cpu_in_same_group)
record("async_op", async_op)
record("barrier", lambda: dist.barrier() or "ok")
dist.destroy_process_group()
print("@@ranks@@" + json.dumps(out), flush=True)
"""


def _two_ranks(ctx: Context) -> list[dict]:
    _probe(ctx)
    if "distributed_ranks" in ctx.scratch:
        return ctx.scratch["distributed_ranks"]
    program = f"IMPORTS = {ctx.imports!r}\n" + textwrap.dedent(_RANK_PROGRAM)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="conformance-dist-") as tmp:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", program, str(r), os.path.join(tmp, "store"), ctx.name],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp,
                env=env,
            )
            for r in range(2)
        ]
        results = []
        try:
            for r, p in enumerate(procs):
                stdout, stderr = p.communicate(timeout=TIMEOUT_S)
                line = next((x for x in stdout.splitlines() if x.startswith("@@ranks@@")), None)
                if line is None:
                    tail = " / ".join(stderr.strip().splitlines()[-3:])
                    raise Failure(f"rank {r} exited with {p.returncode} before reporting: {tail}")
                results.append(json.loads(line[len("@@ranks@@") :]))
        except subprocess.TimeoutExpired:
            raise Failure(f"the two ranks did not finish within {TIMEOUT_S} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    ctx.scratch["distributed_ranks"] = results
    return results


def _per_rank(ctx: Context, key: str, expected) -> None:
    for r, res in enumerate(_two_ranks(ctx)):
        expect_equal(res.get(key), expected(r), f"rank {r} {key}")


@check(T)
def default_backend_for_device(ctx: Context) -> None:
    """init_process_group() without a backend picks one that runs an all_reduce on a
    NAME tensor (one rank)."""
    _probe(ctx)


@check(T)
def backend_registered(ctx: Context) -> None:
    """torch.distributed.Backend.default_device_backend_map names a backend for NAME."""
    _probe(ctx)
    import torch.distributed as dist

    expect(
        ctx.name in dist.Backend.default_device_backend_map,
        f"map: {dist.Backend.default_device_backend_map}",
    )


@check(T)
def two_rank_all_reduce(ctx: Context) -> None:
    """Two processes on 127.0.0.1: all_reduce(SUM) of 1s and 2s gives 3s on the device."""
    _per_rank(ctx, "all_reduce", lambda r: [ctx.name, [3.0] * 5])


@check(T)
def two_rank_broadcast(ctx: Context) -> None:
    """Two processes: broadcast from rank 0 gives rank 0's values everywhere."""
    _per_rank(ctx, "broadcast", lambda r: [0.0, 10.0, 20.0, 30.0])


@check(T)
def two_rank_all_gather(ctx: Context) -> None:
    """Two processes: all_gather_into_tensor concatenates the ranks' tensors in order."""
    _per_rank(ctx, "all_gather", lambda r: [0.0, 0.0, 1.0, 1.0])


@check(T)
def cpu_and_device_one_group(ctx: Context) -> None:
    """The default group also reduces CPU tensors (as "cpu:gloo,cuda:nccl" does)."""
    _per_rank(ctx, "cpu_in_same_group", lambda r: [3.0] * 3)


@check(T)
def async_work_wait(ctx: Context) -> None:
    """all_reduce(async_op=True).wait() orders later device work after the collective."""
    _per_rank(ctx, "async_op", lambda r: [6.0] * 3)


@check(T)
def barrier(ctx: Context) -> None:
    """barrier() returns on both ranks."""
    _per_rank(ctx, "barrier", lambda r: "ok")
