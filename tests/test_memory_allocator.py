"""The caching device allocator and the pinned host allocator.

Statistics are checked exactly for known allocation sequences; the policy they
follow is documented at the top of csrc/memory/OpenRegAllocatorPolicy.h, the
cache in csrc/memory/OpenRegDeviceCache.h.
"""

import os
import random
import threading

import pytest
import torch
from conftest import describe, device_pids

DEV = "openreg"
KiB, MiB = 1024, 1024 * 1024


@pytest.fixture(autouse=True)
def clean_allocator():
    torch.openreg.synchronize()
    torch.openreg.empty_cache()
    torch.openreg.reset_peak_memory_stats()
    torch.openreg.reset_accumulated_memory_stats()
    yield
    torch.openreg.synchronize()
    torch.openreg.empty_cache()


def stat(key, device=0):
    return torch.openreg.memory_stats(device)[key]


def test_exact_statistics_for_a_known_sequence():
    small = torch.empty(1000, dtype=torch.uint8, device=DEV)  # rounds to 1024
    assert torch.openreg.memory_allocated() == 1024
    assert torch.openreg.memory_reserved() == 2 * MiB  # one small segment
    assert stat("allocation.small_pool.current") == 1
    assert stat("segment.small_pool.current") == 1
    assert stat("requested_bytes.all.current") == 1000
    # The rest of the 2 MiB segment is an inactive split block.
    assert stat("inactive_split.small_pool.current") == 1
    assert stat("inactive_split_bytes.small_pool.current") == 2 * MiB - 1024

    large = torch.empty(3 * MiB, dtype=torch.uint8, device=DEV)  # 20 MiB segment
    assert torch.openreg.memory_allocated() == 1024 + 3 * MiB
    assert torch.openreg.memory_reserved() == 22 * MiB
    assert stat("segment.large_pool.current") == 1
    assert stat("allocation.all.current") == 2

    # 11 MiB fits in the 17 MiB left of the large segment: no new segment.
    mid = torch.empty(11 * MiB, dtype=torch.uint8, device=DEV)
    assert torch.openreg.memory_reserved() == 22 * MiB
    del mid
    huge = torch.empty(18 * MiB, dtype=torch.uint8, device=DEV)  # own 18 MiB segment
    assert torch.openreg.memory_reserved() == 40 * MiB
    assert stat("segment.all.current") == 3

    del small, large, huge
    assert torch.openreg.memory_allocated() == 0
    assert torch.openreg.memory_reserved() == 40 * MiB  # cached
    assert torch.openreg.max_memory_allocated() == 1024 + 21 * MiB
    assert stat("allocation.all.allocated") == 4
    assert stat("allocation.all.freed") == 4
    assert stat("inactive_split.all.current") == 0  # merged back into whole segments

    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved() == 0
    assert stat("segment.all.current") == 0
    assert torch.openreg.max_memory_reserved() == 40 * MiB
    torch.openreg.reset_peak_memory_stats()
    assert torch.openreg.max_memory_reserved() == 0


def test_freed_block_is_reused_on_the_same_stream():
    x = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    ptr = x.data_ptr()
    del x
    y = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    assert y.data_ptr() == ptr
    assert stat("num_device_alloc") == 1


def test_split_blocks_merge_and_allocations_do_not_overlap():
    tensors = [torch.full((1000,), i, dtype=torch.int32, device=DEV) for i in range(50)]
    ptrs = sorted(t.data_ptr() for t in tensors)
    assert all(b - a >= 4000 for a, b in zip(ptrs, ptrs[1:], strict=False))
    for i, t in enumerate(tensors):
        assert t.sum().item() == i * 1000
    del tensors, t
    assert stat("inactive_split.all.current") == 0
    assert stat("segment.all.current") == 1


