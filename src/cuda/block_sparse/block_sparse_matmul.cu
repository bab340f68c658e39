// The GPU block-sparse MatMul kernels: sdd, dsd and dds on logical (already transposed) views,
// fp32 accumulation, any strides on dense operands. CUDA layer (kernels and their launchers).
//
// One kernel shape serves the three modes: a CTA of 256 threads owns one TM x TN tile of the
// output and accumulates it over a list of "segments", each a product of a TM x len slice of the
// left operand with a len x TN slice of the right one:
//   sdd: one segment per tile (len = K): rows of x for the block's row, columns of y for its
//        column; the tile lies inside block p of c.
//   dsd: a tile of rows of one output block line times TN dense columns; one segment (len = b)
//        per block of one piece of that line (the index's work split: row_split, walked in CSR
//        order, or col_split in CSC order when S is transposed).
//   dds: the mirror image: TM dense rows times a tile of one output block column.
// Each output element is owned by one thread and summed over the segments in index order and
// over k in increasing order. A line the split cuts into pieces (a global block's line, which
// would otherwise serialise the kernel on one CTA) has each piece's sum stored as an fp32 partial
// in the workspace, and combine_kernel adds a line's partials in piece order; so results are
// bitwise reproducible (no atomics). An output line without blocks is one piece without
// segments and stores zeros, so every element is written.
//
// Operands are read element by element through their strides into shared memory (any stride,
// including a transposed view or a last stride != 1, takes the same path); the threads walk the
// operand's smaller stride so that the reads stay as contiguous as the view allows. Three engines
// multiply the staged slices: f16 / bf16 operands of one type go through the tensor cores
// (mma.sync m16n8k16, fp32 accumulators); an fp32 left operand times a 16-bit right one (the
// composite attention's fp32 probabilities times V, and its backward's) through the tensor cores
// as split TF32 (two m16n8k8 products per step, about fp32 accuracy); fp32 operands through fp32
// FMA on a 16 x 16 thread grid.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/block_sparse/block_sparse_launch.h"
#include "cuda/common/device_utils.cuh"
#include "cuda/common/mma_tf32.cuh"

