#!/usr/bin/env bash
# Builds the sciattn PyTorch extension with CMake directly (no pip, no network) and puts it next to
# the Python sources, so that `PYTHONPATH=bindings/torch/python pytest tests/python` works. This is
# how the package is built on the GPU machine (no registry there; see CONTRIBUTING.md, "The GPU machine").
#
#   scripts/build_torch_ext.sh [--cuda|--cpu] [--python PY] [--jobs N]
#   scripts/build_torch_ext.sh --carry-deps   # here: copy the nlohmann-json headers and CMake
#                                             # package into .carry/deps (for the GPU machine)
#
# --cuda (the default when nvcc and a CUDA-enabled torch are present) builds the CUDA kernels
# (every head dim and dtype, as the `gpu` preset; SCIATTN_HEAD_DIMS="32;64" builds fewer) for the
# architectures of SCIATTN_CUDA_ARCHS, else of TORCH_CUDA_ARCH_LIST, else sm_90a
# (cmake/sciattn_cuda_archs.cmake), and registers the CUDA kernels of the ops.
# The build tree is build/torch-ext-{cpu,cuda}. nlohmann-json is looked up in the usual places and
# in .carry/deps/nlohmann_json (made by --carry-deps).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && python=.venv/bin/python
mode=auto
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) mode=cuda ;;
    --cpu) mode=cpu ;;
    --python) python=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --carry-deps)
      dst=.carry/deps/nlohmann_json
      mkdir -p "$dst/include" "$dst/share/cmake"
      cp -r /usr/include/nlohmann "$dst/include/"
      cp -r /usr/share/cmake/nlohmann_json "$dst/share/cmake/"
      echo "build_torch_ext: copied nlohmann-json into $dst"
      exit 0 ;;
    *) echo "usage: $0 [--cuda|--cpu] [--python PY] [--jobs N] | --carry-deps" >&2; exit 2 ;;
  esac
  shift
done

torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")')
if [ "$mode" = auto ]; then
  mode=cpu
  if command -v nvcc >/dev/null 2>&1 && [ -n "$torch_cuda" ] && command -v nvidia-smi >/dev/null 2>&1 \
     && nvidia-smi -L >/dev/null 2>&1; then
    mode=cuda
  fi
fi

# The compiler: SCIATTN_TORCH_CXX, else the system's /usr/bin/g++ when there is one, rather than
# $CXX. On the GPU machine $CXX (and $CUDAHOSTCXX) is /opt/gcc/bin/g++, a wrapper whose library
# folder (-B/opt/gcc/lib/gcc/x86_64-linux-gnu/13) holds libstdc++.a but no libstdc++.so: an
# extension linked by it carries a static libstdc++ and crashes the first time it formats an error
# (checked 2026-11-30 with a ten-line TORCH_CHECK_VALUE extension). The CUDA build still sees that
# folder through nvcc's link directories, which bindings/torch/CMakeLists.txt deals with by
# linking the shared libstdc++ by its full path.
cxx=${SCIATTN_TORCH_CXX:-}
[ -z "$cxx" ] && [ -x /usr/bin/g++ ] && cxx=/usr/bin/g++
compiler_args=()
if [ -n "$cxx" ]; then
  compiler_args=(-DCMAKE_CXX_COMPILER="$cxx")
  [ "$mode" = cuda ] && compiler_args+=(-DCMAKE_CUDA_HOST_COMPILER="$cxx")
fi

prefix_path="$torch_prefix"
[ -d .carry/deps/nlohmann_json ] && prefix_path="$prefix_path;$PWD/.carry/deps/nlohmann_json"
build=build/torch-ext-$mode
cuda_args=(-DSCIATTN_WITH_CUDA=OFF)
if [ "$mode" = cuda ]; then
  cuda_args=(-DSCIATTN_WITH_CUDA=ON "-DSCIATTN_CUDA_ARCHS=${SCIATTN_CUDA_ARCHS:-}"
             "-DSCIATTN_HEAD_DIMS=${SCIATTN_HEAD_DIMS:-8;16;32;64;128}" "-DSCIATTN_DTYPES=f16;bf16")
fi
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

echo "build_torch_ext: $mode build in $build with $jobs jobs (python: $python)"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DSCIATTN_WITH_TORCH=ON "${cuda_args[@]}" "${compiler_args[@]}" \
  -DSCIATTN_BUILD_TESTS=OFF -DSCIATTN_BUILD_BENCH=OFF -DSCIATTN_BUILD_EXAMPLES=OFF \
  -DSCIATTN_BUILD_TOOLS=OFF -DSCIATTN_BUILD_CAPI=OFF \
  -DPython3_EXECUTABLE="$("$python" -c 'import sys; print(sys.executable)')" "-DCMAKE_PREFIX_PATH=$prefix_path" >/dev/null
cmake --build "$build" --target sciattn_torch -j "$jobs"
cp "$build"/bindings/torch/_sciattn_ops*.so bindings/torch/python/sciattn/
echo "build_torch_ext: done; run PYTHONPATH=bindings/torch/python $python -m pytest tests/python"
