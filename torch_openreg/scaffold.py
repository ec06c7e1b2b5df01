"""Writes a new PrivateUse1 backend, a renamed copy of openreg.

    python -m torch_openreg.scaffold NAME DIR

DIR receives the whole project (runtime, csrc, the Python package, tests,
docs, the conformance kit, the build files) with every openreg name replaced:
package ``torch_NAME``, device ``NAME``, module ``torch.NAME``, C++
namespace ``NAME``, classes ``Name...``, environment variables ``NAME_...``,
the runtime's C API ``NAMEMalloc``/``NAMEStream_t``/... (openreg's ``or``
prefix), its c10d backend ``NAMEccl``, and the file names that carry them.
The result builds with ``pip install --no-build-isolation -e .`` against the
installed torch, autoloads on ``import torch`` and passes its own
conformance kit: it starts with openreg's simulated driver, which the vendor
replaces by one for its hardware (the generated README says where).

    python -m torch_openreg.scaffold NAME DIR --minimal

writes the backend a port of real hardware starts from: the integration
without the simulator's engine (csrc/engine/, the Python side of
torch.compile) and without openreg's own development (tests, benchmarks,
docs, examples). Its fallback copies arguments to the host and back through
the runtime's copies (aten/fallback/OpenRegCopyingFallback.cpp), as on a
device whose memory the host cannot map; it still runs on openreg's
simulated driver, so it builds and passes its conformance kit as written
(``make test``). Its README lists what the vendor replaces.

The tree is read from the openreg checkout this package was installed from
(an editable install); the files are those git tracks (or, without git, the
tree minus build outputs).
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Device types PyTorch already has (torch._C._get_privateuse1_backend_name()
# may not be renamed to one of them) and names the copy cannot use.
RESERVED = {
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve",
    "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
    "privateuseone", "openreg", "torch", "nested", "sparse", "quantized", "test",
}  # fmt: skip

# Never copied: build outputs, and this command with its test (their
# patterns must stay openreg's).
SKIPPED_DIRS = {".git", ".venv", "build", "__pycache__", ".ruff_cache", ".pytest_cache"}
SKIPPED_FILES = {"torch_openreg/scaffold.py", "tests/test_scaffold.py"}
SKIPPED_SUFFIXES = (".so", ".pyc", ".o", ".a", ".egg-info")

# Left out of the --minimal backend: the simulator's engine and its Python
# side, and what exists for openreg's own development (its make targets,
# which the minimal backend's Makefile does not have).
MINIMAL_SKIPPED_DIRS = (
    "csrc/engine/",
    "torch_openreg/compile/",
    "tests/",
    "benchmarks/",
    "docs/",
    "examples/",
)
MINIMAL_SKIPPED_FILES = {
    "scripts/build_wheel.sh",
    "scripts/test_wheel.sh",
    "scripts/thirdparty_slice.py",
    "scripts/scaffold_check.sh",
    "scripts/docs_quotes.py",
    "scripts/README.md",
}

NAME_RE = re.compile(r"[a-z][a-z0-9]{1,15}")


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise ValueError(
            f"NAME must be 2 to 16 lowercase letters and digits starting with a letter "
            f"(it becomes a device type, a C++ namespace and part of identifiers), got {name!r}"
        )
    if name in RESERVED or keyword.iskeyword(name):
        raise ValueError(f"NAME {name!r} is taken (a PyTorch device type or reserved name)")
    return name


def renamer(name: str):
    """A function that rewrites openreg's names in a text into NAME's."""
    camel = name[0].upper() + name[1:]
    upper = name.upper()
    rules = [
        (re.compile(r"OpenReg"), camel),
        (re.compile(r"OPENREG"), upper),
        (re.compile(r"openreg"), name),
        (re.compile(r"Openreg"), camel),
        (re.compile(r"\borccl"), f"{name}ccl"),
        # The runtime's C API: orMalloc, orStream_t, orErrorDeviceLost, ...
        (re.compile(r"\bor(?=[A-Z])"), name),
        # Its test macros: OR_ASSERT_OK, OR_EXPECT_OK, ...
        (re.compile(r"\bOR_(?=[A-Z])"), f"{upper}_"),
    ]

    def rename(text: str) -> str:
        for pattern, replacement in rules:
            text = pattern.sub(replacement, text)
        return text

    return rename


def source_root() -> Path:
    root = Path(__file__).resolve().parent.parent
    if not (root / "runtime" / "include" / "openreg.h").is_file():
        raise RuntimeError(
            f"{root} is not an openreg checkout (runtime/include/openreg.h is missing): "
            "the scaffold copies the source tree, so install openreg editable "
            "(pip install --no-build-isolation -e .) from a checkout"
        )
    return root


def tracked_files(root: Path) -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60
        ).stdout
        files = [f for f in out.decode().split("\0") if f and (root / f).is_file()]
    except (OSError, subprocess.SubprocessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [
                d for d in dirnames if d not in SKIPPED_DIRS and not d.endswith(".egg-info")
            ]
            for f in filenames:
                files.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(
        f
        for f in files
        if f not in SKIPPED_FILES
        and not f.endswith(SKIPPED_SUFFIXES)
        and not (set(Path(f).parts) & SKIPPED_DIRS)
    )


def vendor_readme(name: str) -> str:
    upper = name.upper()
    camel = name[0].upper() + name[1:]
    return f"""# {name}

