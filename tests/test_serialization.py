"""torch.save / torch.load / pickle of openreg tensors, storages and state dicts."""

import copy
import pickle

import torch


def test_save_load_keeps_device_and_values(tmp_path):
    x = torch.randn(4, 5)
    obj = {"a": x.to("openreg:0"), "b": [x.to("openreg:1").t()], "n": 3}
    path = tmp_path / "obj.pt"
    torch.save(obj, path)
    loaded = torch.load(path)
    assert loaded["n"] == 3
    assert loaded["a"].device == torch.device("openreg:0")
    assert loaded["b"][0].device == torch.device("openreg:1")
    assert torch.equal(loaded["a"].cpu(), x)
    assert torch.equal(loaded["b"][0].cpu(), x.t())
    assert loaded["b"][0].stride() == (1, 5)  # views keep their layout


def test_load_with_map_location(tmp_path):
    x = torch.arange(6.0).reshape(2, 3)
    path = tmp_path / "x.pt"
    torch.save(x.to("openreg:1"), path)
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, x)
    on_dev0 = torch.load(path, map_location="openreg:0")
    assert on_dev0.device == torch.device("openreg:0") and torch.equal(on_dev0.cpu(), x)
    # A CPU checkpoint loaded straight onto the device.
    torch.save(x, path)
    moved = torch.load(path, map_location=torch.device("openreg", 1))
    assert moved.device == torch.device("openreg:1") and torch.equal(moved.cpu(), x)


def test_state_dict_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).openreg()
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).openreg()
    fresh.load_state_dict(torch.load(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert b.device.type == "openreg", k
        assert torch.equal(a.cpu(), b.cpu()), k


def test_pickle_and_deepcopy():
    x = torch.arange(5.0, device="openreg:1")
    y = pickle.loads(pickle.dumps(x))
    assert y.device == torch.device("openreg:1") and torch.equal(y.cpu(), x.cpu())
    z = copy.deepcopy(x)
    assert z.device == x.device and z.data_ptr() != x.data_ptr()
    assert torch.equal(z.cpu(), x.cpu())
    p = torch.nn.Parameter(torch.ones(2, device="openreg"))
    q = copy.deepcopy(p)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q.device == p.device
