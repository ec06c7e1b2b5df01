"""A user's C++ operator library on openreg: torch.openreg.load_library.

The library registers operators with CPU kernels only (TORCH_LIBRARY), so
openreg runs them through the CPU fallback. With the process driver the
fallback's kernels run in each device's process, which knows only the
libraries it loaded: torch.openreg.load_library loads the library there as
well, so its operators run on the device (described, then queued) instead
of staged on the host, and a crash in one of them loses the device, not the
program. Each test compiles nothing itself: the libraries are built once
per module with the machine's C++ compiler against torch's headers.
"""

import json
import os
import subprocess
import sysconfig

import pytest
import torch
from conftest import describe

LIBRARY = r"""
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <csignal>

namespace {

at::Tensor twice_plus(const at::Tensor& x, double c) { return x * 2 + c; }

at::Tensor twice_plus_meta(const at::Tensor& x, double /*c*/) {
  return at::empty_like(x);
}

// Data-dependent: the host learns the result's size from the device.
at::Tensor positive_indices(const at::Tensor& x) {
  TORCH_CHECK_INDEX(x.dim() == 1, "positive_indices: x must be 1-D, got ",
                    x.dim(), "-D");
  return (x > 0).nonzero().flatten();
}

// A faulty kernel.
at::Tensor crash(const at::Tensor& x) {
  std::raise(SIGSEGV);
  return x;
}

}  // namespace

TORCH_LIBRARY(openreg_oplib_test, m) {
  m.def("twice_plus(Tensor x, float c) -> Tensor");
  m.def("positive_indices(Tensor x) -> Tensor");
  m.def("crash(Tensor x) -> Tensor");
}

// Its shapes follow the arguments': openreg queues its later calls.
// positive_indices has none: its results' shapes depend on the data.
TORCH_LIBRARY_IMPL(openreg_oplib_test, Meta, m) {
  m.impl("twice_plus", twice_plus_meta);
}

TORCH_LIBRARY_IMPL(openreg_oplib_test, CPU, m) {
  m.impl("twice_plus", twice_plus);
  m.impl("positive_indices", positive_indices);
  m.impl("crash", crash);
}
"""

# A library that needs Python: it loads in the user's process, where the
# interpreter defines the symbol, and not in a device process.
NEEDS_PYTHON = r"""
extern "C" {
extern void* PyExc_RuntimeError;
void* openreg_oplib_needs_python() { return PyExc_RuntimeError; }
}
"""


