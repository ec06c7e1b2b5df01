"""Streams and events through the device-generic ``torch.Stream``/``torch.Event``
and ``torch.accelerator``: ordering, ``wait_stream``, ``wait_event``,
``query``, every ``synchronize``, ``elapsed_time``.

A device whose work really runs asynchronously is what these checks need to
catch a broken ordering: ``ctx.busy()`` queues a chain of matrix products
that takes a while, and the checks look at the results or at ``query()``
right after a synchronisation. On a backend that runs every kernel inline
the same checks pass trivially (there is nothing to wait for).
"""

from __future__ import annotations

import threading

import torch

from .core import Context, Skip, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("streams", "Streams and events")

N = 512  # busy() matrices are N x N filled with 1/N; so is every product


def _expected_busy(n: int = N) -> torch.Tensor:
    return torch.full((n, n), 1.0 / n)


@check(T)
def current_stream(ctx: Context) -> None:
    """torch.accelerator.current_stream() is a torch.Stream of NAME:current_device()."""
    s = torch.accelerator.current_stream()
    expect(isinstance(s, torch.Stream), f"current_stream() is a {type(s).__name__}")
    expect_equal(s.device, ctx.device(ctx.module.current_device()), "current_stream().device")
    expect_equal(s, torch.accelerator.current_stream(), "two calls to current_stream()")
    expect_equal(hash(s), hash(torch.accelerator.current_stream()), "hash of the same stream")


@check(T)
def new_stream_is_distinct(ctx: Context) -> None:
    """torch.Stream(device=NAME) is a new stream on the current device, not the current one."""
    s = torch.Stream(device=ctx.name)
    expect_equal(s.device, ctx.device(0), "new stream's device")
    expect(s != torch.accelerator.current_stream(), "the new stream equals the current stream")
    expect(s != torch.Stream(device=ctx.name), "two new streams are equal")


@check(T)
def stream_context(ctx: Context) -> None:
    """`with stream:` makes it current and restores the previous stream after."""
    before = torch.accelerator.current_stream()
    s = torch.Stream(device=ctx.name)
    with s:
        expect_equal(torch.accelerator.current_stream(), s, "current stream inside")
    expect_equal(torch.accelerator.current_stream(), before, "current stream after")


@check(T)
def set_stream(ctx: Context) -> None:
    """torch.accelerator.set_stream(s) makes s current; the device module's
    current_stream() agrees."""
    before = torch.accelerator.current_stream()
    s = torch.Stream(device=ctx.name)
    try:
        torch.accelerator.set_stream(s)
        expect_equal(torch.accelerator.current_stream(), s, "accelerator current stream")
        expect_equal(ctx.module.current_stream(), s, "device module current_stream()")
    finally:
        torch.accelerator.set_stream(before)


@check(T, devices=2)
def set_stream_of_other_device(ctx: Context) -> None:
    """torch.accelerator.set_stream(stream of NAME:1) also makes device 1 current."""
    before = torch.accelerator.current_stream()
    s = torch.Stream(device=ctx.device(1))
    expect_equal(s.device, ctx.device(1), "stream device")
    try:
        torch.accelerator.set_stream(s)
        expect_equal(torch.accelerator.current_device_index(), 1, "current device")
        expect_equal(torch.accelerator.current_stream(1), s, "current stream of device 1")
    finally:
        torch.accelerator.set_device_index(0)
        torch.accelerator.set_stream(before)


@check(T)
def side_stream_in_order(ctx: Context) -> None:
    """In-place ops queued on a side stream run in order (values as on the CPU)."""
    cpu = torch.arange(1000.0)
    x = cpu.to(ctx.name)
    s = torch.Stream(device=ctx.name)
    s.wait_stream(torch.accelerator.current_stream())
    with s:
        for i in range(20):
            x.mul_(1.5).add_(i).remainder_(97.0)
    for i in range(20):
        cpu.mul_(1.5).add_(i).remainder_(97.0)
    s.synchronize()
    expect_close(x, cpu, "result of 60 in-place ops")


