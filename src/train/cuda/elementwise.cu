// The trainer's elementwise and copy kernels on CUDA: embedding forward, GELU and its backward,
// add, bias add, rotary embedding, and the row copies that pad, unpad and interleave the
// attention's tensors. CUDA layer of the trainer. Arithmetic in fp32, one rounding to the
// storage type per output; 16-byte accesses where every pointer and row allows them.
#include <cmath>

#include "train/cuda/kernels_common.cuh"
#include "train/cuda/layers_cuda.h"

namespace sciattn::train::cuda {
namespace {

constexpr int kThreads = 256;

// sqrt(2 / pi) and the cubic coefficient of GELU's tanh approximation (as in the CPU layers).
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// ---- embedding ----

template <typename T, int kVec>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                         int64_t rows, int64_t L, int64_t C, int64_t V,
                                         unsigned long long* bad_token) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t token = tokens[r];
    const bool valid = token >= 0 && token < V;
    if (!valid && threadIdx.x == 0) report_bad_token(bad_token, r, token);
    const T* te = wte + (valid ? static_cast<int64_t>(token) : 0) * C;
    const T* pe = wpe != nullptr ? wpe + (r % L) * C : nullptr;
    T* o = out + r * C;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < C;
         c += static_cast<int64_t>(blockDim.x) * kVec) {
      float x[kVec];
      load_floats<T, kVec>(te + c, x);
      if (pe != nullptr) {
        float p[kVec];
        load_floats<T, kVec>(pe + c, p);
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[i] += p[i];
      }
      if (!valid) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[i] = __int_as_float(0x7fc00000);  // NaN
      }
      store_floats<T, kVec>(o + c, x);
    }
  }
}

// ---- elementwise maps ----

struct GeluForwardOp {
  __device__ float operator()(float x, float) const {
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};
struct GeluBackwardOp {
  // d/dx [x/2 (1 + tanh u)] = (1 + tanh u) / 2 + x/2 (1 - tanh^2 u) du/dx (1 - tanh^2 rather than
  // sech^2, which overflows for large |u|).
  __device__ float operator()(float x, float dout) const {
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    return (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du) * dout;
  }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out[i] = op(a[i], b[i]) over [0, n); b may be null (op ignores its second argument then). out
// may be a or b: each element is read before it is written, by the same thread. With kVec > 1, n
// is a multiple of kVec and every pointer 16-byte aligned.
template <typename T, int kVec, typename Op>
__global__ void map_kernel(T* out, const T* a, const T* b, int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kVec;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += stride) {
    float x[kVec], y[kVec] = {};
    load_floats<T, kVec>(a + i, x);
    if (b != nullptr) load_floats<T, kVec>(b + i, y);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = op(x[k], y[k]);
    store_floats<T, kVec>(out + i, x);
  }
}

// Runs map_kernel over n elements: 16-byte vectors on the largest multiple of the vector that
// every pointer allows, element by element on the rest.
template <typename T, typename Op>
cudaError_t launch_map(T* out, const T* a, const T* b, int64_t n, Op op, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  int64_t head = 0;
  if (aligned_to(out, 16) && aligned_to(a, 16) && (b == nullptr || aligned_to(b, 16))) {
    head = n / kVec * kVec;
    if (head > 0) {
      map_kernel<T, kVec, Op>
          <<<grid_for(head / kVec, kThreads), kThreads, 0, stream>>>(out, a, b, head, op);
    }
  }
  if (n > head) {
    map_kernel<T, 1, Op><<<grid_for(n - head, kThreads), kThreads, 0, stream>>>(
        out + head, a + head, b != nullptr ? b + head : nullptr, n - head, op);
  }
  return cudaGetLastError();
}

// out[t][c] += bias[c].
template <typename T>
__global__ void add_bias_kernel(T* out, const T* bias, int64_t n, int64_t OC) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % OC]));
  }
}

// ---- rotary ----

// Rows one block rotates at a time: their angles' cosines and sines are formed once, into shared
// memory, and then read by every head of q and k.
constexpr int kRotaryRows = 8;

