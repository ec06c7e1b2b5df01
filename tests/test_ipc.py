"""openreg tensors shared between processes (torch.multiprocessing), like CUDA IPC.

Most tests talk to one spawned peer process (``peer`` fixture): a call sends
a function and its arguments over a ``torch.multiprocessing`` queue, so
every openreg tensor argument is shared with the peer, and every openreg
tensor the peer returns is shared back. Values come back as lists, so no
CPU shared memory (files outside tmp_path) is involved. Spawned processes
import this module to find the functions, so it keeps its imports light.
"""

import io
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

D0, D1 = "openreg:0", "openreg:1"
TIMEOUT_S = 60
SPAWN = mp.get_context("spawn")


# ---------------------------------------------------------------------------
# The peer process


def _serve(requests, replies):
    held = {}  # what the peer keeps between calls
    while True:
        try:
            item = requests.get()
        except Exception as e:  # an argument could not be received
            replies.put((False, f"{type(e).__name__}: {e}"))
            continue
        if item is None:
            return
        fn, args = item
        try:
            replies.put((True, fn(held, *args)))
        except Exception as e:
            replies.put((False, f"{type(e).__name__}: {e}"))
        del item, fn, args  # the call's tensors die here


class Peer:
    def __init__(self):
        self.requests = SPAWN.Queue()
        self.replies = SPAWN.Queue()
        self.process = SPAWN.Process(target=_serve, args=(self.requests, self.replies))
        self.process.start()

    def call(self, fn, *args):
        """Runs fn(held, *args) in the peer; raises RuntimeError with the
        peer's error if it failed."""
        self.requests.put((fn, args))
        ok, value = self.replies.get(timeout=TIMEOUT_S)
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self):
        self.requests.put(None)
        self.process.join(TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


@pytest.fixture(scope="module")
def peer():
    p = Peer()
    yield p
    p.close()


# Functions the peer runs (module level, so the peer can unpickle them).


def _add_in_place(held, t, value):
    t.add_(value)
    torch.openreg.synchronize(t.device.index)
    return str(t.device)


def _describe(held, t):
    return {
        "type": type(t).__name__,
        "device": str(t.device),
        "dtype": str(t.dtype),
        "size": list(t.size()),
        "stride": list(t.stride()),
        "storage_offset": t.storage_offset(),
        "requires_grad": t.requires_grad,
        "values": t.tolist(),
    }


def _views_share_storage(held, a, b):
    same = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    a.fill_(7.0)  # the message's two views are views of one storage here too
    return same, b.tolist()


def _storage_bytes(held, storage):
    t = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return str(storage.device), storage.nbytes(), t[:4].tolist()


def _hold(held, name, t):
    held[name] = t
    return t.data_ptr()


def _drop(held, name):
    device = held.pop(name).device
    torch.openreg.synchronize(device.index)  # the release is stream-ordered
    return True


def _read_held(held, name):
    torch.openreg.synchronize()
    return held[name].tolist()


def _make_and_keep(held, name):
    held[name] = torch.arange(5.0, device=D1) * 3
    return held[name]


def _echo(held, t):
    return t


def _clone_back(held, t):
    return t.clone()


def _sync_all(held):
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)  # runs the queued releases
    return True


def _unused(held, t):
    return True


def _drop_while_the_stream_is_busy(held, name):
    t = held.pop(name)
    index = t.device.index
    a = torch.ones(2048, 2048, device=t.device)
    a @ a  # the signature's first run (synchronous)
    torch.openreg.synchronize(index)
    for _ in range(8):
        a @ a  # queued: seconds of work on the stream
    del t  # its release is queued behind them
    busy = not torch.openreg.current_stream(index).query()
    torch.openreg.synchronize(index)  # ... and has run by now
    return busy


# ---------------------------------------------------------------------------
# Aliasing


def test_receiver_aliases_the_senders_memory(peer):
    x = torch.arange(8.0, device=D0)
    x.mul_(2)  # queued work before the put: the receiver must see it
    assert peer.call(_add_in_place, x, 10.0) == D0
    torch.openreg.synchronize()
    assert x.tolist() == [2.0 * i + 10.0 for i in range(8)]


