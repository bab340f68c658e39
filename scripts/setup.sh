#!/usr/bin/env bash
# Sets up sciattn on a fresh Debian/Ubuntu machine and builds it: installs the build dependencies
# (only those missing, so running it twice is quick and harmless), then configures and builds the
# `cpu` preset, or the `gpu` preset when nvcc and an NVIDIA GPU are present. The program ends up at
# build/current/tools/sciattn.
#
#   scripts/setup.sh            # dependencies + build
#   scripts/setup.sh --deps     # dependencies only
set -euo pipefail
cd "$(dirname "$0")/.."

deps_only=0
[ "${1:-}" = "--deps" ] && deps_only=1

packages=(cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
          libcli11-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ "$deps_only" = 1 ] && exit 0

preset=cpu
if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  preset=gpu
fi
jobs=$(nproc)
echo "setup: building preset '$preset' with $jobs jobs"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
ln -sfn "$preset" build/current
echo "setup: done; run build/current/tools/sciattn demo"
