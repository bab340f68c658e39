// TensorView helpers: construction, element counts and printing. Host-only common layer.
#include "sciattn/tensor_view.h"

#include <algorithm>

namespace sciattn {
namespace {

TensorView make_view(const void* data, DType dtype, Device device,
                     std::initializer_list<int64_t> sizes, const int64_t* strides) {
  TensorView v;
  v.data = const_cast<void*>(data);  // views of inputs are only read; see evoformer.h
  v.dtype = dtype;
  v.device = device;
  // A rank above kMaxRank is recorded as such so that validation rejects it with a message.
  v.rank = static_cast<int>(sizes.size());
  int i = 0;
  for (int64_t s : sizes) {
    if (i >= TensorView::kMaxRank) break;
    v.sizes[i++] = s;
  }
  const int stored = std::min(v.rank, TensorView::kMaxRank);
  if (strides != nullptr) {
    for (int d = 0; d < stored; ++d) v.strides[d] = strides[d];
  } else {
    int64_t running = 1;
    for (int d = stored - 1; d >= 0; --d) {
      v.strides[d] = running;
      running *= std::max<int64_t>(v.sizes[d], 1);
    }
  }
  return v;
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < std::min(rank, kMaxRank); ++d) n *= sizes[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t running = 1;
  for (int d = std::min(rank, kMaxRank) - 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != running) return false;
    running *= sizes[d];
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < std::min(rank, kMaxRank); ++d) {
    if (d) s += ", ";
    s += std::to_string(sizes[d]);
  }
  if (rank > kMaxRank) s += ", ...";
  return s + "]";
}

TensorView TensorView::contiguous(const void* data, DType dtype,
                                  std::initializer_list<int64_t> sizes, Device device) {
  return make_view(data, dtype, device, sizes, nullptr);
}

TensorView TensorView::strided(const void* data, DType dtype, std::initializer_list<int64_t> sizes,
                               std::initializer_list<int64_t> strides, Device device) {
  int64_t st[kMaxRank] = {};
  int i = 0;
  for (int64_t s : strides) {
    if (i >= kMaxRank) break;
    st[i++] = s;
  }
  TensorView v = make_view(data, dtype, device, sizes, st);
  // Mismatched lists are recorded as rank -1, which every validator rejects.
  if (strides.size() != sizes.size()) v.rank = -1;
  return v;
}

}  // namespace sciattn
