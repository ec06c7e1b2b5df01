"""Asynchronous execution: kernels queue on streams, the host runs ahead,
synchronization points wait, and results equal the CPU's."""

import os
import textwrap
import time

import pytest
import torch
from conftest import describe

D = "openreg"

# For the scripts that count threads by name: a thread may end between the
# listing of /proc/self/task and the read of its name (the worker releases
# its OpenMP team's threads; a worker retires when idle), and is skipped.
THREAD_NAMES = """
import os
def thread_names():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass  # ended after the listing
    return names
"""

# The thread driver's worker of device 0 and its OpenMP team's threads,
# counted by name; settled(want) waits (at most 2 s) until they are `want`.
WORKER_TEAM = (
    THREAD_NAMES
    + """
import time, torch
def workers():
    return thread_names().count("openreg0-dflt")
small = torch.ones(64, device="openreg")
def settled(want):
    # One-thread kernels keep the worker from retiring (it does after 10 ms
    # without work; the next launch would start a worker without a team) and
    # start no team. No sleep between them: a sleep that overran 10 ms on a
    # loaded machine let the worker retire.
    deadline = time.monotonic() + 2
    while workers() != want and time.monotonic() < deadline:
        small.add_(1)
    return workers()
"""
)


@pytest.mark.skipif(
    os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1", reason="launches wait in blocking mode"
)
def test_host_returns_before_queued_work_finishes():
    x = torch.ones(4 * 2**20, device=D)
    torch.openreg.synchronize()
    stream = torch.openreg.current_stream()
    for _ in range(40):
        x.mul_(1.0)  # in-place: queued on the current stream
    pending = not stream.query()  # "has the work finished", not "is it queued"
    torch.openreg.synchronize()
    assert stream.query()
    assert pending, "40 in-place passes over 16 MB finished before the host returned"
    assert x.sum().item() == 4 * 2**20


def test_results_equal_cpu_on_default_and_side_streams():
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def program(dev):
        x, y = a.to(dev), b.to(dev)
        z = torch.empty_like(x)
        torch.mul(x, y, out=z)
        z.add_(x).sub_(y * 0.5).clamp_(-1, 1)
        return (z @ y).sum(0)

    expected = program("cpu")
    torch.testing.assert_close(program(D).cpu(), expected)
    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        result = program(D)
    torch.openreg.current_stream().wait_stream(side)
    torch.testing.assert_close(result.cpu(), expected)


def test_backward_on_a_side_stream_gives_cpu_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    dev_model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).to(D)
    dev_model.load_state_dict(model.state_dict())
    x = torch.randn(32, 8)
    model(x).pow(2).mean().backward()
    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        dev_model(x.to(D)).pow(2).mean().backward()
    torch.openreg.current_stream().wait_stream(side)
    for p_cpu, p_dev in zip(model.parameters(), dev_model.parameters(), strict=True):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad)


def test_non_blocking_copies_with_pinned_memory():
    src = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    dev = src.to(D, non_blocking=True)
    back = torch.empty_like(src).pin_memory()
    back.copy_(dev * 2, non_blocking=True)
    torch.openreg.synchronize()  # required before the host reads `back`
    assert torch.equal(back, src * 2)


def test_event_timing_is_plausible():
    x = torch.ones(2**20, device=D)
    start = torch.openreg.Event(enable_timing=True)
    end = torch.openreg.Event(enable_timing=True)
    torch.openreg.synchronize()
    t0 = time.perf_counter()
    start.record()
    for _ in range(50):
        x.mul_(1.0)
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    elapsed = start.elapsed_time(end)
    assert 0 < elapsed <= wall_ms + 1.0, (elapsed, wall_ms)
    assert start.query() and end.query()


def test_stream_priorities_and_external_ids():
    high = torch.openreg.Stream(priority=-1)
    low = torch.openreg.Stream(priority=0)
    clamped = torch.openreg.Stream(priority=-7)
    assert (high.priority, low.priority, clamped.priority) == (-1, 0, -1)
    same = torch.openreg.Stream(
        stream_id=high.stream_id, device_index=high.device_index, device_type=high.device_type
    )
    assert same == high and same.priority == -1
    assert torch.openreg.default_stream().stream_id == 0
    assert torch.openreg.default_stream(1).device_index == 1


