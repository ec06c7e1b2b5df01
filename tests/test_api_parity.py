"""torch.openreg against torch.cuda, row by row, and the torch.accelerator API.

The rows live in torch_openreg/api_parity.py (docs/api_parity.md is generated from
them). For every row with a counterpart this file checks that it exists, that
its signature is torch.cuda's, and calls it (CHECKS below), comparing values.
Rows without a counterpart are checked to be absent from torch.openreg.
"""

import gc
import inspect
import pickle
import types
import warnings
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch
from conftest import run_python

from torch_openreg import api_parity as table

openreg = torch.openreg
MiB = 1024 * 1024
REPO = Path(__file__).resolve().parent.parent

COUNTERPART_ROWS = [r for r in table.ROWS if r.status in ("same", "partial")]
ABSENT_ROWS = [r for r in table.ROWS if r.status not in ("same", "partial")]


def cuda_object(name: str):
    obj = torch.cuda
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def openreg_object(name: str):
    obj = openreg
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.fixture(autouse=True)
def quiet_allocator():
    openreg.synchronize()
    openreg.empty_cache()
    yield
    gc.collect()
    openreg.synchronize()
    openreg.empty_cache()


# ---------------------------------------------------------------------------
# The table against torch.cuda and the docs


def test_table_lists_every_public_torch_cuda_name():
    """A name a new PyTorch adds to torch.cuda fails here until it has a row."""
    public = set(torch.cuda.__all__) | {f"amp.{n}" for n in torch.cuda.amp.__all__}
    # The submodules' own public names are part of torch.cuda.__all__ already.
    for module in (torch.cuda.memory, torch.cuda.random, torch.cuda.graphs):
        assert set(module.__all__) <= set(torch.cuda.__all__), module.__name__
    for name in ("Stream", "Event", "ExternalStream"):
        assert name in torch.cuda.__all__
    listed = [r.cuda for r in table.ROWS]
    assert len(listed) == len(set(listed)), "a name has two rows"
    assert set(listed) - public == set(), "rows for names torch.cuda no longer has"
    assert public - set(listed) == set(), "torch.cuda names without a row"


def test_table_statuses_and_counts():
    for row in table.ROWS:
        assert row.status in table.STATUS_TEXT, row
        assert bool(row.openreg) == (row.status in ("same", "partial")), row
        assert row.notes, row
    c = table.counts()
    assert sum(c.values()) == len(table.ROWS)
    # Device, streams and events, memory, random, AMP and properties are not
    # CUDA-specific: every such row has a counterpart, or is a named gap.
    for title, rows in table.SECTIONS:
        if title.startswith(("Random", "Automatic")):
            assert all(r.status == "same" for r in rows), title


def test_docs_page_is_generated_from_the_table():
    page = REPO / "docs" / "api_parity.md"
    assert page.read_text() == table.render_markdown(), (
        "docs/api_parity.md is stale: run "
        "`.venv/bin/python -m torch_openreg.api_parity > docs/api_parity.md`"
    )


@pytest.mark.parametrize("row", ABSENT_ROWS, ids=lambda r: r.cuda)
def test_rows_without_counterpart_are_absent(row):
    # Nothing half-there: feature checks with hasattr() answer correctly.
    assert not hasattr(openreg, row.cuda.split(".")[-1]), (
        f"torch.openreg has {row.cuda}: update the row"
    )


# ---------------------------------------------------------------------------
# Signatures


