#!/usr/bin/env bash
# Runs the GPU block-sparse ops' test suite (tests/cuda/test_block_sparse_ops_cuda.cpp) on the
# host, against the MatMul / Softmax / composite kernels compiled as C++20 with emulated CTAs
# (each CTA's 256 threads as fibers with their barriers), warp shuffles and mma.sync
# (ops_emu_runtime.h). It checks
# index arithmetic, bounds, fragment layouts and the tests themselves without a GPU; it says
# nothing about timing, races the emulation serialises, or alignment faults (the 16-byte staging
# path is taken for any even address here). Developer tool, not part of CTest.
# Usage: run_ops_emulation.sh [build dir of a CUDA-enabled configuration, default build/cuda]
#        [gtest arguments, e.g. --gtest_filter='*Small*']
# Without gtest arguments every test runs (215, about 25 s after a compile of about 15 s) except
# BlockSparseCudaLimits.*, which asks the fused attention (not part of this emulation: its entry
# points abort here) whether it accepts a shape, and the L = 65536 case (about 4.5 minutes here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build/cuda}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/include/cuda/common" "$work/src"
for h in cuda_runtime.h cuda_runtime_api.h cuda_bf16.h cuda_fp16.h \
         cuda/common/device_utils.cuh cuda/common/mma_tf32.cuh; do
  echo '#include "ops_emu_runtime.h"' > "$work/include/$h"
done
# Kernel launches become emu_launch(kernel, grid, threads, args); every 16-bit address counts
# as aligned, so the vector staging path runs on the test's host buffers.
for f in block_sparse_matmul block_sparse_softmax sparse_attention_composite \
         block_sparse_ops_dispatch; do
  sed -E 's/^( *)([A-Za-z_][A-Za-z_0-9:<>, ]*)<<<([^,]*), *([^,]*), *0, *stream>>>\((.*)\);/\1emu_launch(\2, \3, \4, \5);/; s/% sizeof\(uint4\) == 0/% 2 == 0/' \
    "$root/src/cuda/block_sparse/$f.cu" > "$work/src/$f.cpp"
done
g++ -std=c++20 -O1 -fopenmp -pthread -I"$work/include" -I"$here" -I"$root/tests/cuda/emulation" \
  -I"$root/src" -I"$root/tests" \
  -I"$root/include" "$root/tests/cuda/test_block_sparse_ops_cuda.cpp" "$here/ops_emulation_stubs.cpp" \
  "$work"/src/*.cpp "$build/src/libsciattn.a" "$build/src/libsciattn_sparse_tiles.a" \
  -lgtest -lgtest_main -o "$work/ops_emulation"
if [ $# -eq 0 ]; then
  set -- --gtest_filter='-BlockSparseCudaLimits.*:*L65536*'
fi
"$work/ops_emulation" "$@"
