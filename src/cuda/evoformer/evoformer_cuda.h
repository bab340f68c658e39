// The CUDA back end of Evoformer attention as the op's dispatch point sees it: plain C++
// declarations (no CUDA headers), defined in src/cuda/evoformer/evoformer_dispatch.cu.
#pragma once

#include <cstddef>

#include "common/evoformer_checks.h"
#include "sciattn/evoformer.h"

namespace sciattn::cuda {

// What the kernels of this build accept beyond the common checks (dtype, head dim, grid size).
Status check_evoformer_forward_cuda(const EvoformerForwardParams& p,
                                    const detail::EvoformerShape& s);
Status check_evoformer_backward_cuda(const EvoformerBackwardParams& p,
                                     const detail::EvoformerShape& s);

size_t evoformer_backward_workspace_size_cuda(const EvoformerBackwardParams& p,
                                              const detail::EvoformerShape& s);

Status run_evoformer_forward_cuda(const EvoformerForwardParams& p, const detail::EvoformerShape& s,
                                  Stream stream);
Status run_evoformer_backward_cuda(const EvoformerBackwardParams& p,
                                   const detail::EvoformerShape& s, void* workspace, Stream stream);

}  // namespace sciattn::cuda