@check(T)
def stream_synchronize_waits(ctx: Context) -> None:
    """After Stream.synchronize() the stream's queued work has finished (query() is True)."""
    s = torch.Stream(device=ctx.name)
    with s:
        out = ctx.busy(N)
    s.synchronize()
    expect_equal(s.query(), True, "query() right after synchronize()")
    expect_close(out, _expected_busy(), "result")


@check(T)
def module_synchronize_waits(ctx: Context) -> None:
    """After the device module's synchronize() every stream of the device is idle."""
    s = torch.Stream(device=ctx.name)
    with s:
        ctx.busy(N)
    ctx.module.synchronize()
    expect_equal(s.query(), True, "side stream query() after device module synchronize()")


@check(T)
def accelerator_synchronize_waits(ctx: Context) -> None:
    """After torch.accelerator.synchronize() every stream of the device is idle."""
    s = torch.Stream(device=ctx.name)
    with s:
        ctx.busy(N)
    torch.accelerator.synchronize()
    expect_equal(s.query(), True, "side stream query() after torch.accelerator.synchronize()")


@check(T)
def event_synchronize_waits(ctx: Context) -> None:
    """After Event.synchronize() the work recorded before the event has finished."""
    s = torch.Stream(device=ctx.name)
    e = torch.Event(device=ctx.name)
    with s:
        out = ctx.busy(N)
        e.record(s)
    e.synchronize()
    expect_equal(e.query(), True, "event query() after synchronize()")
    expect_close(out, _expected_busy(), "result")


@check(T)
def idle_queries(ctx: Context) -> None:
    """query() is True for an idle new stream and for an event never recorded."""
    expect_equal(torch.Stream(device=ctx.name).query(), True, "new stream query()")
    expect_equal(torch.Event(device=ctx.name).query(), True, "unrecorded event query()")


# [doc:conformance-wait-stream]
def _producer_consumer(ctx: Context, order) -> tuple[torch.Tensor, torch.Tensor]:
    """Producer stream fills `buf` after long work; consumer reads it after `order`."""
    buf = torch.zeros(N, N, device=ctx.name)
    producer = torch.Stream(device=ctx.name)
    consumer = torch.Stream(device=ctx.name)
    producer.wait_stream(torch.accelerator.current_stream())
    consumer.wait_stream(torch.accelerator.current_stream())
    with producer:
        buf.copy_(ctx.busy(N))
    order(producer, consumer)
    with consumer:
        out = buf * 2
    consumer.synchronize()
    producer.synchronize()
    return out, 2 * _expected_busy()


@check(T)
def wait_stream_orders(ctx: Context) -> None:
    """Work queued on B after B.wait_stream(A) sees the results of A's earlier work."""
    out, want = _producer_consumer(ctx, lambda a, b: b.wait_stream(a))
    expect_close(out, want, "consumer's result")


# [/doc:conformance-wait-stream]
@check(T)
def wait_event_orders(ctx: Context) -> None:
    """Work queued on B after B.wait_event(e) sees the work recorded before e on A."""

    def order(a, b):
        e = torch.Event(device=ctx.name)
        e.record(a)
        b.wait_event(e)

    out, want = _producer_consumer(ctx, order)
    expect_close(out, want, "consumer's result")


@check(T)
def event_wait_orders(ctx: Context) -> None:
    """Event.wait(B) orders B after the event, like B.wait_event(e); record_event()
    returns a recorded torch.Event."""

    def order(a, b):
        e = a.record_event()
        expect(isinstance(e, torch.Event), f"record_event() gave {type(e).__name__}")
        e.wait(b)

    out, want = _producer_consumer(ctx, order)
    expect_close(out, want, "consumer's result")


