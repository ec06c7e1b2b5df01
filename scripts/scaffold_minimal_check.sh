#!/usr/bin/env bash
# make scaffold-minimal-check: writes the minimal backend "mydev" (the
# integration without the simulator's engine: python -m torch_openreg.scaffold
# mydev DIR --minimal) into a temporary directory, builds it there as a vendor
# would (its own `make build`: its own .venv with the pinned torch), checks
# that `import torch` autoloads it and that operators run through its copying
# fallback, and runs its conformance kit. Prints the lines by folder and the
# build time; the card goes to build/scaffold-minimal-card.md. Nothing is left
# outside the temporary directory but that card.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$here/.venv/bin/python" -m torch_openreg.scaffold mydev "$tmp/mydev" --minimal
cd "$tmp/mydev"
for d in runtime csrc torch_mydev pytest_mydev; do
  echo "scaffold-minimal-check: $d: $(find "$d" -type f | xargs cat | wc -l) lines"
done
start=$(date +%s)
make build
echo "scaffold-minimal-check: built in $(( $(date +%s) - start )) s (venv and build)"
.venv/bin/python - <<'PY'
import torch
assert torch._C._get_privateuse1_backend_name() == "mydev"
x = torch.arange(4.0, device="mydev") * 2
assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
stats = torch.mydev._launch_stats()
assert stats["host_copied"] > 0 and stats["queued"] == 0, stats
print("scaffold-minimal-check: import torch autoloads mydev; operators copied through the host:",
      stats["host_copied"])
PY
mkdir -p "$here/build"
env -u OPENREG_DEVICE_COUNT -u OPENREG_DEVICE_MEMORY -u OPENREG_LAUNCH_BLOCKING \
    .venv/bin/python -m torch_mydev.conformance --device mydev --quiet \
    --report "$here/build/scaffold-minimal-card.md"
tail -1 "$here/build/scaffold-minimal-card.md"