@pytest.mark.skipif(
    os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1", reason="copies wait in blocking mode"
)
def test_record_stream_delays_reuse_while_the_other_stream_is_busy():
    side = torch.openreg.Stream()
    big = torch.ones(64 * MiB, dtype=torch.uint8).pin_memory()
    x = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    ptr = x.data_ptr()
    with torch.openreg.stream(side):
        x.add_(1)  # x is used on the side stream
        dst = torch.empty(64 * MiB, dtype=torch.uint8, device=DEV)
        dst.copy_(big, non_blocking=True)  # keeps the side stream busy after it
    x.record_stream(side)
    assert not side.query(), "a 64 MiB copy finished before the host returned"
    del x
    # The side stream has not passed its use of x: the block must wait.
    y = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    assert y.data_ptr() != ptr
    assert stat("active.all.current") == 3  # dst, y, and x's pending free
    side.synchronize()
    del y
    z = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    w = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    assert ptr in (z.data_ptr(), w.data_ptr())
    assert dst.cpu().eq(1).all()


def test_record_stream_block_returns_once_the_other_stream_passed_it():
    side = torch.openreg.Stream()
    x = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    ptr = x.data_ptr()
    with torch.openreg.stream(side):
        x.fill_(7)
    x.record_stream(side)
    del x  # records an event on the side stream
    side.synchronize()  # the event has completed: the block is free again
    y = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    assert y.data_ptr() == ptr
    assert stat("active.all.current") == 1


def test_record_stream_rejects_a_stream_of_another_device():
    x = torch.empty(16, device="openreg:0")
    with pytest.raises(RuntimeError, match="openreg:0"):
        x.record_stream(torch.Stream("openreg:1"))


def device_memory_pid():
    """The process whose resident memory holds device 0's memory: this one,
    or with OPENREG_DRIVER=process device 0's own process (openreg-dev0)."""
    if not torch.openreg._named_kernels_only():
        return os.getpid()
    pids = device_pids()
    assert 0 in pids, f"no device process openreg-dev0 among this process's children: {pids}"
    return pids[0]


def test_empty_cache_returns_physical_memory():
    def rss():
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    x = torch.ones(256 * MiB, dtype=torch.uint8, device=DEV)  # touches every page
    assert x[-1].item() == 1
    pid = device_memory_pid()
    del x
    cached = rss()
    assert torch.openreg.memory_reserved() >= 256 * MiB
    torch.openreg.empty_cache()
    released = rss()
    assert torch.openreg.memory_reserved() == 0
    assert cached - released > 200 * MiB, (cached, released)


def test_mem_get_info_and_fraction():
    free0, total = torch.openreg.mem_get_info()
    assert total == torch.openreg.get_device_properties(0).total_memory
    x = torch.empty(5 * MiB, dtype=torch.uint8, device=DEV)
    free1, _ = torch.openreg.mem_get_info()
    assert free0 - free1 == torch.openreg.memory_reserved() == 20 * MiB
    del x
    torch.openreg.set_per_process_memory_fraction(0.01)
    try:
        assert torch.openreg.get_per_process_memory_fraction() == 0.01
        with pytest.raises(torch.OutOfMemoryError, match="fraction"):
            torch.empty(int(0.02 * total), dtype=torch.uint8, device=DEV)
        torch.empty(MiB, dtype=torch.uint8, device=DEV)  # still usable
    finally:
        torch.openreg.set_per_process_memory_fraction(1.0)
    with pytest.raises(RuntimeError, match="fraction"):
        torch.openreg.set_per_process_memory_fraction(1.5)


def test_accelerator_reports_the_same_numbers():
    x = torch.empty(3000, device=DEV)
    assert torch.accelerator.memory_allocated(0) == torch.openreg.memory_allocated(0) == 12288
    assert torch.accelerator.memory_reserved(0) == torch.openreg.memory_reserved(0)
    assert torch.accelerator.max_memory_allocated(0) == torch.openreg.max_memory_allocated(0)
    del x


