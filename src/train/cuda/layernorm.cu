// LayerNorm forward and backward on CUDA, and the chunked column sums that form the LayerNorm's
// weight and bias gradients and the linear layers' bias gradients. CUDA layer of the trainer.
//
// Rows: one warp per row, its statistics summed in fp32 in a fixed butterfly order.
// Column sums (deterministic, no atomics): the rows of a call are cut into chunks of `chunk`
// rows from row 0 and each chunk into groups of kGroupRows rows. A block sums one group for a
// tile of columns (threads along rows walk their rows in order, then their partial sums are added
// in thread order) and writes the group's partial; a second kernel adds, for each column, the
// groups of a chunk in order and then the chunk's sum into the fp32 gradient, chunk after chunk.
// The result depends only on the chunk size, never on how many rows a call has, which is the
// tiling rule of backend.h.
#include <algorithm>
#include <type_traits>

#include "train/cuda/kernels_common.cuh"
#include "train/cuda/layers_cuda.h"

namespace sciattn::train::cuda {
namespace {

constexpr int kRowThreads = 256;  // threads of the row kernels: 8 warps, 8 rows at a time

// The column sums' block: kColThreads x kRowLanes threads.
constexpr int kColThreads = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kGroupRows = 256;
// Chunks one pair of launches covers; bounds the partials' workspace.
constexpr int64_t kChunksPerLaunch = 16;

// ---- rows ----

template <typename T, int kVec>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* in,
                                         const T* weight, const T* bias, int64_t N, int64_t C,
                                         float eps) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       row < N; row += warps) {
    const T* x = in + row * C;
    float sum = 0.0f;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < C; c += kWarp * kVec) {
      float v[kVec];
      load_floats<T, kVec>(x + c, v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum += v[i];
    }
    const float m = warp_sum(sum) / static_cast<float>(C);
    // Second pass over the row (from L1) for the variance: no cancellation.
    float squares = 0.0f;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < C; c += kWarp * kVec) {
      float v[kVec];
      load_floats<T, kVec>(x + c, v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float d = v[i] - m;
        squares += d * d;
      }
    }
    const float var = warp_sum(squares) / static_cast<float>(C);
    const float s = 1.0f / sqrtf(var + eps);
    T* o = out + row * C;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < C; c += kWarp * kVec) {
      float v[kVec], w[kVec], b[kVec];
      load_floats<T, kVec>(x + c, v);
      load_floats<T, kVec>(weight + c, w);
      load_floats<T, kVec>(bias + c, b);
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = (v[i] - m) * s * w[i] + b[i];
      store_floats<T, kVec>(o + c, v);
    }
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = s;
    }
  }
}

template <typename T, int kVec>
__global__ void layernorm_backward_input_kernel(T* din, const T* dout, const T* in, const T* weight,
                                                const float* mean, const float* rstd, int64_t N,
                                                int64_t C) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       row < N; row += warps) {
    const T* x = in + row * C;
    const T* d = dout + row * C;
    const float m = mean[row], s = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < C; c += kWarp * kVec) {
      float xv[kVec], dv[kVec], wv[kVec];
      load_floats<T, kVec>(x + c, xv);
      load_floats<T, kVec>(d + c, dv);
      load_floats<T, kVec>(weight + c, wv);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float g = dv[i] * wv[i];
        sum_g += g;
        sum_gx += g * ((xv[i] - m) * s);
      }
    }
    const float mean_g = warp_sum(sum_g) / static_cast<float>(C);
    const float mean_gx = warp_sum(sum_gx) / static_cast<float>(C);
    T* di = din + row * C;
    for (int64_t c = static_cast<int64_t>(lane) * kVec; c < C; c += kWarp * kVec) {
      float xv[kVec], dv[kVec], wv[kVec], iv[kVec];
      load_floats<T, kVec>(x + c, xv);
      load_floats<T, kVec>(d + c, dv);
      load_floats<T, kVec>(weight + c, wv);
      load_floats<T, kVec>(di + c, iv);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float xhat = (xv[i] - m) * s;
        iv[i] += s * (dv[i] * wv[i] - mean_g - xhat * mean_gx);
      }
      store_floats<T, kVec>(di + c, iv);
    }
  }
}

// Launches a row kernel with 16-byte vectors when C and every pointer allow them.
template <typename T, typename Launch>
cudaError_t launch_rows(int64_t N, int64_t C, bool aligned, Launch launch) {
  constexpr int kVec = kVec16<T>;
  const unsigned grid = grid_for(N * kWarp, kRowThreads);
  if (aligned && C % kVec == 0) {
    launch(std::integral_constant<int, kVec>{}, grid);
  } else {
    launch(std::integral_constant<int, 1>{}, grid);
  }
  return cudaGetLastError();
}

// ---- column sums ----

