"""Where programs meet the device: backend metadata through save/load and
copies, checkpoints across devices, DLPack, from_blob, shallow copies,
storages, generated methods, DataLoader workers.

DataLoader's spawned workers import this module to find the dataset class,
so it keeps its imports light (no conftest).
"""

import io
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

D0, D1 = "openreg:0", "openreg:1"


# ---------------------------------------------------------------------------
# Backend metadata (c10::BackendMeta + TensorBackendMetaRegistry)


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_tags_start_empty_and_are_set_per_tensor():
    x = torch.ones(3, device=D0)
    y = torch.ones(3, device=D0)
    assert torch.openreg.tensor_tags(x) == {}
    torch.openreg.set_tensor_tag(x, "ema")
    torch.openreg.set_tensor_tag(x, "frozen", False)
    assert torch.openreg.tensor_tags(x) == {"ema": True, "frozen": False}
    assert torch.openreg.tensor_tags(y) == {}


def test_tags_follow_pytorch_copy_rules():
    x = torch.arange(6.0, device=D1)
    torch.openreg.set_tensor_tag(x, "ema")
    # Shallow copies share the TensorImpl's metadata by cloning it...
    assert torch.openreg.tensor_tags(x.detach()) == {"ema": True}
    assert torch.openreg.tensor_tags(x.data) == {"ema": True}
    p = torch.nn.Parameter(x)
    assert torch.openreg.tensor_tags(p) == {"ema": True}
    # ... as a copy: tagging the shallow copy leaves the original alone.
    d = x.detach()
    torch.openreg.set_tensor_tag(d, "other")
    assert torch.openreg.tensor_tags(x) == {"ema": True}
    # New tensors start without metadata.
    assert torch.openreg.tensor_tags(x.clone()) == {}
    assert torch.openreg.tensor_tags(x.to(D0)) == {}
    assert torch.openreg.tensor_tags(x[1:]) == {}
    assert torch.openreg.tensor_tags(x + 1) == {}


@pytest.mark.parametrize("weights_only", [True, False])
def test_tags_survive_save_and_load(weights_only):
    x = torch.arange(4.0, device=D1)
    torch.openreg.set_tensor_tag(x, "ema")
    torch.openreg.set_tensor_tag(x, "frozen", False)
    assert torch._C._get_tensor_metadata(x) == {"openreg.ema": True, "openreg.frozen": False}
    y = _roundtrip(x, weights_only=weights_only)
    assert y.device == torch.device(D1) and torch.equal(y.cpu(), x.cpu())
    assert torch.openreg.tensor_tags(y) == {"ema": True, "frozen": False}
    # Onto another openreg device: still openreg, tags kept.
    z = _roundtrip(x, weights_only=weights_only, map_location=D0)
    assert z.device == torch.device(D0) and torch.openreg.tensor_tags(z) == {
        "ema": True,
        "frozen": False,
    }
    # Onto the CPU: CPU tensors have no openreg metadata; the values arrive.
    c = _roundtrip(x, weights_only=weights_only, map_location="cpu")
    assert c.device.type == "cpu" and torch.equal(c, x.cpu())


def test_tags_of_state_dict_entries_survive():
    model = torch.nn.Linear(3, 2).to(D0)
    torch.openreg.set_tensor_tag(model.weight, "frozen")
    sd = _roundtrip(model.state_dict(), weights_only=True)
    assert torch.openreg.tensor_tags(sd["weight"]) == {"frozen": True}
    assert torch.openreg.tensor_tags(sd["bias"]) == {}


def test_tag_errors_are_clear():
    with pytest.raises(RuntimeError, match="tags live on openreg tensors, got a tensor on cpu"):
        torch.openreg.set_tensor_tag(torch.ones(1), "ema")
    with pytest.raises(RuntimeError, match="contain no '.', got 'a.b'"):
        torch.openreg.set_tensor_tag(torch.ones(1, device=D0), "a.b")
    assert torch.openreg.tensor_tags(torch.ones(1)) == {}


# ---------------------------------------------------------------------------
# Checkpoints


