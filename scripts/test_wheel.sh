#!/usr/bin/env bash
# make test-wheel: the wheel in a fresh venv that has only torch==2.13.0, with
# no compiler, CMake or build tree on PATH: import, a tensor on each driver, a
# CUDA script through the shim, the conformance kit, the pytest plugin.
# Prints the install and import seconds. Everything lives in a temporary
# directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL=$(ls dist/torch_openreg-*.whl | head -1)
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }

"$PYTHON" -m venv "$tmp/venv"
V="$tmp/venv/bin"
"$V/pip" install --quiet --upgrade pip
t0=$(now)
"$V/pip" install --quiet torch==2.13.0
t1=$(now)
"$V/pip" install --quiet "$WHEEL"
t2=$(now)

# From here on: only the venv on PATH (no g++, cmake, ninja), a clean HOME,
# and a working directory outside the source tree.
run() { (cd "$tmp" && env -i HOME="$tmp" PATH="$V" LANG=C.UTF-8 "$@"); }
t3=$(now)
run "$V/python" -c "import torch; print(torch.ones(2, device='openreg'))"
t4=$(now)
run "$V/python" -c "
import torch, torch_openreg, torch_openreg._build_info as b
assert torch_openreg.__file__.startswith('$tmp'), torch_openreg.__file__
print('torch_openreg', torch_openreg.__version__, 'built for torch', b.TORCH_VERSION)
x = torch.randn(64, 64)
assert torch.allclose((x.openreg() @ x.openreg()).cpu(), x @ x, atol=1e-4)
"
run OPENREG_DRIVER=process "$V/python" -c "
import torch
x = torch.arange(10.0)
assert torch.equal((x.openreg() * 2).cpu(), x * 2)
print('process driver: ok')
"
cat > "$tmp/cuda_script.py" <<'PY'
import torch
assert torch.cuda.is_available()
x = torch.ones(3, device="cuda") * 2
print("shim:", x.device, x.sum().item())
PY
run "$V/python" -m torch_openreg.run cuda_script.py
# What a CI job adds beside torch (numpy for PyTorch's OpInfo database).
"$V/pip" install --quiet numpy pytest
run "$V/python" -m torch_openreg.conformance -q --report "$tmp/card.md" \
    --only device,guard,streams,allocator,copies,operators,autograd > "$tmp/card.out"
tail -1 "$tmp/card.out"
cat > "$tmp/test_user.py" <<'PY'
import torch

def test_on_openreg():
    assert torch.ones(2, device="openreg").sum().item() == 2
PY
run "$V/python" -m pytest -q -p no:cacheprovider --openreg test_user.py | tail -5
printf 'wheel: %s\ninstall torch: %.1f s, install the wheel: %.1f s, first import and tensor: %.1f s\n' \
    "$(basename "$WHEEL")" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$(echo "$t4 - $t3" | bc)"