namespace sciattn::cuda::bs {
namespace {

enum class Mode : int { kSdd = 0, kDsd = 1, kDds = 2 };

constexpr int kThreads = 256;
constexpr int kGridSide = 16;  // threads form a kGridSide x kGridSide grid over the tile
// k elements staged in shared memory per round (an engine's kDepth): 64 when a segment is that
// deep (sdd over K, dsd / dds over blocks of 64 and 128), the block otherwise.
constexpr int kMaxDepth = 64;
// A CTA walks tiles with a grid-stride loop; beyond this many CTAs it takes several tiles.
constexpr int64_t kMaxGrid = int64_t{1} << 24;
static_assert(kGridSide * kGridSide == kThreads, "the thread grid covers the CTA");

// A rank-4 view as the kernel reads it: element (i0, i1, r, c) at data[i0*s0 + i1*s1 + r*s2 +
// c*s3].
struct View4 {
  const void* data = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t rows = 0, cols = 0;
};

View4 view4(const TensorView& t) {
  return {t.data, t.strides[0], t.strides[1], t.strides[2], t.strides[3], t.sizes[2], t.sizes[3]};
}

struct MatMulArgs {
  // sdd: x = op(A) [Z, H, M, K], y = op(B) [Z, H, K, N], out = c [Z, nnz, b, b].
  // dsd: x = S [Z, nnz, b, b], y [Z, H, Kin, N], out [Z, H, Mout, N].
  // dds: x [Z, H, M, Kin], y = S [Z, nnz, b, b], out [Z, H, M, Nout].
  View4 x, y, out;
  bool trans_s = false;
  int64_t batch = 0;
  int64_t tiles = 0;
  int32_t block = 0, heads = 0, row_blocks = 0, col_blocks = 0, nnz = 0;
  // The index's stored heads G and their blocks: head h walks the lists of stored head h % G,
  // whose stored position s is block (h / G) * stored_nnz + s of the sparse operand.
  int32_t layout_heads = 1, stored_nnz = 0;
  const int32_t* head = nullptr;
  const int32_t* row = nullptr;
  const int32_t* col = nullptr;
  const int32_t* col_rows = nullptr;
  const int32_t* col_block_ids = nullptr;  // the CSC positions p
  // dsd / dds: the work split of the output's block lines (the index's row split when the lines
  // are block rows of S, its column split when they are block columns), lines per stored head,
  // and the fp32 partials of the split lines' pieces: [batch * repeats, slots, part_rows,
  // part_cols], part_rows x part_cols the output of one block line (b x N for dsd, M x b for dds).
  BlockSparseDeviceArrays::Split split;
  int32_t lines = 0;
  int64_t repeats = 1;  // heads / layout_heads
  int64_t part_rows = 0, part_cols = 0;
  float* partial = nullptr;
};

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ int64_t abs64(int64_t a) {
  return a < 0 ? -a : a;
}

// One operand slice of a segment: element (i, k) (left) or (k, j) (right) at
// base[i_or_k * rs + k_or_j * cs].
template <typename T>
struct Slice {
  const T* base;
  int64_t rs, cs;
};

// Stages a kDepth x TN (right) or TM x kDepth (left, stored transposed) slice into shared
// memory as fp32, k-major (smem[k * kPitch + outer]). `lines` of the outer dimension are valid
// (the rest read as 0), and so are `depth` of the k dimension. When the view allows it (16-byte
// aligned, unit stride along k or along the outer dimension, the other stride a multiple of the
// vector) a thread reads 16 bytes at once (4 floats or 8 16-bit values); otherwise element by
// element, consecutive threads walking k when `k_fast` (the view's smaller stride is along k),
// the outer dimension otherwise.
template <typename T, int kOuter, int kPitch, int kDepth>
__device__ __forceinline__ void stage(float* smem, const T* base, int64_t outer_stride,
                                      int64_t k_stride, int lines, int depth, bool k_fast) {
  constexpr int kVec = static_cast<int>(sizeof(uint4) / sizeof(T));
  const bool aligned = reinterpret_cast<uintptr_t>(base) % sizeof(uint4) == 0;
  if (aligned && k_stride == 1 && outer_stride % kVec == 0) {
    constexpr int kPerRow = kDepth / kVec;
    constexpr int kChunks = kOuter * kPerRow;
#pragma unroll
    for (int e0 = 0; e0 < kChunks; e0 += kThreads) {
      const int e = e0 + static_cast<int>(threadIdx.x);
      if (e >= kChunks) break;
      const int o = e / kPerRow, k = (e % kPerRow) * kVec;
      const T* src = base + o * outer_stride + k;
      float f[kVec];
      if (o < lines && k + kVec <= depth) {
        const uint4 raw = *reinterpret_cast<const uint4*>(src);
        T v[kVec];
        memcpy(v, &raw, sizeof(raw));
#pragma unroll
        for (int i = 0; i < kVec; ++i) f[i] = ElementTraits<T>::to_float(v[i]);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          f[i] = o < lines && k + i < depth ? ElementTraits<T>::to_float(src[i]) : 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) smem[(k + i) * kPitch + o] = f[i];
    }
    return;
  }
  if (aligned && outer_stride == 1 && k_stride % kVec == 0) {
    constexpr int kPerK = kOuter / kVec;
    constexpr int kChunks = kPerK * kDepth;
#pragma unroll
    for (int e0 = 0; e0 < kChunks; e0 += kThreads) {
      const int e = e0 + static_cast<int>(threadIdx.x);
      if (e >= kChunks) break;
      const int k = e / kPerK, o = (e % kPerK) * kVec;
      const T* src = base + k * k_stride + o;
      float f[kVec];
      if (k < depth && o + kVec <= lines) {
        const uint4 raw = *reinterpret_cast<const uint4*>(src);
        T v[kVec];
        memcpy(v, &raw, sizeof(raw));
#pragma unroll
        for (int i = 0; i < kVec; ++i) f[i] = ElementTraits<T>::to_float(v[i]);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          f[i] = k < depth && o + i < lines ? ElementTraits<T>::to_float(src[i]) : 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) smem[k * kPitch + o + i] = f[i];
    }
    return;
  }
  constexpr int kElems = kOuter * kDepth;
#pragma unroll
  for (int e0 = 0; e0 < kElems; e0 += kThreads) {
    const int e = e0 + static_cast<int>(threadIdx.x);
    if (kElems % kThreads != 0 && e >= kElems) break;
    const int o = k_fast ? e / kDepth : e % kOuter;
    const int k = k_fast ? e % kDepth : e / kOuter;
    float v = 0.0f;
    if (o < lines && k < depth) {
      v = ElementTraits<T>::to_float(base[o * outer_stride + k * k_stride]);
    }
    smem[k * kPitch + o] = v;
  }
}

// The fp32 engine (any operand dtypes): operands staged as fp32, FMA from shared memory on a
// kGridSide x kGridSide thread grid, each thread owning (TM / 16) x (TN / 16) outputs.
template <typename TA, typename TB, int TM, int TN, int kDepth>
struct FmaEngine {
  static constexpr int kPitchA = TM + 1, kPitchB = TN + 1;  // +1: conflict-free transposed stores
  struct Shared {
    float a[kDepth * kPitchA];
    float b[kDepth * kPitchB];
  };
  float acc[TM / kGridSide][TN / kGridSide];

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int i = 0; i < TM / kGridSide; ++i)
#pragma unroll
      for (int j = 0; j < TN / kGridSide; ++j) acc[i][j] = 0.0f;
  }

