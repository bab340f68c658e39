// The host plan of the Evoformer CUDA backward (common/evoformer_cuda_plan.h): how the dbias2
// kernel's sum over N is chunked and what the workspace holds. Host-only, so it runs on the CPU
// machines; the kernels that follow the plan are tested on the GPU (tests/cuda).
#include <gtest/gtest.h>

#include <cstdint>

#include "common/evoformer_cuda_plan.h"

namespace sciattn::detail {
namespace {

EvoformerShape shape(int64_t batch, int64_t n, int64_t len, int64_t heads, int64_t dim) {
  return {batch, n, len, heads, dim};
}

// The kernel's modelled time for `chunks`: waves of CTAs times the n each CTA walks plus its
// fixed cost.
int64_t modelled_time(const EvoformerShape& s, int64_t chunks) {
  const int64_t slots = kCudaDbias2Sms * cuda_dbias2_ctas_per_sm(cuda_evoformer_head_dim(s.dim));
  const int64_t waves = (cuda_dbias2_tiles(s) * chunks + slots - 1) / slots;
  return waves * ((s.n + chunks - 1) / chunks + kCudaDbias2CtaCost);
}

int64_t partial_bytes(const EvoformerShape& s, int64_t chunks) {
  return chunks * s.batch * s.heads * s.len * s.len * 4;
}

TEST(EvoformerCudaPlan, TileRowsFollowTheHeadDim) {
  EXPECT_EQ(cuda_dbias2_rows(8), 128);
  EXPECT_EQ(cuda_dbias2_rows(32), 128);
  EXPECT_EQ(cuda_dbias2_rows(64), 128);
  EXPECT_EQ(cuda_dbias2_rows(128), 64);
  // triangle [1, 384, 384, 4, 32]: 3 query blocks of 128 x 6 key blocks of 64, 4 heads.
  EXPECT_EQ(cuda_dbias2_tiles(shape(1, 384, 384, 4, 32)), 3 * 6 * 4);
  // D = 24 is padded to 32, D = 40 to 64; D = 96 to 128 (64-row tiles); L = 1 is one tile.
  EXPECT_EQ(cuda_dbias2_tiles(shape(2, 5, 300, 3, 24)), 2 * 3 * 5 * 3);
  EXPECT_EQ(cuda_dbias2_tiles(shape(2, 5, 300, 3, 40)), 2 * 3 * 5 * 3);
  EXPECT_EQ(cuda_dbias2_tiles(shape(2, 5, 300, 3, 96)), 2 * 3 * 5 * 5);
  EXPECT_EQ(cuda_dbias2_tiles(shape(1, 1, 1, 1, 8)), 1);
}

// On the shapes of PERFORMANCE.md (and a few edges) the chunk count is feasible, within the
// partials' budget, and no feasible count has a shorter modelled time.
TEST(EvoformerCudaPlan, ChunksAreFeasibleAndBest) {
  const EvoformerShape shapes[] = {
      shape(1, 256, 256, 4, 32), shape(1, 512, 256, 8, 32), shape(1, 256, 512, 8, 32),
      shape(1, 384, 384, 4, 32), shape(1, 768, 768, 4, 32), shape(1, 1024, 256, 8, 8),
      shape(1, 256, 256, 4, 64), shape(2, 3, 17, 2, 128),   shape(1, 1, 1, 1, 8),
      shape(1, 70000, 1, 1, 16), shape(3, 40, 1500, 4, 32),
  };
  for (const EvoformerShape& s : shapes) {
    SCOPED_TRACE("N " + std::to_string(s.n) + " L " + std::to_string(s.len) + " D " +
                 std::to_string(s.dim));
    const int64_t chunks = cuda_dbias2_chunks(s);
    ASSERT_GE(chunks, 1);
    ASSERT_LE(chunks, s.n);
    if (chunks > 1) {
      EXPECT_LE(partial_bytes(s, chunks), kCudaDbias2PartialBudget);
    }
    const int64_t slots = kCudaDbias2Sms * cuda_dbias2_ctas_per_sm(cuda_evoformer_head_dim(s.dim));
    for (int64_t c = 1; c <= s.n && c <= 4 * slots; ++c) {
      if (c > 1 && partial_bytes(s, c) > kCudaDbias2PartialBudget) break;
      EXPECT_LE(modelled_time(s, chunks), modelled_time(s, c))
          << "chunks " << chunks << " vs " << c;
    }
  }
}

// The headline shape, worked by hand: 72 tiles, 264 CTA slots (2 per SM), N = 384. One chunk
// per tile would leave 73% of the GPU idle; 11 chunks give 792 CTAs, three full waves of 35 n
// (modelled 3 x (35 + 4) = 117 against 132 for 3 chunks, one 82%-full wave of 128 n).
TEST(EvoformerCudaPlan, HeadlineTriangleShape) {
  const EvoformerShape s = shape(1, 384, 384, 4, 32);
  EXPECT_EQ(cuda_dbias2_chunks(s), 11);
  EXPECT_EQ(modelled_time(s, 11), 117);
  EXPECT_EQ(modelled_time(s, 3), 132);
}

// Head dim 64 [1, 256, 256, 4, 64]: 32 tiles of 128 x 64, 132 slots (1 per SM). 37 chunks of 7 n
// (nine waves) would tie four of 64 n (one wave) but for the CTA's fixed cost: 9 x 11 = 99
// against 68.
TEST(EvoformerCudaPlan, FixedCostPerCtaKeepsChunksLong) {
  const EvoformerShape s = shape(1, 256, 256, 4, 64);
  EXPECT_EQ(cuda_dbias2_tiles(s), 32);
  EXPECT_EQ(cuda_dbias2_chunks(s), 4);
  EXPECT_EQ(modelled_time(s, 4), 68);
  EXPECT_EQ(modelled_time(s, 37), 99);
}

TEST(EvoformerCudaPlan, WorkspaceHoldsThePartialsOnlyWhenChunked) {
  const EvoformerShape s = shape(1, 384, 384, 4, 32);
  const CudaBackwardWorkspace chunked = plan_cuda_backward(s, true, true, true);
  EXPECT_EQ(chunked.chunks, cuda_dbias2_chunks(s));
  ASSERT_GT(chunked.chunks, 1);
  EXPECT_GT(chunked.dbias2_partial, 0u);
  const CudaBackwardWorkspace no_dbias2 = plan_cuda_backward(s, true, false, true);
  EXPECT_EQ(no_dbias2.chunks, 1);
  EXPECT_LT(no_dbias2.layout.used_bytes(), chunked.layout.used_bytes());
  EXPECT_GE(chunked.layout.used_bytes() - no_dbias2.layout.used_bytes(),
            static_cast<size_t>(partial_bytes(s, chunked.chunks)));
  // fp32 inputs sum dbias2 over N in one pass: no partials.
  EXPECT_EQ(plan_cuda_backward(s, true, true, false).chunks, 1);
  // A shape whose single partial exceeds the budget is never chunked.
  const EvoformerShape big = shape(1, 8, 4096, 8, 32);
  EXPECT_EQ(cuda_dbias2_chunks(big), 1);
}

// The fused dK/dV/dQ kernel (head dim 32 on the warpgroup MMA) is modelled faster on the head dim
// 32 shapes of PERFORMANCE.md, whose slices fill the GPU many times over; a few long slices keep
// the per-tile kernels, as does every other head dim. Clusters of two CTAs per slice only where
// one CTA's dQ does not fit two CTAs in an SM.
TEST(EvoformerCudaPlan, FusedBackwardWhereSlicesFillTheGpu) {
  for (const EvoformerShape& s : {shape(1, 256, 256, 4, 32), shape(1, 512, 256, 8, 32),
                                  shape(1, 256, 512, 8, 32), shape(1, 384, 384, 4, 32)}) {
    SCOPED_TRACE("N " + std::to_string(s.n) + " L " + std::to_string(s.len));
    EXPECT_EQ(cuda_fused_backward_ranks(s, {true, true}), 1);
  }
  // Triangle 768: one CTA's 96 KB of dQ does not fit twice, half of it does.
  EXPECT_EQ(cuda_fused_backward_ranks(shape(1, 768, 768, 4, 32), {false, true}), 2);
  // Neither fits twice: the separate kernels.
  EXPECT_EQ(cuda_fused_backward_ranks(shape(1, 768, 768, 4, 32), {false, false}), 0);
  // Four slices of 64 tiles: four CTAs against the separate kernels' 256 each.
  EXPECT_EQ(cuda_fused_backward_ranks(shape(1, 1, 4096, 4, 32), {true, true}), 0);
  // One short slice: one CTA either way, and the fused one skips the dQ kernel.
  EXPECT_EQ(cuda_fused_backward_ranks(shape(1, 1, 17, 1, 32), {true, true}), 1);
  for (int64_t dim : {8, 16, 40, 64, 128}) {
    EXPECT_EQ(cuda_fused_backward_ranks(shape(1, 384, 384, 4, dim), {true, true}), 0) << dim;
  }
  // The warpgroup backward of a D padded to 32 (D from 17, PaddedDimTypes) plans as 32 does.
  EXPECT_EQ(cuda_fused_backward_ranks(shape(1, 384, 384, 4, 24), {true, true}), 1);
  // Triangle 384 worked by hand: 1536 slices over 264 slots, 6 waves of 6 x 6 steps (216),
  // against 9216 tiles over 396 and 528 slots, 24 + 18 waves of 6 steps (252).
  const EvoformerShape tri384 = shape(1, 384, 384, 4, 32);
  EXPECT_EQ(cuda_fused_backward_cost(tri384, 1), 6 * 6 * 6 * kCudaFusedStepCost);
  EXPECT_EQ(cuda_separate_backward_cost(tri384), 42 * 6 * kCudaSeparateStepCost);
  // Triangle 768 on clusters of two: 6144 CTAs over 264 slots, 24 waves of 12 key tiles of 6
  // steps and an exchange, against 36864 tiles over 396 and 528 slots, 94 + 70 waves of 12 steps.
  const EvoformerShape tri768 = shape(1, 768, 768, 4, 32);
  EXPECT_EQ(cuda_fused_backward_cost(tri768, 2),
            24 * 12 * (6 * kCudaFusedStepCost + kCudaFusedClusterKeyTileCost));
  EXPECT_EQ(cuda_separate_backward_cost(tri768), 164 * 12 * kCudaSeparateStepCost);
}

// The fused kernel's plan from its shared memory (cuda_fused_backward_smem, the kernel's layout):
// one CTA per slice up to L 448 with a 16-bit bias2 and 576 without, clusters of two beyond,
// three query-tile buffers up to L 320 with a 16-bit bias2 and 512 without (an fp32 bias2's
// stages are twice as large: two buffers even at L 256).
TEST(EvoformerCudaPlan, FusedBackwardSharedMemoryDecidesRanksAndStages) {
  constexpr int64_t k16BitStage = 64 * (64 * 2 + 16), kF32Stage = 64 * (64 * 4 + 16);
  // Many slices, so that the wave model takes the fused kernel wherever it fits.
  const auto plan = [](int64_t len, int64_t stage) {
    return cuda_fused_backward_plan(shape(1, 1024, len, 4, 32), stage);
  };
  struct Expected {
    int64_t len, stage, ranks, stages;
  };
  for (const Expected& e : {Expected{256, k16BitStage, 1, 3}, Expected{320, k16BitStage, 1, 3},
                            Expected{384, k16BitStage, 1, 2}, Expected{448, k16BitStage, 1, 2},
                            Expected{512, k16BitStage, 2, 2}, Expected{768, k16BitStage, 2, 2},
                            Expected{512, 0, 1, 3}, Expected{576, 0, 1, 2}, Expected{640, 0, 2, 2},
                            Expected{256, kF32Stage, 1, 2}, Expected{320, kF32Stage, 1, 2}}) {
    SCOPED_TRACE("L " + std::to_string(e.len) + ", bias2 stage " + std::to_string(e.stage));
    const CudaFusedBackwardPlan p = plan(e.len, e.stage);
    EXPECT_EQ(p.ranks, e.ranks);
    EXPECT_EQ(p.stages, e.stages);
  }
  // The separate kernels: no fused plan, and its stages stay the default.
  EXPECT_EQ(cuda_fused_backward_plan(shape(1, 384, 384, 4, 64), k16BitStage).ranks, 0);
  // Worked by hand: triangle 256 with three buffers, 43,008 + 4 x 8,192 + 3 x 9,216 + 1,024.
  EXPECT_EQ(cuda_fused_backward_smem(4, 1, 3, k16BitStage), 104448);
  // Two such CTAs and their reserved 1 KB each must fit 227 KB.
  EXPECT_LE(2 * (cuda_fused_backward_smem(5, 1, 3, k16BitStage) + 1024), 227 * 1024);
  EXPECT_GT(2 * (cuda_fused_backward_smem(6, 1, 3, k16BitStage) + 1024), 227 * 1024);
}

}  // namespace
}  // namespace sciattn::detail
