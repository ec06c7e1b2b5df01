"""Device management: torch.openreg (shaped like torch.cuda) and torch.accelerator."""

import threading

import pytest
import torch
from conftest import DEFAULT_DEVICE_COUNT, describe


def test_is_available_and_device_count():
    assert torch.openreg.is_available() is True
    assert torch.openreg.device_count() == DEFAULT_DEVICE_COUNT
    assert isinstance(torch.openreg.device_count(), int)


def test_set_device_and_current_device():
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device(1)
    assert torch.openreg.current_device() == 1
    # Factories without an index use the current device.
    assert torch.empty(1, device="openreg").device == torch.device("openreg", 1)
    assert torch.ones(1, device="openreg").cpu().item() == 1.0
    torch.openreg.set_device(torch.device("openreg:0"))
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device("openreg:1")
    assert torch.openreg.current_device() == 1
    # As torch.cuda.set_device: a negative index is ignored.
    torch.openreg.set_device(-1)
    assert torch.openreg.current_device() == 1


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="openreg"):
        torch.openreg.set_device("cpu")
    assert torch.openreg.current_device() == 0


def test_current_device_is_thread_local():
    seen = {}

    def worker():
        torch.openreg.set_device(1)
        seen["thread"] = torch.openreg.current_device()
        seen["tensor"] = torch.zeros(1, device="openreg").device

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert seen == {"thread": 1, "tensor": torch.device("openreg:1")}
    assert torch.openreg.current_device() == 0


@pytest.mark.parametrize("spec", [1, "openreg:1", torch.device("openreg", 1)])
def test_device_context_manager(spec):
    assert torch.openreg.current_device() == 0
    with torch.openreg.device(spec):
        assert torch.openreg.current_device() == 1
        x = torch.arange(3.0, device="openreg")
        assert x.device == torch.device("openreg:1")
    assert torch.openreg.current_device() == 0
    assert x.cpu().tolist() == [0.0, 1.0, 2.0]


def test_device_context_manager_nested_and_none():
    with torch.openreg.device(1):
        with torch.openreg.device(0):
            assert torch.openreg.current_device() == 0
        assert torch.openreg.current_device() == 1
        with torch.openreg.device(None):  # a no-op, as torch.cuda.device(None)
            assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0


def test_device_context_manager_restores_after_exception():
    torch.openreg.set_device(1)
    with pytest.raises(ZeroDivisionError):
        with torch.openreg.device(0):
            assert torch.openreg.current_device() == 0
            raise ZeroDivisionError
    assert torch.openreg.current_device() == 1


def test_device_guard_in_operators_restores_current_device():
    # An operator on openreg:1 runs under a device guard and must not leave
    # openreg:1 current afterwards.
    x = torch.arange(4.0, device="openreg:1")
    y = (x * 2).sum()
    assert y.device == torch.device("openreg:1")
    assert y.item() == 12.0
    assert torch.openreg.current_device() == 0


def test_device_of():
    x1 = torch.ones(1, device="openreg:1")
    with torch.openreg.device_of(x1):
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0
    # A CPU tensor leaves the current device alone.
    torch.openreg.set_device(1)
    with torch.openreg.device_of(torch.ones(1)):
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 1


@pytest.mark.parametrize("spec", [None, 0, 1, "openreg:1", torch.device("openreg:0")])
def test_device_name_properties_capability(spec):
    name = torch.openreg.get_device_name(spec)
    assert name == "openreg simulated device"
    props = torch.openreg.get_device_properties(spec)
    assert props.name == name
    assert props.total_memory == 4 * 2**30  # the default OPENREG_DEVICE_MEMORY
    assert props.multi_processor_count >= 1
    assert (props.major, props.minor) == torch.openreg.get_device_capability(spec)
    assert torch.openreg.get_device_capability(spec) == (1, 0)
    assert "openreg simulated device" in repr(props)


def test_invalid_index_in_factory():
    with pytest.raises(RuntimeError, match=r"index 7\b.*\b2 openreg device"):
        torch.empty(1, device="openreg:7")
    assert torch.openreg.current_device() == 0


def test_invalid_index_in_set_device():
    with pytest.raises(RuntimeError, match=r"index 7\b.*\b2 openreg device"):
        torch.openreg.set_device(7)
    assert torch.openreg.current_device() == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.openreg.get_device_properties(2),
        lambda: torch.openreg.device(5).__enter__(),
        lambda: torch.accelerator.set_device_index(3),
        lambda: torch.ones(2).to("openreg:2"),
    ],
    ids=["properties", "context", "accelerator", "to"],
)
def test_invalid_index_elsewhere(call):
    with pytest.raises(RuntimeError, match=r"index [235]\b.*\b2 openreg device"):
        call()
    assert torch.openreg.current_device() == 0


def test_torch_accelerator():
    acc = torch.accelerator.current_accelerator()
    assert acc.type == "openreg"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == DEFAULT_DEVICE_COUNT
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    assert torch.openreg.current_device() == 1
    torch.accelerator.set_device_index(0)
    assert torch.openreg.current_device() == 0
    with torch.accelerator.device_index(1):
        assert torch.openreg.current_device() == 1
    assert torch.accelerator.current_device_index() == 0


def test_accelerator_and_openreg_synchronize():
    x = torch.randn(32, 32, device="openreg")
    y = x @ x
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    torch.openreg.synchronize()
    torch.openreg.synchronize("openreg:1")
    torch.openreg.synchronize(torch.device("openreg:0"))
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())
    assert torch.openreg.current_device() == 0


def test_is_initialized_and_init_in_fresh_process(py):
    proc = py(
        """
        import torch
        o = torch.openreg
        print("import", o.is_initialized())
        print("count", o.device_count(), o.is_available(), o.is_initialized())
        o.init()
        print("init", o.is_initialized())
        o.init()  # idempotent
        print("again", o.is_initialized(), torch.ones(1, device="openreg").item())
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split("\n")[:4] == [
        "import False",
        "count 2 True False",  # counting devices must not initialise them
        "init True",
        "again True 1.0",
    ]


def test_first_tensor_initialises(py):
    proc = py(
        """
        import torch
        assert not torch.openreg.is_initialized()
        x = torch.zeros(2, device="openreg")
        print(torch.openreg.is_initialized(), x.cpu().tolist())
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip() == "True [0.0, 0.0]"


def test_device_count_from_environment(py):
    proc = py(
        """
        import torch
        print(torch.openreg.device_count(), torch.accelerator.device_count())
        x = torch.arange(3, device="openreg:3")
        print(x.device, x.cpu().tolist())
        """,
        OPENREG_DEVICE_COUNT=4,
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split("\n")[:2] == ["4 4", "openreg:3 [0, 1, 2]"]


@pytest.mark.parametrize("bad", ["0", "abc", "17"])
def test_bad_device_count_environment(py, bad):
    proc = py(
        """
        import torch
        print("count", torch.openreg.device_count(), torch.openreg.is_available())
        try:
            torch.ones(1, device="openreg")
        except RuntimeError as e:
            print("error", e)
        else:
            print("no error")
        """,
        OPENREG_DEVICE_COUNT=bad,
    )
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    assert lines[0] == "count 0 False", describe(proc)
    assert lines[1].startswith("error"), describe(proc)
    assert "OPENREG_DEVICE_COUNT" in lines[1]
    # The runtime names the bad value on stderr.
    assert f"OPENREG_DEVICE_COUNT='{bad}'" in proc.stderr, describe(proc)
