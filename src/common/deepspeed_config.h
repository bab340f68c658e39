// Reading the "sparse_attention" section of a DeepSpeed JSON config into a SparsityConfig
// (spec section 1.7). Host-only common layer; the public entry points are in block_sparse.h.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "sciattn/block_sparse.h"

namespace sciattn::detail {

// The keys DeepSpeed's JSON path knows (runtime/constants.py), in the order of its docs.
// DeepSpeed's documented example lists all of them whatever the mode, so a key of another mode
// is accepted (type-checked, then ignored as DeepSpeed does); any other key is an error.
inline constexpr std::string_view kDeepSpeedSparseKeys[] = {
    "mode",
    "block",
    "different_layout_per_head",
    "num_local_blocks",
    "num_global_blocks",
    "attention",
    "horizontal_global_attention",
    "num_different_global_patterns",
    "num_random_blocks",
    "local_window_blocks",
    "global_block_indices",
    "global_block_end_indices",
    "num_sliding_window_blocks",
};

// parse_deepspeed_sparsity_config and load_deepspeed_sparsity_config of the public API
// (src/block_sparse_layouts.cpp): the section (or a whole DeepSpeed config holding one) as text,
// or read from a file.
Status parse_deepspeed_sparsity_text(std::string_view json_text, int64_t num_heads, uint64_t seed,
                                     SparsityConfig* out);
Status load_deepspeed_sparsity_file(const std::string& path, int64_t num_heads, uint64_t seed,
                                    SparsityConfig* out);

}  // namespace sciattn::detail