def test_accelerator_stream_functions():
    s = torch.openreg.Stream()
    prev = torch.accelerator.current_stream()
    torch.accelerator.set_stream(s)
    try:
        assert torch.accelerator.current_stream() == s
        assert torch.openreg.current_stream() == s
    finally:
        torch.accelerator.set_stream(prev)
    torch.accelerator.synchronize()
    assert s.query()


PROGRAM = """
import torch
torch.manual_seed(0)
x = torch.randn(256, 256).to("openreg")
w = torch.randn(256, 256).to("openreg")
side = torch.openreg.Stream()
# Each step's sum, kept on the device (no synchronization): a mismatch says
# where the device first computed other bits (a one-ulp difference grows to
# about 1 in the final sums over the five steps).
steps = [x.double().sum(), w.double().sum()]
for i in range(5):
    x = (x @ w).tanh_()
    x.mul_(1.5).add_(0.1)
    steps.append(x.double().sum())
side.wait_stream(torch.openreg.current_stream())
with torch.openreg.stream(side):
    y = x * 2
torch.openreg.current_stream().wait_stream(side)
print(repr(y.sum().item()), repr(x.cpu().double().sum().item()))
print(*(repr(s.item()) for s in steps))
"""


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_launch_blocking_gives_the_same_results(py, blocking):
    cpu = py(
        PROGRAM.replace('.to("openreg")', "")
        .replace("torch.openreg.Stream()", "None")
        .replace("side.wait_stream(torch.openreg.current_stream())", "")
        .replace("with torch.openreg.stream(side):", "if True:")
        .replace("torch.openreg.current_stream().wait_stream(side)", "")
    )
    dev = py(PROGRAM, OPENREG_LAUNCH_BLOCKING=blocking)
    assert cpu.returncode == 0, describe(cpu)
    assert dev.returncode == 0, describe(dev)
    assert dev.stdout == cpu.stdout


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_a_kernel_failure_says_where_it_is_raised(py, blocking):
    # Queued, the failure comes at the next synchronization and the message
    # says how to get it at the launch; with OPENREG_LAUNCH_BLOCKING=1 it
    # comes at the launch of the failing kernel, and says so.
    out = py(
        """
        import torch
        a = torch.ones(64, 64, device="openreg")
        b = torch.empty(64, 64, device="openreg")
        with torch.openreg.faults.fail_kernel("aten::copy_"):
            try:
                b.copy_(a)  # a named kernel with both drivers
                print("launched")
                torch.openreg.synchronize()
            except torch.AcceleratorError as e:
                print(str(e).replace("\\n", " "))
        """,
        OPENREG_LAUNCH_BLOCKING=blocking,
    )
    assert out.returncode == 0, describe(out)
    assert "failed on the device" in out.stdout, out.stdout
    if blocking == "1":
        assert "launched" not in out.stdout
        assert "OPENREG_LAUNCH_BLOCKING=1: the failure is raised at the launch" in out.stdout
    else:
        assert out.stdout.startswith("launched")
        assert "Set OPENREG_LAUNCH_BLOCKING=1 to raise it at the launch" in out.stdout


@pytest.mark.skipif(
    os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1", reason="launches wait in blocking mode"
)
def test_reductions_matmul_and_norms_are_queued_too():
    x = torch.ones(1024, 1024, device=D)
    w = torch.ones(1024, 256, device=D)
    ops = {
        "sum": lambda: x.sum(0),
        "matmul": lambda: x @ w,
        "softmax": lambda: torch.softmax(x, 1),
        "layer_norm": lambda: torch.nn.functional.layer_norm(x, (1024,)),
    }
    stream = torch.openreg.current_stream()
    for name, op in ops.items():
        expected = op().cpu()  # first call: shapes learned, result checked
        torch.openreg.synchronize()
        results = [op() for _ in range(8)]
        pending = not stream.query()
        assert pending, f"{name}: the host waited for the device"
        for r in results:
            torch.testing.assert_close(r.cpu(), expected)


