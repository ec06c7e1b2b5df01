"""Profiler: with ``ProfilerActivity.PrivateUse1``, device work appears as
device events (``DeviceType.PrivateUse1``) on the right device, linked to the
operators that launched it, with device time attributed to those operators;
a CPU-only profile records none.

Kernel names are the backend's choice; the checks only rely on the device
type, index, correlation and time fields that PyTorch's tools read.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from .core import Context, check, expect, expect_equal, topic

T = topic("profiler", "Profiler")

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _device_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _operands(ctx: Context, device: int = 0):
    x = torch.randn(128, 128, device=ctx.device(device))
    y = torch.randn(128, 128, device=ctx.device(device))
    (x @ y + x).sum().item()  # warm up outside the profile
    return x, y


def _profile_mm(ctx: Context, activities=ACTIVITIES, device: int = 0):
    x, y = _operands(ctx, device)
    with profile(activities=activities) as prof:
        z = x @ y
        (z + x).cpu()
    return prof


@check(T)
def activity_supported(ctx: Context) -> None:
    """ProfilerActivity.PrivateUse1 is among torch.profiler.supported_activities()."""
    expect(
        ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities(),
        f"supported: {sorted(str(a) for a in torch.profiler.supported_activities())}",
    )


@check(T)
def device_events_present(ctx: Context) -> None:
    """A profile of a matmul and an add has device events (DeviceType.PrivateUse1) on
    device 0 with positive durations."""
    events = _device_events(_profile_mm(ctx))
    expect(events, "no device events recorded")
    expect_equal({e.device_index for e in events}, {0}, "device indices of the events")
    expect(all(e.time_range.elapsed_us() >= 0 for e in events), "negative durations")
    expect(any(e.time_range.elapsed_us() > 0 for e in events), "every duration is zero")


@check(T)
def events_linked_to_operators(ctx: Context) -> None:
    """Device events are linked (linked_correlation_id) to the CPU operators that launched
    them; aten::mm is among those operators."""
    prof = _profile_mm(ctx)
    cpu = {e.id: e.name for e in prof.events() if e.device_type == DeviceType.CPU}
    linked = {cpu.get(e.linked_correlation_id) for e in _device_events(prof)}
    expect("aten::mm" in linked, f"operators linked to device events: {sorted(map(str, linked))}")


@check(T)
def device_time_attributed(ctx: Context) -> None:
    """key_averages() gives aten::mm a positive self device time."""
    prof = _profile_mm(ctx)
    mm = [e for e in prof.key_averages() if e.key == "aten::mm"]
    expect(mm, "aten::mm missing from key_averages()")
    expect(mm[0].self_device_time_total > 0, f"self device time {mm[0].self_device_time_total}")


@check(T)
def cpu_only_profile_has_no_device_events(ctx: Context) -> None:
    """A profile with activities=[CPU] records the operators but no device events."""
    prof = _profile_mm(ctx, activities=[ProfilerActivity.CPU])
    expect(any(e.name == "aten::mm" for e in prof.events()), "aten::mm not recorded")
    expect_equal(len(_device_events(prof)), 0, "device events in a CPU-only profile")


@check(T, devices=2)
def second_device(ctx: Context) -> None:
    """Work on NAME:1 is recorded with device index 1."""
    events = _device_events(_profile_mm(ctx, device=1))
    expect(events, "no device events recorded")
    expect_equal({e.device_index for e in events}, {1}, "device indices")


@check(T)
def side_stream_work(ctx: Context) -> None:
    """Work queued on a side stream is recorded too."""
    x, y = _operands(ctx)
    s = torch.Stream(device=ctx.name)
    s.wait_stream(torch.accelerator.current_stream())
    with profile(activities=ACTIVITIES) as prof:
        with s:
            z = x @ y
        s.synchronize()
    expect(_device_events(prof), "no device events for side-stream work")
    del z


@check(T)
def chrome_trace(ctx: Context) -> None:
    """export_chrome_trace writes valid JSON whose events include the device work."""
    prof = _profile_mm(ctx)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    events = trace.get("traceEvents", [])
    names = {e.name for e in _device_events(prof)}
    found = {e.get("name") for e in events} & names
    expect(found, f"no device event names in the trace ({len(events)} events)")


@check(T)
def profile_twice(ctx: Context) -> None:
    """Two profiles in a row both record device events (the second is not empty)."""
    first = len(_device_events(_profile_mm(ctx)))
    second = len(_device_events(_profile_mm(ctx)))
    expect(first > 0 and second > 0, f"device events: {first}, then {second}")


@check(T)
def backward_recorded(ctx: Context) -> None:
    """A profiled backward pass records device events for autograd's kernels."""
    w = torch.randn(64, 64, device=ctx.name, requires_grad=True)
    x = torch.randn(32, 64, device=ctx.name)
    (x @ w).sum().backward()  # warm up
    with profile(activities=ACTIVITIES) as prof:
        (x @ w).relu().sum().backward()
        w.grad.cpu()
    cpu = {e.id: e.name for e in prof.events() if e.device_type == DeviceType.CPU}
    linked = {cpu.get(e.linked_correlation_id) for e in _device_events(prof)}
    expect(linked - {None}, "device events of the backward are linked to no operator")
    expect(
        any(name and "mm" in name for name in linked),
        f"no matrix product among linked operators: {sorted(map(str, linked))}",
    )
