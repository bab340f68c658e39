// The dQ kernel of the fused sparse attention backward for dense causal attention (a layout
// holding every block at or below the diagonal under the causal rule, no score terms: the
// forward's condition), on Hopper's warpgroup MMA (sm_90a). A CTA of two warpgroups takes 128
// queries and walks the key tiles to its diagonal (sparse_attention_causal_tiles.cuh), so each
// K / V tile copied serves 128 queries instead of the lists' kernel's 64. Per key tile j each
// warpgroup issues S = Q K_j^T, dP = dO V_j^T and the previous tile's dQ += dS_{j-1} K_{j-1}
// together, forms P and dS = P (dP - delta) of tile j while the third product completes, and
// packs dS into that product's A registers only after it (as the causal forward does). Each dQ
// row is one thread's, written once (times scale), with no partials: deterministic. CUDA layer.
#pragma once

#include <type_traits>

#include "cuda/block_sparse/sparse_attention_bwd_kernels.cuh"
#include "cuda/block_sparse/sparse_attention_causal_tiles.cuh"
#include "cuda/common/wgmma.cuh"

namespace sciattn::cuda {

// Its shared memory: the two warpgroups' Q tiles, their dO tiles, then the key stages; 1024
// bytes extra for the base's rounding.
template <int kHeadDim>
struct SparseCausalDqSmem {
  static constexpr int kStages = 5;
  using Keys = CausalKeyStages<kHeadDim, kStages>;
  using Stages = CausalStages<kStages, /*kKeep=*/1, /*kAhead=*/1>;
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kDo = kCausalWarpgroups * Keys::kTileBytes;
  static constexpr uint32_t kKeys = 2 * kCausalWarpgroups * Keys::kTileBytes;
  static constexpr size_t kLaunchBytes = kKeys + size_t{Keys::kBytes} + 1024;
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kCausalThreads, 1)
    sparse_attention_causal_dq_wgmma_kernel(const SparseAttentionDeviceParams p) {
#if SCIATTN_WGMMA_DEVICE_CODE
  static_assert(kHeadDim == 64 || kHeadDim == 128, "128-byte swizzled rows: head dim 64 or 128");
  using Smem = SparseCausalDqSmem<kHeadDim>;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = aligned_smem(smem_raw).address;
  const CausalRows at(p);
  const typename Smem::Keys keys{base + Smem::kKeys};
  const uint32_t q_tile = base + Smem::kQ + at.wg * Smem::Keys::kTileBytes;
  const uint32_t do_tile = base + Smem::kDo + at.wg * Smem::Keys::kTileBytes;

  const RowSlice k_src = row_slice<T>(p.k, p.k_stride, at.b, at.h);
  const RowSlice v_src = row_slice<T>(p.v, p.v_stride, at.b, at.h);
  const auto load = [&](int j) { keys.load(j, at, k_src, v_src); };
  if (at.mine > 0) {
    const RowSlice q_src = row_slice<T>(p.q, p.q_stride, at.b, at.h);
    const RowSlice do_src = row_slice<T>(p.dout, p.dout_stride, at.b, at.h);
    copy_tile_swizzled<kHeadDim>(q_tile, q_src.row(at.first_row), q_src.row_bytes, kWgmmaRows,
                                 at.thread);
    copy_tile_swizzled<kHeadDim>(do_tile, do_src.row(at.first_row), do_src.row_bytes, kWgmmaRows,
                                 at.thread);
  }
  Smem::Stages::prologue(at.walk, load);

  // The rows' lse in log2 units (+inf for a row without any kept key, only with infinite inputs:
  // P = 0) and delta.
  float lse_log2[2] = {0.0f, 0.0f}, delta[2] = {0.0f, 0.0f};
  if (at.mine > 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = at.row(r);
      lse_log2[r] = lse_log2_of(
          p.lse[at.b * p.lse_stride[0] + at.h * p.lse_stride[1] + row * p.lse_stride[2]]);
      delta[r] = p.delta[(at.b * p.heads + at.h) * p.len + row];
    }
  }
  const float scale_log2 = p.scale * kLog2e;

  float dq[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  uint32_t ds_frags[4][4] = {};  // dS of the previous tile, the A operand of dQ += dS K
  // Warpgroup 1 runs half a tile behind warpgroup 0 (as in the causal forward): it issues S and
  // dP of tile j + 1 at the end of iteration j.
  float s[8][4], dp[8][4];
  // Iteration j of this warpgroup's walk (j < mine), its issue pattern fixed per call site as in
  // the causal forward (kFirst, kEarly, kNext).
  const auto step = [&](int j, auto first, auto early, auto next) {
    constexpr bool kFirst = decltype(first)::value, kEarly = decltype(early)::value;
    constexpr bool kNext = decltype(next)::value;
    Smem::Stages::step(j, at.walk, load);
    if constexpr (kFirst) {
      wgmma_tile_nt_issue<T, kHeadDim>(s, q_tile, keys.k(j));
      wgmma_tile_nt_issue<T, kHeadDim>(dp, do_tile, keys.v(j));
      wgmma_wait<0>();
    } else if constexpr (kEarly) {
      wgmma_wait<0>();  // S_j and dP_j, issued before the barrier
      wgmma_pin(s);
      wgmma_pin(dp);
      wgmma_acc_packed_issue<T, kHeadDim>(dq, ds_frags, keys.k(j - 1));
    } else {
      wgmma_tile_nt_issue<T, kHeadDim>(s, q_tile, keys.k(j));
      wgmma_tile_nt_issue<T, kHeadDim>(dp, do_tile, keys.v(j));
      wgmma_acc_packed_issue<T, kHeadDim>(dq, ds_frags, keys.k(j - 1));
      wgmma_wait<1>();
    }
    wgmma_pin(s);
    wgmma_pin(dp);
    if (j == at.mine - 1) at.mask_diagonal(s);
      // P = 2^(s scale_log2 - lse_log2), then dS = P (dP - delta) in dp.
#pragma unroll
    for (int n8 = 0; n8 < 8; ++n8)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float prob = fast_exp2(fmaf(s[n8][x], scale_log2, -lse_log2[x >> 1]));
        dp[n8][x] = prob * (dp[n8][x] - delta[x >> 1]);
      }
    // dS is packed into the product's A registers only past its wait (see the causal forward).
    if constexpr (!kFirst) {
      wgmma_tile_done<0>(dq);
      wgmma_pin_fragments(ds_frags);
    }
    pack_a_fragments<T>(ds_frags, dp);
    if constexpr (kNext) {
      wgmma_tile_nt_issue<T, kHeadDim>(s, q_tile, keys.k(j + 1));
      wgmma_tile_nt_issue<T, kHeadDim>(dp, do_tile, keys.v(j + 1));
    }
  };
  constexpr std::true_type kYes{};
  constexpr std::false_type kNo{};
  if (at.wg == 0) {
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
  wgmma_acc_packed<T, kHeadDim>(dq, ds_frags, keys.k(at.mine - 1));

  const int64_t my_rows[2] = {at.row(0), at.row(1)};
  const float factor[2] = {p.scale, p.scale};
  store_slice_rows<T, kOutTiles>(dq, factor, p.dq, p.dq_stride, at.b, at.h, my_rows, p.len, p.dim,
                                 at.t, p.grads_paired);
#else
  __trap();  // not in this architecture's image: never launched here
#endif
}

}  // namespace sciattn::cuda