def test_resize_on_a_side_stream_keeps_pending_writes():
    # Growing a storage copies the old bytes; the copy must follow the
    # kernels still queued on the current (side) stream.
    n = 1 << 22
    s = torch.openreg.Stream()
    with torch.openreg.stream(s):
        x = torch.zeros(n, device="openreg")
        for _ in range(5):
            x.add_(1)
        x.resize_(n + 1)
        head = x[:n].clone()
    torch.openreg.synchronize()
    assert torch.equal(head.cpu(), torch.full((n,), 5.0))
    # The same through the storage API (the hooks' resizePrivateUse1Bytes).
    with torch.openreg.stream(s):
        y = torch.zeros(n, device="openreg")
        y.add_(2)
        y.untyped_storage().resize_(8 * n)
        grown = torch.empty(0, device="openreg").set_(y.untyped_storage(), 0, (n,))
        got = grown.clone()
    torch.openreg.synchronize()
    assert torch.equal(got.cpu(), torch.full((n,), 2.0))


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_set_num_threads_limits_the_device_kernels(py, blocking):
    # torch.set_num_threads caps the OpenMP team a kernel gets on the stream
    # worker, as it caps the CPU kernels of the calling thread. An OpenMP
    # team thread takes its creator's name, so while the worker is busy the
    # process has one "openreg0-dflt" thread, not two.
    out = py(
        THREAD_NAMES
        + textwrap.dedent(
            """
        import os, torch
        torch.set_num_threads(1)
        def workers():
            return thread_names().count("openreg0-dflt")
        x = torch.randn(1024, 1024).to("openreg")
        for _ in range(20):
            y = x @ x
        busy = workers()  # the matmuls are still running (or blocking mode)
        torch.openreg.synchronize()
        ok = torch.allclose(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-3)
        print(busy, ok)
        """
        ),
        OPENREG_LAUNCH_BLOCKING=blocking,
    )
    assert out.returncode == 0, out.stderr
    busy, ok = out.stdout.split()
    assert int(busy) <= 1 and ok == "True"


@pytest.mark.skipif(
    os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1", reason="launches wait in blocking mode"
)
@pytest.mark.parametrize("side", [64, 128])
def test_non_blocking_copy_from_pageable_memory_is_staged(side):
    # As CUDA's driver: the bytes are captured at the call and the copy is
    # queued; the host waits neither for the copy nor for the stream's
    # earlier work. Later changes to the source do not reach it. Up to
    # OR_MAX_INLINE_COPY_BYTES (32 KiB: side 64) the bytes travel in the
    # queued command; above (side 128: 64 KiB), through pinned memory.
    x = torch.randn(256, 256, device=D)
    torch.full((side, side), 0.0).to(D, non_blocking=True)  # first runs learnt here
    x @ x
    torch.openreg.synchronize()
    sources = [torch.full((side, side), float(i)) for i in range(40)]
    torch.openreg._reset_launch_stats()
    pinned = torch.openreg.host_memory_stats()["allocated_bytes.allocated"]
    y = x @ x  # queued work ahead of the copies
    copies = []
    for src in sources:
        copies.append(src.to(D, non_blocking=True))
        src.fill_(-1.0)  # the caller reuses its buffer at once
    stats = torch.openreg._launch_stats()
    staged = torch.openreg.host_memory_stats()["allocated_bytes.allocated"] - pinned
    assert stats["host_waits"] == 0, stats
    for i, c in enumerate(copies):
        assert torch.equal(c.cpu(), torch.full((side, side), float(i)))
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())
    assert (staged > 0) == (side * side * 4 > 32768), staged
    # A blocking copy from pageable memory still waits for the stream.
    torch.openreg._reset_launch_stats()
    torch.ones(8).to(D)
    assert torch.openreg._launch_stats()["host_waits"] >= 1