def compile_library(source, path, torch_flags=True):
    src = path.with_suffix(".cpp")
    src.write_text(source)
    cmd = ["g++", "-std=c++17", "-O1", "-w", "-shared", "-fPIC", str(src), "-o", str(path)]
    if torch_flags:
        root = os.path.dirname(torch.__file__)
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        cmd += [
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{root}/include",
            f"-I{root}/include/torch/csrc/api/include",
            f"-L{root}/lib",
            "-lc10",
            "-ltorch_cpu",
            f"-Wl,-rpath,{root}/lib",
        ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, describe(proc)
    return path


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    assert sysconfig.get_platform().startswith("linux")
    d = tmp_path_factory.mktemp("oplib")
    return {
        "ops": compile_library(LIBRARY, d / "libopenreg_oplib_test.so"),
        "needs_python": compile_library(NEEDS_PYTHON, d / "libneeds_python.so", False),
    }


def last_json(proc):
    assert proc.returncode == 0, describe(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


DRIVERS = ["thread", "process"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_library_operators_run_on_the_device_with_the_cpus_values(py, libraries, driver):
    out = last_json(
        py(
            """
            import json, sys, torch, torch_openreg
            torch.openreg.load_library(sys.argv[1])
            ops = torch.ops.openreg_oplib_test
            a = torch.randn(64)
            x = a.to("openreg")
            torch.openreg._reset_launch_stats()
            ok = [torch.equal(ops.twice_plus(x, 0.5).cpu(), ops.twice_plus(a, 0.5))
                  for _ in range(3)]
            for _ in range(3):  # data of the same shape, results of another
                b = torch.randn(64)
                ok.append(torch.equal(ops.positive_indices(b.to("openreg")).cpu(),
                                      ops.positive_indices(b)))
            try:
                ops.positive_indices(x.view(8, 8))
                error = None
            except IndexError as e:
                error = str(e)
            stats = torch.openreg._launch_stats()
            print(json.dumps({"ok": ok, "error": error, "staged": stats["staged_by_op"],
                              "described": stats["described_by_op"],
                              "queued": stats["queued"]}))
            """,
            args=(str(libraries["ops"]),),
            OPENREG_DRIVER=driver,
            OPENREG_LAUNCH_BLOCKING=None,  # it checks which calls are queued
            OPENREG_FALLBACK_WARNINGS="0",
        )
    )
    assert out["ok"] == [True] * 6, out
    assert out["error"] is not None and "must be 1-D, got 2-D" in out["error"], out
    assert not any(k.startswith("openreg_oplib_test") for k in out["staged"]), out
    assert out["queued"] > 0, out  # later calls of twice_plus
    if driver == "process":
        # The first twice_plus and every positive_indices (data-dependent)
        # ran in the device's process.
        assert out["described"].get("openreg_oplib_test::twice_plus") == 1, out
        assert out["described"].get("openreg_oplib_test::positive_indices") == 4, out


def test_without_it_a_process_device_runs_them_staged_until_loaded(py, libraries):
    out = last_json(
        py(
            """
            import json, sys, torch, torch_openreg
            torch.ops.load_library(sys.argv[1])  # this process only
            ops = torch.ops.openreg_oplib_test
            a = torch.randn(16)
            x = a.to("openreg")
            def run():
                torch.openreg._reset_launch_stats()
                ok = all(torch.equal(ops.twice_plus(x, 1.0).cpu(), a * 2 + 1)
                         for _ in range(2))
                stats = torch.openreg._launch_stats()
                return ok, stats["staged_by_op"].get("openreg_oplib_test::twice_plus", 0)
            before = run()
            torch.openreg.load_library(sys.argv[1])
            after = run()
            print(json.dumps({"before": before, "after": after}))
            """,
            args=(str(libraries["ops"]),),
            OPENREG_DRIVER="process",
            OPENREG_FALLBACK_WARNINGS="0",
        )
    )
    assert out["before"] == [True, 2], out
    assert out["after"] == [True, 0], out


def test_a_crashing_library_kernel_loses_the_device_not_the_program(py, libraries):
    out = last_json(
        py(
            """
            import json, sys, torch, torch_openreg
            torch.openreg.load_library(sys.argv[1])
            x = torch.ones(4, device="openreg:1")
            try:
                torch.ops.openreg_oplib_test.crash(x).cpu()
                error = None
            except torch.AcceleratorError as e:
                error = str(e)
            ok0 = torch.equal(torch.ops.openreg_oplib_test.twice_plus(
                torch.ones(3, device="openreg:0"), 1.0).cpu(), torch.full((3,), 3.0))
            print(json.dumps({"error": error, "ok0": ok0}))
            """,
            args=(str(libraries["ops"]),),
            OPENREG_DRIVER="process",
            OPENREG_FALLBACK_WARNINGS="0",
        )
    )
    assert out["error"] is not None, out
    assert "openreg:1" in out["error"] or "device 1" in out["error"], out
    assert "SIGSEGV" in out["error"], out
    assert "openreg_oplib_test::crash" in out["error"], out
    assert out["ok0"], out


@pytest.mark.parametrize("driver", DRIVERS)
def test_untagged_data_dependent_custom_ops_are_never_planned_from_one_run(py, driver):
    """A custom operator whose results' shapes depend on the data, without a
    tag saying so: its first run cannot tell openreg its later results'
    shapes, so its calls stay synchronous unless its Meta kernel (a fake)
    gives the first run's shapes. Before, the second call was queued with
    the first call's shapes and failed on the device."""
    out = last_json(
        py(
            """
            import json, torch, torch_openreg

            @torch.library.custom_op("oplibtest::positive", mutates_args=())
            def positive(x: torch.Tensor) -> torch.Tensor:
                return x[x > 0].clone()

            @positive.register_fake
            def _(x):
                return x.new_empty(torch.library.get_ctx().new_dynamic_size())

            @torch.library.custom_op("oplibtest::nofake", mutates_args=())
            def nofake(x: torch.Tensor) -> torch.Tensor:
                return x[x < 0].clone()

            @torch.library.custom_op("oplibtest::scaled", mutates_args=())
            def scaled(x: torch.Tensor) -> torch.Tensor:
                return x * 3

            @scaled.register_fake
            def _(x):
                return torch.empty_like(x)

            ok = []
            for _ in range(4):
                a = torch.randn(32)
                x = a.to("openreg")
                for op in (positive, nofake, scaled):
                    ok.append(torch.equal(op(x).cpu(), op(a)))
            torch.openreg._reset_launch_stats()
            scaled(x); torch.openreg.synchronize()
            print(json.dumps({"ok": ok, "queued": torch.openreg._launch_stats()["queued"]}))
            """,
            OPENREG_DRIVER=driver,
            OPENREG_LAUNCH_BLOCKING=None,  # it checks which calls are queued
            OPENREG_FALLBACK_WARNINGS="0",
        )
    )
    assert out["ok"] == [True] * 12, out
    assert out["queued"] == 1, out  # the one whose fake gives its shapes


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_library_a_device_cannot_load_is_a_clear_error(py, libraries, driver):
    out = last_json(
        py(
            """
            import json, sys, torch, torch_openreg
            try:
                torch.openreg.load_library(sys.argv[1])
                error = None
            except RuntimeError as e:
                error = str(e)
            try:
                torch.openreg.load_library(sys.argv[2])
                missing = None
            except OSError as e:  # torch.ops.load_library's own check
                missing = str(e)
            print(json.dumps({"error": error, "missing": missing}))
            """,
            args=(str(libraries["needs_python"]), str(libraries["ops"]) + ".missing"),
            OPENREG_DRIVER=driver,
        )
    )
    assert out["missing"] is not None, out
    if driver == "thread":
        # The device shares this process, where the interpreter is.
        assert out["error"] is None, out
    else:
        assert out["error"] is not None, out
        assert "undefined symbol: PyExc_RuntimeError" in out["error"], out
        assert "device 0" in out["error"] and "runs no Python" in out["error"], out