def test_parameter_and_non_contiguous_view_round_trip(peer):
    p = torch.nn.Parameter(torch.randn(3, 4, device=D1))
    got = peer.call(_describe, p)
    assert got["type"] == "Parameter" and got["requires_grad"] is True
    assert got["device"] == D1 and got["values"] == p.tolist()
    base = torch.arange(40.0, device=D0).view(5, 8)
    view = base.t()[2:, 1::2]  # transposed, offset, strided
    got = peer.call(_describe, view)
    assert got["size"] == list(view.size())
    assert got["stride"] == list(view.stride())
    assert got["storage_offset"] == view.storage_offset()
    assert got["values"] == view.tolist()
    ints = torch.arange(6, dtype=torch.int16, device=D0)
    assert peer.call(_describe, ints)["dtype"] == "torch.int16"
    empty = torch.empty(0, device=D1)
    assert peer.call(_describe, empty)["size"] == [0]


def test_views_in_one_message_share_one_storage(peer):
    a = torch.zeros(2, 3, device=D0)
    same, b_values = peer.call(_views_share_storage, a[0], a[1])
    assert same and b_values == [0.0, 0.0, 0.0]
    assert a.tolist() == [[7.0, 7.0, 7.0], [0.0, 0.0, 0.0]]


def test_untyped_storage_round_trips(peer):
    x = torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8, device=D1)
    assert peer.call(_storage_bytes, x.untyped_storage()) == (D1, 5, [1, 2, 3, 4])


def test_sending_back_from_the_receiver(peer):
    # A tensor the peer allocated comes back aliasing the peer's memory.
    y = peer.call(_make_and_keep, "made")
    assert y.device == torch.device(D1) and y.tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
    y.add_(1)
    torch.openreg.synchronize(1)
    assert peer.call(_read_held, "made") == [1.0, 4.0, 7.0, 10.0, 13.0]
    del y
    # A tensor the peer received cannot be sent on (as with CUDA): the
    # peer's reply queue pickles in its feeder thread, so the error arrives
    # here, at get(), instead of a hang.
    x = torch.ones(3, device=D0)
    with pytest.raises(RuntimeError, match="cannot send a tensor received from another process"):
        peer.call(_echo, x)
    # A clone can be sent.
    assert peer.call(_clone_back, x).tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------------------
# The sender's block stays allocated while a receiver holds it


