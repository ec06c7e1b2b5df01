"""openreg and multiprocessing: fork after/before initialisation, spawn workers.

Spawned children import this module to find their target, so it keeps its
imports light: no conftest import (the subprocess helper comes as the ``py``
fixture).
"""

import multiprocessing
import queue

import pytest
import torch

CHILD_TIMEOUT_S = 120


# ---------------------------------------------------------------------------
# Targets (module level so that spawned children can import them)


def _fork_child_uses_device(q):
    try:
        torch.ones(1, device="openreg")
    except Exception as e:  # report it back to the parent
        q.put(("raised", type(e).__name__, str(e)))
    else:
        q.put(("no error", "", ""))


def _fork_child_cpu_only(q):
    try:
        torch.manual_seed(3)  # what DataLoader workers do; must skip openreg
        x = torch.randn(4) @ torch.randn(4)
        q.put(
            (
                "ok",
                torch.openreg.is_initialized(),
                torch.openreg._is_in_bad_fork(),
                torch.openreg.device_count(),
                float(x),
            )
        )
    except Exception as e:
        q.put(("raised", f"{type(e).__name__}: {e}"))


def _spawn_worker(args):
    index, data = args
    device = f"openreg:{index}"
    x = data.to(device)
    y = (x @ x.t()).relu() + index
    return str(y.device), torch.openreg.current_device(), y.cpu()


def _get(q):
    try:
        return q.get(timeout=CHILD_TIMEOUT_S)
    except queue.Empty:
        pytest.fail("the child process reported nothing (hung or crashed)")


def _run_fork_child(target):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(q,))
    p.start()
    try:
        result = _get(q)
    finally:
        p.join(CHILD_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join()
    return result, p.exitcode


# ---------------------------------------------------------------------------
# Fork after initialisation


def test_fork_after_initialisation_child_cannot_use_device():
    x = torch.arange(4.0, device="openreg") * 2  # the parent is initialised
    assert torch.openreg.is_initialized()
    (status, exc_type, message), exitcode = _run_fork_child(_fork_child_uses_device)
    assert status == "raised", "a forked child must not use openreg"
    assert exc_type == "RuntimeError"
    assert "forked subprocess" in message
    assert "spawn" in message  # and says what to do instead
    assert exitcode == 0
    # The parent is unaffected.
    assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert (x + 1).sum().item() == 16.0


def test_fork_after_initialisation_child_can_use_cpu_and_seed():
    torch.ones(1, device="openreg")
    result, exitcode = _run_fork_child(_fork_child_cpu_only)
    assert result[0] == "ok", result
    _, initialised, bad_fork, count, _value = result
    assert initialised is False and bad_fork is True
    assert count == 2
    assert exitcode == 0


# ---------------------------------------------------------------------------
# Spawn


def test_spawn_children_use_devices():
    data = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map_async(_spawn_worker, [(0, data), (1, data)]).get(CHILD_TIMEOUT_S)
    for index, (device, current, y) in enumerate(results):
        assert device == f"openreg:{index}"
        assert current == 0  # the guard of the op restored the current device
        torch.testing.assert_close(y, (data @ data.t()).relu() + index)


# ---------------------------------------------------------------------------
# Fork before initialisation


def test_fork_before_initialisation_child_can_use_device(py):
    proc = py(
        """
        import multiprocessing, torch

        def child(q):
            try:
                x = torch.arange(4.0, device="openreg:1") * 3
                q.put(("ok", str(x.device), x.cpu().tolist()))
            except Exception as e:
                q.put(("raised", type(e).__name__, str(e)))

        if __name__ == "__main__":
            assert torch.openreg.device_count() == 2      # reads the configuration only
            assert not torch.openreg.is_initialized()
            ctx = multiprocessing.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            print(q.get(timeout=60))
            p.join(60)
            print("exitcode", p.exitcode)
            # The parent can still initialise and use the devices afterwards.
            print("parent", torch.ones(2, device="openreg").sum().item())
        """,
        timeout=CHILD_TIMEOUT_S,
    )
    detail = f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, detail
    assert proc.stdout.splitlines() == [
        "('ok', 'openreg:1', [0.0, 3.0, 6.0, 9.0])",
        "exitcode 0",
        "parent 2.0",
    ], detail
