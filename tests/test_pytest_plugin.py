"""openreg's pytest plugin (pytest_openreg/plugin.py, docs/ci.md).

Each case writes a small test file into tmp_path and runs pytest on it in a
fresh interpreter (``-p no:cacheprovider``, so nothing is written beside it),
then reads pytest's outcome line and the plugin's summary section.
"""

import re
import textwrap

from conftest import describe

PYTEST = ("-m", "pytest", "-q", "-p", "no:cacheprovider")


def run_pytest(py, tmp_path, source, *options, timeout=240, **env):
    (tmp_path / "test_user.py").write_text(textwrap.dedent(source))
    return py(None, args=[*PYTEST, *options, "test_user.py"], timeout=timeout, **env)


def outcome(out) -> dict[str, int]:
    """pytest's final counts: {"passed": 2, "failed": 1, ...}."""
    last = out.stdout.strip().splitlines()[-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", last)}


def test_off_unless_asked_and_torch_not_imported(py, tmp_path):
    out = run_pytest(
        py,
        tmp_path,
        """
        import sys

        def test_no_torch():
            # Installing openreg registers the plugin; it must not import
            # torch (or openreg) in a session that did not ask for it.
            assert "torch" not in sys.modules
        """,
    )
    assert outcome(out) == {"passed": 1}, describe(out)
    assert "openreg" not in out.stdout, describe(out)


def test_a_leaking_test_is_reported(py, tmp_path):
    source = """
        import torch

        KEEP = []

        def test_leaks():
            KEEP.append(torch.ones(1000, device="openreg"))

        def test_frees():
            x = torch.ones(1000, device="openreg")
            assert x.sum().item() == 1000

        def test_cpu_only():
            assert torch.ones(2).sum().item() == 2
        """
    out = run_pytest(py, tmp_path, source, "--openreg-leaks")
    assert outcome(out) == {"passed": 3, "error": 1}, describe(out)
    assert "ERROR at teardown of test_leaks" in out.stdout, describe(out)
    assert re.search(r"test_user.py::test_leaks left \d+ bytes allocated on openreg:0", out.stdout)
    assert "leaked: test_user.py::test_leaks" in out.stdout, describe(out)
    assert "tests that used openreg: 2 of 3 run" in out.stdout, describe(out)
    # Without the option the same file passes.
    out = run_pytest(py, tmp_path, source, "--openreg")
    assert outcome(out) == {"passed": 3}, describe(out)


RACE = """
    import torch

    o = torch.openreg

    def add_one_on_a_side_stream():
        x = torch.zeros(1000, device="openreg")
        s = o.Stream()
        s.wait_stream(o.current_stream())
        with o.stream(s):
            x.add_(1)
        return x, s

    def test_race():
        x, s = add_one_on_a_side_stream()
        y = x * 2  # no wait_stream(s) before reading x on the default stream
        o.synchronize()

    def test_ordered():
        x, s = add_one_on_a_side_stream()
        o.current_stream().wait_stream(s)
        assert torch.equal((x * 2).cpu(), torch.full((1000,), 2.0))
    """


def test_a_racing_test_is_flagged_with_the_sanitizer(py, tmp_path):
    out = run_pytest(py, tmp_path, RACE, "--openreg-sanitizer")
    assert outcome(out) == {"failed": 1, "passed": 1}, describe(out)
    assert "StreamRaceError" in out.stdout and "FAILED test_user.py::test_race" in out.stdout
    out = run_pytest(py, tmp_path, RACE, "--openreg")
    assert outcome(out) == {"passed": 2}, describe(out)


HOT_LOOP = """
    import torch

    def test_hot_loop():
        x = torch.ones(8, device="openreg")
        total = 0.0
        for _ in range(25):
            total += x.sum().item()  # a host synchronization per step
        assert total == 200.0

    def test_no_sync():
        x = torch.ones(8, device="openreg")
        for _ in range(25):
            x = x + 1
    """


def test_a_sync_in_a_hot_loop_is_reported(py, tmp_path):
    out = run_pytest(py, tmp_path, HOT_LOOP, "--openreg-sync-debug=warn")
    assert outcome(out)["passed"] == 2, describe(out)
    assert (
        "synchronizations reported by sync debug: 25 in test_user.py::test_hot_loop" in out.stdout
    ), describe(out)
    assert "test_no_sync" not in out.stdout.split("= openreg =")[-1], describe(out)
    out = run_pytest(py, tmp_path, HOT_LOOP, "--openreg-sync-debug=error")
    assert outcome(out) == {"failed": 1, "passed": 1}, describe(out)
    assert "FAILED test_user.py::test_hot_loop" in out.stdout, describe(out)


def test_an_asynchronous_error_fails_the_test_that_caused_it(py, tmp_path):
    out = run_pytest(
        py,
        tmp_path,
        """
        import torch

        def test_fault(openreg_faults):
            a = torch.ones(4, 4, device="openreg")
            a @ a  # the first call runs synchronously, to learn its signature
            openreg_faults.fail_kernel(op="aten::mm")
            a @ a  # reported at the next synchronization, not here

        def test_after(openreg_device):
            a = torch.ones(4, 4, device=openreg_device)
            assert torch.equal((a @ a).cpu(), torch.full((4, 4), 4.0))
        """,
        "--openreg",
        OPENREG_LAUNCH_BLOCKING="0",
    )
    assert outcome(out) == {"passed": 2, "error": 1}, describe(out)
    assert "ERROR at teardown of test_fault" in out.stdout, describe(out)
    assert "the device reported an error when test_user.py::test_fault ended" in out.stdout


CRASH = """
    import torch

    def test_before():
        assert torch.ones(3, device="openreg").sum().item() == 3

    def test_crashes():
        torch.ones(3, device="openreg")
        torch.openreg.faults.crash_device(0)  # a kernel that segfaults
        torch.openreg.synchronize()

    def test_after_1():
        assert torch.ones(3, device="openreg").sum().item() == 3

    def test_after_2():
        assert torch.ones(3, device="openreg").sum().item() == 3
    """


def test_a_segfaulting_kernel_fails_one_test_not_the_session(py, tmp_path):
    # The process driver keeps the crash in the device's process; under xdist
    # the plugin ends the worker after that test and xdist starts a new one,
    # with new devices, for the tests after it.
    out = run_pytest(py, tmp_path, CRASH, "--openreg", "-n", "1", OPENREG_DRIVER="process")
    counts = outcome(out)
    assert counts.get("passed") == 3 and counts.get("failed") == 1, describe(out)
    assert "FAILED test_user.py::test_crashes" in out.stdout, describe(out)
    assert "device lost" in out.stdout, describe(out)
    # The test the ended worker had been given already ran on the new one.
    assert counts.get("rerun", 0) <= 1, describe(out)
    assert "test_after_1 FAILED" not in out.stdout, describe(out)


def test_without_xdist_a_lost_device_is_named(py, tmp_path):
    out = run_pytest(py, tmp_path, CRASH, "--openreg", OPENREG_DRIVER="process")
    counts = outcome(out)
    assert counts.get("passed") == 1 and counts.get("failed") == 3, describe(out)
    assert "device made unusable: openreg:0 in test_user.py::test_crashes" in out.stdout


def test_xdist_with_two_workers_sums_the_workers(py, tmp_path):
    out = run_pytest(
        py,
        tmp_path,
        """
        import pytest
        import torch

        @pytest.mark.parametrize("n", range(6))
        def test_values(n):
            x = torch.arange(n + 1.0, device="openreg")
            assert torch.equal(x.cumsum(0).cpu(), torch.arange(n + 1.0).cumsum(0))

        def test_cpu():
            assert torch.ones(1).item() == 1
        """,
        "--openreg",
        "-n",
        "2",
    )
    assert outcome(out) == {"passed": 7}, describe(out)
    assert "tests that used openreg: 6 of 7 run" in out.stdout, describe(out)
    assert re.search(r"peak device memory allocated: \d+(\.\d \w+| bytes)\n", out.stdout), describe(
        out
    )
    assert re.search(r"operators that fell back to the CPU: \d+", out.stdout), describe(out)


def test_the_cuda_shim_and_the_default_device(py, tmp_path):
    out = run_pytest(
        py,
        tmp_path,
        """
        import torch

        def test_cuda_is_openreg():
            assert torch.cuda.is_available()
            x = torch.ones(2, device="cuda")
            assert x.device.type == "openreg"
            assert torch.empty(1).device.type == "openreg"  # --openreg-default-device
        """,
        "--openreg-cuda",
        "--openreg-default-device",
    )
    assert outcome(out) == {"passed": 1}, describe(out)


def test_the_ini_option_turns_it_on(py, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nopenreg = true\n")
    out = run_pytest(
        py,
        tmp_path,
        """
        import torch

        def test_one():
            torch.ones(1, device="openreg")
        """,
    )
    assert outcome(out) == {"passed": 1}, describe(out)
    assert "tests that used openreg: 1 of 1 run" in out.stdout, describe(out)