@pytest.mark.parametrize("device", [D0, D1])
def test_model_and_optimizer_state_roundtrip_with_weights_only(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(
        device
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(16, 4, device=device)
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    ckpt = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()}, weights_only=True)
    for t in ckpt["opt"]["state"][0].values():
        assert t.device == torch.device(device) or t.device.type == "cpu"  # "step" may stay on CPU
    exp_avg = ckpt["opt"]["state"][0]["exp_avg"]
    assert exp_avg.device == torch.device(device)
    assert torch.equal(exp_avg.cpu(), opt.state_dict()["state"][0]["exp_avg"].cpu())

    # Resuming from the checkpoint continues exactly like the original.
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(
        device
    )
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    fresh.load_state_dict(ckpt["model"])
    fresh_opt.load_state_dict(ckpt["opt"])
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a.cpu(), b.cpu())


def test_whole_module_roundtrip_and_map_location():
    # Pickling a whole module needs weights_only=False (arbitrary classes).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh()).to(D1)
    x = torch.randn(2, 3)
    loaded = _roundtrip(model, weights_only=False)
    assert next(loaded.parameters()).device == torch.device(D1)
    assert torch.equal(loaded(x.to(D1)).cpu(), model(x.to(D1)).cpu())
    on0 = _roundtrip(model, weights_only=False, map_location=D0)
    assert all(p.device == torch.device(D0) for p in on0.parameters())
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        _roundtrip(model, weights_only=True)


def test_map_location_dict_and_callable_move_between_devices():
    sd = {"a": torch.arange(3.0, device=D1), "b": torch.arange(2.0, device=D0)}
    moved = _roundtrip(sd, weights_only=True, map_location={D1: D0})
    assert moved["a"].device == torch.device(D0) and moved["b"].device == torch.device(D0)
    to_cpu = _roundtrip(sd, weights_only=True, map_location=lambda storage, loc: storage)
    assert to_cpu["a"].device.type == "cpu" and torch.equal(to_cpu["a"], torch.arange(3.0))
    cpu_ckpt = {"w": torch.randn(2, 2)}
    on_dev = _roundtrip(cpu_ckpt, weights_only=True, map_location=D1)
    assert on_dev["w"].device == torch.device(D1) and torch.equal(on_dev["w"].cpu(), cpu_ckpt["w"])


def test_checkpoint_naming_a_missing_device_gives_a_clear_error():
    buf = io.BytesIO()
    torch.save(torch.ones(2, device=D1), buf)
    data = buf.getvalue()
    # Rewrite the saved location to a device index this machine lacks.
    patched = data.replace(b"openreg:1", b"openreg:7")
    assert patched != data
    with pytest.raises(
        RuntimeError, match=r"OPENREG device 7 but torch.openreg.device_count\(\) is 2"
    ):
        torch.load(io.BytesIO(patched), weights_only=True)
    # ... and map_location is the way out.
    ok = torch.load(io.BytesIO(patched), weights_only=True, map_location=D0)
    assert torch.equal(ok.cpu(), torch.ones(2))


# ---------------------------------------------------------------------------
# DLPack and from_blob


def test_dlpack_keeps_device_and_memory():
    from torch.utils.dlpack import DLDeviceType, from_dlpack, to_dlpack

    x = torch.arange(6.0, device=D1).reshape(2, 3)
    assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, 1)
    for y in (from_dlpack(to_dlpack(x)), torch.from_dlpack(x)):
        assert y.device == torch.device(D1)
        assert y.data_ptr() == x.data_ptr()
        y[0, 0] = 42.0
        assert x[0, 0].item() == 42.0
    p = torch.nn.Parameter(torch.ones(2, device=D1))
    assert p.__dlpack_device__() == (DLDeviceType.kDLExtDev, 1)
    # CPU tensors are untouched by openreg.
    assert torch.ones(2).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)