def test_non_blocking_staged_copy_keeps_dtype_and_layout_rules():
    # Copies that are not a plain memcpy (dtype change, non-contiguous) take
    # the general path; values equal the CPU's.
    src = torch.arange(24, dtype=torch.float64).view(4, 6)
    assert torch.equal(src.t().to(D, non_blocking=True).cpu(), src.t())
    dst = torch.empty(4, 6, dtype=torch.float32, device=D)
    dst.copy_(src, non_blocking=True)
    assert torch.equal(dst.cpu(), src.float())


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="no OpenMP team with one thread")
def test_a_launch_on_a_team_releases_the_host_threads_team(py):
    # A host thread that ran a CPU parallel region keeps its OpenMP team's
    # threads, which on a machine with few cores makes libgomp put the
    # device's team to sleep after each region (aten/OpenRegLaunch.cpp,
    # release_host_team). A launch of a kernel that may use a team ends the
    # launching thread's idle team; a small kernel's launch leaves it. The
    # team's threads take the name of the thread that starts them.
    out = py(
        THREAD_NAMES
        + textwrap.dedent(
            """
        import os, time, torch
        main = open(f"/proc/self/task/{os.getpid()}/comm").read().strip()
        def named_as_main():
            return thread_names().count(main)
        def settled(want):
            deadline = time.monotonic() + 10
            while team() != want and time.monotonic() < deadline:
                time.sleep(0.01)
            return team()
        small = torch.arange(1024, dtype=torch.float32)  # no parallel region
        dsmall = small.to("openreg")
        s = (dsmall + dsmall).cpu()  # the device is up, its threads started
        base = named_as_main()
        def team():
            return named_as_main() - base
        before = team()
        big = torch.arange(1 << 20, dtype=torch.float32)  # a parallel region
        ran = team()
        s = (dsmall + dsmall).cpu()
        after_small = team()
        dbig = big.to("openreg")
        b = (dbig * 3).cpu()
        after_big = settled(0)
        host = (big * 3).sum().item()  # the host's team starts again
        print(before, ran, after_small, after_big, team(),
              host == float((dbig * 3).sum().item()),
              torch.equal(s, small + small), torch.equal(b, big * 3))
        """
        )
    )
    assert out.returncode == 0, out.stderr
    before, ran, after_small, after_big, rerun, *ok = out.stdout.split()
    assert (before, ran, after_small) == ("0", "1", "1"), out.stdout
    # A device process has an OpenMP runtime of its own, and the process
    # driver's staged kernels run on the host's team: nothing to release.
    released = "1" if torch.openreg._named_kernels_only() else "0"
    assert (after_big, rerun) == (released, "1"), out.stdout
    assert ok == ["True"] * 3, out.stdout


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="no OpenMP team with one thread")
def test_elementwise_kernels_leave_a_running_host_a_thread(py):
    # A kernel whose bits do not depend on its thread count (add, mul, ...:
    # kTeamSizeFree in aten/fallback/OpenRegOpTraits.cpp) runs on one thread
    # fewer while the host runs its own work (orKernelContext::team_threads),
    # in deterministic mode too,
    # and after four such kernels in a row the worker ends its idle OpenMP
    # team, whose threads would spin on the host's core
    # (kernels/OpenRegKernelLibrary.cpp, call_threads). The team's threads
    # take the worker's name.
    out = py(
        WORKER_TEAM
        + textwrap.dedent(
            """
        cpu = torch.linspace(-3, 3, (1 << 20) + 13)
        x = cpu.to("openreg")
        x.clone().mul_(1.5)  # each signature's first call runs at once
        small.add_(1)
        e = x.exp()  # not one of them: a team of every thread
        torch.openreg.synchronize()
        with_team = workers()
        for _ in range(8):
            x.mul_(1.5)
        stream = torch.openreg.current_stream()
        deadline = time.monotonic() + 10
        while not stream.query() and time.monotonic() < deadline:
            pass  # the host runs: it never waits in the driver
        after = settled(with_team - 1)
        # In deterministic mode exp keeps every thread (outside it, it may run
        # on fewer too: doc:fewer-threads in aten/fallback/OpenRegOpTraits.cpp).
        torch.use_deterministic_algorithms(True)
        e2 = x.exp()
        torch.openreg.synchronize()
        again = workers()
        want = cpu.clone()
        for _ in range(8):
            want.mul_(1.5)
        print(with_team, after, again, torch.equal(x.cpu(), want),
              torch.equal(e.cpu(), cpu.exp()), torch.equal(e2.cpu(), want.exp()))
        """
        )
    )
    assert out.returncode == 0, out.stderr
    with_team, after, again, *ok = out.stdout.split()
    assert ok == ["True"] * 3, out.stdout
    if torch.openreg._named_kernels_only():
        return  # the kernels run in the device's process
    assert with_team == "2", out.stdout  # the worker and its team's thread
    if os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1":
        # Every launch waits for its kernel: the host never runs beside it.
        assert (after, again) == ("2", "2"), out.stdout
    else:
        assert (after, again) == ("1", "2"), out.stdout


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="no OpenMP team with one thread")
@pytest.mark.parametrize("deterministic", [False, True])
def test_products_leave_a_running_host_a_thread_outside_deterministic_mode(py, deterministic):
    # Outside deterministic mode every queued call may run on one thread
    # fewer while the host runs its own work, matrix products included, whose
    # partial sums (and so their last bits) follow the team; in it a product
    # keeps the launch's team and gives the CPU's bits (doc:fewer-threads in
    # aten/fallback/OpenRegOpTraits.cpp). Four one-thread kernels in a row
    # end the worker's idle team (call_threads), which the test counts.
    out = py(
        WORKER_TEAM
        + textwrap.dedent(
            f"""
        a_cpu = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
        want = a_cpu @ a_cpu
        a = a_cpu.to("openreg")
        small.add_(1)
        # A team of every thread: exp is not team-size-free, and in
        # deterministic mode it keeps the launch's thread count.
        torch.use_deterministic_algorithms(True)
        torch.linspace(-3, 3, 1 << 20, device="openreg").exp()
        first = a @ a
        torch.openreg.synchronize()
        with_team = workers()
        torch.use_deterministic_algorithms({deterministic})
        products = [a @ a for _ in range(8)]
        stream = torch.openreg.current_stream()
        deadline = time.monotonic() + 10
        while not stream.query() and time.monotonic() < deadline:
            pass  # the host runs: it never waits in the driver
        after = settled(with_team - 1 if not {deterministic} else with_team)
        got = [p.cpu() for p in products]
        close = all(torch.allclose(g, want, rtol=1e-5, atol=1e-4) for g in got)
        exact = all(torch.equal(g, want) for g in got)
        print(with_team, after, torch.equal(first.cpu(), want), close, exact)
        """
        )
    )
    assert out.returncode == 0, out.stderr
    with_team, after, first_exact, close, exact = out.stdout.split()
    assert (first_exact, close) == ("True", "True"), out.stdout
    if deterministic:
        assert exact == "True", out.stdout  # the CPU's bits
    if torch.openreg._named_kernels_only():
        return  # the kernels run in the device's process
    assert with_team == "2", out.stdout
    if deterministic or os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1":
        assert after == "2", out.stdout  # the products kept their team
    else:
        assert after == "1", out.stdout  # they ran on the worker alone