  // acc += A[TM x len] * B[len x TN] for one segment.
  __device__ __forceinline__ void segment(Shared& sm, const Slice<TA>& a, int a_rows,
                                          const Slice<TB>& b, int b_cols, int64_t len) {
    const int ty = static_cast<int>(threadIdx.x) / kGridSide;
    const int tx = static_cast<int>(threadIdx.x) % kGridSide;
    const bool a_k_fast = abs64(a.cs) < abs64(a.rs);
    const bool b_k_fast = abs64(b.rs) < abs64(b.cs);
    for (int64_t k0 = 0; k0 < len; k0 += kDepth) {
      const int depth = static_cast<int>(min64(kDepth, len - k0));
      stage<TA, TM, kPitchA, kDepth>(sm.a, a.base + k0 * a.cs, a.rs, a.cs, a_rows, depth, a_k_fast);
      stage<TB, TN, kPitchB, kDepth>(sm.b, b.base + k0 * b.rs, b.cs, b.rs, b_cols, depth, b_k_fast);
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        float av[TM / kGridSide], bv[TN / kGridSide];
#pragma unroll
        for (int i = 0; i < TM / kGridSide; ++i) av[i] = sm.a[k * kPitchA + ty + kGridSide * i];
#pragma unroll
        for (int j = 0; j < TN / kGridSide; ++j) bv[j] = sm.b[k * kPitchB + tx + kGridSide * j];
#pragma unroll
        for (int i = 0; i < TM / kGridSide; ++i)
#pragma unroll
          for (int j = 0; j < TN / kGridSide; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();  // the next step overwrites the staged slices
    }
  }

  template <typename TC>
  __device__ __forceinline__ void store(TC* out, int rows, int cols, int64_t rs, int64_t cs) const {
    const int ty = static_cast<int>(threadIdx.x) / kGridSide;
    const int tx = static_cast<int>(threadIdx.x) % kGridSide;
#pragma unroll
    for (int i = 0; i < TM / kGridSide; ++i) {
      const int r = ty + kGridSide * i;
#pragma unroll
      for (int j = 0; j < TN / kGridSide; ++j) {
        const int c = tx + kGridSide * j;
        if (r < rows && c < cols) out[r * rs + c * cs] = ElementTraits<TC>::from_float(acc[i][j]);
      }
    }
  }
};

// The fp32 accumulators of the MMA engines: a TM x TN tile cut into 16 x 8 MMA tiles (kTilesN
// per row of tiles), dealt to the 8 warps round-robin; c[i] is the m16n8 accumulator fragment of
// this warp's i-th tile. Each output element is owned by one thread.
template <int TM, int TN>
struct MmaTiles {
  static constexpr int kTilesN = TN / 8;
  static constexpr int kTiles = (TM / 16) * kTilesN;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kPerWarp = (kTiles + kWarps - 1) / kWarps;
  float c[kPerWarp][4];

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) c[i][j] = 0.0f;
  }

  // Stores the accumulators into the rows x cols corner of an output tile with strides rs, cs.
  template <typename TC>
  __device__ __forceinline__ void store(TC* out, int rows, int cols, int64_t rs, int64_t cs) const {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int g = lane / 4, t2 = (lane % 4) * 2;
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int tile = warp + kWarps * i;
      if (tile >= kTiles) continue;
      const int r0 = (tile / kTilesN) * 16 + g, c0 = (tile % kTilesN) * 8 + t2;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = r0 + (j / 2) * 8, col = c0 + j % 2;
        if (r < rows && col < cols) out[r * rs + col * cs] = ElementTraits<TC>::from_float(c[i][j]);
      }
    }
  }
};

// Stages a TM x kDepth (or TN x kDepth) slice into shared memory in its own 16-bit type,
// row-major with k contiguous (row pitch kPitch): the layout the MMA fragments read in pairs.
// Rows >= lines and k >= depth are zero. When the view allows it (16-byte aligned, unit stride
// along k or along the rows, the other stride a multiple of 8) a thread moves 8 elements with one
// 16-byte load: along k they land as one 16-byte store, along the rows they are transposed into 8
// stores. Anything else (transposed-in-memory views with odd strides, unaligned starts) takes
// the element-wise path.
template <typename T, int kOuter, int kPitch, int kDepth>
__device__ __forceinline__ void stage_rows(T* smem, const T* base, int64_t outer_stride,
                                           int64_t k_stride, int lines, int depth, bool k_fast) {
  constexpr int kVec = 8;  // 16-bit elements per 16-byte load
  static_assert(sizeof(T) * kVec == sizeof(uint4), "16-bit elements");
  const T zero = ElementTraits<T>::from_float(0.0f);
  const bool aligned = reinterpret_cast<uintptr_t>(base) % sizeof(uint4) == 0;
  if (aligned && k_stride == 1 && outer_stride % kVec == 0) {
    constexpr int kPerRow = kDepth / kVec;
    constexpr int kChunks = kOuter * kPerRow;
#pragma unroll
    for (int e0 = 0; e0 < kChunks; e0 += kThreads) {
      const int e = e0 + static_cast<int>(threadIdx.x);
      if (e >= kChunks) break;
      const int o = e / kPerRow, k = (e % kPerRow) * kVec;
      T* dst = smem + o * kPitch + k;
      const T* src = base + o * outer_stride + k;
      if (o < lines && k + kVec <= depth) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) dst[i] = o < lines && k + i < depth ? src[i] : zero;
      }
    }
    return;
  }
  if (aligned && outer_stride == 1 && k_stride % kVec == 0) {
    constexpr int kPerK = kOuter / kVec;
    constexpr int kChunks = kPerK * kDepth;
#pragma unroll
    for (int e0 = 0; e0 < kChunks; e0 += kThreads) {
      const int e = e0 + static_cast<int>(threadIdx.x);
      if (e >= kChunks) break;
      const int k = e / kPerK, o = (e % kPerK) * kVec;
      const T* src = base + k * k_stride + o;
      T v[kVec];
      if (k < depth && o + kVec <= lines) {
        const uint4 raw = *reinterpret_cast<const uint4*>(src);
        memcpy(v, &raw, sizeof(raw));
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = k < depth && o + i < lines ? src[i] : zero;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) smem[(o + i) * kPitch + k] = v[i];
    }
    return;
  }
  constexpr int kElems = kOuter * kDepth;
