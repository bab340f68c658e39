#!/usr/bin/env bash
# Runs the whole sciattn test suite on this machine, as CI does:
#   1. the `cpu` preset: build, then every cpu-labelled test (library suites, the examples, the
#      command-line program), then `sciattn demo` and `sciattn train --demo` (seconds);
#   2. the C++ package: `cmake --install` of the cpu build into a temporary prefix, then examples/
#      built as a separate CMake project against it (find_package(sciattn CONFIG)) and run;
#   3. the `cuda` preset: compiles every kernel for sm_80, 86, 89 and 90a and every GPU test (runs
#      nothing on a GPU; skipped with a message when nvcc is absent), then the host emulator's
#      fixed cases of the mma.sync and warpgroup kernels (tests/cuda/emulation: Evoformer and
#      block-sparse, side by side, against the fp64 oracle; about two minutes on 2 cores);
#   4. the `asan` preset: the cpu-labelled tests under AddressSanitizer and UBSan;
#   5. the libFuzzer targets (scripts/fuzz.sh): side by side for 60 s from their seed corpora,
#      failing on any crash, leak or sanitizer report;
#   6. the Python package (label python): installs .venv and the package (scripts/setup.sh
#      --python; its requirements were installed in the background since the start), then runs
#      pytest tests/python on the CPU.
# Installs missing build dependencies first (scripts/setup.sh --deps).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Each stage's duration is printed when the next begins (CI must stay under 30 minutes).
stage_start=$(date +%s)
stage_name=""
stage() {
  [ -n "$stage_name" ] && echo "== $stage_name took $(( $(date +%s) - stage_start )) s"
  stage_name=$1
  stage_start=$(date +%s)
  echo "== $1"
}

scripts/setup.sh --deps

# The C++ compiles go through ccache (installed by setup.sh --deps), its cache in build/ccache
# unless CCACHE_DIR says otherwise: the cuda preset and the Python package compile most of the
# library's C++ sources with the cpu preset's flags, and ccache's preprocessor mode (which leaves
# -D and -I out of its key) serves those objects from the cpu build instead of compiling them
# again.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache}
fi

# The Python requirements (PyTorch and its wheels, mostly download time) install in the background
# while the C++ stages build and test; the python stage waits for them.
logs=$(mktemp -d)
scripts/setup.sh --python-requirements >"$logs/python_requirements.log" 2>&1 &
requirements_pid=$!
trap 'pkill -P "$requirements_pid" 2>/dev/null || true; kill "$requirements_pid" 2>/dev/null || true; rm -rf "$logs" "${prefix:-}"' EXIT

stage "cpu preset: build and test"
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$jobs"
ctest --preset cpu -j "$jobs"

stage "sciattn demo"
build/cpu/tools/sciattn demo

stage "sciattn train --demo"
build/cpu/tools/sciattn train --demo

stage "installed package: cmake --install, then examples/ as a project of its own"
prefix=$(mktemp -d)
cmake --install build/cpu --prefix "$prefix/install" >/dev/null
cmake -S examples -B "$prefix/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix/install" >/dev/null
cmake --build "$prefix/examples" -j "$jobs"
ctest --test-dir "$prefix/examples" -j "$jobs"

stage "cuda preset: compile the kernels, GPU tests and GPU benchmark (runs nothing)"
if command -v nvcc >/dev/null 2>&1; then
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda -j "$jobs"
else
  echo "nvcc not found: skipping the cuda preset (install the CUDA toolkit to compile kernels)"
fi

stage "kernel emulation: the mma.sync and wgmma kernels on the CPU against the fp64 oracle"
if command -v nvcc >/dev/null 2>&1; then
  # The two programs build and run at the same time (each compile is one process); their logs
  # are printed when both have ended.
  emulate=tests/cuda/emulation/run_emulation.sh
  "$emulate" build/cpu evoformer >"$prefix/emulation_evoformer.log" 2>&1 &
  evoformer_pid=$!
  "$emulate" build/cpu >"$prefix/emulation_block_sparse.log" 2>&1 &
  block_sparse_pid=$!
  emulation_status=0
  wait "$evoformer_pid" || emulation_status=1
  wait "$block_sparse_pid" || emulation_status=1
  cat "$prefix/emulation_evoformer.log" "$prefix/emulation_block_sparse.log"
  [ "$emulation_status" = 0 ] || { echo "kernel emulation failed (see above)"; exit 1; }
else
  echo "nvcc not found: skipping the kernel emulation (it needs the CUDA toolkit's headers)"
fi

stage "asan preset: build and test"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"

stage "fuzz: the libFuzzer targets side by side for 60 s"
scripts/fuzz.sh 60

stage "python: install the package into .venv and run pytest tests/python"
if ! wait "$requirements_pid"; then
  cat "$logs/python_requirements.log"
  echo "installing the Python requirements failed (log above)"
  exit 1
fi
cat "$logs/python_requirements.log"
# The cpu preset's compiler and -Werror (warnings are errors here as in the presets), so that the
# library's objects come from ccache; the compiler's name is part of ccache's key, and the
# package's build would otherwise take g++ where the presets take c++.
CXX=c++ SKBUILD_CMAKE_DEFINE="SCIATTN_WERROR=ON" scripts/setup.sh --python
.venv/bin/python -m pytest tests/python -q -p no:cacheprovider
stage "all tests passed"