// The values a column sum adds for kVec consecutive columns c .. c + kVec - 1 of row r: dout for
// a bias; dout * xhat and dout for the LayerNorm's weight and bias. With kVec > 1 the row's
// element c is 16-byte aligned (one vector load per tensor).
template <typename T>
struct BiasValues {
  static constexpr int kValues = 1;
  const T* dout;
  int64_t cols;
  template <int kVec>
  __device__ void load(int64_t r, int64_t c, float (&v)[kValues][kVec]) const {
    load_floats<T, kVec>(dout + r * cols + c, v[0]);
  }
};
template <typename T>
struct LayerNormValues {
  static constexpr int kValues = 2;
  const T* dout;
  const T* in;
  const float* mean;
  const float* rstd;
  int64_t cols;
  template <int kVec>
  __device__ void load(int64_t r, int64_t c, float (&v)[kValues][kVec]) const {
    float x[kVec];
    load_floats<T, kVec>(dout + r * cols + c, v[1]);
    load_floats<T, kVec>(in + r * cols + c, x);
    const float m = mean[r], s = rstd[r];
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[0][i] = v[1][i] * ((x[i] - m) * s);
  }
};

struct Outputs {
  float* out[2];
};

int64_t groups_per_chunk(int64_t chunk) {
  return (chunk + kGroupRows - 1) / kGroupRows;
}

// The columns one block covers: kColThreads threads of kVec consecutive columns, kSpans times
// (the spans kColThreads * kVec columns apart, so that a warp reads consecutive elements).
template <int kVec, int kSpans>
constexpr int kTileCols = kColThreads* kVec* kSpans;

// partials[((k * groups + g) * kValues + v) * cols + c]: the sum of value v over the rows of group
// g of chunk k (chunks counted from first_row). Each thread walks its rows (y, y + kRowLanes, ...)
// in order; then thread row 0 adds the kRowLanes partial sums in order.
template <typename Values, int kVec, int kSpans>
__global__ void column_partials_kernel(Values values, int64_t first_row, int64_t N, int64_t chunk,
                                       int64_t groups, int64_t cols, float* partials) {
  constexpr int kValues = Values::kValues;
  constexpr int kTile = kTileCols<kVec, kSpans>;
  __shared__ float shared[kRowLanes][kValues][kTile];
  const int64_t k = blockIdx.z, g = blockIdx.y;
  const int64_t chunk_begin = first_row + k * chunk;
  const int64_t begin = chunk_begin + g * kGroupRows;
  const int64_t end = std::min(std::min(begin + kGroupRows, chunk_begin + chunk), N);
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[kSpans][kValues][kVec] = {};
  for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
#pragma unroll
    for (int j = 0; j < kSpans; ++j) {
      const int64_t c = tile0 + j * kColThreads * kVec + threadIdx.x * kVec;
      if (c < cols) {
        float v[kValues][kVec];
        values.template load<kVec>(r, c, v);
#pragma unroll
        for (int i = 0; i < kValues; ++i) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[j][i][e] += v[i][e];
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kSpans; ++j) {
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        shared[threadIdx.y][i][j * kColThreads * kVec + threadIdx.x * kVec + e] = acc[j][i][e];
      }
    }
  }
  __syncthreads();
  if (threadIdx.y != 0) return;
#pragma unroll
  for (int j = 0; j < kSpans; ++j) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int t = j * kColThreads * kVec + threadIdx.x * kVec + e;
      const int64_t c = tile0 + t;
      if (c >= cols) continue;
#pragma unroll
      for (int i = 0; i < kValues; ++i) {
        float s = shared[0][i][t];
        for (int y = 1; y < kRowLanes; ++y) s += shared[y][i][t];
        partials[((k * groups + g) * kValues + i) * cols + c] = s;
      }
    }
  }
}

// For each (value, column): for the launch's chunks in order, the chunk's groups added in order,
// then the chunk's sum added to the output.
template <int kValues>
__global__ void column_finalize_kernel(Outputs outputs, const float* partials, int64_t first_row,
                                       int64_t N, int64_t chunk, int64_t chunks, int64_t groups,
                                       int64_t cols) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < kValues * cols;
       i += stride) {
    const int64_t v = i / cols, c = i % cols;
    float* out = outputs.out[v];
    float acc = out[c];
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t rows = std::min(chunk, N - (first_row + k * chunk));
      const int64_t used = (rows + kGroupRows - 1) / kGroupRows;
      float s = partials[((k * groups) * kValues + v) * cols + c];
      for (int64_t g = 1; g < used; ++g) s += partials[((k * groups + g) * kValues + v) * cols + c];
      acc += s;
    }
    out[c] = acc;
  }
}