#pragma unroll
  for (int e0 = 0; e0 < kElems; e0 += kThreads) {
    const int e = e0 + static_cast<int>(threadIdx.x);
    if (kElems % kThreads != 0 && e >= kElems) break;
    const int o = k_fast ? e / kDepth : e % kOuter;
    const int k = k_fast ? e % kDepth : e / kOuter;
    smem[o * kPitch + k] = o < lines && k < depth ? base[o * outer_stride + k * k_stride] : zero;
  }
}

// The tensor-core engine (f16 / bf16 operands of one type): m16n8k16 MMAs on the 16 x 8 tiles
// of MmaTiles, kDepth / 16 k-steps per staged round. Each output element is summed over the
// segments and k-steps in order.
template <typename T, int TM, int TN, int kDepth>
struct MmaEngine : MmaTiles<TM, TN> {
  using Tiles = MmaTiles<TM, TN>;
  using Tiles::c;
  using Tiles::kPerWarp;
  using Tiles::kTiles;
  using Tiles::kTilesN;
  using Tiles::kWarps;
  // kDepth + 8 elements per row (an odd multiple of 16 bytes): the fragment loads of the 8 row
  // groups hit distinct banks.
  static constexpr int kPitch = kDepth + 8;
  struct Shared {
    alignas(16) T a[TM * kPitch];
    alignas(16) T b[TN * kPitch];
  };

  __device__ __forceinline__ void segment(Shared& sm, const Slice<T>& a, int a_rows,
                                          const Slice<T>& b, int b_cols, int64_t len) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int g = lane / 4, t2 = (lane % 4) * 2;
    const bool a_k_fast = abs64(a.cs) < abs64(a.rs);
    const bool b_k_fast = abs64(b.rs) < abs64(b.cs);
    for (int64_t k0 = 0; k0 < len; k0 += kDepth) {
      const int depth = static_cast<int>(min64(kDepth, len - k0));
      stage_rows<T, TM, kPitch, kDepth>(sm.a, a.base + k0 * a.cs, a.rs, a.cs, a_rows, depth,
                                        a_k_fast);
      stage_rows<T, TN, kPitch, kDepth>(sm.b, b.base + k0 * b.rs, b.cs, b.rs, b_cols, depth,
                                        b_k_fast);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPerWarp; ++i) {
        const int tile = warp + kWarps * i;
        if (tile < kTiles) {
          const T* at_a = sm.a + (tile / kTilesN) * 16 * kPitch;
          const T* at_b = sm.b + ((tile % kTilesN) * 8 + g) * kPitch;
#pragma unroll
          for (int kk = 0; kk < kDepth; kk += 16) {
            uint32_t af[4], bf[2];
            af[0] = load_pair(at_a + g * kPitch + kk + t2);
            af[1] = load_pair(at_a + (g + 8) * kPitch + kk + t2);
            af[2] = load_pair(at_a + g * kPitch + kk + t2 + 8);
            af[3] = load_pair(at_a + (g + 8) * kPitch + kk + t2 + 8);
            bf[0] = load_pair(at_b + kk + t2);
            bf[1] = load_pair(at_b + kk + t2 + 8);
            mma_16816<T>(c[i], af, bf);
          }
        }
      }
      __syncthreads();  // the next step overwrites the staged slices
    }
  }
};

// The split-TF32 engine (an fp32 left operand times a 16-bit right one: the composite attention's
// fp32 probabilities and score gradients times V, dO, K or Q): tensor cores at about fp32
// accuracy, where the FMA engine ran ~5 TFLOP/s. A 16-bit value is exact in TF32 (f16 has its 10
// mantissa bits, bf16 7), and an fp32 value a is a_hi + a_lo up to 2^-22 |a| with a_hi = tf32(a)
// and a_lo = tf32(a - a_hi); each product of TF32 values is exact in fp32, so two m16n8k8 MMAs per
// k-step (a_lo b, then a_hi b) sum what the FMA engine sums, rounded as fp32 accumulation
// rounds. Operands are staged as the FMA engine stages them (fp32, k-major); the MMAs run on the
// 16 x 8 tiles of MmaTiles, each output element summed over the segments and k in order.
template <typename TB, int TM, int TN, int kDepth>
struct Tf32Engine : MmaTiles<TM, TN> {
  using Tiles = MmaTiles<TM, TN>;
  using Tiles::c;
  using Tiles::kPerWarp;
  using Tiles::kTiles;
  using Tiles::kTilesN;
  using Tiles::kWarps;
  // k-major rows of TM (TN) + 8 floats: a fragment load's 8 row groups x 4 k lanes hit 32 banks.
  static constexpr int kPitchA = TM + 8, kPitchB = TN + 8;
  struct Shared {
    float a[kDepth * kPitchA];
    float b[kDepth * kPitchB];
  };

