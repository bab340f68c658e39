#!/usr/bin/env bash
# Sets up sciattn on a fresh Debian/Ubuntu machine and builds it: installs the build dependencies
# (only those missing, so running it twice is quick and harmless), then configures and builds the
# `cpu` preset, or the `gpu` preset when nvcc and an NVIDIA GPU are present. The program ends up at
# build/current/tools/sciattn. Then installs the Python package for PyTorch into .venv (a virtual
# environment in the repository, git-ignored): the pinned packages of bindings/torch/requirements.txt
# from PyPI, and sciattn itself with `pip install --no-build-isolation .`.
#
#   scripts/setup.sh            # dependencies + build + Python package
#   scripts/setup.sh --deps     # dependencies only
#   scripts/setup.sh --python   # the Python package only (.venv)
#   scripts/setup.sh --python-requirements   # .venv and the pinned requirements, not sciattn
set -euo pipefail
cd "$(dirname "$0")/.."

deps_only=0
[ "${1:-}" = "--deps" ] && deps_only=1

# The Python package: .venv with the pinned requirements, then sciattn built against its torch
# (CPU-only build; SCIATTN_WITH_CUDA=ON in the environment builds the CUDA kernels as well).
setup_python_requirements() {
  if [ ! -x .venv/bin/python ]; then
    if ! python3 -m venv .venv 2>/dev/null; then
      echo "setup: installing python3-venv"
      sudo_cmd=""
      [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
      $sudo_cmd apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq python3-venv >/dev/null
      rm -rf .venv
      python3 -m venv .venv
    fi
  fi
  echo "setup: installing the Python requirements into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r bindings/torch/requirements.txt
}
setup_python() {
  setup_python_requirements
  echo "setup: building and installing the sciattn Python package"
  .venv/bin/python -m pip install -q --no-build-isolation . -Cbuild.tool-args=-j"$(nproc)"
}
if [ "${1:-}" = "--python" ]; then
  setup_python
  exit 0
fi
if [ "${1:-}" = "--python-requirements" ]; then
  setup_python_requirements
  exit 0
fi

# libopenblas-openmp-dev: the trainer's CPU matrix products (the OpenMP build of OpenBLAS, whose
# threads are the same OpenMP pool as the trainer's own loops). ccache: scripts/test.sh compiles
# the library's C++ through it, so the cuda preset and the Python package reuse the cpu preset's
# objects.
packages=(cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
          libcli11-dev libopenblas-openmp-dev ccache)
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
arch_args=()
if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  preset=gpu
  # The kernels for the GPUs of this machine (compute capability 9.0 as sm_90a, whose code holds
  # the warpgroup kernels); the preset's sm_90a otherwise.
  archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
          awk -F. '$1 >= 8 { a = $1 $2; if (a == "90") a = "90a"; print a }' | sort -u | paste -sd';')
  [ -n "$archs" ] && arch_args=(-DSCIATTN_CUDA_ARCHS="$archs")
fi
jobs=$(nproc)
echo "setup: building preset '$preset' with $jobs jobs${arch_args:+ (${arch_args[*]})}"
cmake --preset "$preset" "${arch_args[@]}" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
ln -sfn "$preset" build/current
setup_python
echo "setup: done; run build/current/tools/sciattn demo (Python: .venv/bin/python -c 'import sciattn')"
