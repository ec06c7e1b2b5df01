"""python -m torch_openreg.scaffold NAME DIR (issue 32): a renamed copy of
openreg that is a backend of its own.

The bounded check here writes the copy into a temporary directory and looks
at it (files, names, Python syntax, the C API, the build and entry-point
names); `make scaffold-check` builds the copy in its own environment and runs
its conformance kit.
"""

import ast
import re
import subprocess
import sys

import pytest

from torch_openreg import scaffold


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    dest = tmp_path_factory.mktemp("scaffold") / "mydev"
    written = scaffold.scaffold("mydev", dest)
    return dest, written


def test_every_tracked_file_is_written(tree):
    dest, written = tree
    source = scaffold.source_root()
    expected = scaffold.tracked_files(source)
    assert len(written) == len(expected) > 200
    for rel in ("runtime/include/mydev.h", "csrc/core/MydevStream.cpp",
                "torch_mydev/__init__.py", "torch_mydev/mydev/__init__.py",
                "torch_mydev/conformance/__main__.py", "setup.py", "pyproject.toml",
                "CMakeLists.txt", "Makefile", ".ci/run", "README.md"):  # fmt: skip
        assert (dest / rel).is_file(), rel
    assert not (dest / "torch_mydev" / "scaffold.py").exists()


def test_no_openreg_name_is_left(tree):
    dest, written = tree
    left = []
    for path in written:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if re.search(r"openreg|OpenReg|OPENREG|\borccl\b", text, re.IGNORECASE):
            left.append(str(path.relative_to(dest)))
        if "openreg" in str(path.relative_to(dest)).lower():
            left.append(str(path.relative_to(dest)))
    assert left == []


def test_names_are_the_new_backends(tree):
    dest, _ = tree
    header = (dest / "runtime/include/mydev.h").read_text()
    assert "mydevError_t mydevMalloc(" in header.replace("MYDEV_API ", "")
    assert re.search(r"\bor[A-Z]\w+", header) is None  # openreg's C prefix
    pyproject = (dest / "pyproject.toml").read_text()
    assert 'name = "torch_mydev"' in pyproject
    assert 'mydev = "torch_mydev._autoload:load"' in pyproject
    assert "project(mydev " in (dest / "CMakeLists.txt").read_text()
    init = (dest / "torch_mydev/__init__.py").read_text()
    assert 'BACKEND_NAME = "mydev"' in init
    assert "namespace mydev {" in (dest / "csrc/core/MydevStream.cpp").read_text()
    readme = (dest / "README.md").read_text()
    assert readme.startswith("# mydev") and "Replace the driver in `runtime/`" in readme


def test_python_files_parse(tree):
    dest, written = tree
    for path in written:
        if path.suffix == ".py":
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@pytest.mark.parametrize("name", ["cuda", "openreg", "My-Dev", "x", "class", "1dev"])
def test_bad_names_are_refused(name, tmp_path):
    with pytest.raises(ValueError, match="NAME"):
        scaffold.scaffold(name, tmp_path / "out")


def test_cli_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-m", "torch_openreg.scaffold", "mydev", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "exists and is not empty" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


# The --minimal backend (issue 61): the integration without the simulator's
# engine. `make scaffold-minimal-check` builds it and runs its conformance kit.
@pytest.fixture(scope="module")
def minimal(tmp_path_factory):
    dest = tmp_path_factory.mktemp("minimal") / "mydev"
    written = scaffold.scaffold("mydev", dest, minimal=True)
    return dest, written


def test_minimal_backend_has_the_integration_and_no_engine(minimal):
    dest, written = minimal
    rels = {p.relative_to(dest).as_posix() for p in written}
    for rel in ("runtime/include/mydev.h", "runtime/src/device.cpp",
                "csrc/core/MydevEngine.h", "csrc/aten/fallback/MydevCopyingFallback.cpp",
                "csrc/aten/fallback/MydevFallbackEntry.cpp", "csrc/aten/MydevHostConvolution.cpp",
                "csrc/kernels/MydevKernelLibrary.cpp", "csrc/mydev_native_functions.yaml",
                "torch_mydev/__init__.py", "torch_mydev/conformance/__main__.py",
                "setup.py", "pyproject.toml", "CMakeLists.txt", "Makefile",
                "README.md"):  # fmt: skip
        assert rel in rels, rel
    for prefix in ("csrc/engine/", "torch_mydev/compile/", "tests/", "benchmarks/", "docs/"):
        assert not any(r.startswith(prefix) for r in rels), prefix
    # The PyTorch layer without the engine: well under two thirds of csrc/.
    source = scaffold.source_root()

    def lines(paths):
        return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)

    full = lines(source / f for f in scaffold.tracked_files(source) if f.startswith("csrc/"))
    ours = lines(p for p in written if p.relative_to(dest).as_posix().startswith("csrc/"))
    assert ours < 0.6 * full, (ours, full)


def test_minimal_backend_never_names_the_engine_in_its_build(minimal):
    dest, written = minimal
    left = []
    for path in written:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if re.search(r"openreg|OpenReg|OPENREG", text):
            left.append(path.relative_to(dest).as_posix())
        if re.search(r'#\s*include\s*"engine/', text):
            left.append(f"{path.relative_to(dest).as_posix()} includes the engine")
    assert left == []
    pyproject = (dest / "pyproject.toml").read_text()
    assert "torch_mydev.compile" not in pyproject and '"tests"' not in pyproject
    makefile = (dest / "Makefile").read_text()
    assert "test: test-runtime conformance" in makefile
    assert "torch_mydev.conformance --device mydev" in makefile
    readme = (dest / "README.md").read_text()
    assert "copying fallback" in readme and "What to replace" in readme


def test_minimal_backend_python_files_parse(minimal):
    dest, written = minimal
    for path in written:
        if path.suffix == ".py":
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_cli_writes_the_minimal_backend(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torch_openreg.scaffold", "mydev", str(tmp_path / "m"), "--minimal"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "make build && make test" in proc.stdout
    assert not (tmp_path / "m" / "csrc" / "engine").exists()
