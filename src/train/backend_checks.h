// The argument checks the trainer's CPU and CUDA back ends share (beyond check_strided_copy in
// backend.h), so that both refuse the same views with the same words: a packed tensor of given
// sizes in the back end's memory and dtype, and the geometry of an attention call. Trainer layer
// (host code), internal.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "sciattn/block_sparse_ops.h"
#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn::train {

// "[2, 3, 4]".
std::string shape_list(std::initializer_list<int64_t> sizes);

// What a back end requires of a tensor argument: where it lives and its dtype, with the words that
// name them in a message ("<call>: <name> must be in <memory>", "... must be <dtype><context>;
// got <dtype>"). The words are the caller's and must outlive the check; nothing is formatted
// unless the check fails.
struct TensorRule {
  Device device;
  const char* memory;  // "host memory for the CPU back end"
  DType dtype;
  const char* context;  // " on the CPU back end"
};

// A tensor that is present, obeys `rule`, has exactly `sizes` and is packed (row-major); the
// first failure is reported, naming `call` and `name`.
Status check_packed(const char* call, const TensorView& t, const char* name, const TensorRule& rule,
                    std::initializer_list<int64_t> sizes);

// Sizes of an attention call on packed qkv [B, L, 3, H, D] (C = H D); Lp is the index's padded
// length (rows past L are padding).
struct AttentionShape {
  int64_t B = 0, L = 0, Lp = 0, H = 0, D = 0, C = 0;
  bool padded() const { return Lp != L; }
};

// Reads the shape from qkv and checks the index against it (its heads, square, Lp - L below one
// block); qkv's rank and third size are checked here, its memory, dtype and packing by the caller.
Status attention_shape(const char* call, const BlockSparseIndex* index, const TensorView& qkv,
                       AttentionShape* s);

}  // namespace sciattn::train