def _dlpack_capsule(address, shape, device_index=0):
    """A legacy DLPack capsule ("dltensor") of float32 at a raw device address,
    as a C library that hands out device memory would make it."""
    import ctypes

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [
            ("data", ctypes.c_void_p),
            ("device", DLDevice),
            ("ndim", ctypes.c_int32),
            ("dtype", DLDataType),
            ("shape", ctypes.POINTER(ctypes.c_int64)),
            ("strides", ctypes.POINTER(ctypes.c_int64)),
            ("byte_offset", ctypes.c_uint64),
        ]

    class DLManagedTensor(ctypes.Structure):
        _fields_ = [
            ("dl_tensor", DLTensor),
            ("manager_ctx", ctypes.c_void_p),
            ("deleter", ctypes.c_void_p),
        ]

    sizes = (ctypes.c_int64 * len(shape))(*shape)
    managed = DLManagedTensor()
    managed.dl_tensor.data = address
    managed.dl_tensor.device = DLDevice(12, device_index)  # kDLExtDev
    managed.dl_tensor.ndim = len(shape)
    managed.dl_tensor.dtype = DLDataType(2, 32, 1)  # float32
    managed.dl_tensor.shape = sizes
    managed.dl_tensor.strides = None  # contiguous
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new_capsule(ctypes.addressof(managed), b"dltensor", None)
    return capsule, (managed, sizes)  # the second keeps the structures alive


def test_dlpack_import_checks_the_device_memory():
    x = torch.arange(256.0, device=D0)
    # The capsules' structures outlive every tensor made from them (an
    # imported tensor reads its deleter from them when it dies).
    structures = []

    def capsule(address, shape):
        made, keep = _dlpack_capsule(address, shape)
        structures.append(keep)
        return made

    # Inside the allocation: imported as is.
    y = torch.from_dlpack(capsule(x.data_ptr() + 4 * 4, [8]))
    assert y.data_ptr() == x.data_ptr() + 16
    assert torch.equal(y.cpu(), torch.arange(4.0, 12.0))
    del y
    # Past the end of its allocation (the caching allocator's block).
    with pytest.raises(RuntimeError, match="run past the end of its allocation"):
        torch.from_dlpack(capsule(x.data_ptr(), [100_000]))
    # Memory freed to the cache, and memory returned by empty_cache().
    z = torch.empty(2**20, device=D0)
    address = z.data_ptr()
    del z
    with pytest.raises(RuntimeError, match="memory that was freed"):
        torch.from_dlpack(capsule(address, [16]))
    torch.openreg.empty_cache()
    with pytest.raises(RuntimeError, match="not allocated"):
        torch.utils.dlpack.from_dlpack(capsule(address, [16]))
    import gc

    gc.collect()  # the refused tensors are gone before their structures


def test_from_blob_wraps_device_memory_without_copy():
    x = torch.arange(12.0, device=D1)
    y = torch.openreg.from_blob(x.data_ptr() + 2 * 4, (2, 3), dtype=torch.float32, owner=x)
    assert y.device == torch.device(D1)
    assert torch.equal(y.cpu(), torch.arange(2.0, 8.0).reshape(2, 3))
    y.mul_(10)
    assert torch.equal(x.cpu()[2:8], torch.arange(2.0, 8.0) * 10)
    t = torch.openreg.from_blob(x.data_ptr(), (3, 2), stride=(1, 3), dtype=torch.float32, owner=x)
    assert torch.equal(t.cpu(), x.cpu()[:6].reshape(2, 3).t())


def test_from_blob_keeps_the_owner_alive():
    import weakref

    class Owner:
        pass

    x = torch.ones(4, device=D0)
    owner = Owner()
    owner.tensor = x
    ref = weakref.ref(owner)
    y = torch.openreg.from_blob(x.data_ptr(), (4,), dtype=torch.float32, owner=owner)
    del owner, x
    assert ref() is not None
    assert torch.equal(y.cpu(), torch.ones(4))
    del y
    assert ref() is None


