// Device helpers of the attention kernels (Evoformer and block-sparse): tensor-core MMA
// (m16n8k16, fp32 accumulate) and its fragments, element conversions, bias reads and tile loads
// into shared memory. CUDA layer, shared by the kernel families.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include "cuda/common/bias_type.h"

namespace sciattn::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();

// 2^x on the special-function unit with results below 2^-126 flushed to zero
// (ex2.approx.ftz.f32, 2 ulp). The build has no fast-math, so exp2f compiles to the same
// instruction wrapped in a compare against -126 and two predicated multiplies that keep denormal
// results: ~96 of ~447 compute instructions per tile of the Evoformer forward. Every use here
// is a probability or a rescale factor, where a
// value below 2^-126 is 0 at any tolerance and in any 16-bit output. fast_exp2(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A row's lse (natural log) in log2 units, for P = fast_exp2(s_log2 - lse_log2): a row without
// any kept key (lse -inf) gets +inf, so that its P is exactly 0 with no per-element test.
__device__ __forceinline__ float lse_log2_of(float lse) {
  return lse == kNegInf ? __builtin_huge_valf() : lse * kLog2e;
}

// lse_log2_of the lse of columns j * 8 + 2 t and j * 8 + 2 t + 1 of a transposed tile's row
// stats (shared memory, 8-byte aligned): the two query columns of an m16n8 accumulator's thread.
__device__ __forceinline__ float2 lse_pair_log2(const float* lse, int j, int t) {
  const float2 pair = *reinterpret_cast<const float2*>(&lse[j * 8 + 2 * t]);
  return make_float2(lse_log2_of(pair.x), lse_log2_of(pair.y));
}

// The Evoformer dK/dV steps read each query row's lse in log2 units from the query tile's stage:
// thread r < kRows, which copied row r's lse there (or wrote +inf past L), converts it in place
// once per tile, after its own copy is complete and before the barrier that shows the stage to the
// CTA, instead of every thread converting its 16 query columns at every step.
template <int kRows>
__device__ __forceinline__ void stage_lse_to_log2(float* lse) {
  if (threadIdx.x < kRows) lse[threadIdx.x] = lse_log2_of(lse[threadIdx.x]);
}

// Per storage type: conversions and the MMA instruction's type name.
template <typename T>
struct ElementTraits;

template <>
struct ElementTraits<float> {
  static __device__ __forceinline__ float to_float(float x) { return x; }
  static __device__ __forceinline__ float from_float(float x) { return x; }
};

template <>
struct ElementTraits<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  // Two floats as a packed pair (low half = first).
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct ElementTraits<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// The width of the shared tiles and of the Q K^T reduction for an instantiated head dim: the MMA
// reduces 16 elements at a time, so head dim 8 runs with its tiles zero-padded to 16 (the P V and
// dS K products still produce 8 columns only).
template <int kHeadDim>
constexpr int kTileDimFor = kHeadDim < 16 ? 16 : kHeadDim;

// D[16x8] += A[16x16] * B[16x8], A row-major, B column-major, fp32 accumulators.
// Fragment ownership (lane = threadIdx.x % 32, g = lane / 4, t = lane % 4):
//   a[0]: A[g][2t..2t+1]   a[1]: A[g+8][2t..]   a[2]: A[g][2t+8..]   a[3]: A[g+8][2t+8..]
//   b[0]: B[2t..2t+1][g]   b[1]: B[2t+8..][g]
//   c[0..1]: C[g][2t..2t+1]   c[2..3]: C[g+8][2t..2t+1]
template <typename T>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float c[4], const uint32_t a[4],
                                                  const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                         const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory in one instruction (ldmatrix .x4):
// lane l passes the address of row l % 8 of matrix l / 8 (16 contiguous, 16-byte aligned bytes).
// Of matrix i, lane l receives r[i] = elements (l / 4, 2 (l % 4) .. +1), the layout of an mma
// fragment register; with kTrans it receives elements (2 (l % 4) .. +1, l / 4), i.e. the
// transposed matrix, which is how a k-major operand becomes a B fragment.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
}

// The A fragment of rows 0..15, columns 16 s .. 16 s + 15 of a row-major shared tile (row pitch
// kPitch elements, a multiple of 8). g and t are the lane's mma coordinates (lane = 4 g + t).
template <typename T, int kPitch>
__device__ __forceinline__ void load_a_frag(uint32_t a[4], const T* tile, int s, int g, int t) {
  const int lane = 4 * g + t, m = lane / 8;
  ldmatrix_x4<false>(a, tile + ((m & 1) * 8 + lane % 8) * kPitch + s * 16 + (m >> 1) * 8);
}

