"""Device activity in the PyTorch profiler (Kineto plugin and legacy fallback).

The assertions are about values (which kernels, on which device and stream,
linked to which operator), never about how long anything took, beyond
durations being positive.
"""

import json
import os

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

D = "openreg"
DEVICE_ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]

# Tests of queued kernels; under OPENREG_LAUNCH_BLOCKING=1 every kernel runs
# while the host waits (test_launch_blocking_kernels_run_at_the_call covers that).
queued_only = pytest.mark.skipif(
    os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1",
    reason="kernels are not queued under OPENREG_LAUNCH_BLOCKING=1",
)


def _events(prof):
    """All events of a torch.profiler or torch.autograd.profiler profile."""
    return prof.events() if hasattr(prof, "events") else prof.function_events


def _kernels(prof):
    """The device-side events of a finished profile."""
    return [e for e in _events(prof) if e.device_type == DeviceType.PrivateUse1]


def _ops(prof, name):
    return [e for e in _events(prof) if e.name == name and e.device_type == DeviceType.CPU]


def _operands(device=D):
    x = torch.randn(64, 64, device=device)
    y = torch.randn(64, 64, device=device)
    # Warm up: the first call of a signature runs synchronously (the host
    # learns its checks and results); later calls are queued kernels.
    (x @ y, x + y, x + x, x * 2)
    torch.openreg.synchronize(x.device)
    return x, y


def _linked_ops(prof):
    """kernel name -> names of the CPU operators it is linked to."""
    # Runtime activities (orLaunchKernel, ...) number their ids apart from the
    # operators' correlation ids: only operators are link targets.
    runtime = {"orLaunchKernel", "orMemcpyAsync", "run_sync"}
    by_id = {
        e.id: e.name
        for e in prof.events()
        if e.device_type == DeviceType.CPU and e.name not in runtime
    }
    out = {}
    for k in _kernels(prof):
        out.setdefault(k.name, set()).add(by_id.get(k.linked_correlation_id))
    return out


def test_profiler_activity_is_supported():
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


@queued_only
def test_kernels_are_device_events_linked_to_their_operator():
    x, y = _operands()
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        z = x @ y
        w = z + x
        torch.empty(4, device=D)  # host work only
        w.cpu()
    kernels = _kernels(prof)
    names = {k.name for k in kernels}
    assert "aten::mm [kernel]" in names
    assert "aten::add.Tensor [kernel]" in names
    for k in kernels:
        assert k.device_type == DeviceType.PrivateUse1
        assert k.device_index == 0
        assert k.time_range.elapsed_us() > 0
        assert k.linked_correlation_id > 0
    linked = _linked_ops(prof)
    assert linked["aten::mm [kernel]"] == {"aten::mm"}
    assert linked["aten::add.Tensor [kernel]"] == {"aten::add"}
    # The copy to pageable host memory is a device copy the host waits for,
    # named as CUDA names it.
    assert linked["Memcpy DtoH (openreg -> Pageable)"] == {"aten::_copy_from"}

    # The operator that launched a kernel carries its device time.
    mm = _ops(prof, "aten::mm")
    assert sum(e.self_device_time_total for e in mm) > 0
    assert sum(e.device_time_total for e in _ops(prof, "aten::matmul")) > 0
    averages = {(e.key, e.device_type): e for e in prof.key_averages()}
    assert averages[("aten::mm", DeviceType.CPU)].self_device_time_total > 0
    assert averages[("aten::add", DeviceType.CPU)].device_time_total > 0
    assert averages[("aten::empty", DeviceType.CPU)].device_time_total == 0
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "aten::mm" in table and "OPENREG" in table


@queued_only
def test_a_foreach_list_is_one_kernel():
    """An optimizer's _foreach_ update is one kernel for the whole list (the
    fallback takes the list), not one per tensor."""
    params = [torch.randn(8, device=D) for _ in range(5)]
    grads = [torch.randn(8, device=D) for _ in range(5)]
    torch._foreach_add_(params, grads, alpha=-0.1)  # learns the signature
    torch.openreg.synchronize()
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        torch._foreach_add_(params, grads, alpha=-0.1)
        torch.openreg.synchronize()
    names = [k.name for k in _kernels(prof)]
    assert names == ["aten::_foreach_add_.List [kernel]"]


@queued_only
def test_runtime_events_on_the_launching_thread():
    x, y = _operands()
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        x @ y
        torch.openreg.synchronize()
    launches = [e for e in prof.events() if e.name == "orLaunchKernel"]
    assert launches and all(e.device_type == DeviceType.CPU for e in launches)
    mm = _ops(prof, "aten::mm")
    assert {e.linked_correlation_id for e in launches} <= {e.id for e in mm}


@queued_only
def test_streams_and_devices():
    x, _ = _operands("openreg:0")
    y, _ = _operands("openreg:1")
    side = torch.openreg.Stream(device="openreg:0")
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        x + x
        with torch.openreg.stream(side):
            x * 2
        y + y
        torch.openreg.synchronize(0)
        torch.openreg.synchronize(1)
    placed = {(k.name, k.device_index, k.device_resource_id) for k in _kernels(prof)}
    assert ("aten::add.Tensor [kernel]", 0, 0) in placed
    assert ("aten::mul.Tensor [kernel]", 0, side.stream_id) in placed
    assert ("aten::add.Tensor [kernel]", 1, 0) in placed


