// The fused sparse attention forward for a layout that holds every block at or below the diagonal
// under the causal rule (BlockSparseDeviceIndex::Tiles::lower_complete): dense causal attention,
// the trainer's GPT layout, on Hopper's warpgroup MMA (sm_90a). Nothing of the layout is read: a
// CTA of two warpgroups takes 128 queries (sparse_attention_causal_tiles.cuh), so each K / V tile
// copied into shared memory serves 128 queries (the lists' kernel reads it once per 64: at 16K
// tokens its L2 traffic was 72% of the L2's throughput). Each warpgroup keeps two products in
// flight: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued together, and tile j's softmax runs
// while the second completes, so the tensor cores have work during the exponentials. Only the
// diagonal tile is masked. CUDA layer.
#pragma once

#include <type_traits>

#include "cuda/block_sparse/sparse_attention_causal_tiles.cuh"
#include "cuda/block_sparse/sparse_attention_device.cuh"
#include "cuda/common/wgmma.cuh"

namespace sciattn::cuda {

// Its shared memory: the two warpgroups' Q tiles, then the key stages; 1024 bytes extra for
// rounding the base up to the swizzle pattern's period inside the kernel.
template <int kHeadDim>
struct SparseCausalFwdSmem {
  static constexpr int kStages = 5;
  using Keys = CausalKeyStages<kHeadDim, kStages>;
  using Stages = CausalStages<kStages, /*kKeep=*/1, /*kAhead=*/1>;
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kKeys = kCausalWarpgroups * Keys::kTileBytes;
  static constexpr size_t kLaunchBytes = kKeys + size_t{Keys::kBytes} + 1024;
};

// One key tile's softmax step for this thread's two rows, from the raw dot products s (scaled and
// taken to base 2 by one multiply-add per element: `scale_log2` > 0, so the raw maximum is the
// scaled one's). Running maxima are kept in base-2 units of the scaled scores. s becomes the
// tile's probabilities 2^(s scale_log2 - max - prob_shift) (bf16's guard against an fp32 overflow
// of O, cuda/common/probability_shift.h); `rescale` is the factor O, whose product is in flight
// while this runs, must take once it completes.
__device__ __forceinline__ void causal_softmax_step(float (&s)[8][4], float scale_log2,
                                                    float prob_shift, float (&row_max)[2],
                                                    float (&row_sum)[2], float (&rescale)[2]) {
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) tile_max[x >> 1] = fmaxf(tile_max[x >> 1], s[j][x]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The four threads of a row (t = 0..3) hold its 64 columns between them.
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float new_max = fmaxf(row_max[r], tile_max[r] * scale_log2);
    // A row whose keys so far are all removed (only with infinite inputs: every row holds its
    // key 0) keeps the max -inf; shift by 0 so that its -inf scores give 0, not NaN.
    const float shift = new_max == kNegInf ? 0.0f : new_max;
    rescale[r] = fast_exp2(row_max[r] - shift);
    row_max[r] = new_max;
    row_sum[r] *= rescale[r];
    const float bias = shift + prob_shift;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][2 * r] = fast_exp2(fmaf(s[j][2 * r], scale_log2, -bias));
      s[j][2 * r + 1] = fast_exp2(fmaf(s[j][2 * r + 1], scale_log2, -bias));
      row_sum[r] += s[j][2 * r] + s[j][2 * r + 1];
    }
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kCausalThreads, kHeadDim <= 64 ? 2 : 1)
    sparse_attention_causal_fwd_wgmma_kernel(const SparseAttentionDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  static_assert(kHeadDim == 64 || kHeadDim == 128, "128-byte swizzled rows: head dim 64 or 128");
  using Smem = SparseCausalFwdSmem<kHeadDim>;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = aligned_smem(smem_raw).address;
  const CausalRows at(p);
  const typename Smem::Keys keys{base + Smem::kKeys};
  const uint32_t q_tile = base + Smem::kQ + at.wg * Smem::Keys::kTileBytes;

  const RowSlice q_src = row_slice<T>(p.q, p.q_stride, at.b, at.h);
  const RowSlice k_src = row_slice<T>(p.k, p.k_stride, at.b, at.h);
  const RowSlice v_src = row_slice<T>(p.v, p.v_stride, at.b, at.h);
  const auto load = [&](int j) { keys.load(j, at, k_src, v_src); };
  if (at.mine > 0) {
    copy_tile_swizzled<kHeadDim>(q_tile, q_src.row(at.first_row), q_src.row_bytes, kWgmmaRows,
                                 at.thread);
  }
  Smem::Stages::prologue(at.walk, load);

  const float scale_log2 = p.scale * kLog2e;
  float row_max[2] = {kNegInf, kNegInf};  // base-2 units of the scaled scores
  float row_sum[2] = {0.0f, 0.0f};        // this thread's share of the running sum
  float o_acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
  uint32_t probs[4][4] = {};  // P of the previous tile, the A operand of O += P V
  // Warpgroup 1 runs half a tile behind warpgroup 0: it issues S of tile j + 1 at the end of
  // iteration j, so that at the start of each iteration (both warpgroups leave the same barrier)
  // warpgroup 0 waits for its S while warpgroup 1 already runs its softmax, and warpgroup 1's next
  // S runs during warpgroup 0's softmax, instead of both waiting on the tensor cores at once and
  // then leaving them idle together.
  float s[8][4];
  // Iteration j of this warpgroup's walk (j < mine). The products' issue pattern is fixed per call
  // site (kFirst: j = 0, nothing in flight before it; kEarly: S_j was issued by the iteration
  // before, or here when kFirst; kNext: issue S_{j+1} at the end): ptxas serializes every product
  // of a kernel whose accumulators may or may not be in flight where control flow merges.
  const auto step = [&](int j, auto first, auto early, auto next) {
    constexpr bool kFirst = decltype(first)::value, kEarly = decltype(early)::value;
    constexpr bool kNext = decltype(next)::value;
    Smem::Stages::step(j, at.walk, load);
    if constexpr (kFirst) {
      wgmma_tile_nt_issue<T, kHeadDim>(s, q_tile, keys.k(j));
      wgmma_tile_done<0>(s);
    } else if constexpr (kEarly) {
      // S_j, issued before the barrier, is complete first (ptxas does not follow a commit group
      // across the barrier: waiting for it behind the next product serializes them).
      wgmma_tile_done<0>(s);
      wgmma_acc_packed_issue<T, kHeadDim>(o_acc, probs, keys.v(j - 1));
    } else {
      wgmma_tile_nt_issue<T, kHeadDim>(s, q_tile, keys.k(j));
      wgmma_acc_packed_issue<T, kHeadDim>(o_acc, probs, keys.v(j - 1));
      wgmma_tile_done<1>(s);
    }
    if (j == at.mine - 1) at.mask_diagonal(s);
    float rescale[2];
    causal_softmax_step(s, scale_log2, p.prob_shift_log2, row_max, row_sum, rescale);
    // P is packed into the product's A registers only past its wait (defining them while it runs
    // serializes the products too).
    if constexpr (!kFirst) {
      wgmma_tile_done<0>(o_acc);
      wgmma_pin_fragments(probs);
#pragma unroll
      for (int i = 0; i < kOutTiles; ++i) {
        o_acc[i][0] *= rescale[0];
        o_acc[i][1] *= rescale[0];
        o_acc[i][2] *= rescale[1];
        o_acc[i][3] *= rescale[1];
      }
    }
    pack_a_fragments<T>(probs, s);
    if constexpr (kNext) wgmma_tile_nt_issue<T, kHeadDim>(s, q_tile, keys.k(j + 1));
  };
  constexpr std::true_type kYes{};
  constexpr std::false_type kNo{};
  if (at.wg == 0) {
    // Tiles 0 .. mine - 1, then (a whole query tile) one more barrier, where warpgroup 1 takes its
    // diagonal tile.
    step(0, kYes, kNo, kNo);
    for (int j = 1; j < at.mine; ++j) step(j, kNo, kNo, kNo);
    if (at.mine < at.walk) Smem::Stages::step(at.mine, at.walk, load);
  } else if (at.mine == 0) {
    // Rows past L: only the copies and the barriers.
    for (int j = 0; j < at.walk; ++j) Smem::Stages::step(j, at.walk, load);
    return;
  } else {
    // mine = walk >= 2 (this warpgroup's diagonal is the CTA's last tile).
    step(0, kYes, kYes, kYes);
    for (int j = 1; j < at.mine - 1; ++j) step(j, kNo, kYes, kYes);
    step(at.mine - 1, kNo, kYes, kNo);
  }
  wgmma_acc_packed<T, kHeadDim>(o_acc, probs, keys.v(at.mine - 1));

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  // Every row holds its key 0, so its sum is at least 2^-prob_shift unless an input is not
  // finite; a NaN score gives a NaN sum (fmaxf drops NaN from the max, but exp of it does not),
  // which must reach O and lse: the tests are != 0, not > 0.
  const float inv[2] = {row_sum[0] != 0.0f ? __fdividef(1.0f, row_sum[0]) : 0.0f,
                        row_sum[1] != 0.0f ? __fdividef(1.0f, row_sum[1]) : 0.0f};
  const int64_t my_rows[2] = {at.row(0), at.row(1)};
  store_slice_rows<T, kOutTiles>(o_acc, inv, p.out, p.out_stride, at.b, at.h, my_rows, p.len, p.dim,
                                 at.t, p.out_paired);
  if (p.lse != nullptr && at.t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      p.lse[at.b * p.lse_stride[0] + at.h * p.lse_stride[1] + my_rows[r] * p.lse_stride[2]] =
          row_sum[r] != 0.0f ? fmaf(row_max[r] + p.prob_shift_log2, kLn2, __logf(row_sum[r]))
                             : kNegInf;
    }
  }
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda
