// Host-side plan of the Evoformer CUDA kernels: which head dims are instantiated, how N is
// chunked for the deterministic dbias2 sum, and the workspace regions (padded copies of unaligned
// biases and inputs, the backward's partial sums). Host-only common
// layer (no CUDA headers), so that workspace_size() and the launch agree by construction.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/evoformer_checks.h"
#include "common/workspace_layout.h"

namespace sciattn::detail {

// The kernels' tile: 64 rows per CTA on each side.
constexpr int64_t kCudaEvoformerBlock = 64;
// The largest head dim a kernel is instantiated for; D up to it is padded to the next one.
constexpr int64_t kCudaEvoformerMaxHeadDim = 128;
// The SMs of the H200 the dbias2 plan is made for (a constant, not the device's count, so that
// the chunking, and with it the bits of dbias2, depend on the shape only).
constexpr int64_t kCudaDbias2Sms = 132;
// The dbias2 kernel's per-chunk fp32 partials may take at most this much memory.
constexpr int64_t kCudaDbias2PartialBudget = int64_t{64} << 20;
// A dbias2 CTA's fixed work (reading its bias2 cells, waiting for its first tiles, storing its
// sum) in units of the work of one n: about 2,000 instructions per warp against ~450 per n in the
// head dim 64 kernel, as counted in its SASS and measured with ncu. Without it the model took
// 37 chunks of 7 n over 4 of 64 at head dim 64 (63 against 64 modelled) and the kernel spent most
// of its time on that fixed work.
constexpr int64_t kCudaDbias2CtaCost = 4;

// The padded head dim for D: the smallest of 8, 16, 32, 64, 128 that holds it (0 if D > 128).
constexpr int64_t cuda_evoformer_head_dim(int64_t dim) {
  return dim <= 8 ? 8 : dim <= 16 ? 16 : dim <= 32 ? 32 : dim <= 64 ? 64 : dim <= 128 ? 128 : 0;
}

// The dbias2 kernel's CTA owns a tile of dbias2[b, h] of cuda_dbias2_rows(head dim) queries x 64
// keys: 128 rows up to head dim 64 (eight warps of 16 rows; at head dim 64 two warpgroups of the
// warpgroup-MMA kernel), so that each K/V tile staged serves twice the rows (at head dim 64 the
// kernel moves 6 bytes of tiles per cell and n instead of 8 with 64 rows), and 64 rows at 128
// (two stages of 128-row tiles would not fit). Its shared memory and registers allow this many
// CTAs per SM.
constexpr int64_t cuda_dbias2_rows(int64_t head_dim) {
  return head_dim <= 64 ? 128 : 64;
}
constexpr int64_t cuda_dbias2_ctas_per_sm(int64_t head_dim) {
  return head_dim <= 32 ? 2 : 1;
}

// Tiles of dbias2 (over B, H, query and key blocks), without the N chunks.
inline int64_t cuda_dbias2_tiles(const EvoformerShape& s) {
  const int64_t rows = cuda_dbias2_rows(cuda_evoformer_head_dim(s.dim));
  const int64_t query_blocks = (s.len + rows - 1) / rows;
  const int64_t key_blocks = (s.len + kCudaEvoformerBlock - 1) / kCudaEvoformerBlock;
  return query_blocks * key_blocks * s.heads * s.batch;
}

// Each dbias2 CTA sums dS over the n of one chunk of N, in order. With few tiles, N is split into
// chunks whose fp32 partials are added in a fixed order afterwards. The count minimises the
// kernel's modelled time, waves x (n per CTA + the CTA's fixed cost) (a wave: every CTA slot of
// the GPU busy once), within the partials' memory budget; of equal times the fewest chunks.
// Depends on the shape only, so every run gives the same bits.
inline int64_t cuda_dbias2_chunks(const EvoformerShape& s) {
  const int64_t tiles = cuda_dbias2_tiles(s);
  const int64_t slots = kCudaDbias2Sms * cuda_dbias2_ctas_per_sm(cuda_evoformer_head_dim(s.dim));
  const int64_t per_chunk_bytes = s.batch * s.heads * s.len * s.len * 4;
  // More chunks than CTA slots cannot shorten the longest CTA further than the slots do.
  const int64_t max_chunks = std::max<int64_t>(
      1, std::min({s.n, slots, kCudaDbias2PartialBudget / std::max<int64_t>(per_chunk_bytes, 1)}));
  int64_t best = 1, best_time = -1;
  for (int64_t c = 1; c <= max_chunks; ++c) {
    const int64_t waves = (tiles * c + slots - 1) / slots;
    const int64_t time = waves * ((s.n + c - 1) / c + kCudaDbias2CtaCost);
    if (best_time < 0 || time < best_time) best = c, best_time = time;
  }
  return best;
}

// The fused backward (head dim 32 on the warpgroup MMA, evoformer_bwd_fused_wgmma_kernel.cuh): one
// CTA per (b, n, h) slice walks its key tiles in order, summing the slice's dQ in shared memory
// (L x 32 fp32); where that does not fit two CTAs in an SM, a cluster of two CTAs per slice, each
// over half the query tiles with half the dQ, their partial dK / dV added at the end of each key
// tile. Either way two CTAs per SM. The separate dK/dV and dQ kernels it replaces run their own
// counts (kEvoformerWgmma*Ctas).
constexpr int64_t kCudaFusedBackwardCtasPerSm = 2;
constexpr int64_t kCudaDkdvCtasPerSm = 3, kCudaDqCtasPerSm = 4;
// Modelled cost of a step (one query tile x one key tile) in quarters of a separate dK/dV step:
// the fused kernel's, and the separate dK/dV and dQ kernels' each.
constexpr int64_t kCudaFusedStepCost = 4, kCudaSeparateStepCost = 4;
// A two-CTA cluster's added cost per key tile (two cluster barriers, the partial sums' exchange),
// in the same quarters, fitted to the H200 at triangle 768, where the clusters pay off: fused
// kernel and delta 3.43 ms against the separate kernels' 3.60.
constexpr int64_t kCudaFusedClusterKeyTileCost = 2;

// Modelled time of the fused kernel on clusters of `ranks` CTAs per slice: its CTAs each walk
// tiles x ceil(tiles / ranks) steps in waves of the GPU's slots.
inline int64_t cuda_fused_backward_cost(const EvoformerShape& s, int64_t ranks) {
  const int64_t slices = s.batch * s.n * s.heads;
  const int64_t tiles = (s.len + kCudaEvoformerBlock - 1) / kCudaEvoformerBlock;
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t per_key_tile =
      ceil_div(tiles, ranks) * kCudaFusedStepCost + (ranks > 1 ? kCudaFusedClusterKeyTileCost : 0);
  return ceil_div(ranks * slices, kCudaDbias2Sms * kCudaFusedBackwardCtasPerSm) * tiles *
         per_key_tile;
}

// Modelled time of the separate dK/dV and dQ kernels: their CTAs walk one row of tiles each.
inline int64_t cuda_separate_backward_cost(const EvoformerShape& s) {
  const int64_t slices = s.batch * s.n * s.heads;
  const int64_t tiles = (s.len + kCudaEvoformerBlock - 1) / kCudaEvoformerBlock;
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  return (ceil_div(slices * tiles, kCudaDbias2Sms * kCudaDkdvCtasPerSm) +
          ceil_div(slices * tiles, kCudaDbias2Sms * kCudaDqCtasPerSm)) *
         tiles * kCudaSeparateStepCost;
}

// The fused kernel's CTAs per slice for a head dim 32 shape (D from 17 to 32), given whether two
// CTAs per SM fit with one CTA per slice and with two (fits[ranks - 1], from the shared memory):
// one where it fits, else two where that fits, provided the fused kernel is modelled faster than
// the separate ones; else 0 (the separate kernels). The fused kernel needs slices enough to fill
// the GPU: few long slices (large L, small N) keep the separate kernels, whose CTAs are per tile.
// Depends on the shape and the bias kinds only, so every run of a call takes the same kernels and
// gives the same bits. (Two CTAs per slice where one fits is slower: on the H200 a third CTA per
// SM, which half the dQ allows up to L = 256 with a 16-bit bias2 and 640 without, did not make up
// for the exchange when measured.)
inline int64_t cuda_fused_backward_ranks(const EvoformerShape& s, const bool (&fits)[2]) {
  if (cuda_evoformer_head_dim(s.dim) != 32 || s.batch * s.n * s.heads == 0 || s.len == 0) {
    return 0;
  }
  const int64_t ranks = fits[0] ? 1 : fits[1] ? 2 : 0;
  if (ranks == 0) return 0;
  return cuda_fused_backward_cost(s, ranks) < cuda_separate_backward_cost(s) ? ranks : 0;
}

// Shared memory of a fused kernel CTA in bytes, as the kernel lays it out
// (evoformer_bwd_fused_wgmma_kernel.cuh checks its layout against these at compile time): the key
// tile's K and V, `stages` buffers of the query tile's Q, dO, lse and delta, and dS^T
// (kCudaFusedTileSmem[stages - 2]); its share of the slice's dQ (8 KB for each of the
// ceil(tiles / ranks) query tiles it keeps); `stages` stages of bias2 (`bias2_stage_bytes` each,
// 0 without bias2); 1024 bytes for the base's rounding.
constexpr int64_t kCudaFusedTileSmem[2] = {33792, 43008};
constexpr int64_t kCudaSmemPerSm = 227 * 1024, kCudaSmemReservedPerCta = 1024;
inline int64_t cuda_fused_backward_smem(int64_t tiles, int64_t ranks, int64_t stages,
                                        int64_t bias2_stage_bytes) {
  return kCudaFusedTileSmem[stages - 2] + (tiles + ranks - 1) / ranks * 8192 +
         stages * bias2_stage_bytes + 1024;
}

// The fused kernel's plan for a call: CTAs per slice (cuda_fused_backward_ranks; 0: the separate
// kernels) and query-tile buffers: three (copies two steps ahead) where one CTA per slice still
// fits twice in an SM with them (L up to 320 with a 16-bit bias2, 512 without), else two.
struct CudaFusedBackwardPlan {
  int64_t ranks = 0, stages = 2;
};
inline CudaFusedBackwardPlan cuda_fused_backward_plan(const EvoformerShape& s,
                                                      int64_t bias2_stage_bytes) {
  const int64_t tiles = (s.len + kCudaEvoformerBlock - 1) / kCudaEvoformerBlock;
  const auto fits = [&](int64_t ranks, int64_t stages) {
    return kCudaFusedBackwardCtasPerSm *
               (cuda_fused_backward_smem(tiles, ranks, stages, bias2_stage_bytes) +
                kCudaSmemReservedPerCta) <=
           kCudaSmemPerSm;
  };
  const bool fit[2] = {fits(1, 2), fits(2, 2)};
  const int64_t ranks = cuda_fused_backward_ranks(s, fit);
  return {ranks, ranks == 1 && fits(1, 3) ? 3 : 2};
}

// Copies the tensor-core kernels read instead of an input, made in the workspace before the
// launch (CudaInputCopies), so that every tile takes the 16-byte copies.
//
// Biases: the kernels stage bias tiles with 16-byte copies, which needs every bias row to start on
// a 16-byte boundary: L a multiple of 8 for a 16-bit bias. A bias whose rows do not (most real
// lengths: AlphaFold runs at the protein's own residue count) is first copied with rows padded to
// a 16-byte multiple, `bias*_bytes` being its element size (0: no copy). The copy reads the bias
// once; the kernels then take their fast copies for every whole tile, where reading such a bias
// element by element made L = 300 2.6x slower than L = 320. bias1 [B, N, 1, 1, L] becomes
// [B, N, row], bias2 [B, 1, H, L, L] becomes [B, H, L, row].
//
// Q, K, V and dO: rows that are not whole aligned 16-byte chunks (D not a multiple of 8, or a
// tensor off a 16-byte boundary) are copied into packed [B, N, L, H, input_row] tensors
// (cuda_staged_row), the columns past D zeros. The kernels read the copies as they read a D that
// is a multiple of 8 (whole chunks), and write the outputs at D; reading such rows in 2-, 4- or
// 8-byte pieces in every tile made the kernels 2-3x slower than at the head dim (H200, [1, 256,
// 256, 4, D]), and a copy is one read and one write of the tensor. The copies make the workspace
// that much larger (about the size of the copied tensors).
enum CudaStagedInput { kStagedQ, kStagedK, kStagedV, kStagedDout, kStagedInputs };

struct CudaCopyNeeds {
  int64_t bias1_bytes = 0, bias2_bytes = 0;  // element size of each bias copy; 0: none
  unsigned inputs = 0;                       // bit i: input i of CudaStagedInput is copied
  int64_t input_bytes = 0;                   // the inputs' element size
};

struct CudaInputCopies {
  int64_t bias1_bytes = 0, bias2_bytes = 0;  // element size of each copy; 0: none
  int64_t bias1_row = 0, bias2_row = 0;      // elements per padded row
  size_t bias1 = 0, bias2 = 0;               // the copies' workspace regions
  int64_t input_bytes = 0;                   // element size of the staged inputs; 0: none staged
  int64_t input_row = 0;                     // elements per staged row: cuda_staged_row(D)
  bool staged[kStagedInputs] = {};
  size_t input[kStagedInputs] = {};  // the staged inputs' workspace regions
};

// Elements per row of a staged Q, K, V or dO of head dim D: D itself where it is a multiple of 8
// (only a tensor off its 16-byte boundary is staged then, beside others read in place in rows of
// D, and every copy a kernel reads must have the same row), else D rounded up to 16 (32 bytes of a
// 16-bit type: every row starts on a 32-byte sector of the L2), or to 8 below 8. Rows of 8 x odd
// elements (24, 40, ..., 120) start mid-sector every other row and mostly straddle two 128-byte
// lines: the kernels' 16-byte copies of them cost more L2 requests and bank conflicts than whole
// sectors do (H100, [1, 256, 256, 4, D], D 56 against D 64: forward 1.18x, dbias2 1.31x; D 48,
// whole sectors: 1.02x and 1.10x), more than the copy's extra zeros.
constexpr int64_t cuda_staged_row(int64_t dim) {
  return dim % 8 == 0 || dim < 8 ? (dim + 7) / 8 * 8 : (dim + 15) / 16 * 16;
}

// L rounded up to whole 16-byte chunks of `elem_bytes`-byte elements.
constexpr int64_t cuda_padded_bias_row(int64_t len, int64_t elem_bytes) {
  return (len * elem_bytes + 15) / 16 * 16 / elem_bytes;
}

inline CudaInputCopies plan_cuda_copies(const EvoformerShape& s, const CudaCopyNeeds& needs,
                                        WorkspaceLayout* layout) {
  CudaInputCopies c;
  if (needs.bias1_bytes > 0) {
    c.bias1_bytes = needs.bias1_bytes;
    c.bias1_row = cuda_padded_bias_row(s.len, needs.bias1_bytes);
    c.bias1 = layout->add<unsigned char>(s.batch * s.n * c.bias1_row * needs.bias1_bytes);
  }
  if (needs.bias2_bytes > 0) {
    c.bias2_bytes = needs.bias2_bytes;
    c.bias2_row = cuda_padded_bias_row(s.len, needs.bias2_bytes);
    c.bias2 =
        layout->add<unsigned char>(s.batch * s.heads * s.len * c.bias2_row * needs.bias2_bytes);
  }
  if (needs.inputs != 0 && needs.input_bytes > 0) {
    c.input_bytes = needs.input_bytes;
    c.input_row = cuda_staged_row(s.dim);
    for (int i = 0; i < kStagedInputs; ++i) {
      if ((needs.inputs >> i & 1u) == 0) continue;
      c.staged[i] = true;
      c.input[i] = layout->add<unsigned char>(s.batch * s.n * s.len * s.heads * c.input_row *
                                              needs.input_bytes);
    }
  }
  return c;
}

// The forward's workspace: only the copies (none for aligned inputs and biases).
struct CudaForwardWorkspace {
  WorkspaceLayout layout;
  CudaInputCopies copies;
};
inline CudaForwardWorkspace plan_cuda_forward(const EvoformerShape& s, const CudaCopyNeeds& needs) {
  CudaForwardWorkspace w;
  w.copies = plan_cuda_copies(s, needs, &w.layout);
  return w;
}

struct CudaBackwardWorkspace {
  WorkspaceLayout layout;
  size_t delta = 0, dbias1_partial = 0, dbias2_partial = 0;
  int64_t chunks = 1;  // dbias2 chunks; with one, the kernel writes dbias2 itself (no partial)
  CudaInputCopies copies;
};

// `tensor_cores` is false for fp32 inputs, whose kernels sum dbias2 over N in one pass.
// `needs`: as plan_cuda_copies (the copies follow the backward's own regions).
inline CudaBackwardWorkspace plan_cuda_backward(const EvoformerShape& s, bool dbias1, bool dbias2,
                                                bool tensor_cores,
                                                const CudaCopyNeeds& needs = {}) {
  CudaBackwardWorkspace w;
  w.chunks = dbias2 && tensor_cores ? cuda_dbias2_chunks(s) : 1;
  w.delta = w.layout.add<float>(s.batch * s.n * s.heads * s.len);
  if (dbias1) w.dbias1_partial = w.layout.add<float>(s.batch * s.n * s.heads * s.len);
  if (dbias2 && w.chunks > 1) {
    w.dbias2_partial = w.layout.add<float>(w.chunks * s.batch * s.heads * s.len * s.len);
  }
  w.copies = plan_cuda_copies(s, needs, &w.layout);
  return w;
}

}  // namespace sciattn::detail