  __device__ __forceinline__ void segment(Shared& sm, const Slice<float>& a, int a_rows,
                                          const Slice<TB>& b, int b_cols, int64_t len) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4;
    const bool a_k_fast = abs64(a.cs) < abs64(a.rs);
    const bool b_k_fast = abs64(b.rs) < abs64(b.cs);
    for (int64_t k0 = 0; k0 < len; k0 += kDepth) {
      const int depth = static_cast<int>(min64(kDepth, len - k0));
      stage<float, TM, kPitchA, kDepth>(sm.a, a.base + k0 * a.cs, a.rs, a.cs, a_rows, depth,
                                        a_k_fast);
      stage<TB, TN, kPitchB, kDepth>(sm.b, b.base + k0 * b.rs, b.cs, b.rs, b_cols, depth, b_k_fast);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPerWarp; ++i) {
        const int tile = warp + kWarps * i;
        if (kTiles % kWarps == 0 || tile < kTiles) {
          const float* at_a = sm.a + (tile / kTilesN) * 16 + g;
          const float* at_b = sm.b + (tile % kTilesN) * 8 + g;
#pragma unroll
          for (int kk = 0; kk < kDepth; kk += 8) {
            const float av[4] = {at_a[(kk + t) * kPitchA], at_a[(kk + t) * kPitchA + 8],
                                 at_a[(kk + t + 4) * kPitchA], at_a[(kk + t + 4) * kPitchA + 8]};
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              hi[e] = tf32_bits(av[e]);
              lo[e] = tf32_bits(av[e] - __uint_as_float(hi[e]));
            }
            const uint32_t bf[2] = {__float_as_uint(at_b[(kk + t) * kPitchB]),
                                    __float_as_uint(at_b[(kk + t + 4) * kPitchB])};
            mma_1688_tf32(c[i], lo, bf);
            mma_1688_tf32(c[i], hi, bf);
          }
        }
      }
      __syncthreads();  // the next step overwrites the staged slices
    }
  }
};

template <typename T>
__device__ __forceinline__ const T* at(const void* data, int64_t offset) {
  return static_cast<const T*>(data) + offset;
}

// Two CTAs per SM at least (128 registers), four for the 16 x 16 tiles of an sdd at block 16:
// every kernel here waits on its loads between rounds, so resident CTAs are what hides them.
template <int TM, int TN>
constexpr int kMinCtasPerSm = TM* TN <= 16 * 16 ? 4 : 2;

