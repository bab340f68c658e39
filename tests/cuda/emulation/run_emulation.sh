#!/usr/bin/env bash
# Runs the fused block-sparse attention kernels, or with `evoformer` the Evoformer kernels, under
# host emulation (no GPU): the kernel sources compiled as C++20 with emulated mma.sync / ldmatrix /
# warp shuffles / barriers / warpgroup MMA (one CTA or cluster at a time, its threads as fibers
# on one OS thread, run in thread order from barrier to barrier; cp.async lands at issue, or with EMU_DEFER=1 only at the wait that must complete it, the two
# extremes of the pipeline's timing; wgmma completes at issue), against the fp64 oracle and the
# CPU path with the tolerance rule: the mma.sync kernels, and the sm_90a warpgroup kernels where
# the host picks them, through the dispatch's own launchers. Developer tool (tests/cuda/emulation),
# not part of CTest. Usage:
#   run_emulation.sh [CPU build dir, default build/cpu] [case | 100 (fp32) | 200 N (N random)]
#   run_emulation.sh [CPU build dir] evoformer [case index | random [count [seed]]]
# With no case argument the fixed cases run (and, for block-sparse, the fp32 ones).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build/cpu}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/make_shims.py" "$work"
program=sparse_attention_emulation.cpp
if [ "${1:-}" = evoformer ]; then
  program=evoformer_emulation.cpp
  shift
fi
# The CUDA headers (cuda_fp16.h, cuda_bf16.h) of the toolkit whose nvcc is on PATH, else
# /usr/local/cuda's.
cuda_include=/usr/local/cuda/include
if command -v nvcc >/dev/null 2>&1; then
  cuda_include=$(cd "$(dirname "$(readlink -f "$(command -v nvcc)")")/../include" && pwd)
fi
g++ -std=c++20 -O1 -fopenmp -I"$work" -I"$here" -I"$root/src" -I"$root/include" -I"$root/tests" \
  -I"$cuda_include" "$here/$program" -o "$work/emulation" \
  "$build/src/libsciattn.a" "$build/src/libsciattn_sparse_tiles.a" -lgtest -lpthread
"$work/emulation" "$@"
