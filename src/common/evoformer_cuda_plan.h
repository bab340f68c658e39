// Host-side plan of the Evoformer CUDA kernels: which head dims are instantiated, how N is
// chunked for the deterministic dbias2 sum, and the backward's workspace regions. Host-only common
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
// Enough CTAs to fill the H200's 132 SMs twice.
constexpr int64_t kCudaTargetCtas = 2 * 132;
// The dbias2 partials may take at most this much memory (fp32, one [B, H, L, L] per chunk).
constexpr int64_t kCudaDbias2PartialBudget = int64_t{512} << 20;

// The padded head dim for D: the smallest of 16, 32, 64, 128 that holds it (0 if D > 128).
constexpr int64_t cuda_evoformer_head_dim(int64_t dim) {
  return dim <= 16 ? 16 : dim <= 32 ? 32 : dim <= 64 ? 64 : dim <= 128 ? 128 : 0;
}

// N is split into this many chunks for dbias2; depends on the shape only, so results are the same
// on every run. More chunks give more CTAs to the dK/dV kernel and cost one more fp32 [B, H, L, L]
// each.
inline int64_t cuda_dbias2_chunks(const EvoformerShape& s) {
  const int64_t key_blocks = (s.len + kCudaEvoformerBlock - 1) / kCudaEvoformerBlock;
  const int64_t base_ctas = key_blocks * s.heads * s.batch;
  int64_t chunks = std::min<int64_t>(s.n, (kCudaTargetCtas + base_ctas - 1) / base_ctas);
  const int64_t per_chunk_bytes = s.batch * s.heads * s.len * s.len * 4;
  while (chunks > 1 && chunks * per_chunk_bytes > kCudaDbias2PartialBudget) --chunks;
  return std::max<int64_t>(chunks, 1);
}

struct CudaBackwardWorkspace {
  WorkspaceLayout layout;
  size_t delta = 0, dbias1_partial = 0, dbias2_partial = 0;
  int64_t chunks = 1;
};

// Without dbias2 nothing is summed over N, so each n gets its own chunk (CTA).
inline CudaBackwardWorkspace plan_cuda_backward(const EvoformerShape& s, bool dbias1, bool dbias2) {
  CudaBackwardWorkspace w;
  w.chunks = dbias2 ? cuda_dbias2_chunks(s) : s.n;
  w.delta = w.layout.add<float>(s.batch * s.n * s.heads * s.len);
  if (dbias1) w.dbias1_partial = w.layout.add<float>(s.batch * s.n * s.heads * s.len);
  if (dbias2) w.dbias2_partial = w.layout.add<float>(w.chunks * s.batch * s.heads * s.len * s.len);
  return w;
}

}  // namespace sciattn::detail