// A block takes kRotaryRows rows: first the cosine and sine of every (row, k < D/2) in fp64, each
// rounded once to fp32 (as the CPU forms them: angle = position * base^(-2k/D)), then the pairs
// (k, k + D/2) of every head of q and k, kVec consecutive k per thread (16-byte accesses when
// kVec > 1). The products and sums are rounded one by one (no contracted multiply-add), as on
// the CPU, so the fp32 results equal the CPU's.
template <typename T, int kVec>
__global__ void rotary_kernel(T* qkv, int64_t rows, int64_t L, int H, int D, double base,
                              bool inverse) {
  extern __shared__ float2 angles[];  // [kRotaryRows][D / 2]: (cos, sin)
  const int half = D / 2, C = H * D, groups = half / kVec;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRotaryRows; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.x) * kRotaryRows) {
    const int n = static_cast<int>(rows - r0 < kRotaryRows ? rows - r0 : kRotaryRows);
    for (int i = threadIdx.x; i < n * half; i += blockDim.x) {
      const int64_t row = r0 + i / half;
      const int k = i % half;
      const double angle = static_cast<double>(row % L) *
                           pow(base, -2.0 * static_cast<double>(k) / static_cast<double>(D));
      double sine, cosine;
      sincos(angle, &sine, &cosine);
      angles[i] =
          make_float2(static_cast<float>(cosine), static_cast<float>(inverse ? -sine : sine));
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n * 2 * H * groups; i += blockDim.x) {
      const int g = i % groups, head = (i / groups) % H, part = (i / groups / H) % 2,
                r = i / groups / H / 2;
      T* x = qkv + (r0 + r) * 3 * C + part * C + head * D + g * kVec;
      const float2* cs = angles + r * half + g * kVec;
      float a[kVec], b[kVec], ra[kVec], rb[kVec];
      load_floats<T, kVec>(x, a);
      load_floats<T, kVec>(x + half, b);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float c = cs[e].x, s = cs[e].y;
        ra[e] = __fsub_rn(__fmul_rn(a[e], c), __fmul_rn(b[e], s));
        rb[e] = __fadd_rn(__fmul_rn(b[e], c), __fmul_rn(a[e], s));
      }
      store_floats<T, kVec>(x, ra);
      store_floats<T, kVec>(x + half, rb);
    }
    __syncthreads();  // the angles are rewritten for the next rows
  }
}

// ---- row copies ----

template <typename U>
__global__ void copy_rows_kernel(char* dst, int64_t dst_batch_stride, int64_t dst_row_stride,
                                 const char* src, int64_t src_batch_stride, int64_t src_row_stride,
                                 int64_t rows, int64_t dst_rows, int64_t src_rows, int64_t units) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t b = r / dst_rows, l = r % dst_rows;
    U* d = reinterpret_cast<U*>(dst + b * dst_batch_stride + l * dst_row_stride);
    const U* s = l < src_rows
                     ? reinterpret_cast<const U*>(src + b * src_batch_stride + l * src_row_stride)
                     : nullptr;
    for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
         u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      d[u] = s != nullptr ? s[u] : U{};
    }
  }
}

template <typename U>
cudaError_t launch_copy_rows(void* dst, int64_t dbs, int64_t drs, const void* src, int64_t sbs,
                             int64_t srs, int64_t B, int64_t dst_rows, int64_t src_rows,
                             int64_t row_bytes, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  const int64_t rows = B * dst_rows;
  const int64_t x = (units + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(x < 1      ? 1
                                        : x > 1024 ? 1024
                                                   : x),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  copy_rows_kernel<U><<<grid, kThreads, 0, stream>>>(static_cast<char*>(dst), dbs, drs,
                                                     static_cast<const char*>(src), sbs, srs, rows,
                                                     dst_rows, src_rows, units);
  return cudaGetLastError();
}

}  // namespace

