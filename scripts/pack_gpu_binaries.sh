#!/usr/bin/env bash
# Builds the GPU programs here (a CPU machine with nvcc) and packs them for the GPU machine, where
# scripts/gpu_suite.sh runs them: .carry/bins.tar.xz (git-ignored; carry `.carry` to the device).
#
#   scripts/pack_gpu_binaries.sh          # the gpu preset: kernels' tests and benchmarks, the C
#                                         # API library, the CLI, the trainer's GPU programs
#   scripts/pack_gpu_binaries.sh --sm80   # also the gpu-sm80 preset's test programs (sm80/)
#
# Layout inside the archive (gpu_suite.sh unpacks it into .carry/):
#   <program>        test_evoformer_cuda, test_sparse_attention_cuda, test_block_sparse_ops_cuda,
#                    test_cuda_device, test_cuda_kernel_path, bench_evoformer_cuda,
#                    bench_sparse_attention_cuda, libsciattn_capi.so, sciattn,
#                    libbenchmark.so.1debian (Debian's Google Benchmark: the GPU machine lacks it)
#   train/<program>  test_train_cuda, test_train_step_cuda, test_train_nccl (where NCCL was
#                    found), bench_train_cuda, sciattn (with the trainer)
#   sm80/<program>   the test programs built for sm_80 alone (--sm80)
# Every program holds the same kernel images; xz with a dictionary larger than the archive stores
# them once, so the whole set is about 40 MB (50 with sm80/) where one program alone is 25.
# The gpu build links OpenBLAS statically (Debian's libopenblas.a), so that only
# libbenchmark.so.1debian has to travel; cuBLASLt and NCCL come from the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
sm80=0
[ "${1:-}" = "--sm80" ] && sm80=1
jobs=$(nproc)
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.a
[ -f "$blas" ] || { echo "pack: $blas is missing (scripts/setup.sh --deps installs it)"; exit 1; }

kernels=(test_evoformer_cuda test_sparse_attention_cuda test_block_sparse_ops_cuda test_cuda_device
         test_cuda_kernel_path bench_evoformer_cuda bench_sparse_attention_cuda sciattn_capi
         sciattn_cli)
trainer=(test_train_cuda test_train_step_cuda bench_train_cuda)
cmake --preset gpu -DSCIATTN_BUILD_TRAINER=ON -DBLAS_LIBRARIES="$blas" >/dev/null
nccl=()
if ninja -C build/gpu -t targets all 2>/dev/null | grep -q '^test_train_nccl:'; then
  nccl=(test_train_nccl)
fi
cmake --build build/gpu -j "$jobs" --target "${kernels[@]}" "${trainer[@]}" "${nccl[@]}"
if [ $sm80 = 1 ]; then
  cmake --preset gpu-sm80 -DSCIATTN_BUILD_TRAINER=OFF >/dev/null
  cmake --build build/gpu-sm80 -j "$jobs" --target test_evoformer_cuda test_sparse_attention_cuda \
    test_block_sparse_ops_cuda test_cuda_device
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bins/train"
find build/gpu \( -name 'test_evoformer_cuda' -o -name 'test_sparse_attention_cuda' \
  -o -name 'test_block_sparse_ops_cuda' -o -name 'test_cuda_device' -o -name 'test_cuda_kernel_path' \
  -o -name 'bench_evoformer_cuda' -o -name 'bench_sparse_attention_cuda' \
  -o -name 'libsciattn_capi.so' \) -type f -perm -u+x -exec cp {} "$stage/bins/" \;
cp build/gpu/tools/sciattn "$stage/bins/"
for t in "${trainer[@]}" "${nccl[@]}"; do
  find build/gpu -name "$t" -type f -perm -u+x -exec cp {} "$stage/bins/train/" \;
done
cp build/gpu/tools/sciattn "$stage/bins/train/"
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian "$stage/bins/"
if [ $sm80 = 1 ]; then
  mkdir -p "$stage/bins/sm80"
  for t in test_evoformer_cuda test_sparse_attention_cuda test_block_sparse_ops_cuda \
           test_cuda_device; do
    cp "build/gpu-sm80/tests/cuda/$t" "$stage/bins/sm80/"
  done
fi
find "$stage/bins" -type f ! -name '*.so*' -exec strip {} +
mkdir -p .carry
tar cf - -C "$stage/bins" . | xz -T1 --lzma2=preset=6,dict=1024MiB > .carry/bins.tar.xz
ls -la .carry/bins.tar.xz
echo "pack: carry .carry to the GPU machine; there: scripts/gpu_suite.sh <parts>"