template <Mode kMode, typename Engine, typename TA, typename TB, typename TC, int TM, int TN>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<TM, TN>)
    matmul_kernel(const MatMulArgs a) {
  __shared__ typename Engine::Shared smem;
  Engine engine;
  const int64_t b = a.block;

  for (int64_t t = blockIdx.x; t < a.tiles; t += gridDim.x) {
    engine.reset();

    TC* out = nullptr;  // the tile's element (0, 0)
    int out_rows = TM, out_cols = TN;
    int64_t out_rs = a.out.s2, out_cs = a.out.s3;

    if constexpr (kMode == Mode::kSdd) {
      // Tiles: (z, p, tile row, tile column) with the tile inside block p.
      const int64_t per_row = b / TN, per_block = (b / TM) * per_row;
      const int64_t z = t / (a.nnz * per_block), rest = t % (a.nnz * per_block);
      const int64_t p = rest / per_block, sub = rest % per_block;
      const int64_t r0 = (sub / per_row) * TM, c0 = (sub % per_row) * TN;
      // Block p is stored block s of the repeat p / stored_nnz of the stored heads.
      const int64_t s = p % a.stored_nnz;
      const int64_t h = a.head[s] + (p / a.stored_nnz) * a.layout_heads;
      const int64_t i_blk = a.row[s], j_blk = a.col[s];
      const Slice<TA> xs{at<TA>(a.x.data, z * a.x.s0 + h * a.x.s1 + (i_blk * b + r0) * a.x.s2),
                         a.x.s2, a.x.s3};
      const Slice<TB> ys{at<TB>(a.y.data, z * a.y.s0 + h * a.y.s1 + (j_blk * b + c0) * a.y.s3),
                         a.y.s2, a.y.s3};
      engine.segment(smem, xs, TM, ys, TN, a.x.cols);
      out = const_cast<TC*>(
          at<TC>(a.out.data, z * a.out.s0 + p * a.out.s1 + r0 * a.out.s2 + c0 * a.out.s3));
    } else if constexpr (kMode == Mode::kDsd) {
      // Tiles: (z, head repeat k, piece i of the split, tile row inside the line, tile of N
      // columns); the piece's line o of stored head g is output block line o of head g + k * G.
      const int64_t n = a.y.cols;
      const int64_t n_tiles = (n + TN - 1) / TN, m_tiles = b / TM;
      const int64_t per_piece = m_tiles * n_tiles;
      const int64_t zk = t / (a.split.pieces * per_piece), rest = t % (a.split.pieces * per_piece);
      const int64_t i = rest / per_piece, sub = rest % per_piece;
      const int64_t r0 = (sub / n_tiles) * TM, n0 = (sub % n_tiles) * TN;
      const int64_t z = zk / a.repeats, k = zk % a.repeats;
      const int64_t line = a.split.item_line[i], g = line / a.lines, o = line % a.lines;
      const int64_t h = g + k * a.layout_heads;
      out_cols = static_cast<int>(min64(TN, n - n0));
      const int64_t s_base = z * a.x.s0 + k * a.stored_nnz * a.x.s1;  // stored s -> block s + shift
      const int64_t y_base = z * a.y.s0 + h * a.y.s1 + n0 * a.y.s3;
      const int64_t begin = a.split.item_begin[i], end = a.split.item_end[i];
      if (!a.trans_s) {
        // out[I*b + r, :] += S_p[r, c] * y[J_p*b + c, :] over the piece's blocks p of block row I.
        for (int64_t p = begin; p < end; ++p) {
          const Slice<TA> ss{at<TA>(a.x.data, s_base + p * a.x.s1 + r0 * a.x.s2), a.x.s2, a.x.s3};
          const Slice<TB> ys{at<TB>(a.y.data, y_base + int64_t{a.col[p]} * b * a.y.s2), a.y.s2,
                             a.y.s3};
          engine.segment(smem, ss, TM, ys, out_cols, b);
        }
      } else {
        // out[J*b + c, :] += S_p[r, c] * y[I_p*b + r, :] over the piece's blocks p of block
        // column J: the left slice is S_p transposed, element (c, r) at r * s2 + c.
        for (int64_t e = begin; e < end; ++e) {
          const int64_t p = a.col_block_ids[e];
          const Slice<TA> ss{at<TA>(a.x.data, s_base + p * a.x.s1 + r0 * a.x.s3), a.x.s3, a.x.s2};
          const Slice<TB> ys{at<TB>(a.y.data, y_base + int64_t{a.col_rows[e]} * b * a.y.s2), a.y.s2,
                             a.y.s3};
          engine.segment(smem, ss, TM, ys, out_cols, b);
        }
      }
      const int32_t slot = a.split.item_slot[i];
      if (slot >= 0) {  // a piece of a split line: its fp32 partial, combined later in piece order
        engine.store(
            a.partial + ((zk * a.split.slots + slot) * a.part_rows + r0) * a.part_cols + n0, TM,
            out_cols, a.part_cols, int64_t{1});
        continue;
      }
      out = const_cast<TC*>(at<TC>(
          a.out.data, z * a.out.s0 + h * a.out.s1 + (o * b + r0) * a.out.s2 + n0 * a.out.s3));
    } else {
      // dds. Tiles: (z, head repeat k, piece i of the split, tile of M rows, tile column inside
      // the line).
      const int64_t m = a.x.rows;
      const int64_t m_tiles = (m + TM - 1) / TM, n_tiles = b / TN;
      const int64_t per_piece = m_tiles * n_tiles;
      const int64_t zk = t / (a.split.pieces * per_piece), rest = t % (a.split.pieces * per_piece);
      const int64_t i = rest / per_piece, sub = rest % per_piece;
      const int64_t m0 = (sub / n_tiles) * TM, c0 = (sub % n_tiles) * TN;
      const int64_t z = zk / a.repeats, k = zk % a.repeats;
      const int64_t line = a.split.item_line[i], g = line / a.lines, o = line % a.lines;
      const int64_t h = g + k * a.layout_heads;
      out_rows = static_cast<int>(min64(TM, m - m0));
      const int64_t x_base = z * a.x.s0 + h * a.x.s1 + m0 * a.x.s2;
      const int64_t s_base = z * a.y.s0 + k * a.stored_nnz * a.y.s1;  // stored s -> block s + shift
      const int64_t begin = a.split.item_begin[i], end = a.split.item_end[i];
      if (!a.trans_s) {
        // out[:, J*b + c] += x[:, I_p*b + r] * S_p[r, c] over the piece's blocks p of block
        // column J.
        for (int64_t e = begin; e < end; ++e) {
          const int64_t p = a.col_block_ids[e];
          const Slice<TA> xs{at<TA>(a.x.data, x_base + int64_t{a.col_rows[e]} * b * a.x.s3), a.x.s2,
                             a.x.s3};
          const Slice<TB> ss{at<TB>(a.y.data, s_base + p * a.y.s1 + c0 * a.y.s3), a.y.s2, a.y.s3};
          engine.segment(smem, xs, out_rows, ss, TN, b);
        }
      } else {
        // out[:, I*b + r] += x[:, J_p*b + c] * S_p[r, c] over the piece's blocks p of block row
        // I: the right slice is S_p transposed, element (c, r) at r * s2 + c.
        for (int64_t p = begin; p < end; ++p) {
          const Slice<TA> xs{at<TA>(a.x.data, x_base + int64_t{a.col[p]} * b * a.x.s3), a.x.s2,
                             a.x.s3};
          const Slice<TB> ss{at<TB>(a.y.data, s_base + p * a.y.s1 + c0 * a.y.s2), a.y.s3, a.y.s2};
          engine.segment(smem, xs, out_rows, ss, TN, b);
        }
      }
      const int32_t slot = a.split.item_slot[i];
      if (slot >= 0) {
        engine.store(
            a.partial + ((zk * a.split.slots + slot) * a.part_rows + m0) * a.part_cols + c0,
            out_rows, TN, a.part_cols, int64_t{1});
        continue;
      }
      out = const_cast<TC*>(at<TC>(
          a.out.data, z * a.out.s0 + h * a.out.s1 + m0 * a.out.s2 + (o * b + c0) * a.out.s3));
    }

    engine.store(out, out_rows, out_cols, out_rs, out_cs);
  }
}

