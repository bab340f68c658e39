// The Evoformer attention forward kernel: one CTA per (64 query rows, h, b*n), four warps of 16
// rows each, streaming over 64-key tiles with an online softmax on tensor cores (m16n8k16).
// K/V tiles are double-buffered with cp.async, so the next tile loads while this one is used.
// Writes O and the fp32 log-sum-exp. CUDA layer; instantiated per (dtype, head dim) in generated
// evoformer_fwd_hd<D>_<dtype>.cu files.
#pragma once

#include "cuda/common/accumulator_row_store.cuh"
#include "cuda/common/device_utils.cuh"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/evoformer/evoformer_grid.cuh"
#include "cuda/evoformer/evoformer_tile_copies.cuh"

namespace sciattn::cuda {

struct EvoformerFwdTile {
  static constexpr int kBlockM = 64;  // query rows per CTA (16 per warp)
  static constexpr int kBlockN = 64;  // keys per tile
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
};

// kStages buffers of the streamed K/V tiles (stream_tile, common/device_utils.cuh): two, or one
// where the device's shared memory per block cannot hold two (kEvoformerOneStage).
template <typename T, int kHeadDim, int kStages = 2>
struct EvoformerFwdSmem {
  // Rows padded by 8 elements (16 bytes) so that the fragment reads of one warp, which walk down
  // 8 rows, fall in different banks, and every row start stays 16-byte aligned for cp.async.
  static constexpr int kPitch = kTileDimFor<kHeadDim> + 8;
  T q[EvoformerFwdTile::kBlockM * kPitch];
  T k[kStages][EvoformerFwdTile::kBlockN * kPitch];
  T v[kStages][EvoformerFwdTile::kBlockN * kPitch];
};

// The head dims whose mma.sync kernels also exist with one stage of streamed tiles: those whose
// two-stage forms (with staged fp32 biases) pass the 99 KiB per block of sm_86 and sm_89.
template <int kHeadDim>
constexpr bool kEvoformerOneStage = kHeadDim >= 64;

// CTAs per SM the register count must allow: up to head dim 32 the kernel fits 128 registers
// (four CTAs) without spilling in its loop. Left to itself the compiler took 137-158 (three CTAs):
// four ran the forward 4-7% faster at head dim 32 and 9% faster at 8.
// 0 (no bound) above, since a bound of 1 made ptxas take more registers (182 at head dim 32).
template <int kHeadDim>
constexpr int kEvoformerFwdMinCtas = kHeadDim <= 32 ? 4 : 0;

// One key tile of the forward's online softmax, in log2 units, for this thread's two rows: on
// entry s holds the tile's biases and dot its Q K^T (fp32 accumulators, in the m16n8 layout); on
// return s holds P = exp2(s + dot * scale_log2 - running max - prob_shift) (prob_shift: bf16's
// guard against an fp32 overflow of O, cuda/common/probability_shift.h), keys past L (the last
// tile only) give 0, and the running max, the running sum and O are rescaled to the new max.
// `past_len_biased`: the biases in s already hold -inf for keys past L (the wgmma forward's bias1
// row), so the tile masks nothing itself.
template <int kOutTiles>
__device__ __forceinline__ void evoformer_softmax_tile(float (&s)[8][4], const float (&dot)[8][4],
                                                       float scale_log2, float prob_shift,
                                                       int64_t col0, int64_t len,
                                                       bool past_len_biased, int t,
                                                       float (&row_max)[2], float (&row_sum)[2],
                                                       float (&o_acc)[kOutTiles][4]) {
  constexpr int kScoreTiles = 8;
  // Scores in log2 units, keys past L masked; then the tile's row maxima.
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int j = 0; j < kScoreTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = fmaf(dot[j][e], scale_log2, s[j][e]);
  // Keys past L exist only in the last tile (checked once per tile, not per element).
  if (!past_len_biased && col0 + 64 > len) {
    const int cols_left = static_cast<int>(len - col0);
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (j * 8 + 2 * t + (e & 1) >= cols_left) s[j][e] = kNegInf;
      }
  }
  // Each row's 16 values by a tree of maxima (depth 4 instead of a chain of 16: the same result,
  // max being exact and order-free).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) m[j] = fmaxf(s[j][2 * r], s[j][2 * r + 1]);
#pragma unroll
    for (int w = 4; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) m[j] = fmaxf(m[j], m[j + w]);
    tile_max[r] = m[0];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The four threads of a row (t = 0..3) hold its 64 columns between them.
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
  }
  float rescale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float new_max = fmaxf(row_max[r], tile_max[r]);
    // While every key so far is masked the max stays -inf; use 0 as the shift so that exp2 of
    // -inf scores gives 0 instead of exp2(-inf - -inf) = NaN.
    const float shift = new_max == kNegInf ? 0.0f : new_max;
    rescale[r] = fast_exp2(row_max[r] - shift);
    row_max[r] = new_max;
    row_sum[r] *= rescale[r];
    const float p_shift = shift + prob_shift;
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
      s[j][2 * r] = fast_exp2(s[j][2 * r] - p_shift);
      s[j][2 * r + 1] = fast_exp2(s[j][2 * r + 1] - p_shift);
      row_sum[r] += s[j][2 * r] + s[j][2 * r + 1];
    }
  }
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) {
    o_acc[i][0] *= rescale[0];
    o_acc[i][1] *= rescale[0];
    o_acc[i][2] *= rescale[1];
    o_acc[i][3] *= rescale[1];
  }
}

