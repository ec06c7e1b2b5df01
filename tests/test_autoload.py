"""Backend registration: autoload through the torch.backends entry point, generated methods."""

import pytest
import torch
from conftest import describe

D = "openreg"


def test_autoload_without_explicit_import(py):
    proc = py(
        """
        import sys, torch
        x = torch.ones(2, device="openreg")
        print("loaded", "torch_openreg" in sys.modules)
        print("backend", torch._C._get_privateuse1_backend_name())
        print("value", x.sum().item(), x.device)
        print("module", hasattr(torch, "openreg"), torch.openreg.device_count())
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines() == [
        "loaded True",
        "backend openreg",
        "value 2.0 openreg:0",
        "module True 2",
    ]


def test_import_torch_openreg_as_the_first_line(py):
    # The package imports torch, whose autoload calls the entry point while
    # the package is half imported: that must not be a circular import.
    proc = py(
        """
        import torch_openreg
        import torch
        x = torch.ones(2, device="openreg")
        print(x.sum().item(), x.device, torch.openreg.device_count())
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["2.0", "openreg:0", "2"]
    assert proc.stderr == ""


def test_autoload_disabled_then_explicit_import(py):
    proc = py(
        """
        import torch
        for what, fn in [("device", lambda: torch.device("openreg")),
                         ("ones", lambda: torch.ones(1, device="openreg"))]:
            try:
                fn()
            except RuntimeError as e:
                print(what, "fails", "openreg" in str(e))
            else:
                print(what, "works")
        print("module", hasattr(torch, "openreg"))
        import torch_openreg
        print("device", torch.device("openreg:1"))
        print("ones", torch.ones(3, device="openreg").sum().item())
        print("module", torch.openreg.is_available())
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines() == [
        "device fails True",
        "ones fails True",
        "module False",
        "device openreg:1",
        "ones 3.0",
        "module True",
    ]


def test_import_twice_is_harmless():
    import importlib

    import torch_openreg

    importlib.reload(torch_openreg)
    torch_openreg._register()
    assert torch._C._get_privateuse1_backend_name() == "openreg"
    assert torch.ones(1, device=D).sum().item() == 1.0


# ---------------------------------------------------------------------------
# Generated methods (torch.utils.generate_methods_for_privateuse1_backend)


def test_tensor_methods():
    x = torch.arange(3.0)
    assert x.is_openreg is False
    y = x.openreg()
    assert y.is_openreg is True
    assert y.device == torch.device("openreg:0")
    assert torch.equal(y.cpu(), x)
    assert x.openreg(1).device == torch.device("openreg:1")
    assert x.openreg("openreg:1").device == torch.device("openreg:1")
    assert y.openreg() is y  # already there
    z = x.openreg(non_blocking=True)
    torch.accelerator.synchronize()
    assert torch.equal(z.cpu(), x)


def test_tensor_type_strings():
    assert torch.ones(1, device=D).type() == "torch.openreg.FloatTensor"
    assert torch.ones(1, dtype=torch.float64, device=D).type() == "torch.openreg.DoubleTensor"
    assert torch.ones(1, dtype=torch.int64, device=D).type() == "torch.openreg.LongTensor"
    assert torch.ones(1, dtype=torch.bool, device=D).type() == "torch.openreg.BoolTensor"
    assert torch.ones(1).type() == "torch.FloatTensor"
    moved = torch.ones(2).type("torch.openreg.FloatTensor")
    assert moved.device.type == "openreg" and moved.sum().item() == 2.0


def test_module_methods():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ref = [t.clone() for t in m.state_dict().values()]
    m.openreg()
    for t, r in zip(m.state_dict().values(), ref, strict=True):
        assert t.device == torch.device("openreg:0")
        assert torch.equal(t.cpu(), r)
    m.openreg(1)
    assert all(p.device == torch.device("openreg:1") for p in m.parameters())
    m.eval()
    out = m(torch.ones(4, 3, device="openreg:1"))
    assert out.device == torch.device("openreg:1")


def test_storage_methods():
    s = torch.tensor([1, 2, 3], dtype=torch.uint8).untyped_storage()
    assert s.is_openreg is False
    d = s.openreg()
    assert d.is_openreg is True
    assert d.device == torch.device("openreg:0")
    assert d.cpu().tolist() == [1, 2, 3]
    assert torch.ones(2, device=D).untyped_storage().is_openreg


def test_packed_sequence_methods():
    from torch.nn.utils.rnn import pack_padded_sequence

    ps = pack_padded_sequence(torch.arange(6.0).reshape(3, 2, 1), [3, 2])
    assert ps.is_openreg is False
    moved = ps.openreg()
    assert moved.is_openreg is True
    assert moved.data.device == torch.device("openreg:0")
    assert torch.equal(moved.data.cpu(), ps.data)


@pytest.mark.parametrize("name", ["openreg", "is_openreg"])
def test_generated_attributes_exist(name):
    assert hasattr(torch.Tensor, name)
    assert hasattr(torch.UntypedStorage, name)
    if name == "openreg":
        assert hasattr(torch.nn.Module, name)
