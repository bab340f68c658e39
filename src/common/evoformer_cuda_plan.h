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
// The dbias2 kernel aims for this many CTAs (four per SM of the H200's 132) ...
constexpr int64_t kCudaDbias2TargetCtas = 4 * 132;
// ... but its per-chunk fp32 partials may take at most this much memory.
constexpr int64_t kCudaDbias2PartialBudget = int64_t{64} << 20;

// The padded head dim for D: the smallest of 8, 16, 32, 64, 128 that holds it (0 if D > 128).
constexpr int64_t cuda_evoformer_head_dim(int64_t dim) {
  return dim <= 8 ? 8 : dim <= 16 ? 16 : dim <= 32 ? 32 : dim <= 64 ? 64 : dim <= 128 ? 128 : 0;
}

// The dbias2 kernel owns one 64 x 64 tile of dbias2[b, h] per CTA and sums dS over N in order.
// When there are too few tiles to fill the GPU, N is split into chunks whose fp32 partials are
// added in a fixed order afterwards. Depends on the shape only, so every run gives the same bits.
inline int64_t cuda_dbias2_chunks(const EvoformerShape& s) {
  const int64_t blocks = (s.len + kCudaEvoformerBlock - 1) / kCudaEvoformerBlock;
  const int64_t tiles = blocks * blocks * s.heads * s.batch;
  int64_t chunks = std::min<int64_t>(s.n, (kCudaDbias2TargetCtas + tiles - 1) / tiles);
  const int64_t per_chunk_bytes = s.batch * s.heads * s.len * s.len * 4;
  while (chunks > 1 && chunks * per_chunk_bytes > kCudaDbias2PartialBudget) --chunks;
  return std::max<int64_t>(chunks, 1);
}

struct CudaBackwardWorkspace {
  WorkspaceLayout layout;
  size_t delta = 0, dbias1_partial = 0, dbias2_partial = 0;
  int64_t chunks = 1;  // dbias2 chunks; with one, the kernel writes dbias2 itself (no partial)
};

// `tensor_cores` is false for fp32 inputs, whose kernels sum dbias2 over N in one pass.
inline CudaBackwardWorkspace plan_cuda_backward(const EvoformerShape& s, bool dbias1, bool dbias2,
                                                bool tensor_cores) {
  CudaBackwardWorkspace w;
  w.chunks = dbias2 && tensor_cores ? cuda_dbias2_chunks(s) : 1;
  w.delta = w.layout.add<float>(s.batch * s.n * s.heads * s.len);
  if (dbias1) w.dbias1_partial = w.layout.add<float>(s.batch * s.n * s.heads * s.len);
  if (dbias2 && w.chunks > 1) {
    w.dbias2_partial = w.layout.add<float>(w.chunks * s.batch * s.heads * s.len * s.len);
  }
  return w;
}

}  // namespace sciattn::detail
