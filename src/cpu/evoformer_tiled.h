// The tiled, multithreaded CPU path of Evoformer attention: what users run on the CPU.
// CPU layer. Streams over key tiles with an online softmax; deterministic for any thread count.
#pragma once

#include <cstddef>

#include "common/evoformer_checks.h"
#include "sciattn/evoformer.h"

namespace sciattn::cpu {

// Threads a call will use: options.num_threads, or all hardware threads when it is 0.
int tiled_thread_count(const EvoformerOptions& options);

size_t tiled_forward_workspace_size(const EvoformerForwardParams& p,
                                    const detail::EvoformerShape& s);
size_t tiled_backward_workspace_size(const EvoformerBackwardParams& p,
                                     const detail::EvoformerShape& s);

void run_tiled_forward(const EvoformerForwardParams& p, const detail::EvoformerShape& s,
                       void* workspace);
void run_tiled_backward(const EvoformerBackwardParams& p, const detail::EvoformerShape& s,
                        void* workspace);

}  // namespace sciattn::cpu