@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a * b,
        lambda a, b: a / b,
        lambda a, b: -a,
        lambda a, b: a * 0.3,
        lambda a, b: torch.add(a, b, alpha=2.5),
        lambda a, b: a.exp(),
        lambda a, b: torch.nn.functional.gelu(a),
    ],
    ids=["add", "sub", "mul", "div", "neg", "mul-scalar", "add-alpha", "exp", "gelu"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "default"])
def test_large_elementwise_kernels_beside_a_running_host_give_the_cpus_bits(
    op, dtype, deterministic
):
    # In deterministic mode, whether the host runs or waits decides how many
    # threads an elementwise kernel gets, never its bits: an odd length puts
    # each thread's last elements in ATen's scalar loop, which some operators
    # round differently from the vectorized one; those keep their thread
    # count. Outside it they may run on one thread fewer too, and give the
    # CPU's values (doc:fewer-threads in aten/fallback/OpenRegOpTraits.cpp).
    torch.use_deterministic_algorithms(deterministic)
    try:
        _elementwise_beside_a_running_host(op, dtype, deterministic)
    finally:
        torch.use_deterministic_algorithms(False)


def _elementwise_beside_a_running_host(op, dtype, deterministic):
    g = torch.Generator().manual_seed(0)
    n = (1 << 18) + 13
    a = torch.randn(n, generator=g).to(dtype)
    b = (torch.rand(n, generator=g) + 0.5).to(dtype)
    try:
        want = op(a, b)
    except RuntimeError:
        pytest.skip("not a CPU operator for this dtype")
    da, db = a.to("openreg"), b.to("openreg")
    results = [op(da, db) for _ in range(6)]  # the host runs meanwhile
    spin = sum(i * i for i in range(20000))
    assert spin > 0
    for r in results:
        if deterministic:
            assert torch.equal(r.cpu(), want)
        else:
            torch.testing.assert_close(r.cpu(), want)
