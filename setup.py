"""setuptools drives CMake to build torch_openreg._C and the runtime library.

Environment:
  OPENREG_BUILD_TYPE  CMake build type (default Release): Debug, RelWithDebInfo, ...
  OPENREG_SANITIZE    sanitizers, e.g. "address,undefined" (default: none)
  OPENREG_BUILD_DIR   build tree (default build/<type>); kept between builds,
                      so rebuilds are incremental
  MAX_JOBS            parallel compile jobs (default: number of CPUs)
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def build_info() -> str:
    """The text of torch_openreg/_build_info.py: what this build is, and the
    torch it was compiled against (the import checks it, since the extension
    links to that torch's C++ libraries)."""
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return (
        '"""Written by setup.py at build time; not in git."""\n\n'
        f"VERSION = {version.group(1)!r}\n"
        f"TORCH_VERSION = {importlib.metadata.version('torch')!r}\n"
        f"BUILD_TYPE = {os.environ.get('OPENREG_BUILD_TYPE', 'Release')!r}\n"
        f"SANITIZE = {os.environ.get('OPENREG_SANITIZE', '')!r}\n"
        f"GIT_COMMIT = {commit!r}\n"
    )


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        build_type = os.environ.get("OPENREG_BUILD_TYPE", "Release")
        build_dir = Path(os.environ.get("OPENREG_BUILD_DIR", ROOT / "build" / build_type.lower()))
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        configure = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DOPENREG_SANITIZE={os.environ.get('OPENREG_SANITIZE', '')}",
        ]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs])
        Path(self.get_ext_fullpath(ext.name)).parent.mkdir(parents=True, exist_ok=True)
        built = list((build_dir / "csrc").glob("_C*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _C*.so in {build_dir / 'csrc'}, found {built}")
        # Copy then rename: processes that have the old module loaded keep
        # their mapping instead of seeing the file rewritten under them.
        target = Path(self.get_ext_fullpath(ext.name))
        tmp = target.with_name(target.name + ".tmp")
        shutil.copy2(built[0], tmp)
        os.replace(tmp, target)
        # The process driver's device executable goes next to the module that
        # starts it (the runtime looks beside the library it is linked into).
        # An editable install copies only the module itself into the source
        # tree, so the executable goes to both places.
        # The kernel library a device process loads goes with it, and the
        # build's description.
        info = build_info()
        for package_dir in {target.parent, ROOT / "torch_openreg"}:
            (package_dir / "_build_info.py").write_text(info)
            for built_file in (
                build_dir / "runtime" / "openreg-device",
                build_dir / "csrc" / "libopenreg_kernels.so",
            ):
                dest = package_dir / built_file.name
                shutil.copy2(built_file, dest.with_name(dest.name + ".tmp"))
                os.replace(dest.with_name(dest.name + ".tmp"), dest)


setup(
    ext_modules=[CMakeExtension("torch_openreg._C")],
    cmdclass={"build_ext": CMakeBuild},
)
