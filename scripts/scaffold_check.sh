#!/usr/bin/env bash
# make scaffold-check: writes a backend named "mydev" with the scaffold into a
# temporary directory, builds it there as a vendor would (its own `make
# build`: its own .venv with the pinned torch, no build isolation), checks that
# `import torch` autoloads it, and runs its conformance kit. Prints the build
# time; the card goes to build/scaffold-card.md. Nothing is left outside the
# temporary directory but that card.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$here/.venv/bin/python" -m torch_openreg.scaffold mydev "$tmp/mydev"
cd "$tmp/mydev"
start=$(date +%s)
make build
echo "scaffold-check: the mydev backend built in $(( $(date +%s) - start )) s (venv and build)"
.venv/bin/python - <<'PY'
import torch
assert torch._C._get_privateuse1_backend_name() == "mydev"
x = torch.arange(4.0, device="mydev") * 2
assert x.device.type == "mydev" and x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
print("scaffold-check: import torch autoloads mydev;", torch.mydev.device_count(), "devices")
PY
mkdir -p "$here/build"
env -u OPENREG_DEVICE_COUNT -u OPENREG_DEVICE_MEMORY -u OPENREG_LAUNCH_BLOCKING \
    .venv/bin/python -m torch_mydev.conformance --device mydev --quiet \
    --report "$here/build/scaffold-card.md"
grep -m1 "checks over" "$here/build/scaffold-card.md"
tail -1 "$here/build/scaffold-card.md"
