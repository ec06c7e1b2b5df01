"""The caching device allocator and the pinned host allocator.

Statistics are checked exactly for known allocation sequences; the policy they
follow is documented at the top of csrc/memory/OpenRegCachingAllocator.cpp.
"""

import os
import random
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

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


def run_python(code, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=full_env,
    )


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


def test_record_stream_delays_reuse_on_another_stream():
    side = torch.openreg.Stream() if hasattr(torch.openreg, "Stream") else torch.Stream(DEV)
    big = torch.ones(64 * MiB, dtype=torch.uint8).pin_memory()
    x = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    ptr = x.data_ptr()
    with torch.accelerator.device_index(0):
        prev = torch.accelerator.current_stream()
        torch.accelerator.set_stream(side)
        # Keep the side stream busy with an asynchronous pinned copy, and use x there.
        dst = torch.empty(64 * MiB, dtype=torch.uint8, device=DEV)
        torch.accelerator.set_stream(prev)
    dst_ptr = dst.data_ptr()
    torch.accelerator.set_stream(side)
    dst.copy_(big, non_blocking=True)
    torch.accelerator.set_stream(prev)
    x.record_stream(side)
    busy = not side.query()
    del x
    y = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    if busy:
        # The side stream has not passed its use of x: the block must wait.
        assert y.data_ptr() != ptr
    side.synchronize()
    del y
    z = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    w = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    assert ptr in (z.data_ptr(), w.data_ptr())
    assert dst.cpu().eq(1).all()
    assert dst.data_ptr() == dst_ptr


def test_record_stream_rejects_a_stream_of_another_device():
    x = torch.empty(16, device="openreg:0")
    with pytest.raises(RuntimeError, match="openreg:0"):
        x.record_stream(torch.Stream("openreg:1"))


def test_empty_cache_returns_physical_memory():
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    x = torch.ones(256 * MiB, dtype=torch.uint8, device=DEV)  # touches every page
    assert x[-1].item() == 1
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


def test_oom_raised_and_recovered_100_times():
    result = run_python(
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
    assert result.returncode == 0, result.stderr
    first, msg = result.stdout.strip().split("\n", 1)
    assert first.split() == ["100", "100", str(8 * 2**20)]
    assert "Tried to allocate 100.00 MiB" in msg
    assert "total capacity of 64.00 MiB" in msg
    assert "8.00 MiB is allocated by PyTorch" in msg


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