def test_from_blob_refuses_bad_pointers():
    with pytest.raises(RuntimeError, match="is not openreg device memory"):
        torch.openreg.from_blob(torch.ones(3).data_ptr(), (3,), dtype=torch.float32)
    x = torch.ones(4, device=D0)
    # 64 MiB reach past the driver allocation holding a 16-byte tensor.
    with pytest.raises(RuntimeError, match="run past the end of its allocation"):
        torch.openreg.from_blob(x.data_ptr(), (16 << 20,), dtype=torch.float32, owner=x)
    # The allocation is the tensor's block, not the segment it was cut from:
    # 5 floats reach past a 4-float tensor though the segment is larger.
    with pytest.raises(RuntimeError, match=r"run past the end of its allocation \(16 bytes"):
        torch.openreg.from_blob(x.data_ptr(), (5,), dtype=torch.float32, owner=x)
    y = torch.ones(4, device=D0)
    address = y.data_ptr()
    del y  # its block goes back to the cache
    with pytest.raises(RuntimeError, match="memory that was freed"):
        torch.openreg.from_blob(address, (4,), dtype=torch.float32)
    with pytest.raises(RuntimeError, match="2 sizes but 1 strides"):
        torch.openreg.from_blob(x.data_ptr(), (2, 2), stride=(1,), dtype=torch.float32, owner=x)


# ---------------------------------------------------------------------------
# Shallow copies (`param.data = other`)


def test_shallow_copy_between_openreg_tensors():
    p = torch.nn.Parameter(torch.zeros(3, device=D0))
    other = torch.arange(3.0, device=D1)
    p.data = other
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert p.device == torch.device(D1) and p.data_ptr() == other.data_ptr()
    assert torch._has_compatible_shallow_copy_type(p, torch.ones(1, device=D0))


def test_shallow_copy_between_cpu_and_openreg_as_cuda():
    # As between the CPU and CUDA: dense tensors swap data in place.
    cpu = torch.ones(3)
    dev = torch.arange(3.0, device=D0)
    assert torch._has_compatible_shallow_copy_type(cpu, dev)
    assert torch._has_compatible_shallow_copy_type(dev, cpu)
    cpu.data = dev
    assert cpu.device == torch.device(D0) and cpu.data_ptr() == dev.data_ptr()
    back = torch.zeros(3, device=D1)
    back.data = torch.full((2,), 7.0)
    assert back.device == torch.device("cpu") and back.tolist() == [7.0, 7.0]
    # Sparse and quantized tensors are not dense: no swap, as on CUDA.
    assert not torch._has_compatible_shallow_copy_type(dev, torch.ones(3).to_sparse())


def test_module_to_device_keeps_parameters():
    model = torch.nn.Linear(2, 2)
    before = model.weight
    model.to(D0)
    assert model.weight is before and model.weight.device == torch.device(D0)
    model.to(D1)
    assert model.weight is before and model.weight.device == torch.device(D1)
    model.cpu()
    assert model.weight is before and model.weight.device == torch.device("cpu")


def test_tied_weights_stay_tied_and_optimizer_built_before_the_move_trains():
    def make():
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4)
        head = torch.nn.Linear(4, 10, bias=False)
        head.weight = emb.weight  # tied, as in GPT-2
        model = torch.nn.Sequential(emb, head)
        return model, torch.optim.SGD(model.parameters(), lr=0.5)

    tokens = torch.tensor([1, 2, 3, 4])
    results = []
    for device in ("cpu", D0):
        model, opt = make()  # optimizer built before the move
        model.to(device)
        assert model[0].weight is model[1].weight
        for _ in range(3):
            opt.zero_grad()
            logits = model(tokens.to(device))
            torch.nn.functional.cross_entropy(logits, tokens.to(device)).backward()
            opt.step()
        assert model[0].weight is model[1].weight
        results.append(model[0].weight.detach().cpu())
    torch.testing.assert_close(results[1], results[0])
    assert not torch.equal(results[0], make()[0][0].weight.detach())  # it trained


# ---------------------------------------------------------------------------
# Storages and generated methods


