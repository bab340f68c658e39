// The CUDA back end of Evoformer attention as the op's dispatch point sees it: plain C++
// declarations (no CUDA headers), defined in src/cuda/evoformer/evoformer_dispatch.cu.
#pragma once

#include <cstddef>

#include "common/evoformer_checks.h"
#include "sciattn/evoformer.h"

namespace sciattn::cuda {

// Each function has an overload for the forward and one for the backward Params.

// What the kernels of this build accept beyond the common checks (dtype, head dim, grid size).
Status check_evoformer_cuda(const EvoformerForwardParams& p, const detail::EvoformerShape& s);
Status check_evoformer_cuda(const EvoformerBackwardParams& p, const detail::EvoformerShape& s);

// Device workspace bytes (exact: the launch carves the same layout); the forward needs none.
size_t evoformer_workspace_size_cuda(const EvoformerForwardParams& p,
                                     const detail::EvoformerShape& s);
size_t evoformer_workspace_size_cuda(const EvoformerBackwardParams& p,
                                     const detail::EvoformerShape& s);

// Queue the forward / backward on `stream`.
Status run_evoformer_cuda(const EvoformerForwardParams& p, const detail::EvoformerShape& s,
                          void* workspace, Stream stream);
Status run_evoformer_cuda(const EvoformerBackwardParams& p, const detail::EvoformerShape& s,
                          void* workspace, Stream stream);

}  // namespace sciattn::cuda
