"""torch.openreg._launch_stats: how operators ran (a profiling aid)."""

import os

import torch

D = "openreg:0"


def test_counts_queued_learned_and_synchronous_calls():
    x = torch.randn(100, device=D)
    y = torch.randn(100, device=D)
    torch.openreg.synchronize()
    torch.openreg._reset_launch_stats()
    z = torch.atan2(x, y)  # first call of this signature: learnt synchronously
    for _ in range(5):
        z = torch.atan2(x, y)  # then queued
    nz = torch.nonzero(z > 0)  # data-dependent result shape: synchronous
    value = z.sum().item()  # a host wait
    s = torch.openreg._launch_stats()
    torch.testing.assert_close(value, torch.atan2(x.cpu(), y.cpu()).sum().item())
    if os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1":
        # Every call runs synchronously: nothing is queued or learnt.
        assert s["queued"] == s["learned"] == 0 and s["synchronous"] >= 8, s
        assert s["synchronous_by_op"].get("aten::atan2", 0) == 6, s
        return
    assert (
        s["learned_by_op"].get("aten::atan2", 0) + s["learned_by_op"].get("aten::atan2.out", 0) >= 1
    ), s
    assert s["queued"] >= 5, s
    assert s["synchronous"] >= 1 and any("nonzero" in op for op in s["synchronous_by_op"]), s
    assert s["host_waits"] >= 1 and s["launches"] >= s["queued"], s
    torch.testing.assert_close(value, torch.atan2(x.cpu(), y.cpu()).sum().item())
    assert nz.shape[0] == int((torch.atan2(x.cpu(), y.cpu()) > 0).sum())
    torch.openreg._reset_launch_stats()
    s = torch.openreg._launch_stats()
    assert s["queued"] == s["synchronous"] == s["learned"] == s["host_waits"] == 0
    assert s["synchronous_by_op"] == {} and s["learned_by_op"] == {}