// The B fragments of n8 tiles j and j + 1 at k-step s when the operand is stored as rows of n:
// B[k][n] = tile[8 j + n][16 s + k] (K in Q K^T). b[x] belongs to tile j + x.
template <typename T, int kPitch>
__device__ __forceinline__ void load_b_frags_of_rows(uint32_t b[2][2], const T* tile, int j, int s,
                                                     int g, int t) {
  const int lane = 4 * g + t, m = lane / 8;
  uint32_t r[4];
  ldmatrix_x4<false>(r, tile + ((j + (m >> 1)) * 8 + lane % 8) * kPitch + s * 16 + (m & 1) * 8);
  b[0][0] = r[0];
  b[0][1] = r[1];
  b[1][0] = r[2];
  b[1][1] = r[3];
}

// The B fragments of n8 tiles i and i + 1 at k-step kk when the operand is stored k-major:
// B[k][n] = tile[16 kk + k][8 i + n] (V in P V). b[x] belongs to tile i + x.
template <typename T, int kPitch>
__device__ __forceinline__ void load_b_frags_of_cols(uint32_t b[2][2], const T* tile, int kk, int i,
                                                     int g, int t) {
  const int lane = 4 * g + t, m = lane / 8;
  uint32_t r[4];
  ldmatrix_x4<true>(r, tile + (kk * 16 + (m & 1) * 8 + lane % 8) * kPitch + (i + (m >> 1)) * 8);
  b[0][0] = r[0];
  b[0][1] = r[1];
  b[1][0] = r[2];
  b[1][1] = r[3];
}

// out[i] += A * B_i for the kOutTiles n8 tiles of a k-major operand at k-step kk:
// B_i[k][n] = tile[16 kk + k][8 i + n] (P V, dS Q, dS K). Pairs of tiles take one ldmatrix; an
// odd last tile (head dim 8) is read element by element.
template <typename T, int kOutTiles, int kPitch>
__device__ __forceinline__ void mma_acc_k_major(float out[kOutTiles][4], const uint32_t a[4],
                                                const T* tile, int kk, int g, int t);