def _params(obj):
    """(name, kind, default) of each parameter, or None if Python cannot tell."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        default = p.default
        if isinstance(default, str):
            default = default.replace("cuda", "openreg")
        out.append((p.name, p.kind, default))
    return out


@pytest.mark.parametrize("row", COUNTERPART_ROWS, ids=lambda r: r.cuda)
def test_counterpart_exists_with_the_same_signature(row):
    assert hasattr(openreg, row.openreg.split(".")[0]), f"torch.openreg.{row.openreg} is missing"
    theirs, ours = cuda_object(row.cuda), openreg_object(row.openreg)
    if isinstance(theirs, types.ModuleType):
        assert isinstance(ours, types.ModuleType)
        return
    if not callable(theirs):
        assert type(ours) is type(theirs), (type(ours), type(theirs))
        return
    assert callable(ours)
    assert inspect.isclass(ours) == inspect.isclass(theirs)
    assert _params(ours) == _params(theirs)
    if row.openreg.startswith("amp."):
        return
    # Reachable where device-agnostic code looks for it.
    assert getattr(torch.get_device_module("openreg"), row.openreg) is ours


@pytest.mark.parametrize(
    "cuda_module, ours",
    [
        (torch.cuda.memory, openreg.memory),
        (torch.cuda.random, openreg.random),
        (torch.cuda.amp, openreg.amp),
    ],
    ids=lambda m: getattr(m, "__name__", ""),
)
def test_submodules_hold_their_counterparts(cuda_module, ours):
    prefix = "amp." if cuda_module is torch.cuda.amp else ""
    rows = {r.cuda: r for r in COUNTERPART_ROWS}
    for name in cuda_module.__all__:
        row = rows.get(prefix + name)
        if row is not None:
            assert getattr(ours, row.openreg.split(".")[-1]) is openreg_object(row.openreg)


# ---------------------------------------------------------------------------
# Behaviour: one check per counterpart row


def _check_is_available():
    assert openreg.is_available() is True
    assert openreg.is_available() == (openreg.device_count() > 0)


def _check_device_count():
    assert openreg.device_count() == 2
    assert openreg.device_count() == torch.accelerator.device_count()


def _check_init():
    openreg.init()
    assert openreg.is_initialized()
    proc = run_python(
        """
        import torch
        assert not torch.openreg.is_initialized()
        torch.openreg.init()
        assert torch.openreg.is_initialized()
        print("ok")
        """
    )
    assert proc.stdout.strip() == "ok", proc.stderr


def _check_is_initialized():
    torch.empty(1, device="openreg")
    assert openreg.is_initialized() is True


def _check_current_device():
    assert openreg.current_device() == 0
    openreg.set_device(1)
    assert openreg.current_device() == 1 == torch.accelerator.current_device_index()


def _check_set_device():
    openreg.set_device("openreg:1")
    assert openreg.current_device() == 1
    assert torch.empty(1, device="openreg").device == torch.device("openreg:1")
    openreg.set_device(torch.device("openreg", 0))
    assert openreg.current_device() == 0
    openreg.set_device(-1)  # ignored, as on CUDA
    assert openreg.current_device() == 0


def _check_device():
    with openreg.device(1):
        assert openreg.current_device() == 1
        assert torch.zeros(1, device="openreg").device.index == 1
    assert openreg.current_device() == 0
    with pytest.raises(ZeroDivisionError):
        with openreg.device("openreg:1"):
            raise ZeroDivisionError
    assert openreg.current_device() == 0


def _check_device_of():
    t = torch.ones(2, device="openreg:1")
    with openreg.device_of(t):
        assert openreg.current_device() == 1
    with openreg.device_of(torch.ones(2)):
        assert openreg.current_device() == 0
    assert openreg.current_device() == 0


def _check_synchronize():
    s = openreg.Stream()
    with openreg.stream(s):
        x = torch.ones(256, 256, device="openreg")
        for _ in range(20):
            x.mul_(1.0)
    openreg.synchronize(0)
    assert s.query()
    assert x.sum().item() == 256 * 256
    openreg.synchronize("openreg:1")


def _check_get_device_properties():
    p = openreg.get_device_properties(0)
    assert p.total_memory == openreg.mem_get_info(0)[1] == 4 * 1024 * MiB
    assert (p.major, p.minor) == openreg.get_device_capability(0)
    assert p.multi_processor_count >= 1
    assert openreg.get_device_properties("openreg:1").name == p.name


def _check_get_device_name():
    assert (
        openreg.get_device_name()
        == openreg.get_device_properties(0).name
        == "openreg simulated device"
    )
    assert openreg.get_device_name(1) == openreg.get_device_name(0)


def _check_get_device_capability():
    p = openreg.get_device_properties(1)
    assert openreg.get_device_capability(1) == (p.major, p.minor) == (1, 0)


def _check_can_device_access_peer():
    assert openreg.can_device_access_peer(0, 1) is True
    assert openreg.can_device_access_peer("openreg:1", 0) is True
    assert openreg.can_device_access_peer(0, 0) is False
    with pytest.raises(AssertionError, match="Invalid peer device id 5"):
        openreg.can_device_access_peer(0, 5)
    # What peer access promises: direct copies between the devices.
    a = torch.arange(10.0, device="openreg:0")
    assert torch.equal(a.to("openreg:1").cpu(), torch.arange(10.0))


def _check_is_bf16_supported():
    assert openreg.is_bf16_supported() is True
    assert openreg.is_bf16_supported(including_emulation=False) is True
    x = torch.tensor([1.5, 2.25], dtype=torch.bfloat16)
    assert torch.equal((x.to("openreg") * 2).cpu(), x * 2)


def _check_is_tf32_supported():
    assert openreg.is_tf32_supported() is False
    # float32 matmul is exact float32, as the CPU computes it.
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    torch.testing.assert_close((a.to("openreg") @ b.to("openreg")).cpu(), a @ b)


def _check_device_memory_used():
    free, total = openreg.mem_get_info(1)
    before = openreg.device_memory_used(1)
    assert before == total - free
    x = torch.empty(20 * MiB, dtype=torch.uint8, device="openreg:1")
    assert openreg.device_memory_used(1) - before == 20 * MiB
    del x
    openreg.empty_cache()
    assert openreg.device_memory_used(1) == before


def _check_get_arch_list():
    # What a CPU-only PyTorch answers for CUDA.
    assert openreg.get_arch_list() == [] == torch.cuda.get_arch_list()


def _check_get_gencode_flags():
    assert openreg.get_gencode_flags() == "" == torch.cuda.get_gencode_flags()


def _check_has_half():
    assert openreg.has_half is True
    x = torch.tensor([1.0, 0.5], dtype=torch.half)
    assert torch.equal((x.to("openreg") + x.to("openreg")).cpu(), x + x)


def _check_default_generators():
    torch.empty(1, device="openreg")
    gens = openreg.default_generators
    assert isinstance(gens, tuple) and len(gens) == openreg.device_count()
    assert [g.device for g in gens] == [torch.device("openreg", i) for i in range(2)]
    gens[1].manual_seed(1234)
    assert openreg.initial_seed() != 1234 or openreg.current_device() == 1
    with openreg.device(1):
        assert openreg.initial_seed() == 1234
    a = torch.randn(8, device="openreg:1").cpu()
    gens[1].manual_seed(1234)
    assert torch.equal(torch.randn(8, device="openreg:1").cpu(), a)
    # Before initialisation it is empty, as torch.cuda's.
    proc = run_python(
        """
        import torch
        print(torch.openreg.default_generators)
        torch.openreg.init()
        print(len(torch.openreg.default_generators))
        """
    )
    assert proc.stdout.split() == ["()", "2"], proc.stderr


def _check_DeferredCudaCallError():
    assert issubclass(openreg.DeferredOpenRegCallError, Exception)
    proc = run_python(
        """
        import torch
        torch.openreg.set_rng_state(torch.zeros(3, dtype=torch.uint8))  # queued: bad size
        try:
            torch.openreg.init()
        except torch.openreg.DeferredOpenRegCallError as e:
            print("deferred:", "originally invoked at" in str(e))
        """
    )
    assert proc.stdout.strip() == "deferred: True", proc.stderr


def _check_get_sync_debug_mode():
    assert openreg.get_sync_debug_mode() == 0
    try:
        for name, mode in (("warn", 1), ("error", 2), ("default", 0)):
            openreg.set_sync_debug_mode(name)
            assert openreg.get_sync_debug_mode() == mode
    finally:
        openreg.set_sync_debug_mode(0)


def _sync_messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "synchronizing openreg operation" in str(w.message)]


def _check_set_sync_debug_mode():
    x = torch.ones(4, device="openreg")
    pinned = torch.ones(4).pin_memory()
    synchronizing = {
        "item": lambda: x.sum().item(),
        "to the CPU": lambda: x.cpu(),
        "from the CPU": lambda: torch.ones(4).to("openreg"),
        "stream": lambda: openreg.current_stream().synchronize(),
    }
    quiet = {
        "elementwise": lambda: x.add_(1),
        "device sync": lambda: openreg.synchronize(),
        "pinned non_blocking": lambda: pinned.to("openreg", non_blocking=True),
        "on the device": lambda: x.to("openreg:1"),
    }
    try:
        openreg.set_sync_debug_mode("warn")
        for name, fn in synchronizing.items():
            assert len(_sync_messages(fn)) == 1, name
        for name, fn in quiet.items():
            assert _sync_messages(fn) == [], name
        openreg.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match=r"synchronizing openreg operation \(aten::_local"):
            x.sum().item()
        with pytest.raises(RuntimeError, match="blocking copy between openreg and the CPU"):
            x.cpu()
        x.add_(1)  # not synchronizing: allowed
        openreg.set_sync_debug_mode("default")
        assert _sync_messages(lambda: x.cpu()) == []
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            openreg.set_sync_debug_mode("loud")
        with pytest.raises(RuntimeError, match="invalid sync debug mode 3"):
            openreg.set_sync_debug_mode(3)
    finally:
        openreg.set_sync_debug_mode(0)
    openreg.synchronize()
    assert torch.equal(x.cpu(), torch.full((4,), 3.0))


# Streams and events


def _check_Stream():
    s = openreg.Stream(device=1, priority=-1)
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("openreg:1") and s.priority == -1
    assert openreg.Stream().priority == 0 and openreg.Stream().device_index == 0
    with openreg.stream(s):
        x = torch.ones(128, device="openreg:1").mul_(3)
    e = s.record_event()
    s2 = openreg.Stream(1)
    s2.wait_event(e)
    s2.wait_stream(s)
    s2.synchronize()
    assert s.query() and s2.query()
    assert x.sum().item() == 384
    same = openreg.Stream(stream_id=s.stream_id, device_index=1, device_type=s.device_type)
    assert same == s and same.priority == -1


def _check_Event():
    start, end = openreg.Event(enable_timing=True), openreg.Event(enable_timing=True)
    assert isinstance(start, torch.Event)
    start.record()
    y = torch.ones(512, 512, device="openreg") @ torch.ones(512, 512, device="openreg")
    end.record()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 0.0
    assert y[0, 0].item() == 512
    s = openreg.Stream()
    e = openreg.Event()
    e.record(openreg.current_stream())
    e.wait(s)
    s.synchronize()
    with pytest.raises(NotImplementedError, match="interprocess"):
        openreg.Event(interprocess=True)
    with pytest.raises(NotImplementedError, match="external"):
        openreg.Event(external=True)


def _check_StreamContext():
    s = openreg.Stream(1)
    ctx = openreg.StreamContext(s)
    before = openreg.current_stream(0)
    with ctx:
        assert openreg.current_device() == 1
        assert openreg.current_stream() == s
    assert openreg.current_device() == 0 and openreg.current_stream(0) == before
    assert openreg.current_stream(1) == openreg.default_stream(1)
    with openreg.StreamContext(None):
        assert openreg.current_stream() == before


def _check_stream():
    s = openreg.Stream()
    with openreg.stream(s):
        assert openreg.current_stream() == s
        assert torch.accelerator.current_stream() == s
        x = torch.zeros(64, device="openreg").add_(2)
    assert openreg.current_stream() == openreg.default_stream()
    s.synchronize()
    assert x.sum().item() == 128
    with openreg.stream(None):
        assert openreg.current_stream() == openreg.default_stream()


def _check_current_stream():
    assert openreg.current_stream() == openreg.default_stream()
    assert openreg.current_stream(1).device_index == 1
    assert isinstance(openreg.current_stream(), openreg.Stream)


def _check_default_stream():
    d = openreg.default_stream("openreg:1")
    assert d.device_index == 1 and d.stream_id == 0
    assert isinstance(d, openreg.Stream)


def _check_set_stream():
    s = openreg.Stream()
    openreg.set_stream(s)
    try:
        assert openreg.current_stream() == s
    finally:
        openreg.set_stream(openreg.default_stream())
    assert openreg.current_stream() == openreg.default_stream()


def _check_is_current_stream_capturing():
    assert openreg.is_current_stream_capturing() is False
    with openreg.stream(openreg.Stream()):
        assert openreg.is_current_stream_capturing() is False


# Memory


def _check_memory_allocated():
    before = openreg.memory_allocated(0)
    x = torch.empty(MiB // 4, dtype=torch.float32, device="openreg")
    assert openreg.memory_allocated(0) - before == MiB
    assert openreg.memory_allocated("openreg:0") == openreg.memory_allocated() == before + MiB
    y = torch.empty(100, dtype=torch.uint8, device="openreg")
    assert openreg.memory_allocated() - before == MiB + 512  # blocks round up to 512 bytes
    del x, y
    assert openreg.memory_allocated() == before


def _check_max_memory_allocated():
    openreg.reset_peak_memory_stats()
    base = openreg.memory_allocated()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="openreg")
    del x
    assert openreg.max_memory_allocated() == base + 4 * MiB
    assert openreg.memory_allocated() == base


def _check_memory_reserved():
    before = openreg.memory_reserved(1)
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg:1")
    grown = openreg.memory_reserved(1) - before
    assert grown >= 8 * MiB
    del x
    assert openreg.memory_reserved(1) - before == grown  # cached, still reserved
    openreg.empty_cache()
    assert openreg.memory_reserved(1) == before


def _check_max_memory_reserved():
    openreg.reset_peak_memory_stats(1)
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg:1")
    peak = openreg.memory_reserved(1)
    del x
    openreg.empty_cache()
    assert openreg.max_memory_reserved(1) == peak > openreg.memory_reserved(1)


def _check_memory_stats():
    stats = openreg.memory_stats()
    assert stats["allocated_bytes.all.current"] == openreg.memory_allocated()
    assert stats["reserved_bytes.all.current"] == openreg.memory_reserved()
    assert stats == torch.accelerator.memory_stats(0)
    before = stats["allocation.all.current"]
    x = torch.empty(10, device="openreg")
    assert openreg.memory_stats()["allocation.all.current"] == before + 1
    del x


def _check_memory_stats_as_nested_dict():
    x = torch.empty(10, device="openreg")
    nested, flat = openreg.memory_stats_as_nested_dict(), openreg.memory_stats()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"]
    assert nested["num_ooms"] == flat["num_ooms"]
    count = 0
    for key, value in flat.items():
        node = nested
        for part in key.split("."):
            node = node[part]
        assert node == value, key
        count += 1
    assert count == len(flat)
    del x


def _check_memory_summary():
    x = torch.empty(MiB, dtype=torch.uint8, device="openreg:1")
    text = openreg.memory_summary(1)
    assert "device 1" in text and "Allocated memory" in text
    assert "from large pool" in text and "from large pool" not in openreg.memory_summary(1, True)
    del x


def _check_memory_snapshot():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="openreg:1")
    segments = openreg.memory_snapshot()
    blocks = [
        b for s in segments if s["device"] == 1 for b in s["blocks"] if b["address"] == x.data_ptr()
    ]
    assert len(blocks) == 1
    assert blocks[0]["state"] == "active_allocated" and blocks[0]["size"] == 3 * MiB
    assert openreg.memory_snapshot(include_traces=False) == segments
    with pytest.raises(NotImplementedError, match="memory pools"):
        openreg.memory_snapshot(mempool_id=(1, 0))
    del x


def _check_reset_peak_memory_stats():
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="openreg")
    del x
    assert openreg.max_memory_allocated() >= openreg.memory_allocated() + 2 * MiB
    openreg.reset_peak_memory_stats("openreg:0")
    assert openreg.max_memory_allocated() == openreg.memory_allocated()
    assert openreg.max_memory_reserved() == openreg.memory_reserved()


def _check_reset_accumulated_memory_stats():
    x = torch.empty(1024, device="openreg")
    del x
    assert openreg.memory_stats()["allocated_bytes.all.allocated"] > 0
    openreg.reset_accumulated_memory_stats()
    stats = openreg.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0 == stats["allocated_bytes.all.freed"]


def _check_empty_cache():
    x = torch.empty(16 * MiB, dtype=torch.uint8, device="openreg:1")
    free_before = openreg.mem_get_info(1)[0]
    del x
    assert openreg.memory_reserved(1) >= 16 * MiB
    openreg.empty_cache()
    assert openreg.memory_reserved(1) == 0
    assert openreg.mem_get_info(1)[0] >= free_before + 16 * MiB


def _check_ipc_collect():
    before = openreg.memory_allocated(1)
    x = torch.ones(MiB // 4, device="openreg:1")
    message = ForkingPickler.dumps(x)  # a send no process has received yet
    del x
    openreg.ipc_collect()
    assert openreg.memory_allocated(1) == before + MiB  # kept for the receiver
    y = pickle.loads(message)  # received (here: by the sending process)
    assert y.tolist() == [1.0] * (MiB // 4)
    del y
    openreg.synchronize(1)  # the release is queued on the receiver's stream
    openreg.ipc_collect()
    assert openreg.memory_allocated(1) == before


def _check_mem_get_info():
    free, total = openreg.mem_get_info(1)
    assert total == openreg.get_device_properties(1).total_memory
    assert free == total - openreg.memory_reserved(1)
    x = torch.empty(20 * MiB, dtype=torch.uint8, device="openreg:1")
    assert openreg.mem_get_info("openreg:1") == (free - 20 * MiB, total)
    assert openreg.mem_get_info(1) == torch.accelerator.get_memory_info(1)
    del x


def _check_set_per_process_memory_fraction():
    total = openreg.get_device_properties(1).total_memory
    try:
        openreg.set_per_process_memory_fraction(0.01, 1)  # ~41 MiB
        small = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg:1")
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(total * 0.02), dtype=torch.uint8, device="openreg:1")
        del small
        with pytest.raises(TypeError, match="float"):
            openreg.set_per_process_memory_fraction(1, 1)
    finally:
        openreg.set_per_process_memory_fraction(1.0, 1)
    big = torch.empty(int(total * 0.02), dtype=torch.uint8, device="openreg:1")
    del big


def _check_get_per_process_memory_fraction():
    assert openreg.get_per_process_memory_fraction(1) == 1.0
    try:
        openreg.set_per_process_memory_fraction(0.5, 1)
        assert openreg.get_per_process_memory_fraction("openreg:1") == 0.5
        assert openreg.get_per_process_memory_fraction(0) == 1.0
    finally:
        openreg.set_per_process_memory_fraction(1.0, 1)


def _check_caching_allocator_alloc():
    before = openreg.memory_allocated(0)
    ptr = openreg.caching_allocator_alloc(MiB)
    assert ptr != 0 and openreg.memory_allocated(0) == before + MiB
    s = openreg.Stream(1)
    ptr1 = openreg.caching_allocator_alloc(2 * MiB, 1, s)
    (seg,) = [
        seg
        for seg in openreg.memory_snapshot()
        if seg["device"] == 1 and any(b["address"] == ptr1 for b in seg["blocks"])
    ]
    assert seg["stream"] == s.stream_id
    assert openreg.caching_allocator_alloc(0) == 0
    with pytest.raises(TypeError, match="torch.Stream"):
        openreg.caching_allocator_alloc(16, 0, 12345)
    with pytest.raises(ValueError, match="openreg:0"):
        openreg.caching_allocator_alloc(16, 0, s)
    openreg.caching_allocator_delete(ptr)
    openreg.caching_allocator_delete(ptr1)
    assert openreg.memory_allocated(0) == before


def _check_caching_allocator_delete():
    before = openreg.memory_allocated(1)
    ptr = openreg.caching_allocator_alloc(4096, "openreg:1")
    assert openreg.memory_allocated(1) == before + 4096
    openreg.caching_allocator_delete(ptr)
    assert openreg.memory_allocated(1) == before
    openreg.caching_allocator_delete(0)  # as a null pointer on CUDA
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        openreg.caching_allocator_delete(ptr)


def _check_caching_allocator_enable():
    openreg.caching_allocator_enable()
    openreg.caching_allocator_enable(True)
    with pytest.raises(NotImplementedError, match="cannot disable"):
        openreg.caching_allocator_enable(False)


def _check_caching_allocator_disabled():
    with pytest.raises(NotImplementedError, match="cannot disable"):
        with openreg.caching_allocator_disabled():
            pass


def _check_get_allocator_backend():
    assert openreg.get_allocator_backend() == "native"


def _pinned_round_trip():
    x = torch.arange(4096, dtype=torch.float32).pin_memory()
    y = x.to("openreg", non_blocking=True)
    openreg.synchronize()
    assert torch.equal(y.cpu(), x)
    return x


def _check_host_memory_stats():
    x = _pinned_round_trip()
    stats = openreg.host_memory_stats()
    assert list(stats) == sorted(stats)
    assert stats["allocations.current"] >= 1
    assert stats["active_bytes.current"] >= x.numel() * 4
    assert {"num_host_alloc", "num_host_free", "allocated_bytes.peak"} <= set(stats)
    del x


def _check_host_memory_stats_as_nested_dict():
    x = _pinned_round_trip()
    nested, flat = openreg.host_memory_stats_as_nested_dict(), openreg.host_memory_stats()
    assert nested["allocations"]["current"] == flat["allocations.current"]
    assert nested["num_host_alloc"] == flat["num_host_alloc"]
    del x


def _check_reset_peak_host_memory_stats():
    x = _pinned_round_trip()
    del x
    torch.accelerator.empty_host_cache()
    assert openreg.host_memory_stats()["allocations.peak"] >= 1
    openreg.reset_peak_host_memory_stats()
    stats = openreg.host_memory_stats()
    assert stats["allocations.peak"] == stats["allocations.current"]


def _check_reset_accumulated_host_memory_stats():
    x = _pinned_round_trip()
    del x
    assert openreg.host_memory_stats()["allocations.allocated"] >= 1
    openreg.reset_accumulated_host_memory_stats()
    stats = openreg.host_memory_stats()
    assert stats["allocations.allocated"] == 0 == stats["allocations.freed"]


def _deprecated_alias(old, new, *args):
    with pytest.warns(FutureWarning, match="renamed|now calls"):
        result = old(*args)
    return result, new(*args)


def _check_memory_cached():
    x = torch.empty(MiB, dtype=torch.uint8, device="openreg")
    got, want = _deprecated_alias(openreg.memory_cached, openreg.memory_reserved, 0)
    assert got == want > 0
    del x


def _check_max_memory_cached():
    x = torch.empty(MiB, dtype=torch.uint8, device="openreg")
    got, want = _deprecated_alias(openreg.max_memory_cached, openreg.max_memory_reserved, 0)
    assert got == want > 0
    del x


def _check_reset_max_memory_allocated():
    x = torch.empty(MiB, dtype=torch.uint8, device="openreg")
    del x
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        openreg.reset_max_memory_allocated()
    assert openreg.max_memory_allocated() == openreg.memory_allocated()


def _check_reset_max_memory_cached():
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg")
    del x
    openreg.empty_cache()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        openreg.reset_max_memory_cached()
    assert openreg.max_memory_reserved() == openreg.memory_reserved()


# Random numbers


def _randn(device="openreg"):
    return torch.randn(16, device=device).cpu()


def _check_manual_seed():
    openreg.manual_seed(7)
    a = _randn()
    openreg.manual_seed(7)
    assert torch.equal(_randn(), a)
    assert openreg.initial_seed() == 7
    openreg.manual_seed(8)
    assert not torch.equal(_randn(), a)


def _check_manual_seed_all():
    openreg.manual_seed_all(11)
    a0, a1 = _randn("openreg:0"), _randn("openreg:1")
    openreg.manual_seed_all(11)
    assert torch.equal(_randn("openreg:0"), a0) and torch.equal(_randn("openreg:1"), a1)
    assert torch.equal(a0, a1)  # same seed, same generator algorithm
    with openreg.device(1):
        assert openreg.initial_seed() == 11


def _check_seed():
    openreg.seed()
    first = openreg.initial_seed()
    a = _randn()
    openreg.manual_seed(first)
    assert torch.equal(_randn(), a)
    openreg.seed()
    assert openreg.initial_seed() != first  # 64 random bits


def _check_seed_all():
    openreg.seed_all()
    s0 = openreg.initial_seed()
    with openreg.device(1):
        assert openreg.initial_seed() == s0
    assert torch.equal(_randn("openreg:0"), _randn("openreg:1"))


def _check_initial_seed():
    openreg.manual_seed_all(3)
    openreg.manual_seed(5)
    assert openreg.initial_seed() == 5
    with openreg.device(1):
        assert openreg.initial_seed() == 3


def _check_get_rng_state():
    state = openreg.get_rng_state()
    assert state.device == torch.device("cpu") and state.dtype == torch.uint8
    a = _randn()
    openreg.set_rng_state(state)
    assert torch.equal(_randn(), a)
    assert torch.equal(openreg.get_rng_state("openreg:0"), openreg.get_rng_state(0))


def _check_get_rng_state_all():
    states = openreg.get_rng_state_all()
    assert len(states) == 2
    assert torch.equal(states[1], openreg.get_rng_state(1))


def _check_set_rng_state():
    state = openreg.get_rng_state(1)
    a = _randn("openreg:1")
    openreg.set_rng_state(state, "openreg:1")
    assert torch.equal(_randn("openreg:1"), a)


def _check_set_rng_state_all():
    states = openreg.get_rng_state_all()
    a0, a1 = _randn("openreg:0"), _randn("openreg:1")
    openreg.set_rng_state_all(states)
    assert torch.equal(_randn("openreg:0"), a0) and torch.equal(_randn("openreg:1"), a1)


# AMP


def _check_amp_autocast():
    a = torch.randn(8, 8, device="openreg")
    with pytest.warns(FutureWarning, match="torch.amp.autocast"):
        ctx = openreg.amp.autocast(dtype=torch.bfloat16)
    with ctx:
        assert torch.is_autocast_enabled("openreg")
        y = a @ a
    assert y.dtype == torch.bfloat16 and (a @ a).dtype == torch.float32
    torch.testing.assert_close(y.float().cpu(), a.cpu() @ a.cpu(), atol=0.5, rtol=0.05)
    with pytest.warns(FutureWarning):
        off = openreg.amp.autocast(enabled=False)
    with off:
        assert (a @ a).dtype == torch.float32


def _check_amp_GradScaler():
    with pytest.warns(FutureWarning, match="GradScaler"):
        scaler = openreg.amp.GradScaler(init_scale=8.0, growth_interval=1)
    assert isinstance(scaler, torch.amp.GradScaler)
    w = torch.nn.Parameter(torch.ones(4, device="openreg"))
    opt = torch.optim.SGD([w], lr=0.5)
    loss = (w * 2).sum()
    assert scaler.scale(loss).item() == loss.item() * 8.0
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(w.detach().cpu(), torch.zeros(4))  # 1 - 0.5 * 2, unscaled
    assert scaler.get_scale() == 16.0  # grew after a finite step
    opt.zero_grad()
    w.grad = torch.full((4,), float("inf"), device="openreg")
    scaler.step(opt)
    scaler.update()
    assert torch.equal(w.detach().cpu(), torch.zeros(4))  # step skipped
    assert scaler.get_scale() == 8.0  # backed off


def _custom_function():
    with pytest.warns(FutureWarning, match="custom_fwd"):
        fwd = openreg.amp.custom_fwd(cast_inputs=torch.float32)
    with pytest.warns(FutureWarning, match="custom_bwd"):
        bwd_decorator = openreg.amp.custom_bwd

        class Square(torch.autograd.Function):
            @staticmethod
            @fwd
            def forward(ctx, x):
                ctx.save_for_backward(x)
                ctx.dtype_seen = x.dtype
                return x * x

            @staticmethod
            @bwd_decorator
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                ctx.grad_autocast = torch.is_autocast_enabled("openreg")
                return 2 * x * grad

    return Square


def _check_amp_custom_fwd():
    square = _custom_function()
    x = torch.tensor([1.0, 2.0, 3.0], device="openreg", requires_grad=True)
    with torch.autocast("openreg", dtype=torch.float16):
        y = square.apply(x.half())
    assert y.dtype == torch.float32  # inputs cast to float32, autocast off inside
    assert torch.equal(y.detach().cpu(), torch.tensor([1.0, 4.0, 9.0]))


def _check_amp_custom_bwd():
    square = _custom_function()
    x = torch.tensor([1.0, 2.0, 3.0], device="openreg", requires_grad=True)
    with torch.autocast("openreg", dtype=torch.float16):
        y = square.apply(x)
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.tensor([2.0, 4.0, 6.0]))


def _check_amp_amp_definitely_not_available():
    assert openreg.amp.amp_definitely_not_available() is False


# Submodules


def _check_amp():
    assert openreg.amp.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert openreg.get_autocast_dtype is openreg.amp.get_autocast_dtype


def _check_memory():
    assert openreg.memory.memory_allocated is openreg.memory_allocated


def _check_random():
    assert openreg.random.manual_seed is openreg.manual_seed


def _check_streams():
    assert openreg.streams.Stream is openreg.Stream and openreg.streams.Event is openreg.Event


# Legacy typed storages: what Tensor.storage_type() and TypedStorage use.


def _make_storage_check(dtype_name):
    def check():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation
            cls = getattr(openreg, f"{dtype_name}Storage")
            dtype = cls._dtype
            assert dtype == getattr(torch.cuda, f"{dtype_name}Storage")._dtype
            x = torch.zeros(3, dtype=dtype, device="openreg")
            assert x.storage_type() is cls
            assert isinstance(x.storage(), cls)
            assert not isinstance(x.cpu().storage(), cls)
            s = cls(5)
            assert s.device == torch.device("openreg", 0) and s.size() == 5 and s.dtype == dtype
            with pytest.raises(RuntimeError, match="not available for openreg storage"):
                cls.from_buffer(b"\x00" * 8)

    return check


for _name in table.STORAGE_DTYPES:
    globals()[f"_check_{_name}Storage"] = _make_storage_check(_name)


CHECKS = {
    name.removeprefix("_check_").replace("amp_", "amp.", 1)
    if name.startswith("_check_amp_")
    else name.removeprefix("_check_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("_check_")
}


def test_every_counterpart_row_has_a_behaviour_check():
    rows = {r.cuda for r in COUNTERPART_ROWS}
    assert rows - set(CHECKS) == set(), "rows without a check"
    assert set(CHECKS) - rows == set(), "checks without a row"


@pytest.mark.parametrize("row", COUNTERPART_ROWS, ids=lambda r: r.cuda)
def test_counterpart_behaves_like_torch_cuda(row):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. an unexpected fallback notice
        CHECKS[row.cuda]()


# ---------------------------------------------------------------------------
# torch.accelerator


def _accelerator_names():
    memory = torch.accelerator.memory
    for name in memory.__all__:
        assert getattr(torch.accelerator, name) is getattr(memory, name)
    return set(torch.accelerator.__all__) | set(memory.__all__)


def test_accelerator_table_lists_the_whole_api():
    assert _accelerator_names() == set(table.ACCELERATOR)
    assert set(ACCEL_CHECKS) == set(table.ACCELERATOR)


def _acc_current_accelerator():
    assert torch.accelerator.current_accelerator() == torch.device("openreg")
    assert torch.accelerator.current_accelerator(check_available=True).type == "openreg"


def _acc_is_available():
    assert torch.accelerator.is_available() is True


def _acc_device_count():
    assert torch.accelerator.device_count() == openreg.device_count() == 2


def _acc_current_device_index():
    openreg.set_device(1)
    assert torch.accelerator.current_device_index() == 1


def _acc_current_device_idx():
    openreg.set_device(1)
    with pytest.warns(FutureWarning):
        assert torch.accelerator.current_device_idx() == 1


def _acc_set_device_index():
    torch.accelerator.set_device_index("openreg:1")
    assert openreg.current_device() == 1
    torch.accelerator.set_device_index(0)
    assert openreg.current_device() == 0


def _acc_set_device_idx():
    with pytest.warns(FutureWarning):
        torch.accelerator.set_device_idx(1)
    assert openreg.current_device() == 1


def _acc_device_index():
    with torch.accelerator.device_index(1):
        assert openreg.current_device() == 1
        assert torch.ones(1, device="openreg").device.index == 1
    assert openreg.current_device() == 0
    with torch.accelerator.device_index(None):
        assert openreg.current_device() == 0


def _acc_get_device_capability():
    cap = torch.accelerator.get_device_capability("openreg:0")
    dtypes = cap["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool} <= dtypes
    for dtype in (torch.float16, torch.bfloat16, torch.int8, torch.complex64):
        x = torch.ones(3, dtype=dtype)
        assert torch.equal(x.to("openreg").cpu(), x)


def _acc_current_stream():
    s = openreg.Stream(1)
    with openreg.stream(s):
        assert torch.accelerator.current_stream() == s
        assert torch.accelerator.current_stream(1) == s
    assert torch.accelerator.current_stream(1) == openreg.default_stream(1)


def _acc_set_stream():
    s = openreg.Stream()
    torch.accelerator.set_stream(s)
    try:
        assert openreg.current_stream() == s
    finally:
        torch.accelerator.set_stream(openreg.default_stream())


def _acc_synchronize():
    s = openreg.Stream(1)
    with openreg.stream(s):
        x = torch.ones(256, 256, device="openreg:1")
        for _ in range(10):
            x.add_(1)
    torch.accelerator.synchronize(1)
    assert s.query()
    assert x[0, 0].item() == 11


def _acc_empty_cache():
    x = torch.empty(16 * MiB, dtype=torch.uint8, device="openreg")
    del x
    assert openreg.memory_reserved() > openreg.memory_allocated()
    torch.accelerator.empty_cache()
    assert openreg.memory_reserved() == 0


def _acc_empty_host_cache():
    x = _pinned_round_trip()
    del x
    # Freeing records an event on the stream that used the block; it is
    # reusable (and releasable) once the stream has passed that event.
    openreg.synchronize()
    assert openreg.host_memory_stats()["allocations.current"] >= 1  # cached
    torch.accelerator.empty_host_cache()
    stats = openreg.host_memory_stats()
    assert stats["allocations.current"] == 0 == stats["allocated_bytes.current"]


def _acc_get_memory_info():
    x = torch.empty(20 * MiB, dtype=torch.uint8, device="openreg:1")
    free, total = torch.accelerator.get_memory_info(1)
    assert (free, total) == openreg.mem_get_info(1)
    assert total == openreg.get_device_properties(1).total_memory
    assert free == total - openreg.memory_reserved(1)
    del x


def _acc_memory_stats():
    x = torch.empty(MiB, dtype=torch.uint8, device="openreg")
    assert torch.accelerator.memory_stats() == openreg.memory_stats()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] >= MiB
    del x


def _acc_memory_allocated():
    before = torch.accelerator.memory_allocated(0)
    x = torch.empty(MiB, dtype=torch.uint8, device="openreg")
    assert torch.accelerator.memory_allocated(0) == before + MiB == openreg.memory_allocated(0)
    del x


def _acc_max_memory_allocated():
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="openreg")
    del x
    assert torch.accelerator.max_memory_allocated() == base + 2 * MiB
    assert torch.accelerator.max_memory_allocated() == openreg.max_memory_allocated()


def _acc_memory_reserved():
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="openreg:1")
    assert torch.accelerator.memory_reserved(1) == openreg.memory_reserved(1) >= 2 * MiB
    del x


def _acc_max_memory_reserved():
    torch.accelerator.reset_peak_memory_stats(1)
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg:1")
    peak = openreg.memory_reserved(1)
    del x
    torch.accelerator.empty_cache()
    assert torch.accelerator.max_memory_reserved(1) == peak == openreg.max_memory_reserved(1)


def _acc_reset_peak_memory_stats():
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="openreg")
    del x
    torch.accelerator.reset_peak_memory_stats()
    assert openreg.max_memory_allocated() == openreg.memory_allocated()


def _acc_reset_accumulated_memory_stats():
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="openreg")
    del x
    torch.accelerator.reset_accumulated_memory_stats()
    assert openreg.memory_stats()["allocated_bytes.all.freed"] == 0


def _acc_Graph():
    # Documented as unsupported: a clear error, not a graph that replays nothing.
    with pytest.raises(RuntimeError, match="Graph is not supported on device type: openreg"):
        torch.accelerator.Graph()


ACCEL_CHECKS = {
    name.removeprefix("_acc_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("_acc_")
}


@pytest.mark.parametrize("name", sorted(table.ACCELERATOR))
def test_accelerator_api_on_openreg(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ACCEL_CHECKS[name]()