def test_snapshot_and_summary():
    x = torch.empty(1000, dtype=torch.uint8, device=DEV)
    segments = [s for s in torch.openreg.memory_snapshot() if s["device"] == 0]
    assert len(segments) == 1
    seg = segments[0]
    assert seg["total_size"] == 2 * MiB and seg["segment_type"] == "small"
    assert seg["allocated_size"] == 1024 and seg["requested_size"] == 1000
    states = [b["state"] for b in seg["blocks"]]
    assert states == ["active_allocated", "inactive"]
    assert seg["blocks"][0]["address"] == x.data_ptr()
    summary = torch.openreg.memory_summary()
    assert "Allocated memory" in summary and "1.0 KiB" in summary


def test_recently_freed_small_blocks_come_back_for_the_same_size_and_stream():
    # The allocator keeps the last small blocks freed unmerged and hands one
    # back for a request of its size on its stream; statistics and snapshots
    # see every free block merged, as without that cache.
    a = torch.empty(1000, dtype=torch.uint8, device=DEV)
    b = torch.empty(3000, dtype=torch.uint8, device=DEV)
    pa, pb = a.data_ptr(), b.data_ptr()
    del a, b
    assert torch.empty(3000, dtype=torch.uint8, device=DEV).data_ptr() == pb
    assert torch.empty(1000, dtype=torch.uint8, device=DEV).data_ptr() == pa
    assert stat("inactive_split.all.current") == 0  # one whole free segment
    segments = [s for s in torch.openreg.memory_snapshot() if s["device"] == 0]
    assert [[blk["state"] for blk in s["blocks"]] for s in segments] == [["inactive"]]
    c = torch.empty(1000, dtype=torch.uint8, device=DEV)
    pc = c.data_ptr()
    del c
    side = torch.openreg.Stream()
    with torch.openreg.stream(side):
        d = torch.empty(1000, dtype=torch.uint8, device=DEV)
    assert d.data_ptr() != pc  # not on another stream before the first is past it
    del d
    assert torch.openreg.memory_allocated() == 0
    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved() == 0


def test_queued_kernels_reuse_the_device_workspace():
    # A queued convolution is the kernel library's named kernel with either
    # driver. Its large temporaries (the CPU convolution's output before the
    # copy into the device tensor, oneDNN's scratchpad) come from the
    # library's workspace, reused from call to call where the device's memory
    # lives: 2000-2400 page faults per call without it, about 80 with it
    # (engine/kernels/OpenRegWorkspace.h). The host's own cache (next test) stays
    # unused.
    from torch_openreg import _C

    def minor_faults(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 64, 56, 56, generator=g), torch.randn(64, 64, 3, 3, generator=g)
    expected = torch.nn.functional.conv2d(x, w, padding=1)
    dx, dw = x.to(DEV), w.to(DEV)
    for _ in range(3):
        torch.nn.functional.conv2d(dx, dw, padding=1)
    torch.openreg.synchronize()
    pid = device_memory_pid()
    before = minor_faults(pid)
    for _ in range(10):  # each result freed before the next: cached memory
        out = torch.nn.functional.conv2d(dx, dw, padding=1)
    torch.openreg.synchronize()
    per_call = (minor_faults(pid) - before) / 10
    assert per_call < 400, per_call
    # Queued with OPENREG_LAUNCH_BLOCKING=1 too (each launch then waits).
    assert _C._kernel_scratch_cached_bytes() == 0
    torch.testing.assert_close(out.cpu(), expected)
    torch.openreg.empty_cache()  # frees the workspace too, in stream order
    torch.testing.assert_close(torch.nn.functional.conv2d(dx, dw, padding=1).cpu(), expected)


