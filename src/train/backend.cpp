// What the back ends of the trainer share beyond the interface (backend.h): the argument checks of
// strided_copy, of packed tensors and of attention calls (backend_checks.h), so that the CPU and
// CUDA back ends refuse the same views with the same words. Trainer layer (host code).
#include "sciattn/train/backend.h"

#include <string>

#include "train/backend_checks.h"

namespace sciattn::train {

Status check_strided_copy(const StridedCopyParams& p, Device device, const char* memory) {
  const TensorView &src = p.src, &dst = p.dst;
  if (src.data == nullptr || dst.data == nullptr) {
    return Status::invalid_argument("strided_copy: src and dst must be present");
  }
  if (src.device != device || dst.device != device) {
    return Status::invalid_argument(std::string("strided_copy: src and dst must be in ") + memory);
  }
  bool same = src.rank == dst.rank && src.rank >= 1 && src.rank <= TensorView::kMaxRank &&
              src.dtype == dst.dtype;
  for (int d = 0; same && d < src.rank; ++d) same = src.sizes[d] == dst.sizes[d];
  if (!same) {
    return Status::invalid_argument(std::string("strided_copy: dst must have src's sizes and "
                                                "dtype (rank 1 to 6); got src ") +
                                    src.shape_string() + " " + dtype_name(src.dtype) + ", dst " +
                                    dst.shape_string() + " " + dtype_name(dst.dtype));
  }
  return Status::ok_status();
}

std::string shape_list(std::initializer_list<int64_t> sizes) {
  std::string s = "[";
  bool first = true;
  for (int64_t v : sizes) {
    s += (first ? "" : ", ") + std::to_string(v);
    first = false;
  }
  return s + "]";
}

Status check_packed(const char* call, const TensorView& t, const char* name, const TensorRule& rule,
                    std::initializer_list<int64_t> sizes) {
  // The message is formed only for a failure (checks run several times per layer call).
  auto refuse = [&](const std::string& what) {
    return Status::invalid_argument(std::string(call) + ": " + name + " " + what);
  };
  if (t.data == nullptr) return refuse("is missing");
  if (t.device != rule.device) return refuse(std::string("must be in ") + rule.memory);
  if (t.dtype != rule.dtype) {
    return refuse(std::string("must be ") + dtype_name(rule.dtype) + rule.context + "; got " +
                  dtype_name(t.dtype));
  }
  bool same = t.rank == static_cast<int>(sizes.size());
  int d = 0;
  for (int64_t v : sizes) {
    if (same && t.sizes[d] != v) same = false;
    ++d;
  }
  if (!same) return refuse("must have shape " + shape_list(sizes) + "; got " + t.shape_string());
  if (!t.is_contiguous()) return refuse("must be packed (row-major)");
  return Status::ok_status();
}

Status attention_shape(const char* call, const BlockSparseIndex* index, const TensorView& qkv,
                       AttentionShape* s) {
  if (index == nullptr) return Status::invalid_argument(std::string(call) + ": index missing");
  if (qkv.rank != 5 || qkv.sizes[2] != 3) {
    return Status::invalid_argument(
        std::string(call) + ": qkv must have shape [B, L, 3, H, D]; got " + qkv.shape_string());
  }
  s->B = qkv.sizes[0];
  s->L = qkv.sizes[1];
  s->H = qkv.sizes[3];
  s->D = qkv.sizes[4];
  s->C = s->H * s->D;
  s->Lp = index->num_row_blocks * index->block;
  if (index->num_heads != s->H || index->num_col_blocks != index->num_row_blocks || s->Lp < s->L ||
      s->Lp - s->L >= index->block) {
    return Status::invalid_argument(
        std::string(call) + ": the index (" + std::to_string(index->num_heads) + " heads, " +
        std::to_string(index->num_row_blocks) + " x " + std::to_string(index->num_col_blocks) +
        " blocks of " + std::to_string(index->block) + ") does not fit " + std::to_string(s->H) +
        " heads and length " + std::to_string(s->L));
  }
  return Status::ok_status();
}

}  // namespace sciattn::train
