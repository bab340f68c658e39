// Reusable argument checks on TensorViews that produce the messages every op returns.
// Host-only common layer: each check names the argument and says what would be accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn::detail {

// "[B, N, L, H, D] = [2, 4, 64, 8, 32]" for the messages.
std::string expected_shape_string(const char* symbolic, const std::vector<int64_t>& sizes);

// The byte range [lo, hi) a view can touch, computed with overflow checks.
struct ByteExtent {
  intptr_t lo = 0;
  intptr_t hi = 0;
};

// Checks for a view named `name`: present (a view of no elements may have a null pointer), rank
// and sizes equal `sizes` (printed with the symbolic shape `symbolic`), dtype among `dtypes`,
// device, unit stride on the last dim, and that the addressed range does not overflow int64.
// Returns ok or kInvalidArgument naming `name`.
Status check_tensor(const TensorView& t, const char* name, const char* symbolic,
                    const std::vector<int64_t>& sizes, std::initializer_list<DType> dtypes,
                    Device device);

// Outputs must not have two elements at one address (else threads would race on it).
Status check_non_overlapping(const TensorView& t, const char* name);

// The element offsets from t.data of the lowest and highest elements a view that already passed
// check_tensor reaches (any strides: the lowest is at or below 0): every element offset between
// them lies inside the memory that holds the view.
struct ElementExtent {
  int64_t lo = 0;
  int64_t hi = 0;
};
ElementExtent element_extent(const TensorView& t);

// The byte range touched by a view that already passed check_tensor.
ByteExtent byte_extent(const TensorView& t);

// An output must not share memory with any other tensor of the call.
Status check_disjoint(const TensorView& out, const char* out_name, const TensorView& other,
                      const char* other_name);

// The caller's workspace holds at least `needed` bytes (kWorkspaceTooSmall otherwise) and is not
// null when any are needed.
Status check_workspace(size_t needed, const void* workspace, size_t workspace_bytes);

// Multiplies positive sizes; false on int64 overflow.
bool checked_product(std::initializer_list<int64_t> factors, int64_t* result);

}  // namespace sciattn::detail