cudaError_t embedding_forward(DType dtype, void* out, const int32_t* tokens, const void* wte,
                              const void* wpe, int64_t B, int64_t L, int64_t C, int64_t V,
                              unsigned long long* bad_token, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = kVec16<T>;
    const int64_t rows = B * L;
    if (rows == 0 || C == 0) return cudaSuccess;
    const unsigned grid = grid_for(rows * kThreads, kThreads);
    const bool vector = C % kVec == 0 && aligned_to(out, 16) && aligned_to(wte, 16) &&
                        (wpe == nullptr || aligned_to(wpe, 16));
    if (vector) {
      embedding_forward_kernel<T, kVec>
          <<<grid, kThreads, 0, stream>>>(static_cast<T*>(out), tokens, static_cast<const T*>(wte),
                                          static_cast<const T*>(wpe), rows, L, C, V, bad_token);
    } else {
      embedding_forward_kernel<T, 1>
          <<<grid, kThreads, 0, stream>>>(static_cast<T*>(out), tokens, static_cast<const T*>(wte),
                                          static_cast<const T*>(wpe), rows, L, C, V, bad_token);
    }
    return cudaGetLastError();
  });
}

cudaError_t gelu_forward(DType dtype, void* out, const void* in, int64_t n, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return cudaSuccess;
    return launch_map<T>(static_cast<T*>(out), static_cast<const T*>(in), nullptr, n,
                         GeluForwardOp{}, stream);
  });
}

cudaError_t gelu_backward(DType dtype, void* din, const void* in, const void* dout, int64_t n,
                          cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return cudaSuccess;
    return launch_map<T>(static_cast<T*>(din), static_cast<const T*>(in),
                         static_cast<const T*>(dout), n, GeluBackwardOp{}, stream);
  });
}

cudaError_t add(DType dtype, void* out, const void* a, const void* b, int64_t n,
                cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return cudaSuccess;
    return launch_map<T>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b),
                         n, AddOp{}, stream);
  });
}

cudaError_t add_bias(DType dtype, void* out, const void* bias, int64_t N, int64_t OC,
                     cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = N * OC;
    if (n == 0) return cudaSuccess;
    add_bias_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(bias), n, OC);
    return cudaGetLastError();
  });
}

cudaError_t rotary(DType dtype, void* qkv, int64_t B, int64_t L, int64_t H, int64_t D, float base,
                   bool inverse, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = kVec16<T>;
    const int64_t rows = B * L, half = D / 2;
    if (rows == 0 || half == 0) return cudaSuccess;
    const size_t shared = static_cast<size_t>(kRotaryRows * half) * sizeof(float2);
    if (shared > 48 * 1024 || H * D > (int64_t{1} << 30)) return cudaErrorInvalidValue;
    const unsigned grid = grid_for((rows + kRotaryRows - 1) / kRotaryRows * kThreads, kThreads);
    const int h = static_cast<int>(H), d = static_cast<int>(D);
    if (half % kVec == 0 && aligned_to(qkv, 16)) {
      rotary_kernel<T, kVec><<<grid, kThreads, shared, stream>>>(
          static_cast<T*>(qkv), rows, L, h, d, static_cast<double>(base), inverse);
    } else {
      rotary_kernel<T, 1><<<grid, kThreads, shared, stream>>>(static_cast<T*>(qkv), rows, L, h, d,
                                                              static_cast<double>(base), inverse);
    }
    return cudaGetLastError();
  });
}

cudaError_t copy_rows(void* dst, int64_t dst_batch_stride, int64_t dst_row_stride, const void* src,
                      int64_t src_batch_stride, int64_t src_row_stride, int64_t B, int64_t dst_rows,
                      int64_t src_rows, int64_t row_bytes, cudaStream_t stream) {
  if (B == 0 || dst_rows == 0 || row_bytes == 0) return cudaSuccess;
  // The widest unit that divides every address, stride and the row.
  const uint64_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                        static_cast<uint64_t>(dst_batch_stride) |
                        static_cast<uint64_t>(dst_row_stride) |
                        static_cast<uint64_t>(src_batch_stride) |
                        static_cast<uint64_t>(src_row_stride) | static_cast<uint64_t>(row_bytes);
  auto launch = [&](auto unit) {
    using U = decltype(unit);
    return launch_copy_rows<U>(dst, dst_batch_stride, dst_row_stride, src, src_batch_stride,
                               src_row_stride, B, dst_rows, src_rows, row_bytes, stream);
  };
  if (bits % 16 == 0) return launch(uint4{});
  if (bits % 8 == 0) return launch(uint2{});
  if (bits % 4 == 0) return launch(uint32_t{});
  if (bits % 2 == 0) return launch(uint16_t{});
  return launch(uint8_t{});
}

}  // namespace sciattn::train::cuda