A PyTorch backend for the `{name}` device (`torch.device("{name}")`, the
`PrivateUse1` dispatch key), generated from openreg by
`python -m torch_openreg.scaffold {name} DIR`. It builds and passes its
conformance kit as generated, on openreg's simulated device.

```sh
pip install --no-build-isolation -e .       # against the installed torch
python -c "import torch; print(torch.ones(2, device='{name}') + 1)"
python -m torch_{name}.conformance --device {name}
```

## What to change for real hardware

1. **Replace the driver in `runtime/`**: `runtime/include/{name}.h` is the
   driver API the PyTorch layer uses (devices, memory, streams, events,
   kernel launch); `runtime/src/` is the simulator behind it. Implement the
   same header over your driver, and keep `runtime/tests/` (the contract)
   passing.
2. **Replace the simulator-only code in `csrc/`**: every place marked
   `SIMULATOR ONLY` (`grep -rn "SIMULATOR ONLY" csrc runtime`): chiefly the
   kernel views through which PyTorch's CPU kernels run on device memory.
3. **Add kernels to the YAML**: `csrc/{name}_native_functions.yaml` lists the
   aten operators with a native kernel; the build generates their
   registrations with PyTorch's torchgen, and `csrc/aten/` defines each
   kernel as a static member of `{name}::{camel}NativeFunctions` with the
   signature the generated header declares. What is not listed runs through
   the fallback (`csrc/aten/fallback/`). `docs/scaffold.md` walks through a
   first kernel, `docs/operators.md` describes both paths.
4. Rename what the tools could not guess: the package metadata in
   `pyproject.toml` (description, version) and this README.

Everything else (device guard, allocators, generators, streams, events,
hooks, autograd, autocast, serialization, profiler, the Python module
`torch.{name}`, `{upper}_*` environment variables, the conformance kit) is
ready and documented in `docs/`. The rest of this file is openreg's README,
renamed.

"""


def minimal_readme(name: str) -> str:
    upper = name.upper()
    camel = name[0].upper() + name[1:]
    return f"""# {name}

