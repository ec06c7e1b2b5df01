"""Streams and events on openreg through torch.Stream, torch.Event and torch.accelerator."""

import threading

import pytest
import torch

D = "openreg"


def _work(device=D, n=128, reps=4):
    """Some device work with a known result: returns (tensor, expected CPU value)."""
    x = torch.full((n, n), 1.0 / n, device=device)
    y = x
    for _ in range(reps):
        y = y @ x
    return y, torch.full((n, n), 1.0 / n)


# ---------------------------------------------------------------------------
# Streams


def test_stream_creation():
    s = torch.Stream(device=D)
    assert s.device_type == torch.Stream(device="openreg:0").device_type
    assert s.device == torch.device("openreg:0") and s.device_index == 0
    assert s.stream_id != 0  # not the default stream
    s1 = torch.Stream(device="openreg:1")
    assert s1.device == torch.device("openreg:1")
    high = torch.Stream(device=D, priority=-1)
    assert high.device_index == 0
    assert s.query() is True  # nothing queued
    s.synchronize()
    assert "openreg" in repr(s)


def test_current_stream_is_default_stream():
    cur = torch.accelerator.current_stream()
    assert cur.device == torch.device("openreg:0")
    assert cur.stream_id == 0
    assert torch.accelerator.current_stream(1).device == torch.device("openreg:1")
    assert torch.accelerator.current_stream() == torch.accelerator.current_stream(0)
    with torch.openreg.device(1):
        assert torch.accelerator.current_stream().device_index == 1


def test_stream_query_and_synchronize_after_work():
    s = torch.accelerator.current_stream()
    y, expected = _work()
    s.synchronize()
    assert s.query() is True
    torch.testing.assert_close(y.cpu(), expected)


def test_stream_context_manager_and_set_stream():
    s = torch.Stream(device=D)
    default = torch.accelerator.current_stream()
    with s:
        assert torch.accelerator.current_stream() == s
        y, expected = _work()
    assert torch.accelerator.current_stream() == default
    s.synchronize()
    torch.testing.assert_close(y.cpu(), expected)

    torch.accelerator.set_stream(s)
    try:
        assert torch.accelerator.current_stream() == s
        z = torch.arange(4.0, device=D) * 3
    finally:
        torch.accelerator.set_stream(default)
    assert torch.accelerator.current_stream() == default
    # z was produced on s: the default stream must wait for s before reading
    # it (without this the read races the kernel, as it would on a GPU).
    default.wait_stream(s)
    assert z.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]


def test_stream_on_other_device_context():
    s1 = torch.Stream(device="openreg:1")
    with s1:
        # Entering a stream of openreg:1 makes it current on that device.
        assert torch.accelerator.current_stream(1) == s1
        x = torch.ones(3, device="openreg:1") * 5
    assert torch.accelerator.current_stream(1).stream_id == 0
    s1.synchronize()
    assert x.cpu().tolist() == [5.0, 5.0, 5.0]


def test_current_stream_is_thread_local():
    s = torch.Stream(device=D)
    seen = {}

    def worker():
        seen["before"] = torch.accelerator.current_stream().stream_id
        torch.accelerator.set_stream(s)
        seen["after"] = torch.accelerator.current_stream() == s

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert seen == {"before": 0, "after": True}
    assert torch.accelerator.current_stream().stream_id == 0


def test_many_streams_and_pool_streams():
    streams = [torch.Stream(device=D) for _ in range(6)]
    assert len({s.stream_id for s in streams}) == 6
    results = []
    for i, s in enumerate(streams):
        with s:
            results.append(torch.full((4,), float(i), device=D) + 1)
    for s in streams:
        s.synchronize()
    assert [r.cpu()[0].item() for r in results] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


# ---------------------------------------------------------------------------
# Events


def test_event_record_synchronize_query_elapsed_time():
    start = torch.Event(device=D, enable_timing=True)
    end = torch.Event(device=D, enable_timing=True)
    assert start.query() is True  # never recorded: complete by definition
    start.record()
    y, expected = _work(reps=6)
    end.record()
    end.synchronize()
    assert start.query() is True and end.query() is True
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms >= 0.0
    assert end.device == torch.device("openreg:0")
    torch.testing.assert_close(y.cpu(), expected)


def test_event_record_on_explicit_stream():
    s = torch.Stream(device=D)
    e = torch.Event(device=D, enable_timing=True)
    with s:
        y, expected = _work()
    e.record(s)
    e.synchronize()
    assert e.query() is True
    s.synchronize()
    assert s.query() is True
    torch.testing.assert_close(y.cpu(), expected)
    e2 = s.record_event()
    assert isinstance(e2, torch.Event)
    e2.synchronize()
    assert e2.query() is True


def test_elapsed_time_without_timing_raises():
    a = torch.Event(device=D)
    b = torch.Event(device=D)
    a.record()
    b.record()
    b.synchronize()
    # torch.Event reports this through c10::Event (TORCH_CHECK_VALUE): ValueError.
    with pytest.raises(ValueError, match="enable_timing"):
        a.elapsed_time(b)


