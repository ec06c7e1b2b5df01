"""The stream sanitizer flags unsynchronized cross-stream and host accesses,
and stays quiet on correctly synchronized programs."""

import time

import pytest
import torch
from conftest import describe

o = torch.openreg
D = "openreg"


@pytest.fixture
def sanitizer():
    o.synchronize()
    o.sanitizer.enable()
    try:
        yield o.sanitizer
    finally:
        o.sanitizer.disable()
        o.synchronize()


def side_stream():
    s = o.Stream()
    s.wait_stream(o.current_stream())
    return s


def test_read_on_another_stream_without_wait_is_flagged(sanitizer):
    x = torch.zeros(1000, device=D)
    s = side_stream()
    with o.stream(s):
        x.add_(1)
    with pytest.raises(sanitizer.StreamRaceError) as info:
        x * 2
    msg = str(info.value)
    assert "aten.mul.Tensor" in msg and "aten.add_.Tensor" in msg
    assert "launched from" in msg and "test_sanitizer.py" in msg
    o.current_stream().wait_stream(s)


def test_write_after_read_on_another_stream_is_flagged(sanitizer):
    x = torch.ones(1000, device=D)
    s = side_stream()
    with o.stream(s):
        y = x * 2
    with pytest.raises(sanitizer.StreamRaceError, match="write by aten.mul_"):
        x.mul_(3)
    o.current_stream().wait_stream(s)
    del y


def test_wait_stream_orders_the_accesses(sanitizer):
    x = torch.zeros(1000, device=D)
    s = side_stream()
    with o.stream(s):
        x.add_(1)
    o.current_stream().wait_stream(s)
    assert (x * 2).sum().item() == 2000


def test_events_order_the_accesses(sanitizer):
    x = torch.zeros(1000, device=D)
    s = side_stream()
    done = o.Event()
    with o.stream(s):
        x.add_(1)
        done.record()
    o.current_stream().wait_event(done)
    assert (x * 2).sum().item() == 2000


def test_record_stream_program_is_clean(sanitizer):
    x = torch.ones(1000, device=D)
    s = side_stream()
    with o.stream(s):
        y = x * 2
    x.record_stream(s)
    del x
    o.current_stream().wait_stream(s)
    assert y.sum().item() == 2000


def test_host_read_of_pending_non_blocking_copy_is_flagged(sanitizer):
    x = torch.ones(1000, device=D)
    pinned = torch.empty(1000).pin_memory()
    pinned.copy_(x, non_blocking=True)
    with pytest.raises(sanitizer.StreamRaceError, match="on the host"):
        pinned.sum()
    o.synchronize()


def test_host_read_after_synchronize_is_clean(sanitizer):
    x = torch.ones(1000, device=D)
    pinned = torch.empty(1000).pin_memory()
    pinned.copy_(x, non_blocking=True)
    o.current_stream().synchronize()
    assert pinned.sum().item() == 1000


def test_enabled_by_environment_variable(py):
    out = py(
        """
        import torch
        print(torch.openreg.sanitizer.is_enabled())
        """,
        OPENREG_SANITIZE_STREAMS="1",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_cross_device_copies_are_not_flagged(sanitizer):
    # A copy between devices is synchronous and ordered on the destination's
    # stream: using the copy right after is not a race (copy_ too).
    a = torch.arange(6.0, device="openreg:1")
    b = a.to("openreg:0")
    assert (-b).cpu().tolist() == [-0.0, -1.0, -2.0, -3.0, -4.0, -5.0]
    c = torch.empty(6, device="openreg:0")
    c.copy_(a)
    assert (c * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    d = torch.empty(6, device="openreg:1")
    d.copy_(b)
    assert (d + 1).cpu()[0].item() == 1.0


# --- a free without record_stream, timing without a synchronization ----------


def test_memory_freed_without_record_stream_and_reused_is_flagged(sanitizer):
    # CUDA's sanitizer reports it: x is read on s, freed, and its block is
    # handed out again on the default stream while s may still read it.
    x = torch.ones(1 << 20, device=D)
    s = side_stream()
    with o.stream(s):
        y = x * 2
    del x
    with pytest.raises(sanitizer.StreamRaceError, match="without record_stream"):
        torch.empty(1 << 20, device=D).fill_(3)
    o.current_stream().wait_stream(s)
    del y


def test_record_stream_before_the_free_is_clean(sanitizer):
    x = torch.ones(1 << 20, device=D)
    s = side_stream()
    with o.stream(s):
        y = x * 2
    x.record_stream(s)
    del x
    z = torch.empty(1 << 20, device=D).fill_(3)
    o.current_stream().wait_stream(s)
    assert y.sum().item() == 2 * (1 << 20) and z.sum().item() == 3 * (1 << 20)


def test_elapsed_time_before_synchronizing_is_flagged(sanitizer):
    start = torch.Event(device=D, enable_timing=True)
    end = torch.Event(device=D, enable_timing=True)
    start.record()
    torch.ones(1000, device=D).mul_(2)
    end.record()
    # Until both events complete PyTorch's own check raises first
    # (c10/core/impl/InlineEvent.h: "Both events must be completed"); once the
    # device is done the time would be read without the host having
    # synchronized with it, which the sanitizer flags. A query() that returns
    # True does not count as a synchronization (elapsed_time itself queries
    # both events before the backend's elapsedTime), nor does it to CUDA's.
    while not end.query():
        time.sleep(0.001)
    with pytest.raises(sanitizer.StreamRaceError, match="elapsed_time"):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) >= 0


ALL_SWITCHES = """
import sys, torch
o = torch.openreg
D = "openreg"
case = sys.argv[1]
try:
    if case == "race":
        x = torch.zeros(1000, device=D)
        s = o.Stream(); s.wait_stream(o.current_stream())
        with o.stream(s):
            x.add_(1)
        y = x * 2
    elif case == "free":
        x = torch.ones(1 << 20, device=D)
        s = o.Stream(); s.wait_stream(o.current_stream())
        with o.stream(s):
            y = x * 2
        del x
        torch.empty(1 << 20, device=D).fill_(3)
    elif case == "elapsed":
        a = torch.Event(device=D, enable_timing=True)
        b = torch.Event(device=D, enable_timing=True)
        a.record(); torch.ones(1000, device=D).mul_(2); b.record()
        a.elapsed_time(b)
    print("CLEAN")
except o.sanitizer.StreamRaceError as e:
    print("FLAGGED", str(e).split(chr(10))[0])
except RuntimeError as e:
    # PyTorch's own check (c10/core/impl/InlineEvent.h, as CUDAEvent.h): an
    # end event still running when elapsed_time is called. It comes before
    # the backend, so the sanitizer sees only the events that completed.
    if "Both events must be completed" not in str(e):
        raise
    print("FLAGGED by PyTorch:", str(e))
"""


@pytest.mark.parametrize("case", ["race", "free", "elapsed"])
@pytest.mark.parametrize("blocking", ["0", "1"])
def test_every_debug_switch_at_once_still_flags_the_bug(py, case, blocking):
    # Blocking launches wait for every kernel; those waits are openreg's own,
    # not the program's, so the sanitizer does not take them for
    # synchronizations (as CUDA's sanitizer under CUDA_LAUNCH_BLOCKING=1).
    out = py(
        ALL_SWITCHES,
        args=[case],
        OPENREG_LAUNCH_BLOCKING=blocking,
        OPENREG_SANITIZE_STREAMS="1",
        OPENREG_FAULTS="delay_kernels:max_us=200",
    )
    assert out.stdout.startswith("FLAGGED"), describe(out)