def test_kernel_workspace_host_memory_is_reused_and_released(py):
    # The kernels the host runs from closures on the stream's worker (a
    # captured call: what the call format cannot carry, every queued call
    # with OPENREG_SERIALIZED_CALLS=0) take their large temporaries from a
    # host block cache, as the device's kernels take theirs from its
    # workspace (previous test): summing 1M uint8 into int64 casts the input
    # first (8 MiB). CPU work on the host keeps the CPU's own allocator, raw
    # interface included (oneDNN on the CPU allocates through it). With the
    # process driver every call is bytes run in the device's process, and
    # this cache stays unused.
    result = py(
        """
        import torch, torch_openreg
        from torch_openreg import _C
        g = torch.Generator().manual_seed(0)
        xb = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, generator=g)
        dxb = xb.to("openreg")
        sums = [dxb.sum(dtype=torch.int64) for _ in range(3)]
        torch.openreg.synchronize()
        used = _C._kernel_scratch_cached_bytes()
        for s in sums:
            assert s.item() == xb.sum(dtype=torch.int64).item()
        x, w = torch.randn(1, 16, 40, 40, generator=g), torch.randn(16, 16, 3, 3, generator=g)
        torch.nn.functional.conv2d(x, w, padding=1)  # oneDNN on the host's CPU
        torch.openreg.empty_cache()
        print(used > 0, _C._kernel_scratch_cached_bytes())
        """,
        OPENREG_SERIALIZED_CALLS="0",
    )
    assert result.returncode == 0, result.stderr
    used, left = result.stdout.split()
    assert used == ("False" if torch.openreg._named_kernels_only() else "True")
    assert left == "0"


def test_random_allocate_free_cycles_do_not_grow():
    rng = random.Random(0)
    live = []
    for _ in range(100_000):
        if live and (len(live) > 40 or rng.random() < 0.5):
            live.pop(rng.randrange(len(live)))
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 4 * MiB)])
            live.append(torch.empty(size, dtype=torch.uint8, device=DEV))
    live.clear()
    assert torch.openreg.memory_allocated() == 0
    assert stat("active.all.current") == 0
    # At most ~41 live blocks up to 4 MiB each: the cache stays bounded.
    assert torch.openreg.max_memory_reserved() < 512 * MiB
    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved() == 0


def test_eight_threads_on_two_devices():
    errors = []

    def work(tid):
        try:
            device = f"openreg:{tid % 2}"
            rng = random.Random(tid)
            for i in range(300):
                n = rng.randrange(1, 20000)
                t = torch.full((n,), tid * 1000 + i, dtype=torch.int64, device=device)
                u = torch.empty(rng.randrange(1, 5000), dtype=torch.uint8, device=device)
                assert t.sum().item() == n * (tid * 1000 + i)
                del u
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for d in (0, 1):
        assert torch.openreg.memory_allocated(d) == 0


def test_oom_raised_and_recovered_100_times(py):
    result = py(
        """
        import torch
        MiB = 2**20
        keep = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg")
        for i in range(100):
            try:
                torch.empty(100 * MiB, dtype=torch.uint8, device="openreg")
                raise SystemExit("no OOM")
            except torch.OutOfMemoryError as e:
                msg = str(e)
            x = torch.ones(10 * MiB, dtype=torch.uint8, device="openreg")
            assert x.sum().item() == 10 * MiB
            del x
        stats = torch.openreg.memory_stats()
        print(stats["num_ooms"], stats["num_alloc_retries"], torch.openreg.memory_allocated())
        print(msg)
        """,
        OPENREG_DEVICE_MEMORY="64M",
    )
    assert result.returncode == 0, describe(result)
    first, msg = result.stdout.strip().split("\n", 1)
    assert first.split() == ["100", "100", str(8 * 2**20)]
    assert "Tried to allocate 100.00 MiB" in msg
    assert "total capacity of 64.00 MiB" in msg
    assert "8.00 MiB is allocated by PyTorch" in msg