// Two consecutive 16-bit elements of a shared-memory row as one register.
template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Elements p[0] and p[stride] (two rows, one column) packed into one register.
template <typename T>
__device__ __forceinline__ uint32_t load_column_pair(const T* p, int stride) {
  const uint16_t lo = *reinterpret_cast<const uint16_t*>(p);
  const uint16_t hi = *reinterpret_cast<const uint16_t*>(p + stride);
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

template <typename T, int kOutTiles, int kPitch>
__device__ __forceinline__ void mma_acc_k_major(float out[kOutTiles][4], const uint32_t a[4],
                                                const T* tile, int kk, int g, int t) {
#pragma unroll
  for (int i = 0; i + 1 < kOutTiles; i += 2) {
    uint32_t bf[2][2];
    load_b_frags_of_cols<T, kPitch>(bf, tile, kk, i, g, t);
    mma_16816<T>(out[i], a, bf[0]);
    mma_16816<T>(out[i + 1], a, bf[1]);
  }
  if constexpr (kOutTiles % 2 == 1) {
    const T* r = tile + (kk * 16 + 2 * t) * kPitch + (kOutTiles - 1) * 8 + g;
    const uint32_t bf[2] = {load_column_pair(r, kPitch), load_column_pair(r + 8 * kPitch, kPitch)};
    mma_16816<T>(out[kOutTiles - 1], a, bf);
  }
}

// load_bias in two halves, for a value loaded well before its first use (so that the load's
// latency passes while other work runs; the compiler places a conversion right after its load):
// the element's bits (zero-extended), then the value they stand for.
__device__ __forceinline__ uint32_t load_bias_bits(const void* base, BiasType type,
                                                   int64_t offset) {
  switch (type) {
    case BiasType::kF32:
      return __float_as_uint(static_cast<const float*>(base)[offset]);
    case BiasType::kF16:
    case BiasType::kBF16:
      return static_cast<const uint16_t*>(base)[offset];
    case BiasType::kBool:
      return static_cast<const uint8_t*>(base)[offset];
    default:
      return 0;
  }
}

// A bias element's bits as it enters the score: a boolean mask adds 0 (attend) or -inf (masked).
__device__ __forceinline__ float bias_from_bits(uint32_t bits, BiasType type) {
  switch (type) {
    case BiasType::kF32:
      return __uint_as_float(bits);
    case BiasType::kF16:
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    case BiasType::kBF16:
      return __uint_as_float(bits << 16);
    case BiasType::kBool:
      return bits != 0 ? 0.0f : kNegInf;
    default:
      return 0.0f;
  }
}

// The bits of a bias element that adds nothing (0, or an attending mask entry), for positions
// past L and absent biases.
__device__ __forceinline__ uint32_t neutral_bias_bits(BiasType type) {
  return type == BiasType::kBool ? 1u : 0u;
}

// The bits of a bias element that masks its key (-inf, or a masked mask entry): what the forward
// puts in bias1's row for keys past L, so that those keys need no masking of their own.
__device__ __forceinline__ uint32_t masking_bias_bits(BiasType type) {
  switch (type) {
    case BiasType::kF32:
      return 0xff800000u;
    case BiasType::kF16:
      return 0xfc00u;
    case BiasType::kBF16:
      return 0xff80u;
    default:
      return 0u;  // kBool: 0 masks
  }
}

// A bias element as it enters the score.
__device__ __forceinline__ float load_bias(const void* base, BiasType type, int64_t offset) {
  return bias_from_bits(load_bias_bits(base, type, offset), type);
}

// Stores a float into a bias-gradient buffer of the bias's float type.
__device__ __forceinline__ void store_bias(void* base, BiasType type, int64_t offset, float v) {
  switch (type) {
    case BiasType::kF32:
      static_cast<float*>(base)[offset] = v;
      break;
    case BiasType::kF16:
      static_cast<__half*>(base)[offset] = __float2half_rn(v);
      break;
    case BiasType::kBF16:
      static_cast<__nv_bfloat16*>(base)[offset] = __float2bfloat16_rn(v);
      break;
    default:
      break;
  }
}

// ---- Tiles of [B, N, L, H, D] tensors into shared memory ----

// One (b, n, :, h, :) slice: the address of its element (row 0, d 0) and the row (L) stride.
// `shift` 1: a shifted slice (the Evoformer forward's in-place reads of an odd D, TileCols::kPieces
// of cuda/common/wgmma_tiles.cuh): `base` is one element before row 0's first, and a tile's column
// c + 1 holds element c.
struct SliceSource {
  const void* base;
  int64_t row_stride;
  int vec;        // 16-byte copies allowed
  int shift = 0;  // 0, or 1 for a shifted slice
};

__host__ __device__ inline size_t bias_bytes(BiasType type) {
  return type == BiasType::kF32 ? 4 : type == BiasType::kBool ? 1 : 2;
}

// Address of element `offset` of a bias of this type.
__device__ __forceinline__ const void* bias_ptr(const void* base, BiasType type, int64_t offset) {
  return static_cast<const char*>(base) + offset * static_cast<int64_t>(bias_bytes(type));
}

__device__ __forceinline__ SliceSource slice_of(const void* data, const int64_t stride[4], int vec,
                                                size_t elem_bytes, int64_t b, int64_t n,
                                                int64_t h) {
  const int64_t offset = b * stride[0] + n * stride[1] + h * stride[3];
  return {static_cast<const char*>(data) + offset * static_cast<int64_t>(elem_bytes), stride[2],
          vec};
}

// cp.async of 16 bytes, zero-filling when `bytes` is 0 (then nothing is read from `src`).
__device__ __forceinline__ void cp_async_16(void* smem, const void* src, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// cp.async of 4 bytes (zero-filled when `bytes` is 0).
__device__ __forceinline__ void cp_async_4(void* smem, const void* src, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The streamed tiles' pipeline of the mma.sync kernels, at the top of iteration i of `count`
// (tile 0 already copied into buffer 0 and committed): returns the iteration's buffer once its
// tile has landed (the caller's barrier then makes every thread's copies visible). Two stages:
// the next tile is copied into the other buffer, freed by the barrier that ended the previous
// iteration, while this one is used. One stage (GPUs whose shared memory per block cannot hold
// two, sm_86 and sm_89 at the widest head dims): tile i is copied into the only buffer here, after
// that barrier, and waited for at once. copy_to(buf, i) starts tile i's copies; the commit is
// made here.
template <int kStages, typename CopyTo>
__device__ __forceinline__ int stream_tile(int64_t i, int64_t count, const CopyTo& copy_to) {
  static_assert(kStages == 1 || kStages == 2, "one or two stages");
  if constexpr (kStages == 2) {
    const int buf = static_cast<int>(i & 1);
    if (i + 1 < count) {
      copy_to(buf ^ 1, i + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    return buf;
  } else {
    if (i > 0) {
      copy_to(0, i);
      cp_async_commit();
    }
    cp_async_wait<0>();
    return 0;
  }
}

// Starts 16-byte cp.async copies of rows [row0, row0 + kRows) x [0, 8 kChunks) of a row-major
// source (rows row_stride elements apart) into shared memory (row pitch kPitch); rows >= len and
// chunks at or past dim are zero-filled. Each thread owns one chunk column (threadIdx.x %
// kChunks) and every (kThreads / kChunks)-th row from threadIdx.x / kChunks, so its copies are a
// fixed, unrolled set whose addresses advance by constants: no division or 64-bit multiply per
// copy (the generic strided loop spent ~25 instructions on each; without them the Evoformer dK/dV
// and dQ kernels ran 11-13% faster).
template <typename T, int kRows, int kChunks, int kPitch, int kThreads>
__device__ __forceinline__ void copy_rows_async(T* smem, const T* base, int64_t row_stride,
                                                int64_t row0, int64_t len, int64_t dim) {
  static_assert(kThreads % kChunks == 0, "a thread's chunk column must not change");
  constexpr int kRowStep = kThreads / kChunks;
  constexpr int kIters = (kRows + kRowStep - 1) / kRowStep;
  const int r0 = static_cast<int>(threadIdx.x) / kChunks,
            c = static_cast<int>(threadIdx.x) % kChunks;
  const bool column_inside = c * 8 < dim;
  const int64_t rows_inside = len - row0;
  const T* src = base + (row0 + r0) * row_stride + c * 8;
  const int64_t src_step = kRowStep * row_stride;
  T* dst = smem + r0 * kPitch + c * 8;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int r = r0 + i * kRowStep;
    if (kRows % kRowStep != 0 && r >= kRows) break;
    const bool valid = column_inside && r < rows_inside;
    cp_async_16(dst + i * kRowStep * kPitch, valid ? src : base, valid ? 16 : 0);
    src += src_step;
  }
}

// Starts loading rows [row0, row0 + kRows) x [0, kHeadDim) of a slice into shared memory (row
// pitch kPitch). Rows >= L and columns >= D are zero-filled, so padding adds nothing to the
// products. With 16-byte copies the load is asynchronous (cp.async; the caller commits and
// waits); otherwise it is done element by element before returning.
template <typename T, int kRows, int kHeadDim, int kPitch, int kThreads>
__device__ __forceinline__ void load_tile(T* smem, const SliceSource& src, int64_t row0,
                                          int64_t len, int64_t dim) {
  const T* base = static_cast<const T*>(src.base);
  if (src.vec) {
    copy_rows_async<T, kRows, kHeadDim / 8, kPitch, kThreads>(smem, base, src.row_stride, row0, len,
                                                              dim);
  } else {
    // The rare unaligned case: kept rolled so that it does not crowd the fast path's code.
    const T zero = ElementTraits<T>::from_float(0.0f);
#pragma unroll 1
    for (int e = threadIdx.x; e < kRows * kHeadDim; e += kThreads) {
      const int r = e / kHeadDim, d = e % kHeadDim;
      const int64_t row = row0 + r;
      smem[r * kPitch + d] = (row < len && d < dim) ? base[row * src.row_stride + d] : zero;
    }
  }
}

// ---- Bias tiles staged in shared memory ----
// A staged tile holds kRows rows of 64 bias elements in the bias's own type; rows are padded by
// 16 bytes, which keeps a warp's fragment-order reads (8 rows x 4 column pairs) in distinct banks.

__host__ __device__ inline int bias_stage_pitch(BiasType type) {
  return 64 * static_cast<int>(bias_bytes(type)) + 16;
}
// Bytes of one staged tile of `rows` rows (0 for an absent bias).
__host__ __device__ inline int bias_stage_bytes(BiasType type, int rows) {
  return type == BiasType::kNone ? 0 : rows * bias_stage_pitch(type);
}

// Copies rows [0, kRows) x columns [0, 64) of a bias tile whose element (0, 0) is at element
// `offset` of `base` and whose rows are `row_stride` elements apart into a stage. Rows >=
// rows_left and columns >= cols_left are zero-filled (and never used). With `async` (the
// bias*_staged conditions hold) the copy is 16-byte cp.async in the caller's group; otherwise
// (an unaligned bias, rare) it is done element by element before returning.
template <int kRows, int kThreads, int kElem>
__device__ __forceinline__ void stage_bias_tile_of(unsigned char* smem, const void* base,
                                                   int64_t offset, int64_t row_stride,
                                                   int64_t rows_left, int64_t cols_left,
                                                   bool async) {
  constexpr int kPitch = 64 * kElem + 16;
  constexpr int kChunks = 4 * kElem;  // 16-byte chunks per row of 64 elements
  const int64_t cols = cols_left < 64 ? cols_left : 64;
  const char* tile = static_cast<const char*>(base) + offset * kElem;
  if (async) {
    // As copy_rows_async: a fixed chunk column per thread and every kRowStep-th row.
    static_assert(kThreads % kChunks == 0, "a thread's chunk column must not change");
    constexpr int kRowStep = kThreads / kChunks;
    constexpr int kIters = (kRows + kRowStep - 1) / kRowStep;
    const int r0 = static_cast<int>(threadIdx.x) / kChunks,
              c = static_cast<int>(threadIdx.x) % kChunks;
    const int64_t left = cols * kElem - c * 16;
    const int chunk_bytes = static_cast<int>(left < 0 ? 0 : left > 16 ? 16 : left);
    const char* src = tile + r0 * row_stride * kElem + c * 16;
    const int64_t src_step = kRowStep * row_stride * kElem;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int r = r0 + i * kRowStep;
      if (kRows % kRowStep != 0 && r >= kRows) break;
      const int bytes = r < rows_left ? chunk_bytes : 0;
      unsigned char* dst = smem + r * kPitch + c * 16;
      if (bytes == 16 || bytes == 0) {
        cp_async_16(dst, bytes > 0 ? src : base, bytes);
      } else {
        // The last chunk of a row that ends inside it: copy the elements that exist and zero the
        // rest, so that nothing past the end of the bias is read.
        for (int x = 0; x < 16; x += kElem) {
          if constexpr (kElem == 4) {
            *reinterpret_cast<uint32_t*>(dst + x) =
                x < bytes ? *reinterpret_cast<const uint32_t*>(src + x) : 0u;
          } else if constexpr (kElem == 2) {
            *reinterpret_cast<uint16_t*>(dst + x) =
                x < bytes ? *reinterpret_cast<const uint16_t*>(src + x) : 0;
          } else {
            dst[x] = x < bytes ? static_cast<unsigned char>(src[x]) : 0;
          }
        }
      }
      src += src_step;
    }
    return;
  }
#pragma unroll 1
  for (int e = threadIdx.x; e < kRows * 64; e += kThreads) {
    const int r = e / 64, c = e % 64;
    const bool valid = r < rows_left && c < cols;
    const char* src = tile + (r * row_stride + c) * kElem;
    unsigned char* dst = smem + r * kPitch + c * kElem;
    if constexpr (kElem == 4) {
      *reinterpret_cast<uint32_t*>(dst) = valid ? *reinterpret_cast<const uint32_t*>(src) : 0u;
    } else if constexpr (kElem == 2) {
      *reinterpret_cast<uint16_t*>(dst) = valid ? *reinterpret_cast<const uint16_t*>(src) : 0;
    } else {
      *dst = valid ? *reinterpret_cast<const unsigned char*>(src) : 0;
    }
  }
}

// Copies rows [0, kRows) x columns [0, 64) of a bias tile whose element (0, 0) is at element
// `offset` of `base` and whose rows are `row_stride` elements apart into a stage. Rows >=
// rows_left and columns >= cols_left are zero-filled, so that readers need no bounds checks (the
// kernels mask those cells anyway). With `async` (the bias*_staged conditions hold) the copy is
// 16-byte cp.async in the caller's group; otherwise (an unaligned bias, rare) it is done element
// by element before returning.
template <int kRows, int kThreads>
__device__ __forceinline__ void stage_bias_tile(unsigned char* smem, const void* base,
                                                BiasType type, int64_t offset, int64_t row_stride,
                                                int64_t rows_left, int64_t cols_left, bool async) {
  switch (bias_bytes(type)) {
    case 4:
      stage_bias_tile_of<kRows, kThreads, 4>(smem, base, offset, row_stride, rows_left, cols_left,
                                             async);
      break;
    case 2:
      stage_bias_tile_of<kRows, kThreads, 2>(smem, base, offset, row_stride, rows_left, cols_left,
                                             async);
      break;
    default:
      stage_bias_tile_of<kRows, kThreads, 1>(smem, base, offset, row_stride, rows_left, cols_left,
                                             async);
      break;
  }
}

// ---- Biases of one score tile ----

template <BiasType kType>
__device__ __forceinline__ float bias_at(const void* base, int64_t offset) {
  if constexpr (kType == BiasType::kF32) return static_cast<const float*>(base)[offset];
  if constexpr (kType == BiasType::kF16)
    return __half2float(static_cast<const __half*>(base)[offset]);
  if constexpr (kType == BiasType::kBF16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
  if constexpr (kType == BiasType::kBool)
    return static_cast<const uint8_t*>(base)[offset] ? 0.0f : kNegInf;
  return 0.0f;
}

// Two adjacent bias elements (offset, offset + 1) with one load; the caller guarantees that the
// pair is contiguous and aligned to its size (BiasPairs below).
template <BiasType kType>
__device__ __forceinline__ float2 bias_pair_at(const void* base, int64_t offset) {
  if constexpr (kType == BiasType::kF32) {
    return *reinterpret_cast<const float2*>(static_cast<const float*>(base) + offset);
  } else if constexpr (kType == BiasType::kF16) {
    return __half22float2(
        *reinterpret_cast<const __half2*>(static_cast<const __half*>(base) + offset));
  } else if constexpr (kType == BiasType::kBF16) {
    // A bf16 value is the top half of the float it converts to exactly: one shift or mask each
    // (the pair intrinsic compiles to three instructions).
    const uint32_t pair =
        *reinterpret_cast<const uint32_t*>(static_cast<const __nv_bfloat16*>(base) + offset);
    return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
  } else if constexpr (kType == BiasType::kBool) {
    const uint16_t m =
        *reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(base) + offset);
    return make_float2((m & 0xff) ? 0.0f : kNegInf, (m >> 8) ? 0.0f : kNegInf);
  } else {
    return make_float2(0.0f, 0.0f);
  }
}

// acc[j][e] += log2(e) * bias(row(e), col0 + col(j, e)) over the MMA accumulator layout of an
// m16 x n64 tile (kRows = 2: e = 0..3, row(e) = e >> 1 picks one of the thread's two rows) or of
// one of its rows (kRows = 1: e = 0..1). Row r's bias starts at rows[r] (null: the row does not
// exist, add nothing), and col(j, e) = j * 8 + 2t + (e & 1) is read at offset col * col_stride.
// Columns >= `cols` are skipped (the caller masks them). A bias that depends on the row alone
// (bias1 in a transposed tile) uses col_stride 0. With `pairs` (col_stride 1, rows aligned to a
// pair) the two columns of a thread are one load.
template <BiasType kType, int kRows>
__device__ __forceinline__ void add_bias_rows(float acc[8][2 * kRows],
                                              const void* const rows[kRows], int64_t col_stride,
                                              int64_t col0, int64_t cols, int t, bool pairs) {
  // Offsets relative to the tile's first column stay 32-bit (and become immediates once
  // unrolled), so the loads need no 64-bit arithmetic per element.
  const int64_t base = col0 * col_stride;
  const int limit = static_cast<int>(cols - col0 < 64 ? cols - col0 : 64);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (rows[r] == nullptr) continue;
    const void* row = bias_ptr(rows[r], kType, base);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = j * 8 + 2 * t;
      if (pairs && c + 1 < limit) {
        const float2 b = bias_pair_at<kType>(row, c);
        acc[j][2 * r] += b.x * kLog2e;
        acc[j][2 * r + 1] += b.y * kLog2e;
      } else {
        if (c < limit) acc[j][2 * r] += bias_at<kType>(row, c * col_stride) * kLog2e;
        if (c + 1 < limit) acc[j][2 * r + 1] += bias_at<kType>(row, (c + 1) * col_stride) * kLog2e;
      }
    }
  }
}

// The same with the bias type chosen at run time (one switch per tile, not per element).
template <int kRows>
__device__ __forceinline__ void add_bias_rows(BiasType type, float acc[8][2 * kRows],
                                              const void* const rows[kRows], int64_t col_stride,
                                              int64_t col0, int64_t cols, int t, bool pairs) {
  switch (type) {
    case BiasType::kF32:
      add_bias_rows<BiasType::kF32, kRows>(acc, rows, col_stride, col0, cols, t, pairs);
      break;
    case BiasType::kF16:
      add_bias_rows<BiasType::kF16, kRows>(acc, rows, col_stride, col0, cols, t, pairs);
      break;
    case BiasType::kBF16:
      add_bias_rows<BiasType::kBF16, kRows>(acc, rows, col_stride, col0, cols, t, pairs);
      break;
    case BiasType::kBool:
      add_bias_rows<BiasType::kBool, kRows>(acc, rows, col_stride, col0, cols, t, pairs);
      break;
    default:
      break;
  }
}

// A whole m16 x n64 accumulator tile (the thread's two rows).
__device__ __forceinline__ void add_bias_tile(BiasType type, float acc[8][4],
                                              const void* const rows[2], int64_t col_stride,
                                              int64_t col0, int64_t cols, int t, bool pairs) {
  add_bias_rows<2>(type, acc, rows, col_stride, col0, cols, t, pairs);
}

// A bias type as a compile-time value, for generic lambdas.
template <BiasType kType>
using BiasTypeTag = std::integral_constant<BiasType, kType>;

// Calls fn(BiasTypeTag<type>{}) for the bias type (uniform per launch: one branch per tile, not
// per element); nothing for an absent bias.
template <typename Fn>
__device__ __forceinline__ void with_bias_type(BiasType type, const Fn& fn) {
  switch (type) {
    case BiasType::kF32:
      fn(BiasTypeTag<BiasType::kF32>{});
      break;
    case BiasType::kF16:
      fn(BiasTypeTag<BiasType::kF16>{});
      break;
    case BiasType::kBF16:
      fn(BiasTypeTag<BiasType::kBF16>{});
      break;
    case BiasType::kBool:
      fn(BiasTypeTag<BiasType::kBool>{});
      break;
    default:
      break;
  }
}

// acc += log2(e) * a 16-bit bias stage over an m16 x n64 accumulator tile whose rows are stage
// rows row0 .. row0 + 15 (kTrans = false) or, transposed, stage columns row0 .. row0 + 15 whose
// accumulator columns are stage rows (kTrans = true, the dK/dV kernel's [queries][keys] stage).
// Matrix i of an ldmatrix.x4 is the 8 x 8 block of accumulator rows row0 + 8 (i % 2) .. and
// columns 8 (j + i / 2) ..; ldmatrix gives lane (g, t) the elements (g, 2t .. 2t + 1) of a block,
// transposed with kTrans, which is exactly the m16n8 accumulator layout. Four loads per tile
// replace 16 pair loads (or, transposed, 32 two-byte loads, each with its own address).
template <BiasType kType, bool kTrans>
__device__ __forceinline__ void add_bias_stage_16bit(float acc[8][4], const unsigned char* stage,
                                                     int row0, int lane) {
  static_assert(kType == BiasType::kF16 || kType == BiasType::kBF16, "16-bit stages only");
  const int pitch = bias_stage_pitch(kType);
  const int m = lane / 8, acc_row = row0 + 8 * (m % 2) + (kTrans ? 0 : lane % 8),
            acc_col = 8 * (m / 2) + (kTrans ? lane % 8 : 0);
  const unsigned char* addr =
      kTrans ? stage + acc_col * pitch + acc_row * 2 : stage + acc_row * pitch + acc_col * 2;
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    uint32_t r[4];
    ldmatrix_x4<kTrans>(r, addr + (kTrans ? j * 8 * pitch : j * 8 * 2));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 b = bias_pair_at<kType>(&r[i], 0);
      float* c = &acc[j + i / 2][2 * (i % 2)];
      c[0] = fmaf(b.x, kLog2e, c[0]);
      c[1] = fmaf(b.y, kLog2e, c[1]);
    }
  }
}