def test_senders_block_is_kept_until_the_receiver_releases_it(peer):
    peer.call(_sync_all)  # earlier tests' tensors: released by the peer ...
    torch.openreg.ipc_collect()  # ... and returned to the cache here
    torch.openreg.empty_cache()
    nbytes = 12 << 20  # a segment of its own (large pool, not split)
    before = torch.openreg.memory_allocated(D0)
    x = torch.ones(nbytes // 4, device=D0)
    address = x.data_ptr()
    peer.call(_hold, "big", x)
    del x
    torch.openreg.ipc_collect()  # the receiver still holds it: nothing to free
    assert torch.openreg.memory_allocated(D0) == before + nbytes
    y = torch.empty(nbytes // 4, device=D0)
    assert y.data_ptr() != address, "the sender reused a block a receiver holds"
    assert peer.call(_read_held, "big")[:3] == [1.0, 1.0, 1.0]
    peer.call(_drop, "big")
    torch.openreg.ipc_collect()
    assert torch.openreg.memory_allocated(D0) == before + nbytes  # only y now
    z = torch.empty(nbytes // 4, device=D0)
    assert z.data_ptr() == address, "the released block returns to the cache"
    del y, z


def test_storage_dropped_by_the_receiver_first_is_freed_at_once(peer):
    peer.call(_sync_all)
    torch.openreg.ipc_collect()
    before = torch.openreg.memory_allocated(D0)
    x = torch.ones(1000, device=D0)
    peer.call(_unused, x)  # received, then dropped at the end of the call
    peer.call(_sync_all)  # the peer's release is queued on its stream
    del x
    torch.openreg.ipc_collect()
    assert torch.openreg.memory_allocated(D0) == before


def test_releasing_a_received_tensor_does_not_wait_for_the_device(peer):
    """The receiver's deleter queues the release behind its stream's work and
    returns, with either driver: the stream is still busy after it. With each
    device in a process of its own the host runs the release once that work
    has finished (run_after_event), and the sender gets its block back."""
    peer.call(_sync_all)
    torch.openreg.ipc_collect()
    before = torch.openreg.memory_allocated(D0)
    x = torch.ones(1 << 20, device=D0)
    peer.call(_hold, "busy", x)
    del x
    busy = peer.call(_drop_while_the_stream_is_busy, "busy")
    # Under OPENREG_LAUNCH_BLOCKING=1 every launch waits, so the stream is
    # idle by then whatever the deleter does; the release is still checked.
    if os.environ.get("OPENREG_LAUNCH_BLOCKING") != "1":
        assert busy, "the receiver's deleter waited for its stream"
    torch.openreg.ipc_collect()
    assert torch.openreg.memory_allocated(D0) == before


def test_allocation_collects_released_shared_blocks_before_running_out(peer):
    # A released shared block waits in the limbo until something collects
    # it; an allocation that would run out of memory does, before failing.
    peer.call(_sync_all)
    torch.openreg.ipc_collect()
    torch.openreg.empty_cache()
    before = torch.openreg.memory_allocated(D1)
    nbytes = 30 << 20
    torch.openreg.set_per_process_memory_fraction(48 / 4096, D1)  # 48 MiB of 4 GiB
    try:
        x = torch.ones(nbytes // 4, device=D1)
        address = x.data_ptr()
        message = ForkingPickler.dumps(x)  # in flight: the block is kept
        del x
        y = pickle.loads(message)  # received (by this process) ...
        del y
        torch.openreg.synchronize(1)  # ... and released; nothing collected yet
        assert torch.openreg.memory_allocated(D1) == before + nbytes
        ooms = torch.openreg.memory_stats(D1)["num_ooms"]
        z = torch.empty(nbytes // 4, device=D1)  # 60 MiB would not fit
        assert z.data_ptr() == address
        assert torch.openreg.memory_stats(D1)["num_ooms"] == ooms
        del z
    finally:
        torch.openreg.set_per_process_memory_fraction(1.0, D1)


# ---------------------------------------------------------------------------
# Same process


def test_put_and_get_in_the_same_process():
    q = SPAWN.SimpleQueue()
    x = torch.arange(4.0, device=D0)
    q.put(x)
    y = q.get()
    assert y.data_ptr() == x.data_ptr() and y.untyped_storage().data_ptr() == x.data_ptr()
    q.put(x[1:])
    address = x.data_ptr()
    del x, y  # the sender's tensor dies before its get()
    z = q.get()
    assert z.tolist() == [1.0, 2.0, 3.0] and z.data_ptr() == address + 4


def test_the_same_bytes_cannot_be_received_twice():
    x = torch.ones(2, device=D0)
    message = ForkingPickler.dumps(x)
    assert pickle.loads(message).data_ptr() == x.data_ptr()
    with pytest.raises(RuntimeError, match="this shared tensor was already received"):
        pickle.loads(message)


def test_ordinary_pickle_still_copies():
    x = torch.ones(2, device=D0)
    y = pickle.loads(pickle.dumps(x))
    assert y.device == x.device and y.data_ptr() != x.data_ptr() and y.tolist() == [1.0, 1.0]


# ---------------------------------------------------------------------------
# What cannot be shared


def test_unshareable_tensors_raise_at_put_when_put_pickles():
    owner = torch.ones(4, device=D0)
    blob = torch.openreg.from_blob(owner.data_ptr(), [4], dtype=torch.float32, owner=owner)
    with pytest.raises(RuntimeError, match="not allocated by openreg's caching allocator"):
        ForkingPickler(io.BytesIO()).dump(blob)
    with pytest.raises(RuntimeError, match="not allocated by openreg's caching allocator"):
        SPAWN.SimpleQueue().put(blob)
    leaf = torch.ones(2, device=D0, requires_grad=True)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf"):
        ForkingPickler(io.BytesIO()).dump(leaf * 2)


def test_unshareable_tensor_on_a_queue_fails_at_get_not_a_hang(peer):
    owner = torch.ones(4, device=D0)
    blob = torch.openreg.from_blob(owner.data_ptr(), [4], dtype=torch.float32, owner=owner)
    # Queue.put pickles in a feeder thread: the sender warns there, and the
    # peer's get() raises the error, which the peer sends back.
    with (
        pytest.warns(RuntimeWarning, match="the receiver's get\\(\\) raises this error"),
        pytest.raises(RuntimeError, match="not allocated by openreg's caching allocator"),
    ):
        peer.call(_describe, blob)
    assert peer.call(_describe, blob.clone())["values"] == [1.0] * 4


def _forked_receiver(q, results):
    try:
        q.get(timeout=TIMEOUT_S)
        results.put("received")
    except Exception as e:
        results.put(f"{type(e).__name__}: {e}")


def test_forked_child_of_an_initialised_process_gets_the_fork_error(peer):
    peer.call(_sync_all)  # earlier tests' tensors: released by the peer ...
    torch.openreg.ipc_collect()  # ... and returned to the cache here
    before = torch.openreg.memory_allocated(D0)
    fork = mp.get_context("fork")
    q, results = fork.Queue(), fork.Queue()
    child = fork.Process(target=_forked_receiver, args=(q, results))
    child.start()
    try:
        x = torch.arange(3.0, device=D0)
        q.put(x)
        message = results.get(timeout=TIMEOUT_S)
    finally:
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
    assert "Cannot re-initialize openreg in forked subprocess" in message
    # The child gave the send back: the block is not kept for it.
    del x
    torch.openreg.ipc_collect()
    assert torch.openreg.memory_allocated(D0) == before


# ---------------------------------------------------------------------------
# A short-lived process with one device: receives, sends, exits without
# releasing anything (as a crash would)


def _one_device_process(inbox, outbox):
    x0 = inbox.get(timeout=TIMEOUT_S)
    outbox.put(("x0", x0.tolist()))
    try:
        inbox.get(timeout=TIMEOUT_S)
        outbox.put(("x1", "received"))
    except Exception as e:
        outbox.put(("x1", f"{type(e).__name__}: {e}"))
    mine = torch.full((3,), 5.0, device="openreg:0")
    outbox.put(mine)
    outbox.close()
    outbox.join_thread()  # the bytes are in the pipe
    os._exit(0)  # no clean-up: x0 is never released


@pytest.fixture(scope="module")
def one_device_run(peer):
    env = os.environ.get("OPENREG_DEVICE_COUNT")
    os.environ["OPENREG_DEVICE_COUNT"] = "1"
    try:
        inbox, outbox = SPAWN.Queue(), SPAWN.Queue()
        process = SPAWN.Process(target=_one_device_process, args=(inbox, outbox))
        process.start()
    finally:
        if env is None:
            del os.environ["OPENREG_DEVICE_COUNT"]
        else:
            os.environ["OPENREG_DEVICE_COUNT"] = env
    peer.call(_sync_all)
    torch.openreg.ipc_collect()
    before = [torch.openreg.memory_allocated(d) for d in (D0, D1)]
    x0 = torch.full((4,), 2.0, device=D0)
    inbox.put(x0)
    inbox.put(torch.ones(2, device=D1))
    results = dict(outbox.get(timeout=TIMEOUT_S) for _ in range(2))
    process.join(TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()
    try:
        outbox.get(timeout=TIMEOUT_S)
        results["after_exit"] = "received"
    except RuntimeError as e:
        results["after_exit"] = str(e)
    del x0
    torch.openreg.ipc_collect()
    after = [torch.openreg.memory_allocated(d) for d in (D0, D1)]
    results["leaked"] = [a - b for a, b in zip(after, before, strict=True)]
    return results


def test_receiver_without_the_device_gets_a_clear_error(one_device_run):
    assert one_device_run["x0"] == [2.0] * 4
    assert (
        "Invalid openreg device index 1: this machine has 1 openreg device"
        in (one_device_run["x1"])
    )


def test_tensor_from_an_exited_sender_is_a_clear_error(one_device_run):
    assert "exited before this process received the tensor" in one_device_run["after_exit"]


def test_blocks_held_by_an_exited_receiver_are_collected(one_device_run):
    # x0 was held by the process when it died; the openreg:1 tensor it could
    # not open was given back at once.
    assert one_device_run["leaked"] == [0, 0]


# ---------------------------------------------------------------------------
# DataLoader workers (spawn) returning openreg tensors


class DeviceSquares(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        x = torch.full((2,), float(i), device="openreg:1")
        return x * x


def test_spawned_dataloader_workers_return_openreg_tensors():
    loader = DataLoader(
        DeviceSquares(), batch_size=4, num_workers=2, multiprocessing_context="spawn"
    )
    batches = list(loader)
    del loader  # the workers have exited: the batches stay valid
    assert [b.device for b in batches] == [torch.device(D1)] * 3
    for k, b in enumerate(batches):
        expected = [[float(i * i)] * 2 for i in range(4 * k, 4 * k + 4)]
        assert b.tolist() == expected
    assert (torch.stack(batches).sum() == sum(2 * i * i for i in range(12))).item()