def test_pinned_non_blocking_copy_is_a_device_memcpy():
    host = torch.randn(256).pin_memory()
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        dev = host.to(D, non_blocking=True)
        back = torch.empty(256).pin_memory()
        back.copy_(dev, non_blocking=True)
        torch.openreg.synchronize()
    copies = {k.name: k for k in _kernels(prof) if k.name.startswith("Memcpy")}
    assert set(copies) == {
        "Memcpy HtoD (Pinned -> openreg)",
        "Memcpy DtoH (openreg -> Pinned)",
    }
    assert all(c.time_range.elapsed_us() > 0 for c in copies.values())
    torch.testing.assert_close(back, host)


def test_training_step_forward_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = model.to(D)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32, device=D)
    t = torch.randn(16, 8, device=D)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), t)
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # warm-up
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        step()
    kernels = _kernels(prof)
    assert kernels and all(k.linked_correlation_id > 0 for k in kernels)
    linked = {op for ops in _linked_ops(prof).values() for op in ops}
    # Forward, backward (on the autograd engine's device thread) and the
    # optimizer all show up.
    assert {"aten::addmm", "aten::mse_loss", "aten::threshold_backward"} <= linked
    assert any(op.startswith("aten::mm") for op in linked)
    assert sum(e.self_device_time_total for e in _ops(prof, "aten::addmm")) > 0


@queued_only
def test_chrome_trace(tmp_path):
    x, y = _operands("openreg:0")
    x1, _ = _operands("openreg:1")
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        x @ y
        x1 + x1
        torch.openreg.synchronize(0)
        torch.openreg.synchronize(1)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]

    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert {(e["name"], e["pid"]) for e in kernels} >= {
        ("aten::mm [kernel]", 0),
        ("aten::add.Tensor [kernel]", 1),
    }
    assert all(e["dur"] > 0 and e["args"]["External id"] > 0 for e in kernels)

    rows = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    assert rows[0] == "openreg:0" and rows[1] == "openreg:1"
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    assert threads[(0, 0)] == "stream 0" and threads[(1, 0)] == "stream 0"

    # Flow arrows: from the launch on the CPU thread to each kernel.
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    assert len(ends) >= len(kernels) and set(ends) <= set(starts)
    for flow_id, end in ends.items():
        assert end["pid"] in (0, 1)
        assert starts[flow_id]["pid"] not in (0, 1)  # the CPU process


@queued_only
def test_autograd_profiler_use_device():
    x, y = _operands()
    # use_kineto=True: the Kineto plugin, as torch.profiler.profile.
    with torch.autograd.profiler.profile(use_device=D, use_kineto=True) as prof:
        x @ y
        torch.openreg.synchronize()
    assert any(k.name == "aten::mm [kernel]" for k in _kernels(prof))
    averages = {(e.key, e.device_type): e for e in prof.key_averages()}
    assert averages[("aten::mm", DeviceType.CPU)].self_device_time_total > 0


def test_legacy_fallback_events():
    # use_kineto=False (the default of torch.autograd.profiler.profile):
    # PyTorch records an openreg event as each operator starts and ends
    # (registerPrivateUse1Methods) and reports the elapsed time as the
    # operator's device time.
    x, y = _operands()
    with torch.autograd.profiler.profile(use_device=D) as prof:
        x @ y
        torch.openreg.synchronize()
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert mm and all(e.is_legacy for e in mm)
    assert sum(e.device_time_total for e in mm) > 0
    assert not _kernels(prof)  # the fallback has no kernel events


@queued_only
def test_profiling_twice_and_nothing_recorded_outside():
    x, y = _operands()
    for _ in range(2):
        x @ y  # outside any profile
        torch.openreg.synchronize()
        with profile(activities=DEVICE_ACTIVITIES) as prof:
            x + y
            torch.openreg.synchronize()
        assert [k.name for k in _kernels(prof)] == ["aten::add.Tensor [kernel]"]


def test_cpu_only_profile_records_no_device_activity():
    x, y = _operands()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x @ y
        torch.openreg.synchronize()
    assert not _kernels(prof)
    assert not [e for e in prof.events() if e.name == "orLaunchKernel"]
    assert _ops(prof, "aten::mm")


def test_launch_blocking_kernels_run_at_the_call(py):
    # Blocking launches run the same kernels as queued ones and wait for each
    # at its launch: after the signature's first run (a described call), the
    # add is a queued kernel on the device, with either driver.
    proc = py(
        """
        import torch
        from torch.profiler import ProfilerActivity, profile
        x = torch.ones(64, 64, device="openreg")
        (x + x, x + x)
        torch.openreg._reset_launch_stats()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            x + x
        kernels = [e.name for e in prof.events() if e.name.endswith("]")]
        assert kernels == ["aten::add.Tensor [kernel]"], kernels
        stats = torch.openreg._launch_stats()
        assert stats["queued"] == 1 and stats["described"] == stats["synchronous"] == 0, stats
        print("ok")
        """,
        OPENREG_LAUNCH_BLOCKING="1",
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


@pytest.mark.parametrize("entry", ["profiler", "autograd-kineto", "autograd-legacy"])
def test_profiling_before_openreg_is_initialised(py, entry):
    start = {
        "profiler": "torch.profiler.profile(activities=[CPU, ProfilerActivity.PrivateUse1])",
        "autograd-kineto": "torch.autograd.profiler.profile(use_device='openreg', use_kineto=True)",
        "autograd-legacy": "torch.autograd.profiler.profile(use_device='openreg')",
    }[entry]
    proc = py(
        f"""
        import torch
        from torch.profiler import ProfilerActivity
        CPU = ProfilerActivity.CPU
        assert not torch.openreg.is_initialized()
        with {start} as prof:
            x = torch.ones(8, device="openreg")
            (x + x).cpu()
        add = [e for e in prof.key_averages() if e.key == "aten::add"]
        assert add and add[0].device_time_total > 0, prof.key_averages().table()
        print("ok")
        """
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