// acc += log2(e) * a staged bias2 over one m16 x n64 tile (a row per query; the warp's rows are
// row0 .. row0 + 15, this thread's row0 + g and row0 + g + 8). The stage is zero-filled past the
// matrix, so every read is in bounds and needs no check: ldmatrix for a 16-bit bias2, one pair
// load per column pair else.
__device__ __forceinline__ void add_staged_bias2(float acc[8][4], const unsigned char* bias2,
                                                 BiasType bias2_type, int row0, int lane) {
  const int t = lane % 4;
  with_bias_type(bias2_type, [&](auto tag) {
    constexpr BiasType kType = decltype(tag)::value;
    if constexpr (kType == BiasType::kF16 || kType == BiasType::kBF16) {
      add_bias_stage_16bit<kType, false>(acc, bias2, row0, lane);
    } else {
      const int pitch = bias_stage_pitch(kType);
      const unsigned char* r0 = bias2 + (row0 + lane / 4) * pitch;
      const unsigned char* r1 = r0 + 8 * pitch;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 b0 = bias_pair_at<kType>(r0, j * 8 + 2 * t);
        const float2 b1 = bias_pair_at<kType>(r1, j * 8 + 2 * t);
        acc[j][0] = fmaf(b0.x, kLog2e, acc[j][0]);
        acc[j][1] = fmaf(b0.y, kLog2e, acc[j][1]);
        acc[j][2] = fmaf(b1.x, kLog2e, acc[j][2]);
        acc[j][3] = fmaf(b1.y, kLog2e, acc[j][3]);
      }
    }
  });
}

