"""What the package says about itself: its version, the torch it was built
for, and the clear error beside another torch (the wheel itself is checked
in a fresh venv by `make test-wheel`, scripts/test_wheel.sh)."""

import importlib.metadata
import re
from pathlib import Path

import torch
from conftest import describe

import torch_openreg
from torch_openreg import _build_info

ROOT = Path(__file__).resolve().parents[1]


def test_version_and_build_info():
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert torch_openreg.__version__ == version == _build_info.VERSION
    assert _build_info.TORCH_VERSION.split("+")[0] == torch.__version__.split("+")[0] == "2.13.0"
    assert _build_info.BUILD_TYPE in ("Release", "Debug", "RelWithDebInfo", "MinSizeRel")


def test_imported_beside_another_torch_raises_a_clear_import_error(py):
    out = py(
        """
        import torch
        torch.__version__ = "2.12.1"  # as if another torch were installed
        try:
            import torch_openreg
        except ImportError as e:
            print("ImportError:", e)
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert out.returncode == 0, describe(out)
    assert "ImportError: torch_openreg" in out.stdout, describe(out)
    assert "was built for torch 2.13.0, but torch 2.12.1 is installed" in out.stdout
    assert "install torch==2.13.0" in out.stdout, describe(out)


def test_entry_points_are_registered():
    groups = importlib.metadata.entry_points()
    backends = {e.name: e.value for e in groups.select(group="torch.backends")}
    plugins = {e.name: e.value for e in groups.select(group="pytest11")}
    assert backends.get("openreg") == "torch_openreg._autoload:load"
    assert plugins.get("openreg") == "pytest_openreg.plugin"
