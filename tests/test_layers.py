"""The layers of ARCHITECTURE.md, read from the includes of the tree.

- runtime/ (the driver behind openreg.h) includes nothing of PyTorch;
- csrc/ reaches the runtime through runtime/include/openreg.h only;
- the integration (csrc/ outside csrc/engine/) never includes the
  simulator's engine: the engine plugs in through core/OpenRegEngine.h's
  hooks, so a port deletes csrc/engine/ and still builds (issue 61).
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
SOURCES = (".h", ".cpp")


def includes(folder):
    for path in sorted((ROOT / folder).rglob("*")):
        if path.suffix in SOURCES:
            for name in INCLUDE.findall(path.read_text(encoding="utf-8")):
                yield path.relative_to(ROOT).as_posix(), name


def test_the_runtime_includes_nothing_of_pytorch():
    bad = [
        (f, n)
        for f, n in includes("runtime")
        if n.split("/")[0] in {"torch", "ATen", "c10", "pybind11", "caffe2"}
    ]
    assert not bad, bad


def test_csrc_reaches_the_runtime_through_its_public_header_only():
    bad = [(f, n) for f, n in includes("csrc") if "runtime/src" in n or n.startswith("src/")]
    assert not bad, bad


def test_the_integration_never_includes_the_engine():
    bad = [
        (f, n)
        for f, n in includes("csrc")
        if not f.startswith("csrc/engine/") and n.startswith("engine/")
    ]
    assert not bad, bad
    # And the engine exists as the folder the build includes when present.
    assert (ROOT / "csrc" / "engine" / "engine.cmake").is_file()