// acc += log2(e) * the staged biases of one m16 x n64 tile (row-major stages: bias1 one row of
// keys, bias2 as add_staged_bias2's): one pair load per column pair of bias1.
__device__ __forceinline__ void add_staged_biases(float acc[8][4], const unsigned char* bias1,
                                                  BiasType bias1_type, const unsigned char* bias2,
                                                  BiasType bias2_type, int row0, int lane) {
  const int t = lane % 4;
  with_bias_type(bias1_type, [&](auto tag) {
    constexpr BiasType kType = decltype(tag)::value;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 b = bias_pair_at<kType>(bias1, j * 8 + 2 * t);
      acc[j][0] = fmaf(b.x, kLog2e, acc[j][0]);
      acc[j][1] = fmaf(b.y, kLog2e, acc[j][1]);
      acc[j][2] = fmaf(b.x, kLog2e, acc[j][2]);
      acc[j][3] = fmaf(b.y, kLog2e, acc[j][3]);
    }
  });
  add_staged_bias2(acc, bias2, bias2_type, row0, lane);
}

// acc = the biases of one m16 x n64 tile in log2 units, bias1 read from its 64 keys' fp32 values
// already in log2 units (`bias1_log2`; unread where has_bias1 is false) and bias2 from its stage
// as add_staged_bias2's: one 8-byte load per column pair for bias1, no conversion.
__device__ __forceinline__ void set_biases_log2(float acc[8][4], bool has_bias1,
                                                const float* bias1_log2, const unsigned char* bias2,
                                                BiasType bias2_type, int row0, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 b =
        has_bias1 ? *reinterpret_cast<const float2*>(bias1_log2 + j * 8 + 2 * t) : float2{0, 0};
    acc[j][0] = acc[j][2] = b.x;
    acc[j][1] = acc[j][3] = b.y;
  }
  add_staged_bias2(acc, bias2, bias2_type, row0, lane);
}

// The same as add_staged_biases' bias2 for a transposed tile (the dK/dV kernel): the stage holds
// [64 queries][64 keys], the warp's rows are keys key0 .. key0 + 15 (this thread's: key0 + g and
// key0 + g + 8) and its columns are queries. fp32 and boolean stages are read element by element.
__device__ __forceinline__ void add_staged_bias_transposed(float acc[8][4],
                                                           const unsigned char* stage,
                                                           BiasType type, int key0, int lane) {
  with_bias_type(type, [&](auto tag) {
    constexpr BiasType kType = decltype(tag)::value;
    if constexpr (kType == BiasType::kF16 || kType == BiasType::kBF16) {
      add_bias_stage_16bit<kType, true>(acc, stage, key0, lane);
    } else {
      const int pitch = bias_stage_pitch(kType);
      const int key = key0 + lane / 4, t = lane % 4;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const unsigned char* query_row = stage + (j * 8 + 2 * t + (e & 1)) * pitch;
          acc[j][e] = fmaf(bias_at<kType>(query_row, key + 8 * (e >> 1)), kLog2e, acc[j][e]);
        }
    }
  });
}

}  // namespace sciattn::cuda