// The forward's epilogue: O (this thread's two rows, divided by their sums) and the rows' lse.
// dim: the D of the rows written (p.dim, or written_dim's constant on the exact warpgroup tiles).
template <typename T, int kHeadDim>
__device__ __forceinline__ void evoformer_finish_forward(const EvoformerDeviceParams& p,
                                                         const float (&o_acc)[kHeadDim / 8][4],
                                                         float (&row_max)[2], float (&row_sum)[2],
                                                         int64_t b, int64_t n, int64_t h,
                                                         int64_t bn, const int64_t (&my_rows)[2],
                                                         int t, int64_t dim, int shift = 0) {
  constexpr int kOutTiles = kHeadDim / 8;
  // The row sums are spread over the four threads of each row.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  // A shifted accumulator (`shift` 1: column c + 1 holds element c, V read in shifted slices) is
  // stored as rows one element before O's, of D + 1 columns, the first not written.
  T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + n * p.out_stride[1] +
           h * p.out_stride[3] - shift;
  // Pairs of columns as 32-bit stores (store_accumulator_row; p.out_paired: every row aligned and
  // D even, no test per row). Every lane stores (or passes on) both rows: where rows may start on
  // a 2-byte boundary the store is warp-collective.
  const bool pairs_aligned = p.out_paired != 0 && shift == 0;
  const bool may_start_odd = rows_may_start_odd(out, p.out_stride[2]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = my_rows[r];
    const bool inside = row < p.len;
    // A fully masked row has sum 0: output 0, lse -inf. The sum is at least 2^-prob_shift
    // otherwise (the row's largest term is exp2(-prob_shift), prob_shift <= 62), so the fast
    // reciprocal and log are accurate to ~2^-22; a
    // row with a NaN score has a NaN sum (fmaxf drops NaN from the max, but exp2 of the score
    // does not), which must give NaN, not the masked row's 0 and -inf: the tests are != 0.
    const float inv = row_sum[r] != 0.0f ? __fdividef(1.0f, row_sum[r]) : 0.0f;
    store_accumulator_row<T, kOutTiles>(out + (inside ? row : 0) * p.out_stride[2], o_acc, r, inv,
                                        dim + shift, t, pairs_aligned, may_start_odd, inside,
                                        shift != 0);
    if (!inside) continue;
    if (p.lse != nullptr && t == 0) {
      const float lse = row_sum[r] != 0.0f
                            ? (row_max[r] + p.prob_shift_log2 + __log2f(row_sum[r])) * kLn2
                            : kNegInf;
      p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + row * p.lse_stride[2]] = lse;
    }
  }
}

