#!/usr/bin/env bash
# Installs the system packages the build needs (Debian): a C++ toolchain,
# CMake, Ninja, GoogleTest and clang-format. Skips apt when all are present.
set -euo pipefail

need=()
command -v g++ >/dev/null || need+=(g++)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v clang-format >/dev/null || need+=(clang-format)
[ -e /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "setup_system: installing ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
