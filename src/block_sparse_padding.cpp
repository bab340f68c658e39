// The public padding helpers of the block-sparse ops: pad a sequence to a whole number of blocks,
// build the key padding mask of the padded tail, and cut the output back. Host functions on CPU
// tensors; the entry point of each.
#include <cmath>
#include <limits>

#include "common/block_sparse_checks.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn {

int64_t block_pad_length(int64_t seq_len, int64_t block) {
  if (block < 1 || seq_len < 0) return 0;
  return (block - seq_len % block) % block;
}

namespace {

// Calls f(dst_offset, index) for every element of a view, index being its multi-index.
template <typename F>
void for_each_index(const TensorView& t, F&& f) {
  int64_t idx[TensorView::kMaxRank] = {};
  const int64_t n = t.numel();
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, offset = 0;
    for (int d = t.rank - 1; d >= 0; --d) {
      idx[d] = rest % t.sizes[d];
      rest /= t.sizes[d];
      offset += idx[d] * t.strides[d];
    }
    f(offset, idx);
  }
}

int64_t offset_of(const TensorView& t, const int64_t* idx) {
  int64_t offset = 0;
  for (int d = 0; d < t.rank; ++d) offset += idx[d] * t.strides[d];
  return offset;
}

}  // namespace

Status pad_to_block_size(const TensorView& src, int dim, int64_t block, double pad_value,
                         const TensorView& dst) {
  Status status = detail::check_pad(src, dim, block, dst);
  if (!status.ok()) return status;
  const int64_t len = src.sizes[dim];
  const auto pad = static_cast<float>(pad_value);
  // Every value converts through float exactly (the 16-bit formats and bool are subsets of it).
  for_each_index(dst, [&](int64_t dst_offset, const int64_t* idx) {
    const float v = idx[dim] < len ? load_as_float(src.data, src.dtype, offset_of(src, idx)) : pad;
    store_from_float(dst.data, dst.dtype, dst_offset, v);
  });
  return Status::ok_status();
}

Status padding_key_mask(int64_t valid_len, MaskMode mode, const TensorView& dst) {
  Status status = detail::check_padding_key_mask(valid_len, mode, dst);
  if (!status.ok()) return status;
  // keep / remove in the mask's own terms (spec 2.3): a bool mask is true / false whatever the
  // mode; kAdd adds 0 / -inf; kMul keeps any non-zero value and removes 0.
  float keep = 1.0f, remove = 0.0f;
  if (dst.dtype != DType::kBool && mode == MaskMode::kAdd) {
    keep = 0.0f;
    remove = -std::numeric_limits<float>::infinity();
  }
  for_each_index(dst, [&](int64_t offset, const int64_t* idx) {
    store_from_float(dst.data, dst.dtype, offset, idx[1] < valid_len ? keep : remove);
  });
  return Status::ok_status();
}

Status unpad_sequence_output(const TensorView& src, int dim, const TensorView& dst) {
  Status status = detail::check_unpad(src, dim, dst);
  if (!status.ok()) return status;
  for_each_index(dst, [&](int64_t dst_offset, const int64_t* idx) {
    store_from_float(dst.data, dst.dtype, dst_offset,
                     load_as_float(src.data, src.dtype, offset_of(src, idx)));
  });
  return Status::ok_status();
}

}  // namespace sciattn