// The second step of a dsd / dds with split lines: sums each split line's fp32 partials in piece
// order and writes the line's output (dsd: rows o*b .. +b of out, N columns; dds: M rows, columns
// o*b .. +b), one thread per element, consecutive threads along the partial's columns.
template <Mode kMode, typename TC>
__global__ void __launch_bounds__(kThreads) combine_kernel(const MatMulArgs a) {
  const int64_t per_line = a.part_rows * a.part_cols;
  const int64_t total = a.batch * a.repeats * a.split.num_split_lines * per_line;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * kThreads) {
    const int64_t c = e % a.part_cols, r = (e / a.part_cols) % a.part_rows;
    const int64_t rest = e / per_line;
    const int64_t j = rest % a.split.num_split_lines, zk = rest / a.split.num_split_lines;
    const int64_t line = a.split.split_lines[j];
    const int64_t first = a.split.line_items[line];
    const int64_t count = a.split.line_items[line + 1] - first;
    const float* part = a.partial + (zk * a.split.slots + a.split.item_slot[first]) * per_line +
                        r * a.part_cols + c;
    float sum = 0.0f;
    for (int64_t q = 0; q < count; ++q) sum += part[q * per_line];
    const int64_t z = zk / a.repeats, k = zk % a.repeats;
    const int64_t g = line / a.lines, o = line % a.lines, h = g + k * a.layout_heads;
    const int64_t row = kMode == Mode::kDsd ? o * a.block + r : r;
    const int64_t col = kMode == Mode::kDsd ? c : o * a.block + c;
    TC* out = const_cast<TC*>(
        at<TC>(a.out.data, z * a.out.s0 + h * a.out.s1 + row * a.out.s2 + col * a.out.s3));
    *out = ElementTraits<TC>::from_float(sum);
  }
}

// The tile shape of a mode for block b: dimensions inside a block are min(b, 64); dense ones 64.
constexpr int kDenseTile = 64;

template <Mode kMode, typename TA, typename TB, typename TC, int TM, int TN, int kDepth>
cudaError_t launch_tiles(const MatMulArgs& args, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(std::min(args.tiles, kMaxGrid));
  // Tensor cores when both operands are f16 or bf16 of one type, split TF32 for an fp32 left
  // operand times a 16-bit right one; fp32 FMA for fp32 operands (exact fp32, as the CPU path).
  constexpr bool kMma = std::is_same_v<TA, TB> && !std::is_same_v<TA, float>;
  constexpr bool kTf32 = std::is_same_v<TA, float> && !std::is_same_v<TB, float>;
  using Engine = std::conditional_t<
      kMma, MmaEngine<TA, TM, TN, kDepth>,
      std::conditional_t<kTf32, Tf32Engine<TB, TM, TN, kDepth>, FmaEngine<TA, TB, TM, TN, kDepth>>>;
  matmul_kernel<kMode, Engine, TA, TB, TC, TM, TN><<<grid, kThreads, 0, stream>>>(args);
  cudaError_t e = cudaGetLastError();
  if constexpr (kMode != Mode::kSdd) {
    if (e == cudaSuccess && args.split.num_split_lines > 0) {
      const int64_t total =
          args.batch * args.repeats * args.split.num_split_lines * args.part_rows * args.part_cols;
      const auto blocks =
          static_cast<unsigned>(std::min((total + kThreads - 1) / kThreads, kMaxGrid));
      combine_kernel<kMode, TC><<<blocks, kThreads, 0, stream>>>(args);
      e = cudaGetLastError();
    }
  }
  return e;
}