def test_a_small_first_run_needs_no_python_meta_kernel(py):
    # The first call of torch.relu on a few floats copies its result rather
    # than sizing it with relu's Meta kernel (Python, torch._refs), whose first
    # call in a process imports torch._dynamo (about 1 s).
    result = py(
        """
        import sys, torch
        x = torch.randn(1000, device="openreg")
        y = torch.relu(x)
        assert torch.equal(y.cpu(), torch.relu(x.cpu()))
        print("torch._dynamo" in sys.modules)
        """
    )
    assert result.returncode == 0, describe(result)
    assert result.stdout.strip() == "False"


def test_a_small_first_run_on_a_full_device_raises_oom(py):
    # A small result the device cannot hold, its Meta kernel skipped as above,
    # raises torch.OutOfMemoryError; the device stays usable. Full: every
    # block of the one segment allocated, and no room for another segment.
    result = py(
        """
        import torch
        x = torch.randn(1024, device="openreg")
        keep = []
        while torch.openreg.memory_allocated() < torch.openreg.memory_reserved():
            keep.append(torch.empty(1024, device="openreg"))
        torch.openreg.set_per_process_memory_fraction(0.0)
        try:
            torch.sigmoid(x)
            raise SystemExit("no OOM")
        except torch.OutOfMemoryError as e:
            print("OOM", "out of memory" in str(e))
        torch.openreg.set_per_process_memory_fraction(1.0)
        del keep
        y = torch.sigmoid(x)
        assert torch.equal(y.cpu(), torch.sigmoid(x.cpu()))
        print("ok")
        """
    )
    assert result.returncode == 0, describe(result)
    assert result.stdout.split() == ["OOM", "True", "ok"]


def test_pinned_host_allocator_caches_and_counts():
    torch.openreg.host_memory_stats()  # available before any pinning
    x = torch.arange(1000, dtype=torch.float32).pin_memory()
    assert x.is_pinned()
    stats = torch.openreg.host_memory_stats()
    assert stats["allocations.current"] >= 1
    ptr = x.data_ptr()
    del x
    y = torch.zeros(1000).pin_memory()
    assert y.data_ptr() == ptr  # the cached block is reused
    d = y.to(DEV, non_blocking=True)
    torch.openreg.synchronize()
    assert d.cpu().eq(0).all()


# ---------------------------------------------------------------------------
# PYTORCH_ALLOC_CONF. c10 parses the options every accelerator shares, from
# the variable at start-up or from torch._C._accelerator_setAllocatorSettings
# later (what torch.cuda.memory._set_allocator_settings calls); openreg gives
# them the meaning CUDA's caching allocator gives them (the torch.cuda notes,
# "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF") and rejects what it
# cannot do. Most cases set the options at run time, in this process; the
# variable itself is read in fresh processes.


@pytest.fixture
def alloc_conf():
    """``alloc_conf(settings)`` sets the allocator options until the test ends."""

    def apply(settings):
        torch.openreg.synchronize()
        torch.openreg.empty_cache()
        torch._C._accelerator_setAllocatorSettings(settings)

    yield apply
    apply("")
    torch.openreg.set_per_process_memory_fraction(1.0)


def allocated_for(n):
    x = torch.empty(n, dtype=torch.uint8, device=DEV)
    size = torch.openreg.memory_allocated()
    del x
    return size


ROUNDING_SIZES = (1200 * KiB, 5 * MiB + 1, 4 * MiB, 1200)


