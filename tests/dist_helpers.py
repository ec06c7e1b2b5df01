"""Running a function on N ranks in spawned processes, for test_distributed.py.

Each rank is a fresh ``spawn`` process that joins a process group through a
file in pytest's ``tmp_path`` (no TCP store) with Gloo bound to the loopback
interface, uses ``openreg:rank`` and runs ``fn(rank, world_size, *args)``.
The parent waits at most ``timeout`` seconds, kills what is left, and
re-raises the first rank's error with its traceback.
"""

import os
import queue
import time
import traceback

import torch.multiprocessing as mp


def _entry(fn, rank, world_size, init_file, backend, args, results, env):
    os.environ.update(env)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        import torch
        import torch.distributed as dist

        torch.openreg.set_device(rank % torch.openreg.device_count())
        if backend != "none":
            dist.init_process_group(
                backend=backend,
                init_method=f"file://{init_file}",
                rank=rank,
                world_size=world_size,
            )
        value = fn(rank, world_size, *args)
        if backend != "none" and dist.is_initialized():
            dist.destroy_process_group()
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001  (reported to the parent)
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(
    fn, tmp_path, *args, world_size=2, backend=None, timeout=120, env=None, allow_exit=()
):
    """Runs fn on world_size ranks; returns the list of their return values.

    backend=None calls init_process_group() without a backend; "none" makes no
    process group (fn does it itself). Ranks in allow_exit may exit without
    a result (their value is None).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_file = tmp_path / f"init-{time.monotonic_ns()}"
    procs = [
        ctx.Process(
            target=_entry,
            args=(fn, r, world_size, init_file, backend, args, results, dict(env or {})),
        )
        for r in range(world_size)
    ]
    # The environment is inherited at start, before the child imports torch
    # (settings such as TORCH_DISTRIBUTED_DEBUG are read at import).
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        for p in procs:
            p.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    deadline = time.monotonic() + timeout
    out = {}
    try:
        while len(out) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                left = sorted(set(range(world_size)) - set(out))
                raise TimeoutError(f"ranks {left} still running after {timeout} s")
            try:
                rank, status, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                for r in allow_exit:
                    if procs[r].exitcode is not None and r not in out:
                        out[r] = None
                dead = [
                    r
                    for r, p in enumerate(procs)
                    if p.exitcode is not None and r not in out and r not in allow_exit
                ]
                if dead:
                    raise RuntimeError(
                        f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}"
                    ) from None
                continue
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world_size)]
