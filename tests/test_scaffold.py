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