// The column sums of `values` over N rows added to `outputs`. `vector`: every column count and
// address allows 16-byte loads of the element type (the sums are the same either way: each column
// is summed over the same rows in the same order).
template <typename T, typename Values>
cudaError_t column_sums(Values values, Outputs outputs, int64_t N, int64_t cols, int64_t chunk,
                        bool vector, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  constexpr int kValues = Values::kValues;
  constexpr int kVec = kVec16<T>;
  if (N == 0 || cols == 0) return cudaSuccess;
  if (workspace_bytes < column_sums_workspace(N, cols, chunk, kValues)) {
    return cudaErrorInvalidValue;
  }
  float* partials = static_cast<float*>(workspace);
  const int64_t groups = groups_per_chunk(chunk);
  const int64_t total_chunks = (N + chunk - 1) / chunk;
  vector = vector && cols % kVec == 0;
  const int64_t tile = vector ? kTileCols<kVec, 1> : kTileCols<1, 4>;
  const unsigned tiles = static_cast<unsigned>((cols + tile - 1) / tile);
  for (int64_t k0 = 0; k0 < total_chunks; k0 += kChunksPerLaunch) {
    const int64_t chunks = std::min(kChunksPerLaunch, total_chunks - k0);
    const dim3 grid(tiles, static_cast<unsigned>(groups), static_cast<unsigned>(chunks));
    const dim3 block(kColThreads, kRowLanes);
    if (vector) {
      column_partials_kernel<Values, kVec, 1>
          <<<grid, block, 0, stream>>>(values, k0 * chunk, N, chunk, groups, cols, partials);
    } else {
      column_partials_kernel<Values, 1, 4>
          <<<grid, block, 0, stream>>>(values, k0 * chunk, N, chunk, groups, cols, partials);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    column_finalize_kernel<kValues><<<grid_for(kValues * cols, 256), 256, 0, stream>>>(
        outputs, partials, k0 * chunk, N, chunk, chunks, groups, cols);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

size_t column_sums_workspace(int64_t N, int64_t cols, int64_t chunk, int values) {
  if (N <= 0 || chunk <= 0) return 0;
  const int64_t chunks = std::min(kChunksPerLaunch, (N + chunk - 1) / chunk);
  return static_cast<size_t>(chunks * groups_per_chunk(chunk) * values * cols) * sizeof(float);
}

cudaError_t layernorm_forward(DType dtype, void* out, float* mean, float* rstd, const void* in,
                              const void* weight, const void* bias, int64_t N, int64_t C, float eps,
                              cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (N == 0) return cudaSuccess;
    const bool aligned =
        aligned_to(out, 16) && aligned_to(in, 16) && aligned_to(weight, 16) && aligned_to(bias, 16);
    return launch_rows<T>(N, C, aligned, [&](auto vec, unsigned grid) {
      layernorm_forward_kernel<T, decltype(vec)::value><<<grid, kRowThreads, 0, stream>>>(
          static_cast<T*>(out), mean, rstd, static_cast<const T*>(in),
          static_cast<const T*>(weight), static_cast<const T*>(bias), N, C, eps);
    });
  });
}

cudaError_t layernorm_backward_input(DType dtype, void* din, const void* dout, const void* in,
                                     const void* weight, const float* mean, const float* rstd,
                                     int64_t N, int64_t C, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (N == 0) return cudaSuccess;
    const bool aligned =
        aligned_to(din, 16) && aligned_to(dout, 16) && aligned_to(in, 16) && aligned_to(weight, 16);
    return launch_rows<T>(N, C, aligned, [&](auto vec, unsigned grid) {
      layernorm_backward_input_kernel<T, decltype(vec)::value><<<grid, kRowThreads, 0, stream>>>(
          static_cast<T*>(din), static_cast<const T*>(dout), static_cast<const T*>(in),
          static_cast<const T*>(weight), mean, rstd, N, C);
    });
  });
}

cudaError_t layernorm_backward_params(DType dtype, float* dweight, float* dbias, const void* dout,
                                      const void* in, const float* mean, const float* rstd,
                                      int64_t N, int64_t C, int64_t chunk, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const LayerNormValues<T> values{static_cast<const T*>(dout), static_cast<const T*>(in), mean,
                                    rstd, C};
    const bool vector = aligned_to(dout, 16) && aligned_to(in, 16);
    return column_sums<T>(values, Outputs{{dweight, dbias}}, N, C, chunk, vector, workspace,
                          workspace_bytes, stream);
  });
}

cudaError_t bias_backward(DType dtype, float* dbias, const void* dout, int64_t N, int64_t OC,
                          int64_t chunk, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const BiasValues<T> values{static_cast<const T*>(dout), OC};
    return column_sums<T>(values, Outputs{{dbias, nullptr}}, N, OC, chunk, aligned_to(dout, 16),
                          workspace, workspace_bytes, stream);
  });
}

}  // namespace sciattn::train::cuda