def test_conf_roundup_power2_divisions(alloc_conf):
    assert [allocated_for(n) for n in ROUNDING_SIZES] == [1200 * KiB, 5 * MiB + 512, 4 * MiB, 1536]
    # CUDA's example: with 4 divisions, 1200 lies between 1024 and 2048,
    # whose divisions are 1024, 1280, 1536, 1792: it is rounded up to 1280.
    # Powers of two stay; sizes up to 512 bytes * divisions keep the
    # 512-byte rounding.
    alloc_conf("roundup_power2_divisions:4")
    assert [allocated_for(n) for n in ROUNDING_SIZES] == [1280 * KiB, 6 * MiB, 4 * MiB, 1536]
    # The list form: c10's table, which CUDA's allocator reads too, gives the
    # entry "B:N" to the sizes from B MB up to the next boundary, and ">:N"
    # to the sizes above the last one; sizes below the first boundary get
    # its N.
    alloc_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert [allocated_for(n) for n in (300 * MiB + 1, 600 * MiB + 1, 1200 * KiB)] == [
        300 * MiB + 512,  # [256, 512) MB: 1 division, no power-of-two rounding
        768 * MiB,  # [512, 1024) MB: 2 divisions of 512 MiB
        1200 * KiB,
    ]


def test_conf_max_split_size_mb_keeps_oversize_blocks_whole(alloc_conf):
    def sequence():
        a = torch.empty(50 * MiB, dtype=torch.uint8, device=DEV)
        out = {
            "oversize": [stat("oversize_allocations.current"), stat("oversize_segments.current")],
            "max_split_size": stat("max_split_size"),
        }
        del a
        out["oversize_freed"] = [
            stat("oversize_allocations.current"),
            stat("oversize_segments.current"),
        ]
        b = torch.empty(30 * MiB, dtype=torch.uint8, device=DEV)
        out["reserved_b"] = torch.openreg.memory_reserved()
        c = torch.empty(45 * MiB, dtype=torch.uint8, device=DEV)
        out["reserved_c"] = torch.openreg.memory_reserved()
        out["allocated_c"] = torch.openreg.memory_allocated()
        del b, c
        return out

    # Without the option every block may be split: 30 MiB comes out of the
    # cached 50 MiB segment, and the unset limit is reported as -1 (CUDA's
    # SIZE_MAX as int64).
    assert sequence() == {
        "oversize": [0, 0],
        "max_split_size": -1,
        "oversize_freed": [0, 0],
        "reserved_b": 50 * MiB,
        "reserved_c": 50 * MiB + 46 * MiB,
        "allocated_c": 30 * MiB + 46 * MiB,
    }
    alloc_conf("max_split_size_mb:40")
    # 50 MiB is oversize (at least 40 MiB); 30 MiB may not split it; 45 MiB
    # takes it whole, since it exceeds the request by less than
    # max_non_split_rounding_mb (20 MiB by default).
    assert sequence() == {
        "oversize": [1, 1],
        "max_split_size": 40 * MiB,
        "oversize_freed": [0, 1],
        "reserved_b": 80 * MiB,
        "reserved_c": 80 * MiB,
        "allocated_c": 30 * MiB + 50 * MiB,
    }
    alloc_conf("max_split_size_mb:40,max_non_split_rounding_mb:20")
    a = torch.empty(70 * MiB, dtype=torch.uint8, device=DEV)
    del a
    b = torch.empty(45 * MiB, dtype=torch.uint8, device=DEV)  # 70 - 45 >= 20: a new segment
    assert torch.openreg.memory_reserved() == 70 * MiB + 46 * MiB
    del b


def test_conf_max_split_size_mb_frees_oversize_blocks_before_the_whole_cache(alloc_conf):
    alloc_conf("max_split_size_mb:40")
    torch.openreg.set_per_process_memory_fraction(100 / 4096)  # 100 MiB
    small = torch.empty(1000, dtype=torch.uint8, device=DEV)  # a 2 MiB segment
    del small
    a = torch.empty(80 * MiB, dtype=torch.uint8, device=DEV)  # oversize
    del a
    # 30 MiB may not split the cached 80 MiB block, and 80 + 2 + 30 MiB do
    # not fit in 100 MiB: the oversize block is freed, the small segment kept,
    # and nothing counts as a retry (CUDA counts only the release of the
    # whole cache).
    b = torch.empty(30 * MiB, dtype=torch.uint8, device=DEV)
    assert torch.openreg.memory_reserved() == 32 * MiB
    assert [stat("num_device_free"), stat("num_alloc_retries"), stat("num_ooms")] == [1, 0, 0]
    del b