@check(T)
def default_stream_waits_for_side_stream(ctx: Context) -> None:
    """current_stream().wait_stream(side) orders later default-stream work after the side stream."""
    side = torch.Stream(device=ctx.name)
    side.wait_stream(torch.accelerator.current_stream())
    buf = torch.zeros(N, N, device=ctx.name)
    with side:
        buf.copy_(ctx.busy(N))
    torch.accelerator.current_stream().wait_stream(side)
    out = buf + 1
    expect_close(out, _expected_busy() + 1, "default stream's result")
    side.synchronize()


@check(T, devices=2)
def wait_across_devices(ctx: Context) -> None:
    """A stream of device 0 can wait for an event recorded on a stream of device 1."""
    with torch.accelerator.device_index(1):
        producer = torch.Stream(device=ctx.device(1))
        buf = torch.zeros(N, N, device=ctx.device(1))
        producer.wait_stream(torch.accelerator.current_stream(1))
        with producer:
            buf.copy_(ctx.busy(N, device=1))
            e = torch.Event(device=ctx.device(1))
            e.record(producer)
    consumer = torch.Stream(device=ctx.device(0))
    consumer.wait_event(e)
    with consumer:
        out = buf.to(ctx.device(0), non_blocking=True) * 3
    consumer.synchronize()
    expect_close(out, 3 * _expected_busy(), "device 0's result")
    producer.synchronize()


@check(T)
def elapsed_time(ctx: Context) -> None:
    """elapsed_time between two timing events around real work is a positive float (ms)."""
    start = torch.Event(device=ctx.name, enable_timing=True)
    end = torch.Event(device=ctx.name, enable_timing=True)
    start.record()
    ctx.busy(N, steps=4)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    expect(isinstance(ms, float), f"elapsed_time is a {type(ms).__name__}")
    expect(ms > 0, f"elapsed_time is {ms}")


@check(T)
def elapsed_time_needs_timing(ctx: Context) -> None:
    """elapsed_time between events created without enable_timing raises ValueError
    (as CUDA's events)."""
    start = torch.Event(device=ctx.name)
    end = torch.Event(device=ctx.name)
    start.record()
    end.record()
    end.synchronize()
    expect_raises(
        ValueError, lambda: start.elapsed_time(end), "elapsed_time without timing", ["timing"]
    )


@check(T)
def elapsed_time_needs_records(ctx: Context) -> None:
    """elapsed_time with an event never recorded raises ValueError (as CUDA's events)."""
    start = torch.Event(device=ctx.name, enable_timing=True)
    end = torch.Event(device=ctx.name, enable_timing=True)
    start.record()
    start.synchronize()
    expect_raises(
        ValueError,
        lambda: start.elapsed_time(end),
        "elapsed_time to an unrecorded event",
        ["recorded"],
    )


@check(T)
def event_device(ctx: Context) -> None:
    """An event recorded on a NAME stream reports device type NAME."""
    e = torch.Event(device=ctx.name)
    e.record()
    e.synchronize()
    expect_equal(e.device.type, ctx.name, "event.device.type")


@check(T)
def new_thread_starts_on_default_stream(ctx: Context) -> None:
    """The current stream is per thread: a new thread does not see another thread's
    side stream as current."""
    s = torch.Stream(device=ctx.name)
    seen = {}
    with s:

        def worker() -> None:
            seen["stream"] = torch.accelerator.current_stream()

        t = threading.Thread(target=worker)
        t.start()
        t.join(60)
    expect("stream" in seen, "the thread did not report")
    expect(seen["stream"] != s, "the new thread's current stream is the other thread's stream")


@check(T)
def stream_priority(ctx: Context) -> None:
    """The device module's Stream accepts priority=-1 (high) and reports an int priority."""
    Stream = getattr(ctx.module, "Stream", None)
    if Stream is None:
        raise Skip("the device module has no Stream class")
    s = Stream(priority=-1)
    expect(isinstance(s, torch.Stream), "device module Stream is not a torch.Stream")
    expect(isinstance(s.priority, int), f"priority is {s.priority!r}")
    expect(s.priority <= 0, f"priority -1 became {s.priority}")