def test_elapsed_time_of_unrecorded_events_raises():
    a = torch.Event(device=D, enable_timing=True)
    b = torch.Event(device=D, enable_timing=True)
    with pytest.raises(ValueError, match="recorded"):
        a.elapsed_time(b)


def test_event_rerecord_tracks_latest_record():
    e = torch.Event(device=D)
    for i in range(20):
        e.record()
        x = torch.full((8,), float(i), device=D)
        e.synchronize()
        assert e.query() is True
    assert x.cpu()[0].item() == 19.0


# ---------------------------------------------------------------------------
# Cross-stream synchronisation


def test_wait_stream():
    producer = torch.Stream(device=D)
    consumer = torch.Stream(device=D)
    with producer:
        x = torch.arange(10.0, device=D) * 3
    consumer.wait_stream(producer)
    with consumer:
        y = x + 1
    consumer.synchronize()
    assert y.cpu().tolist() == [3.0 * i + 1 for i in range(10)]


def test_wait_event():
    producer = torch.Stream(device=D)
    consumer = torch.Stream(device=D)
    e = torch.Event(device=D)
    with producer:
        y, expected = _work()
        e.record()
    consumer.wait_event(e)
    with consumer:
        z = y * 2
    consumer.synchronize()
    torch.testing.assert_close(z.cpu(), expected * 2)
    # Event.wait(stream) is the same thing seen from the event.
    e2 = torch.Event(device=D)
    with producer:
        w = z + 1
        e2.record()
    e2.wait(consumer)
    with consumer:
        v = w.sum()
    torch.accelerator.synchronize()
    torch.testing.assert_close(v.cpu(), (expected * 2 + 1).sum())


def test_wait_event_across_devices():
    e = torch.Event(device="openreg:0")
    x = torch.arange(5.0, device="openreg:0") ** 2
    e.record(torch.accelerator.current_stream(0))
    s1 = torch.Stream(device="openreg:1")
    s1.wait_event(e)
    with s1:
        y = x.to("openreg:1") + 1
    s1.synchronize()
    assert y.device == torch.device("openreg:1")
    assert y.cpu().tolist() == [1.0, 2.0, 5.0, 10.0, 17.0]


def test_accelerator_synchronize_waits_for_all_streams():
    streams = [torch.Stream(device=D) for _ in range(3)]
    outs = []
    for i, s in enumerate(streams):
        with s:
            outs.append(_work(reps=i + 1)[0])
    torch.accelerator.synchronize()
    assert all(s.query() for s in streams)
    for out in outs:
        torch.testing.assert_close(out.cpu(), torch.full((128, 128), 1.0 / 128))


def test_tensor_record_stream():
    # As with CUDA: tell the allocator a tensor is used on another stream.
    s = torch.Stream(device=D)
    x = torch.ones(16, device=D)
    s.wait_stream(torch.accelerator.current_stream())  # x is filled there
    with s:
        y = x * 2
    x.record_stream(s)
    del x
    s.synchronize()
    assert y.cpu().tolist() == [2.0] * 16


def test_concurrent_threads_on_both_devices():
    errors = []

    def worker(i):
        try:
            dev = f"openreg:{i % 2}"
            torch.openreg.set_device(i % 2)
            s = torch.Stream(device=dev)
            g = torch.Generator().manual_seed(i)
            a, b = torch.randn(48, 48, generator=g), torch.randn(48, 48, generator=g)
            expected = a @ b
            for k in range(20):
                with s if k % 2 else torch.accelerator.current_stream():
                    r = a.to(dev) @ b.to(dev)
                    e = torch.Event(device=dev)
                    e.record()
                e.synchronize()
                if not torch.allclose(r.cpu(), expected):
                    errors.append(f"thread {i} iteration {k}: wrong result")
                if torch.openreg.current_device() != i % 2:
                    errors.append(f"thread {i} iteration {k}: current device changed")
        except Exception as ex:  # reported below
            errors.append(f"thread {i}: {ex!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []


def test_streams_come_from_a_bounded_pool(py):
    # As CUDA: torch.Stream() hands out pool streams round robin, so a loop
    # creating streams does not grow the process (each has a worker thread).
    out = py(
        """
        import os, torch
        x = torch.ones(4, device="openreg")
        main = torch.openreg.current_stream()
        for _ in range(1000):
            s = torch.openreg.Stream()
            s.wait_stream(main)  # ordered as on CUDA: two streams' add_ would race
            with torch.openreg.stream(s):
                x.add_(1)
            main.wait_stream(s)
        torch.openreg.synchronize()
        ids = {torch.openreg.Stream().stream_id for _ in range(100)}
        hi = {torch.openreg.Stream(priority=-1).stream_id for _ in range(100)}
        print(x[0].item(), len(os.listdir("/proc/self/task")), len(ids), len(hi), ids & hi)
        """
    )
    assert out.returncode == 0, out.stderr
    value, threads, ids, hi, common = out.stdout.split(maxsplit=4)
    assert float(value) == 1001.0
    assert int(threads) < 50 and int(ids) == 32 and int(hi) == 32
    assert common.strip() == "set()"