def test_untyped_and_typed_storages():
    x = torch.arange(6, dtype=torch.int32, device=D1)
    s = x.untyped_storage()
    assert s.device == torch.device(D1) and s.is_openreg and s.nbytes() == 24
    assert bytes(s.cpu()) == bytes(torch.arange(6, dtype=torch.int32).untyped_storage())
    moved = torch.arange(4, dtype=torch.int16).untyped_storage().openreg()
    assert moved.device == torch.device(D0) and moved.is_openreg
    assert torch.equal(
        torch.empty(0, dtype=torch.int16).set_(moved.cpu()), torch.arange(4, dtype=torch.int16)
    )
    # The deprecation warning comes once per process; an earlier test may
    # have had it (test_fidelity's storage_type check).
    torch.storage._reset_warn_typed_storage_removal()
    with pytest.warns(UserWarning, match="TypedStorage is deprecated"):
        typed = x.storage()
    assert typed.device == torch.device(D1) and typed.dtype == torch.int32 and typed.is_openreg
    assert typed.tolist() == list(range(6))
    cpu_typed = torch.arange(3.0).storage()
    on_dev = cpu_typed.openreg(1)
    assert on_dev.device == torch.device(D1) and on_dev.tolist() == [0.0, 1.0, 2.0]
    # A tensor built on a device storage shares it.
    y = torch.empty(0, dtype=torch.int32, device=D1).set_(s)
    assert y.data_ptr() == x.data_ptr()


def test_parameter_and_packed_sequence_methods():
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    p = torch.nn.Parameter(torch.ones(2))
    assert not p.is_openreg and p.openreg().is_openreg and p.openreg(1).device == torch.device(D1)
    seq = torch.randn(3, 2, 4)
    packed = pack_padded_sequence(seq, [3, 2])
    on_dev = packed.openreg()
    assert on_dev.is_openreg and on_dev.data.device == torch.device(D0)
    rnn = torch.nn.GRU(4, 5).to(D0)
    out, _ = pad_packed_sequence(rnn(on_dev)[0])
    ref, _ = pad_packed_sequence(rnn.cpu()(packed)[0])
    torch.testing.assert_close(out.cpu(), ref)


def test_legacy_type_strings():
    x = torch.ones(2, device=D0)
    assert x.type() == "torch.openreg.FloatTensor"
    assert x.half().type() == "torch.openreg.HalfTensor"
    assert x.type(torch.float64).dtype == torch.float64 and x.type(torch.float64).device == x.device


# ---------------------------------------------------------------------------
# DataLoader workers


class SquaresDataset(Dataset):
    """CPU samples, as data pipelines produce them."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.full((2,), float(i)) ** 2, i


class DeviceSquaresDataset(SquaresDataset):
    """Computes on openreg inside the worker and returns CPU tensors."""

    def __getitem__(self, i):
        x = torch.full((2,), float(i), device="openreg")
        return (x * x).cpu(), i


def _expected_batches():
    return [
        (torch.arange(i, i + 4, dtype=torch.float32) ** 2).unsqueeze(1).expand(4, 2)
        for i in (0, 4, 8)
    ]


def test_dataloader_workers_after_initialisation():
    torch.ones(1, device=D0)  # the parent has initialised openreg
    loader = DataLoader(SquaresDataset(), batch_size=4, num_workers=2, pin_memory=True)
    got = []
    for x, _ in loader:
        assert x.is_pinned()
        got.append(x.to(D0, non_blocking=True))
    for g, e in zip(got, _expected_batches(), strict=True):
        assert torch.equal(g.cpu(), e)


def test_forked_worker_touching_the_device_gives_the_fork_error():
    torch.ones(1, device=D0)
    loader = DataLoader(
        DeviceSquaresDataset(), batch_size=4, num_workers=1, multiprocessing_context="fork"
    )
    with pytest.raises(RuntimeError, match="Cannot re-initialize openreg in forked subprocess"):
        next(iter(loader))


def test_spawned_workers_use_the_device():
    loader = DataLoader(
        DeviceSquaresDataset(), batch_size=4, num_workers=2, multiprocessing_context="spawn"
    )
    got = [x for x, _ in loader]
    for g, e in zip(got, _expected_batches(), strict=True):
        assert torch.equal(g, e)