A PyTorch backend for the `{name}` device (`torch.device("{name}")`, the
`PrivateUse1` dispatch key), the minimal one a port of real hardware starts
from, written by a simulator project's scaffold (`scaffold {name} DIR
--minimal`). It builds and passes its conformance kit as written, on the
simulated driver in `runtime/src/`.

```sh
make build    # its own .venv with the pinned torch, then the extension
make test     # the driver's contract tests and the conformance kit
.venv/bin/python -c "import torch; print(torch.ones(2, device='{name}') + 1)"
```

## How it runs operators

Every aten operator without a native kernel runs through the **copying
fallback** (`csrc/aten/fallback/{camel}CopyingFallback.cpp`): each device
storage among the arguments is copied to the host with the driver's copies
(`{name}Memcpy*`), PyTorch's CPU kernel runs there, and the arguments it
wrote and its results are copied back, so it works on a device whose memory
the host cannot map. Copies that convert dtypes or strides go through the
host the same way (`csrc/aten/{camel}Copy.cpp`), and so does convolution
(`csrc/aten/{camel}HostConvolution.cpp`). It is correct and slow: every
operator synchronizes and moves its arguments twice.

## What to replace for real hardware

1. **The driver behind `runtime/include/{name}.h`**: the header is the driver
   API the PyTorch layer uses (devices, memory, streams, events, named
   kernels, pinned host memory); `runtime/src/` is the simulator behind
   it. Implement the same header over your driver, and keep
   `runtime/tests/` (the contract: `make test-runtime`) passing.
2. **The device's kernel library** (`csrc/kernels/`): the named kernels
   your device runs (`{name}LaunchFunction` launches them by name with a
   parameter buffer); the fault and profiler-timestamp kernels there show
   the shape.
3. **Native kernels in the YAML**: `csrc/{name}_native_functions.yaml` lists
   the aten operators with a native kernel; the build generates their
   registrations with PyTorch's torchgen, and `csrc/aten/` defines each as a
   static member of `{name}::{camel}NativeFunctions`. Each operator you list
   leaves the copying fallback; start with the ones your models spend their
   time in (`torch.{name}.fallback_ops()` lists those that fell back).
4. The package metadata in `pyproject.toml` and this README.

Everything else is the integration every backend needs and is ready: the
device guard, streams and events, the caching allocator with its
statistics and out-of-memory errors, pinned host memory, generators, hooks,
autograd, autocast, serialization, the profiler, `torch.distributed`
(Gloo on device memory through the runtime's DMA view, or through pinned
host copies), the Python module `torch.{name}`, the
`{upper}_*` settings and the conformance kit
(`.venv/bin/python -m torch_{name}.conformance --device {name}`).
The `docs/` folder of the project this was written from describes each
integration point; `csrc/README.md` maps the folders here.
"""


def minimal_makefile() -> str:
    return """# The minimal backend's two commands: `make build` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BUILD_TYPE ?= Release
BUILD_DIR ?= build/$(shell echo $(BUILD_TYPE) | tr A-Z a-z)
PY := $(VENV)/bin/python
export OPENREG_BUILD_TYPE := $(BUILD_TYPE)
export OPENREG_BUILD_DIR := $(abspath $(BUILD_DIR))

.PHONY: all setup build test test-runtime conformance clean

all: build

$(VENV)/.stamp: requirements.txt scripts/setup_system.sh
\tbash scripts/setup_system.sh
\t$(PYTHON) -m venv $(VENV)
\t$(VENV)/bin/pip install --quiet --upgrade pip
\t$(VENV)/bin/pip install --quiet -r requirements.txt
\ttouch $@

setup: $(VENV)/.stamp

build: setup
\tPATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/pip install --quiet \
\t    --no-build-isolation --no-deps -e .

# The driver's contract (gtest), built without torch.
test-runtime: setup
\tPATH=$(abspath $(VENV))/bin:$$PATH cmake -S . -B $(BUILD_DIR)-runtime -G Ninja \
\t    -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DOPENREG_BUILD_PYTHON=OFF > /dev/null
\tPATH=$(abspath $(VENV))/bin:$$PATH cmake --build $(BUILD_DIR)-runtime
\t$(VENV)/bin/ctest --test-dir $(BUILD_DIR)-runtime --output-on-failure

# The conformance kit: every integration point against its contract.
conformance: build
\t$(PY) -m torch_openreg.conformance --device openreg

test: test-runtime conformance

clean:
\trm -rf build torch_openreg/_C*.so
"""


def minimal_file(rel: str) -> bool:
    return rel not in MINIMAL_SKIPPED_FILES and not rel.startswith(MINIMAL_SKIPPED_DIRS)


def minimal_text(rel: str, text: str, name: str) -> str:
    """The minimal backend's version of a file that names what it leaves out."""
    if rel == "README.md":
        return minimal_readme(name)
    if rel == "Makefile":
        return minimal_makefile()
    if rel == "pyproject.toml":
        text = text.replace('    "torch_openreg.compile",\n', "")
        text = text.replace(
            '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n', "[tool.pytest.ini_options]\n"
        )
    return text


def scaffold(
    name: str, dest: Path, source: Path | None = None, minimal: bool = False
) -> list[Path]:
    """Writes the backend NAME into dest (which must not exist or be empty);
    returns the files written. `minimal`: the integration without the
    simulator's engine (see the module's docstring)."""
    name = check_name(name)
    source = source or source_root()
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty")
    if dest == source or source in dest.parents:
        raise ValueError(f"{dest} is inside the openreg tree {source}")
    rename = renamer(name)
    written = []
    for rel in tracked_files(source):
        if minimal and not minimal_file(rel):
            continue
        src = source / rel
        out = dest / rename(rel)
        out.parent.mkdir(parents=True, exist_ok=True)
        data = src.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            out.write_bytes(data)  # binary: copied as is
        else:
            if minimal:
                text = minimal_text(rel, text, name)
            elif rel == "README.md":
                text = vendor_readme(name) + text
            out.write_text(rename(text), encoding="utf-8")
        shutil.copymode(src, out)
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_openreg.scaffold",
        description="Write a new PrivateUse1 backend named NAME into DIR (a renamed openreg).",
    )
    parser.add_argument("name", metavar="NAME", help="the device name, e.g. mydev")
    parser.add_argument("dir", metavar="DIR", type=Path, help="where to write it (new or empty)")
    parser.add_argument(
        "--minimal",
        action="store_true",
        help="the integration without the simulator's engine: a copying fallback through "
        "the driver's copies, the starting point of a port to real hardware",
    )
    args = parser.parse_args(argv)
    try:
        written = scaffold(args.name, args.dir, minimal=args.minimal)
    except (ValueError, FileExistsError, RuntimeError) as e:
        print(f"scaffold: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files of the '{args.name}' backend into {args.dir}")
    if args.minimal:
        print(f"next: cd {args.dir} && make build && make test")
    else:
        print(f"next: cd {args.dir} && pip install --no-build-isolation -e .")
    return 0


if __name__ == "__main__":
    sys.exit(main())
