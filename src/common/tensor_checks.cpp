// Reusable argument checks on TensorViews (see tensor_checks.h). Host-only common layer.
#include "common/tensor_checks.h"

#include <algorithm>
#include <limits>

namespace sciattn::detail {
namespace {

std::string join_sizes(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + "]";
}

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  size_t i = 0;
  for (DType t : dtypes) {
    if (i > 0) s += (i + 1 == dtypes.size()) ? " or " : ", ";
    s += dtype_name(t);
    ++i;
  }
  return s;
}

bool mul_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool add_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

}  // namespace

std::string expected_shape_string(const char* symbolic, const std::vector<int64_t>& sizes) {
  return std::string(symbolic) + " = " + join_sizes(sizes);
}

bool checked_product(std::initializer_list<int64_t> factors, int64_t* result) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f < 0 || mul_overflows(p, f, &p)) return false;
  }
  *result = p;
  return true;
}

Status check_tensor(const TensorView& t, const char* name, const char* symbolic,
                    const std::vector<int64_t>& sizes, std::initializer_list<DType> dtypes,
                    Device device) {
  const std::string n = name;
  const int rank = static_cast<int>(sizes.size());
  // A tensor without elements (a sparse tensor of a layout without blocks) needs no memory, so a
  // null pointer is a valid view of it; its rank and sizes are still checked below.
  const bool empty = std::find(sizes.begin(), sizes.end(), int64_t{0}) != sizes.end();
  if (t.data == nullptr && !(empty && t.rank == rank)) {
    return Status::invalid_argument(n + " is required but is a null pointer");
  }
  if (t.rank != rank) {
    return Status::invalid_argument(
        n + " must have rank " + std::to_string(rank) + " " + symbolic + "; got rank " +
        std::to_string(t.rank) + (t.rank < 0 ? " (sizes and strides of different lengths)" : ""));
  }
  for (int d = 0; d < rank; ++d) {
    if (t.sizes[d] != sizes[d]) {
      return Status::invalid_argument(n + " must have shape " +
                                      expected_shape_string(symbolic, sizes) + "; got " +
                                      t.shape_string());
    }
  }
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    return Status::invalid_argument(n + " must have dtype " + dtype_list(dtypes) + "; got " +
                                    dtype_name(t.dtype));
  }
  if (t.device != device) {
    return Status::invalid_argument(n + " is on " + device_name(t.device) +
                                    " but the other tensors are on " + device_name(device) +
                                    "; all tensors of a call must be on one device");
  }
  if (rank > 0 && t.sizes[rank - 1] > 1 && t.strides[rank - 1] != 1) {
    return Status::invalid_argument(n + " must have stride 1 on its last dimension; got stride " +
                                    std::to_string(t.strides[rank - 1]));
  }
  // The furthest element, in bytes, must be addressable without int64 overflow.
  int64_t span = 0;
  for (int d = 0; d < rank; ++d) {
    int64_t term = 0;
    const int64_t stride = t.strides[d];
    if (stride == std::numeric_limits<int64_t>::min() ||
        mul_overflows(t.sizes[d] - 1, stride < 0 ? -stride : stride, &term) ||
        add_overflows(span, term, &span)) {
      return Status::invalid_argument(n + " addresses more memory than int64 can index (sizes " +
                                      t.shape_string() + " times its strides overflow)");
    }
  }
  int64_t bytes = 0;
  if (add_overflows(span, 1, &bytes) ||
      mul_overflows(bytes, static_cast<int64_t>(dtype_size(t.dtype)), &bytes)) {
    return Status::invalid_argument(n + " addresses more memory than int64 can index (sizes " +
                                    t.shape_string() + " times its strides overflow)");
  }
  return Status::ok_status();
}

Status check_workspace(size_t needed, const void* workspace, size_t workspace_bytes) {
  if (workspace_bytes < needed) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  "workspace has " + std::to_string(workspace_bytes) +
                      " bytes but this call needs " + std::to_string(needed) +
                      " (ask workspace_size())");
  }
  if (needed > 0 && workspace == nullptr) {
    return Status::invalid_argument("workspace is a null pointer but this call needs " +
                                    std::to_string(needed) + " bytes");
  }
  return Status::ok_status();
}

Status check_non_overlapping(const TensorView& t, const char* name) {
  if (t.numel() == 0) return Status::ok_status();  // no element, no shared address
  // Sort the dimensions that have more than one element by |stride|; the tensor has no two
  // elements at one address when each stride exceeds the extent of all smaller dimensions.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
  for (int d = 0; d < t.rank; ++d) {
    if (t.sizes[d] > 1)
      dims.emplace_back(t.strides[d] < 0 ? -t.strides[d] : t.strides[d], t.sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements spanned by the dimensions seen so far
  for (const auto& [stride, size] : dims) {
    if (stride < extent) {
      return Status::invalid_argument(std::string(name) +
                                      " is an output but its strides make two elements share "
                                      "one address (e.g. a zero stride); give it distinct memory");
    }
    extent = stride * (size - 1) + extent;
  }
  return Status::ok_status();
}

ElementExtent element_extent(const TensorView& t) {
  ElementExtent e;
  for (int d = 0; d < t.rank; ++d) {
    const int64_t reach = (t.sizes[d] - 1) * t.strides[d];
    if (reach < 0)
      e.lo += reach;
    else
      e.hi += reach;
  }
  return e;
}

ByteExtent byte_extent(const TensorView& t) {
  const ElementExtent e = element_extent(t);
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  const intptr_t base = reinterpret_cast<intptr_t>(t.data);
  return {base + static_cast<intptr_t>(e.lo * es), base + static_cast<intptr_t>((e.hi + 1) * es)};
}

Status check_disjoint(const TensorView& out, const char* out_name, const TensorView& other,
                      const char* other_name) {
  if (!out.present() || !other.present() || out.device != other.device || out.numel() == 0 ||
      other.numel() == 0) {
    return Status::ok_status();
  }
  const ByteExtent a = byte_extent(out), b = byte_extent(other);
  if (a.lo < b.hi && b.lo < a.hi) {
    return Status::invalid_argument(std::string(out_name) + " overlaps " + other_name +
                                    " in memory; outputs must not share memory with any other "
                                    "tensor of the call");
  }
  return Status::ok_status();
}

}  // namespace sciattn::detail