template <Mode kMode, typename TA, typename TB, typename TC>
cudaError_t launch_typed(const MatMulArgs& args, cudaStream_t stream) {
  // The block-local tile side: the block itself up to 64, so a 128 block is 2 x 2 tiles. A round
  // stages 64 deep of the sdd's K and one block's side (up to 64) of a dsd / dds segment.
  const int side = std::min(args.block, 64);
#define SCIATTN_BS_TILE(S)                                                    \
  if (side == S) {                                                            \
    if constexpr (kMode == Mode::kSdd) {                                      \
      return launch_tiles<kMode, TA, TB, TC, S, S, kMaxDepth>(args, stream);  \
    } else if constexpr (kMode == Mode::kDsd) {                               \
      return launch_tiles<kMode, TA, TB, TC, S, kDenseTile, S>(args, stream); \
    } else {                                                                  \
      return launch_tiles<kMode, TA, TB, TC, kDenseTile, S, S>(args, stream); \
    }                                                                         \
  }
  SCIATTN_BS_TILE(16)
  SCIATTN_BS_TILE(32)
  SCIATTN_BS_TILE(64)
#undef SCIATTN_BS_TILE
  return cudaErrorInvalidValue;  // blocks are 16, 32, 64 or 128 (checked by the index)
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

MatMulArgs make_args(const BlockSparseDeviceIndex& ix, const TensorView& x, const TensorView& y,
                     const TensorView& out, bool trans_s, int64_t batch) {
  MatMulArgs a;
  a.x = view4(x);
  a.y = view4(y);
  a.out = view4(out);
  a.trans_s = trans_s;
  a.batch = batch;
  a.block = ix.block;
  a.heads = ix.num_heads;
  a.row_blocks = ix.num_row_blocks;
  a.col_blocks = ix.num_col_blocks;
  a.nnz = ix.nnz;
  a.layout_heads = ix.layout_heads;
  a.stored_nnz = ix.stored_nnz;
  a.head = ix.head;
  a.row = ix.row;
  a.col = ix.col;
  a.col_rows = ix.col_rows;
  a.col_block_ids = ix.col_blocks;
  a.repeats = ix.layout_heads > 0 ? ix.num_heads / ix.layout_heads : 1;
  return a;
}

// A dsd / dds over the block lines of `split` (lines per stored head each), with the partials of
// its split lines (part_rows x part_cols each) at `partial`.
Status set_split(MatMulArgs* a, const BlockSparseDeviceArrays::Split& split, int32_t lines,
                 int64_t part_rows, int64_t part_cols, float* partial, const char* what) {
  if (split.slots > 0 && partial == nullptr) {
    return Status::invalid_argument(std::string(what) +
                                    ": the index splits long lines, which needs the workspace "
                                    "for their partial sums; none was given");
  }
  a->split = split;
  a->lines = lines;
  a->part_rows = part_rows;
  a->part_cols = part_cols;
  a->partial = partial;
  a->tiles = a->batch * a->repeats * split.pieces;
  return Status::ok_status();
}

bool is(DType a, DType want) {
  return a == want;
}

// Runs launch_typed<kMode, TA, TB, TC> for the dtypes given, among the combinations the mode
// instantiates: all one type for every mode; (T, T, f32) for sdd and (f32, T, T) for dsd, the
// composite attention's fp32 scores.
template <Mode kMode>
Status dispatch_types(const MatMulArgs& args, DType ta, DType tb, DType tc, cudaStream_t stream,
                      const char* what) {
  using F = float;
  using H = __half;
  using B = __nv_bfloat16;
  cudaError_t e = cudaErrorNotSupported;
  bool found = true;
  if (ta == tb && tb == tc) {
    if (is(ta, DType::kF32)) {
      e = launch_typed<kMode, F, F, F>(args, stream);
    } else if (is(ta, DType::kF16)) {
      e = launch_typed<kMode, H, H, H>(args, stream);
    } else if (is(ta, DType::kBF16)) {
      e = launch_typed<kMode, B, B, B>(args, stream);
    } else {
      found = false;
    }
  } else if constexpr (kMode == Mode::kSdd) {
    if (ta == tb && is(tc, DType::kF32) && is(ta, DType::kF16)) {
      e = launch_typed<kMode, H, H, F>(args, stream);
    } else if (ta == tb && is(tc, DType::kF32) && is(ta, DType::kBF16)) {
      e = launch_typed<kMode, B, B, F>(args, stream);
    } else {
      found = false;
    }
  } else if constexpr (kMode == Mode::kDsd) {
    if (is(ta, DType::kF32) && tb == tc && is(tb, DType::kF16)) {
      e = launch_typed<kMode, F, H, H>(args, stream);
    } else if (is(ta, DType::kF32) && tb == tc && is(tb, DType::kBF16)) {
      e = launch_typed<kMode, F, B, B>(args, stream);
    } else {
      found = false;
    }
  } else {
    found = false;
  }
  if (!found) {
    return Status::not_supported(std::string(what) + ": this combination of operand dtypes (" +
                                 dtype_name(ta) + ", " + dtype_name(tb) + ", " + dtype_name(tc) +
                                 ") has no kernel");
  }
  return device_status(e, what);
}

}  // namespace

Status launch_sdd(const BlockSparseDeviceIndex& ix, const TensorView& x, const TensorView& y,
                  const TensorView& c, cudaStream_t stream) {
  const int64_t batch = x.sizes[0], side = std::min(ix.block, 64);
  MatMulArgs args = make_args(ix, x, y, c, false, batch);
  args.tiles = batch * ix.nnz * (ix.block / side) * (ix.block / side);
  if (args.tiles == 0) return Status::ok_status();  // a layout without blocks: nothing to write
  return dispatch_types<Mode::kSdd>(args, x.dtype, y.dtype, c.dtype, stream,
                                    "the block-sparse sdd kernel");
}

Status launch_dsd(const BlockSparseDeviceIndex& ix, const TensorView& s, bool trans_s,
                  const TensorView& y, const TensorView& out, float* partial, cudaStream_t stream) {
  const int64_t batch = s.sizes[0], side = std::min(ix.block, 64), n = y.sizes[3];
  const char* what = "the block-sparse dsd kernel";
  MatMulArgs args = make_args(ix, s, y, out, trans_s, batch);
  const Status set =
      trans_s ? set_split(&args, ix.col_split, ix.num_col_blocks, ix.block, n, partial, what)
              : set_split(&args, ix.row_split, ix.num_row_blocks, ix.block, n, partial, what);
  if (!set.ok()) return set;
  args.tiles *= (ix.block / side) * ceil_div(n, kDenseTile);
  if (args.tiles == 0) return Status::ok_status();
  return dispatch_types<Mode::kDsd>(args, s.dtype, y.dtype, out.dtype, stream, what);
}

Status launch_dds(const BlockSparseDeviceIndex& ix, const TensorView& x, const TensorView& s,
                  bool trans_s, const TensorView& out, float* partial, cudaStream_t stream) {
  const int64_t batch = x.sizes[0], side = std::min(ix.block, 64), m = x.sizes[2];
  const char* what = "the block-sparse dds kernel";
  MatMulArgs args = make_args(ix, x, s, out, trans_s, batch);
  const Status set =
      trans_s ? set_split(&args, ix.row_split, ix.num_row_blocks, m, ix.block, partial, what)
              : set_split(&args, ix.col_split, ix.num_col_blocks, m, ix.block, partial, what);
  if (!set.ok()) return set;
  args.tiles *= ceil_div(m, kDenseTile) * (ix.block / side);
  if (args.tiles == 0) return Status::ok_status();
  return dispatch_types<Mode::kDds>(args, x.dtype, s.dtype, out.dtype, stream, what);
}

}  // namespace sciattn::cuda::bs
