"""The aten registrations come from csrc/openreg_native_functions.yaml through
PyTorch's torchgen (issue 32): what the YAML lists is registered by the
generated code and reached; what it does not list runs through the fallback;
a bad entry fails the build with a clear message.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
YAML = ROOT / "csrc" / "openreg_native_functions.yaml"
ENGINE_YAML = ROOT / "csrc" / "engine" / "engine_native_functions.yaml"
GENERATOR = ROOT / "csrc" / "codegen" / "gen_registrations.py"
CHECK = ROOT / "csrc" / "codegen" / "check_kernels.cmake"
# What the build registers: the integration's list and the engine's.
SPEC = yaml.safe_load(YAML.read_text())
for _key, _ops in yaml.safe_load(ENGINE_YAML.read_text()).items():
    SPEC[_key] = SPEC.get(_key, []) + _ops


def registration(op, key):
    """Where the dispatcher says `op`'s kernel for `key` was registered."""
    for line in torch._C._dispatch_dump(f"aten::{op}").splitlines():
        if line.startswith(f"{key}: registered at "):
            return line.split("registered at ")[1].split(" ::")[0]
    return None


@pytest.mark.parametrize(
    "op,key",
    [(op, "PrivateUse1") for op in SPEC["supported"]]
    + [(op, "AutogradPrivateUse1") for op in SPEC["autograd"]],
)
def test_listed_kernel_is_registered_by_the_generated_code(op, key):
    where = registration(op, key)
    assert where is not None, f"{op} has no {key} kernel"
    assert re.search(rf"/generated/Register{key}\.cpp:\d+$", where), where


def test_listed_kernel_is_reached_and_unlisted_operator_falls_back():
    torch.openreg.synchronize()
    before = set(torch.openreg.fallback_ops())
    x = torch.tensor([-1.0, 2.0], device="openreg")
    assert torch.relu(x).cpu().tolist() == [0.0, 2.0]  # listed: the native kernel
    assert "aten::relu" not in set(torch.openreg.fallback_ops()) - before
    # relu.out is not listed: torchgen's "kernel then copy" wrapper is not
    # generated; PyTorch's own kernel of the variant runs, as on the CPU.
    assert registration("relu.out", "PrivateUse1") is None
    out = torch.empty(2, device="openreg")
    torch.ops.aten.relu.out(x, out=out)
    assert out.cpu().tolist() == [0.0, 2.0]
    # An operator that is not listed runs through the fallback.
    assert registration("hardtanh", "PrivateUse1") is None
    assert torch.nn.functional.hardtanh(x * 3).cpu().tolist() == [-1.0, 1.0]
    assert "aten::hardtanh" in torch.openreg.fallback_ops()

    def outcome(device):
        out = torch.empty(3, dtype=torch.long, device=device)  # resized, other dtype
        try:
            torch.ops.aten.relu.out(x.to(device), out=out)
        except RuntimeError as e:
            return "error", str(e).split("\n")[0]
        return "ok", out.cpu().tolist(), out.dtype

    assert outcome("openreg") == outcome("cpu")


def generate(tmp_path, spec):
    src = tmp_path / "native.yaml"
    src.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, out


def test_a_removed_line_is_not_registered(tmp_path):
    spec = dict(SPEC, supported=[op for op in SPEC["supported"] if op != "relu"])
    proc, out = generate(tmp_path, spec)
    assert proc.returncode == 0, proc.stderr
    registered = re.findall(r'm\.impl\("([^"]+)"', (out / "RegisterPrivateUse1.cpp").read_text())
    assert "relu" not in registered and "relu_" in registered
    assert sorted(registered) == sorted(spec["supported"])  # nothing generated beyond the list
    header = (out / "PrivateUse1NativeFunctions.h").read_text()
    assert "static at::Tensor relu(" not in header and "static at::Tensor & relu_(" in header


def test_an_unknown_operator_fails_with_torchgens_message(tmp_path):
    spec = dict(SPEC, supported=[*SPEC["supported"], "no_such_op.Tensor"])
    proc, out = generate(tmp_path, spec)
    assert proc.returncode == 1
    assert "Found an invalid operator name: no_such_op.Tensor" in proc.stderr
    assert not (out / "RegisterPrivateUse1.cpp").exists()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_listed_kernel_left_undefined_fails_the_build(tmp_path):
    # A module that uses a declared member no source defines, as the generated
    # registration would: the link succeeds (shared objects may), the check fails.
    src = tmp_path / "m.cpp"
    src.write_text(
        "namespace openreg { struct OpenRegNativeFunctions {\n"
        "  static int relu(int); static int defined(int); }; }\n"
        "int openreg::OpenRegNativeFunctions::defined(int x) { return x; }\n"
        "int use(int x) { return openreg::OpenRegNativeFunctions::relu(x)"
        " + openreg::OpenRegNativeFunctions::defined(x); }\n"
    )
    lib = tmp_path / "m.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", lib, src], check=True, timeout=120)

    def check(library):
        return subprocess.run(
            ["cmake", f"-DLIBRARY={library}", "-DCLASS=openreg::OpenRegNativeFunctions",
             f"-DYAML={YAML}", "-P", str(CHECK)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    proc = check(lib)
    assert proc.returncode != 0
    assert "kernels listed in" in proc.stderr and "OpenRegNativeFunctions::relu(int)" in proc.stderr
    assert "defined(int)" not in proc.stderr
    built = Path(torch.openreg.__file__).resolve().parent.parent / "_C"
    module = next(built.parent.glob("_C*.so"))
    assert check(module).returncode == 0  # openreg's own module defines every kernel