GC_PROGRAM = """
a, b, c = empty(30 * MiB), empty(30 * MiB), empty(30 * MiB)
f = empty(10 * MiB)
a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
del a, f
for _ in range(5):  # served by f's 10 MiB block: a gets older
    f = empty(10 * MiB)
    del f
del b
# 40 MiB fits no cached block, and 100 MiB are reserved.
d = empty(40 * MiB)
segments = {s["address"] for s in torch.openreg.memory_snapshot() if s["device"] == 0}
result = [torch.openreg.memory_reserved(), stat("num_device_free"),
          stat("num_alloc_retries"), a_ptr in segments, b_ptr in segments]
del c, d
"""


def run_gc_program():
    scope = {
        "torch": torch,
        "MiB": MiB,
        "stat": stat,
        "empty": lambda n: torch.empty(n, dtype=torch.uint8, device=DEV),
    }
    exec(GC_PROGRAM, scope)
    return scope["result"]


def test_conf_garbage_collection_threshold_frees_the_oldest_cached_blocks(alloc_conf):
    torch.openreg.set_per_process_memory_fraction(128 / 4096)  # 128 MiB
    # Without it the new segment does not fit the limit: the whole cache is
    # freed after draining the device, and the allocation retried.
    assert run_gc_program()[:3] == [70 * MiB, 3, 1]
    torch.openreg.empty_cache()
    torch.openreg.reset_accumulated_memory_stats()
    # Above 0.6 * 128 MiB reserved, the free whole blocks at least as old as
    # the average (counted in searches of their pool) go first, until
    # 100 - 76.8 MiB are back: only a, not the younger b or f.
    alloc_conf("garbage_collection_threshold:0.6")
    assert run_gc_program() == [110 * MiB, 1, 0, False, True]


def test_conf_garbage_collection_threshold_needs_a_memory_fraction(py):
    # As on CUDA the threshold is a fraction of the per-process limit: without
    # set_per_process_memory_fraction nothing is collected (fresh process:
    # the fraction of this one has been set).
    program = "\n".join(
        [
            "import torch",
            "MiB = 2**20",
            "stat = lambda key: torch.openreg.memory_stats()[key]",
            'empty = lambda n: torch.empty(n, dtype=torch.uint8, device="openreg")',
            GC_PROGRAM,
            "print(result)",
        ]
    )
    proc = py(program, PYTORCH_ALLOC_CONF="garbage_collection_threshold:0.6")
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split("\n")[-2] == str([140 * MiB, 0, 0, True, True])


def test_conf_large_segment_size_mb(alloc_conf):
    x = torch.empty(3 * MiB, dtype=torch.uint8, device=DEV)
    assert torch.openreg.memory_reserved() == 20 * MiB
    del x
    alloc_conf("large_segment_size_mb:40")
    x = torch.empty(3 * MiB, dtype=torch.uint8, device=DEV)
    assert torch.openreg.memory_reserved() == 40 * MiB
    del x


def test_conf_pinned_max_cached_size_mb_is_honoured_by_the_host_allocator(alloc_conf):
    def pin_and_free():
        before = torch.openreg.host_memory_stats()["num_host_free"]
        x = torch.ones(4 * MiB, dtype=torch.uint8).pin_memory()
        del x
        return torch.openreg.host_memory_stats()["num_host_free"] - before

    assert pin_and_free() == 0  # cached
    alloc_conf("pinned_max_cached_size_mb:1")
    assert pin_and_free() == 1  # above the limit: freed at once


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        # openreg's runtime cannot grow a segment in place.
        ("expandable_segments:True", NotImplementedError, "expandable_segments:True"),
        # A key no allocator knows is a mistake, as on CUDA.
        ("max_split_size_mbb:100", ValueError, "'max_split_size_mbb'"),
        # CUDA's own backend choice means nothing here.
        ("backend:cudaMallocAsync", ValueError, "'backend'"),
    ],
)
def test_conf_options_openreg_cannot_honour_are_rejected(alloc_conf, settings, error, message):
    alloc_conf(settings)
    # Checked where a segment is made, where CUDA reads expandable_segments.
    with pytest.raises(error, match=message):
        torch.empty(MiB, dtype=torch.uint8, device=DEV)
    alloc_conf("expandable_segments:False")  # asks for nothing: accepted
    x = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    del x


