// The embedding's backward on CUDA without floating-point atomics. CUDA layer of the trainer.
//
// dwte: the (token, position) pairs are sorted by token with CUB's radix sort, which is stable,
// so each run of equal tokens lists its positions in token order. The block whose segment of the
// sorted list holds a run's first entry walks the whole run for its tile of columns and adds the
// rows of dout to dwte[token] one after another, in token order: the CPU's order of additions,
// so in fp32 the result equals the CPU's bit for bit, and each row of dwte has one writer.
// dwpe: one thread per (position, column) adds the batch's rows in batch order (the CPU's order).
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "train/cuda/kernels_common.cuh"
#include "train/cuda/layers_cuda.h"

namespace sciattn::train::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kColsPerThread = 2;
constexpr int kTileCols = kThreads * kColsPerThread;
constexpr int64_t kSegment = 64;  // sorted entries per block of the run walk
constexpr int kBatch = 4;         // rows of a run loaded before they are added

// Bits that hold every key 0 .. V (V is the key of a bad token).
int key_bits(int64_t V) {
  int bits = 1;
  while ((int64_t{1} << bits) <= V) ++bits;
  return bits;
}

size_t align_up(size_t x) {
  constexpr size_t kAlign = 256;
  return (x + kAlign - 1) / kAlign * kAlign;
}

// The sort's temporary storage for n entries of `bits`-bit keys.
size_t sort_bytes(int64_t n, int bits) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(n), 0, bits);
  return bytes;
}

__global__ void prepare_keys_kernel(uint32_t* keys, int32_t* positions, const int32_t* tokens,
                                    int64_t n, int64_t V, unsigned long long* bad_token) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int32_t t = tokens[i];
    const bool valid = t >= 0 && t < V;
    if (!valid) report_bad_token(bad_token, i, t);
    keys[i] = static_cast<uint32_t>(valid ? t : V);
    positions[i] = static_cast<int32_t>(i);
  }
}

template <typename T>
__global__ void embedding_runs_kernel(float* dwte, const T* dout, const uint32_t* keys,
                                      const int32_t* positions, int64_t n, int64_t C, int64_t V) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSegment;
  const int64_t end = std::min(n, begin + kSegment);
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTileCols + threadIdx.x;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t key = keys[i];
    if (key >= static_cast<uint64_t>(V) || (i > 0 && keys[i - 1] == key)) continue;
    // i starts a run of token `key`: add its rows in order.
    float* row = dwte + static_cast<int64_t>(key) * C;
    float acc[kColsPerThread];
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int64_t c = col0 + j * kThreads;
      acc[j] = c < C ? row[c] : 0.0f;
    }
    int64_t k = i;
    while (true) {
      int64_t pos[kBatch];
      int count = 0;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (count == u && k + u < n && keys[k + u] == key) {
          pos[u] = positions[k + u];
          ++count;
        } else {
          pos[u] = -1;
        }
      }
      float v[kBatch][kColsPerThread];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) {
          const int64_t c = col0 + j * kThreads;
          v[u][j] = u < count && c < C ? to_float(dout[pos[u] * C + c]) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (u < count) {
#pragma unroll
          for (int j = 0; j < kColsPerThread; ++j) acc[j] += v[u][j];
        }
      }
      k += count;
      if (count < kBatch) break;
    }
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int64_t c = col0 + j * kThreads;
      if (c < C) row[c] = acc[j];
    }
  }
}

template <typename T>
__global__ void position_backward_kernel(float* dwpe, const T* dout, int64_t B, int64_t L,
                                         int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < L * C;
       i += stride) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += to_float(dout[b * L * C + i]);
    dwpe[i] = acc;
  }
}

}  // namespace

size_t embedding_backward_workspace(int64_t tokens, int64_t V) {
  if (tokens <= 0) return 0;
  const size_t n = static_cast<size_t>(tokens);
  return 4 * align_up(n * 4) + align_up(sort_bytes(tokens, key_bits(V)));
}

cudaError_t embedding_backward(DType dtype, float* dwte, float* dwpe, const void* dout,
                               const int32_t* tokens, int64_t B, int64_t L, int64_t C, int64_t V,
                               void* workspace, size_t workspace_bytes,
                               unsigned long long* bad_token, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = B * L;
    if (n == 0 || C == 0) return cudaSuccess;
    if (workspace_bytes < embedding_backward_workspace(n, V)) return cudaErrorInvalidValue;
    const int bits = key_bits(V);
    char* ws = static_cast<char*>(workspace);
    const size_t slot = align_up(static_cast<size_t>(n) * 4);
    auto* keys_in = reinterpret_cast<uint32_t*>(ws);
    auto* keys_out = reinterpret_cast<uint32_t*>(ws + slot);
    auto* positions_in = reinterpret_cast<int32_t*>(ws + 2 * slot);
    auto* positions_out = reinterpret_cast<int32_t*>(ws + 3 * slot);
    void* sort_temp = ws + 4 * slot;
    size_t sort_temp_bytes = workspace_bytes - 4 * slot;

    prepare_keys_kernel<<<grid_for(n, 256), 256, 0, stream>>>(keys_in, positions_in, tokens, n, V,
                                                              bad_token);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    e = cub::DeviceRadixSort::SortPairs(sort_temp, sort_temp_bytes,
                                        static_cast<const uint32_t*>(keys_in), keys_out,
                                        static_cast<const int32_t*>(positions_in), positions_out,
                                        static_cast<int>(n), 0, bits, stream);
    if (e != cudaSuccess) return e;
    const dim3 grid(static_cast<unsigned>((n + kSegment - 1) / kSegment),
                    static_cast<unsigned>((C + kTileCols - 1) / kTileCols));
    embedding_runs_kernel<T><<<grid, kThreads, 0, stream>>>(dwte, static_cast<const T*>(dout),
                                                            keys_out, positions_out, n, C, V);
    e = cudaGetLastError();
    if (e != cudaSuccess || dwpe == nullptr) return e;
    position_backward_kernel<T>
        <<<grid_for(L * C, 256), 256, 0, stream>>>(dwpe, static_cast<const T*>(dout), B, L, C);
    return cudaGetLastError();
  });
}

}  // namespace sciattn::train::cuda
