// The Evoformer attention reference: plain, obviously correct loops, the specification every
// other path is tested against. CPU layer. Acc = float for users, double for tests.
#pragma once

#include <cstddef>

#include "common/evoformer_checks.h"
#include "sciattn/evoformer.h"

namespace sciattn::cpu {

// Forward in Acc precision into packed Acc buffers:
//   scores [B, N, H, L, L] (scratch), out [B, N, L, H, D], lse [B, N, H, L].
// A row whose keys are all masked gets out = 0 and lse = -inf.
template <typename Acc>
void reference_forward(const EvoformerForwardParams& p, const detail::EvoformerShape& s,
                       Acc* scores, Acc* out, Acc* lse);

// Backward in Acc precision. Recomputes the softmax itself (it reads neither p.out nor p.lse),
// so it is the exact gradient of reference_forward. Buffers, all packed:
//   probs, dscores [B, N, H, L, L] (scratch), dq, dk, dv [B, N, L, H, D],
//   dbias1 [B, N, L] and dbias2 [B, H, L, L] (always computed).
template <typename Acc>
void reference_backward(const EvoformerBackwardParams& p, const detail::EvoformerShape& s,
                        Acc* probs, Acc* dscores, Acc* dq, Acc* dk, Acc* dv, Acc* dbias1,
                        Acc* dbias2);

// The public kReference path: fp32 buffers carved from the workspace, then the outputs rounded
// into the caller's tensors.
size_t reference_forward_workspace_size(const detail::EvoformerShape& s);
size_t reference_backward_workspace_size(const detail::EvoformerShape& s);
void run_reference_forward(const EvoformerForwardParams& p, const detail::EvoformerShape& s,
                           void* workspace);
void run_reference_backward(const EvoformerBackwardParams& p, const detail::EvoformerShape& s,
                            void* workspace);

}  // namespace sciattn::cpu