def test_conf_is_read_from_the_environment(py):
    code = """
    import torch
    try:
        x = torch.empty(1200 * 1024, dtype=torch.uint8, device="openreg")
        print(torch.openreg.memory_allocated(), torch.openreg.memory_reserved())
    except Exception as e:
        print(type(e).__name__)
    """
    conf = "roundup_power2_divisions:4,large_segment_size_mb:40"
    proc = py(code, PYTORCH_ALLOC_CONF=conf)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == [str(1280 * KiB), str(40 * MiB)]
    # c10 still reads PYTORCH_CUDA_ALLOC_CONF (deprecated) for every device;
    # an option openreg cannot honour fails the first allocation.
    proc = py(code, PYTORCH_CUDA_ALLOC_CONF=conf + ",expandable_segments:True")
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["NotImplementedError"]


def test_memory_history_records_actions_and_stacks(py):
    # torch.cuda.memory's snapshot tools, on openreg (the shim maps the CUDA
    # names to these; tests/test_migration.py).
    proc = py(
        """
        import torch
        from torch_openreg.openreg import memory
        MiB = 2**20
        x = torch.empty(MiB, device="openreg")  # before recording: no entry
        memory._record_memory_history(max_entries=100)
        def allocate_here():
            return torch.empty(3 * MiB, device="openreg")
        y = allocate_here()
        del y
        try:
            torch.empty(100 * MiB, device="openreg")
        except torch.OutOfMemoryError:
            pass
        z = torch.empty(2 * MiB, device="openreg:1")
        snap = memory._snapshot()
        memory._record_memory_history(enabled=None)
        w = torch.empty(MiB, device="openreg")  # after: no entry
        dev0, dev1 = snap["device_traces"][:2]
        print([e["action"] for e in dev0])
        print([e["action"] for e in dev1])
        alloc = [e for e in dev0 if e["action"] == "alloc"][0]
        print(alloc["size"], any(f["name"] == "allocate_here" for f in alloc["frames"]))
        oom = [e for e in dev0 if e["action"] == "oom"][0]
        print(oom["size"], oom["device_free"] > 0)
        blocks = [b for s in snap["segments"] for b in s["blocks"]]
        live = [b for b in blocks if b["state"] == "active_allocated"]
        print(sorted(len(b["frames"]) > 0 for b in live))
        memory._record_memory_history(True, trace_alloc_max_entries=10)  # legacy form
        v = torch.empty(MiB, device="openreg")
        print([e["action"] for e in memory._snapshot()["device_traces"][0]][-1:])
        memory._record_memory_history(None, clear_history=True)
        print(memory._snapshot()["device_traces"][0])
        """,
        OPENREG_DEVICE_MEMORY="64M",
    )
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    # y fits in the 20 MiB segment x opened (CUDA's rounding of a large
    # allocation), so no segment action.
    assert lines[0] == "['alloc', 'free_requested', 'free_completed', 'oom']", lines[0]
    assert lines[1] == "['segment_alloc', 'alloc']"
    assert lines[2] == f"{12 * 2**20} True"
    assert lines[3] == f"{400 * 2**20} True"
    assert lines[4] == "[False, True]"  # x was allocated before recording
    assert lines[5] == "['alloc']"
    assert lines[6] == "[]"
