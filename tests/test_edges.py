"""Odd settings and the messages a user trips over (each in a fresh process).

- the smallest device (OPENREG_DEVICE_MEMORY=1M) is usable: a segment never
  exceeds the device;
- a bad setting names itself in the Python error (OPENREG_DRIVER,
  OPENREG_LAUNCH_BLOCKING, OPENREG_FALLBACK_WARNINGS);
- out-of-memory and recovery cycles do not grow the host's memory;
- a bad OPENREG_FAULTS makes ``import torch`` raise its ValueError itself;
  a fault for an operator that does not exist warns;
- a failure raised at the call does not claim to be reported later.
"""

import pytest
from conftest import describe, run_python


def test_the_smallest_device_is_usable():
    code = """
    import torch
    x = torch.ones(1000, device="openreg")
    y = (x * 2 + 1).sum().item()
    assert y == 3000.0, y
    a = torch.arange(50_000, dtype=torch.float64, device="openreg")  # 400 KB
    assert a.sum().item() == sum(range(50_000))
    try:
        torch.empty(2 << 20, dtype=torch.uint8, device="openreg")
        raise SystemExit("2 MiB fit in a 1 MiB device")
    except torch.OutOfMemoryError as e:
        assert "1024.00 KiB" in str(e), e
    print("OK")
    """
    proc = run_python(code, env={"OPENREG_DEVICE_MEMORY": "1M"})
    assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)


@pytest.mark.parametrize(
    "variable,value",
    [
        ("OPENREG_DRIVER", "procss"),
        ("OPENREG_LAUNCH_BLOCKING", "yes"),
        ("OPENREG_LAUNCH_BLOCKING", "2"),
        ("OPENREG_FALLBACK_WARNINGS", "true"),
        ("OPENREG_NIC_DMA", "yes"),
    ],
)
def test_a_bad_setting_names_itself_in_the_error(variable, value):
    code = """
    import torch
    try:
        torch.ones(1, device="openreg")
    except RuntimeError as e:
        print(str(e).split("\\n")[0])
    """
    proc = run_python(code, env={variable: value})
    assert f"{variable}='{value}'" in proc.stdout, describe(proc)
    others = {"OPENREG_DEVICE_COUNT", "OPENREG_DEVICE_MEMORY", "OPENREG_DRIVER"} - {variable}
    assert not any(o in proc.stdout for o in others), describe(proc)


@pytest.mark.parametrize("value", ["0", "1", ""])
def test_launch_blocking_takes_0_1_or_nothing(value):
    proc = run_python(
        "import torch; print(torch.ones(2, device='openreg').sum().item())",
        env={"OPENREG_LAUNCH_BLOCKING": value},
    )
    assert proc.stdout.strip() == "2.0", describe(proc)


def test_out_of_memory_cycles_do_not_grow_the_host():
    # 60 cycles of an allocation the device refuses, then work that succeeds:
    # the resident size after 20 cycles and after 60 stay within a few MB.
    code = """
    import torch
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    x = torch.ones(1024, 1024, device="openreg")
    sizes = {}
    for i in range(1, 61):
        for make in (lambda: torch.empty(2**31, dtype=torch.uint8, device="openreg"),
                     lambda: x.repeat(300, 1),
                     lambda: torch.arange(2**28, device="openreg")):
            try:
                make()
                raise SystemExit("no out of memory")
            except torch.OutOfMemoryError as e:
                kept = e  # a program that keeps the last error
        assert (x * 2).sum().item() == 2 * 1024 * 1024
        if i in (20, 60):
            sizes[i] = rss_mb()
    print(round(sizes[60] - sizes[20], 1))
    """
    proc = run_python(code, env={"OPENREG_DEVICE_MEMORY": "1G"}, timeout=170)
    assert proc.returncode == 0, describe(proc)
    assert float(proc.stdout.strip()) < 8, describe(proc)


def test_a_bad_faults_setting_raises_its_value_error_at_import_torch():
    code = """
    try:
        import torch
    except ValueError as e:
        print("ValueError", e)
    """
    proc = run_python(code, env={"OPENREG_FAULTS": "fail_kernel:op=aten::mm,after=x"})
    assert proc.stdout.startswith("ValueError OPENREG_FAULTS"), describe(proc)
    assert "after" in proc.stdout, describe(proc)


def test_a_fault_for_an_unknown_operator_warns():
    code = """
    import warnings, torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.openreg.faults.fail_kernel(op="aten::mn")
        torch.openreg.faults.fail_kernel(op="aten::add.Tensor")
        torch.openreg.faults.fail_kernel(op="aten::mm")
    print(len(caught), caught[0].message if caught else "")
    """
    proc = run_python(code)
    assert proc.stdout.startswith("1 fail_kernel: no operator is named 'aten::mn'"), describe(proc)


def test_a_failure_raised_at_the_call_says_so():
    # The first call of a signature runs synchronously: an injected failure is
    # raised at the call, and the message must not say "at the next
    # synchronization".
    code = """
    import torch
    a = torch.ones(8, 8, device="openreg")
    torch.openreg.faults.fail_kernel(op="aten::mm")
    try:
        a @ a
        torch.openreg.synchronize()
    except torch.AcceleratorError as e:
        print(str(e).replace("\\n", " "))
    """
    proc = run_python(code)
    assert "injected" in proc.stdout, describe(proc)
    assert "next synchronization" not in proc.stdout, describe(proc)


def test_out_of_memory_after_steady_growth_says_so():
    # A loop that keeps every step's output alive: the message names the
    # growth (its low point rising window after window) and the likely cause.
    code = """
    import torch
    m = torch.nn.Linear(256, 256).to("openreg")
    kept = []
    try:
        for step in range(100_000):
            out = m(torch.randn(64, 256, device="openreg"))
            kept.append(out)  # the leak
            out.square().mean().backward()
    except torch.OutOfMemoryError as e:
        print(str(e))
    """
    proc = run_python(code, env={"OPENREG_DEVICE_MEMORY": "64M"}, timeout=170)
    assert "grew steadily" in proc.stdout and "loss.item()" in proc.stdout, describe(proc)


def test_a_plain_out_of_memory_does_not_claim_growth():
    code = """
    import torch
    try:
        torch.empty(2**30, dtype=torch.uint8, device="openreg")
    except torch.OutOfMemoryError as e:
        print(str(e))
    """
    proc = run_python(code, env={"OPENREG_DEVICE_MEMORY": "64M"})
    assert "out of memory" in proc.stdout and "grew steadily" not in proc.stdout, describe(proc)