template <typename T, int kHeadDim, int kStages = 2>
__global__ void __launch_bounds__(EvoformerFwdTile::kThreads, kEvoformerFwdMinCtas<kHeadDim>)
    evoformer_fwd_kernel(const EvoformerDeviceParams p) {
  enter_overlapped_grid();
  using Tile = EvoformerFwdTile;
  using Smem = EvoformerFwdSmem<T, kHeadDim, kStages>;
  constexpr int kTileDim = kTileDimFor<kHeadDim>;  // head dim 8 runs in 16-wide tiles
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kTileDim / 16;           // k-steps of S = Q K^T
  constexpr int kScoreTiles = Tile::kBlockN / 8;  // n8 tiles of one score row block
  constexpr int kOutTiles = kHeadDim / 8;         // n8 tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  // A 1-D grid decoded here, so that B*N is not bounded by a grid dimension's 65535.
  static_assert(Tile::kBlockM == 64, "the grid's tiles are p.tiles64_div's");
  const TileHeadSlice at = decode_tile_head_slice(blockIdx.x, p);
  const int64_t m_block = at.tile, h = at.h, b = at.b, n = at.n, bn = at.bn;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = m_block * Tile::kBlockM;
  const int64_t my_rows[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};

  const SliceSource q_src = slice_of(p.q, p.q_stride, p.vec_q, sizeof(T), b, n, h);
  const SliceSource k_src = slice_of(p.k, p.k_stride, p.vec_k, sizeof(T), b, n, h);
  const SliceSource v_src = slice_of(p.v, p.v_stride, p.vec_v, sizeof(T), b, n, h);
  const int64_t tiles = (p.len + Tile::kBlockN - 1) / Tile::kBlockN;

  // The biases of each key tile are staged in shared memory (in kStages buffers like K and V,
  // after the fixed part), copied with the K/V tile they belong to: in flight while the previous
  // tile is computed, where per-thread global loads would wait a memory latency in every tile.
  unsigned char* const bias2_stage = smem_raw + sizeof(Smem);
  const int bias2_stage_bytes = bias_stage_bytes(p.bias2_type, Tile::kBlockM);
  unsigned char* const bias1_stage = bias2_stage + kStages * bias2_stage_bytes;
  const int bias1_stage_bytes = bias_stage_bytes(p.bias1_type, 1);
  auto copy_key_tile_to = [&](int buf, int64_t col0) {
    copy_key_tile<T, Tile::kBlockM, kTileDim, kPitch, Tile::kThreads, BiasCopyWidths::kAll>(
        p, k_src, v_src, b, n, h, row0, smem.k[buf], smem.v[buf],
        bias2_stage + buf * bias2_stage_bytes, bias1_stage + buf * bias1_stage_bytes, col0);
  };

  load_tile<T, Tile::kBlockM, kTileDim, kPitch, Tile::kThreads>(smem.q, q_src, row0, p.len,
                                                                p.load_dim);
  copy_key_tile_to(0, 0);
  cp_async_commit();

  // The softmax runs in base 2: scores are multiplied by log2(e) once, exp2 is one instruction.
  const float scale_log2 = p.scale * kLog2e;
  float row_max[2] = {kNegInf, kNegInf};  // running max of the scaled log2 scores
  float row_sum[2] = {0.0f, 0.0f};        // this thread's share of the running sum
  float o_acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
  uint32_t q_frag[kSteps][4];

  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t col0 = tile * Tile::kBlockN;
    // With two stages the next tile's K and V go into the other buffer (freed by the barrier at
    // the end of the previous iteration) while this one's are waited for.
    const int buf = stream_tile<kStages>(
        tile, tiles, [&](int to, int64_t next) { copy_key_tile_to(to, next * Tile::kBlockN); });
    __syncthreads();
    if (tile == 0) {
      // Q stays in registers as A fragments for the whole key loop.
      const T* qw = smem.q + warp * 16 * kPitch;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) load_a_frag<T, kPitch>(q_frag[s], qw, s, g, t);
    }

    // The biases of this tile first (global loads in flight while the MMAs run), in log2 units.
    float s[kScoreTiles][4];
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    add_staged_biases(s, bias1_stage + buf * bias1_stage_bytes, p.bias1_type,
                      bias2_stage + buf * bias2_stage_bytes, p.bias2_type, warp * 16, lane);

    float dot[kScoreTiles][4];
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) dot[j][0] = dot[j][1] = dot[j][2] = dot[j][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < kScoreTiles; j += 2) {
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        uint32_t bf[2][2];
        load_b_frags_of_rows<T, kPitch>(bf, smem.k[buf], j, st, g, t);
        mma_16816<T>(dot[j], q_frag[st], bf[0]);
        mma_16816<T>(dot[j + 1], q_frag[st], bf[1]);
      }
    }

    evoformer_softmax_tile<kOutTiles>(s, dot, scale_log2, p.prob_shift_log2, col0, p.len, false, t,
                                      row_max, row_sum, o_acc);

    // O += P V. The accumulators of two adjacent n8 score tiles are exactly an A fragment.
#pragma unroll
    for (int kk = 0; kk < Tile::kBlockN / 16; ++kk) {
      const uint32_t a[4] = {ElementTraits<T>::pack(s[2 * kk][0], s[2 * kk][1]),
                             ElementTraits<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                             ElementTraits<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             ElementTraits<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      mma_acc_k_major<T, kOutTiles, kPitch>(o_acc, a, smem.v[buf], kk, g, t);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  evoformer_finish_forward<T, kHeadDim>(p, o_acc, row_max, row_sum, b, n, h, bn, my_rows, t, p.dim);
}

}  // namespace sciattn::cuda
