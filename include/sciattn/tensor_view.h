// TensorView: a non-owning view of a strided tensor, the only tensor type in the public API.
// Public API layer (plain C++17). Strides are in elements, not bytes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "sciattn/device.h"
#include "sciattn/dtype.h"

namespace sciattn {

struct TensorView {
  static constexpr int kMaxRank = 6;

  void* data = nullptr;  // nullptr means "absent" for optional tensors
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int rank = 0;
  int64_t sizes[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};  // in elements; may be any value, including 0 (broadcast)

  bool present() const { return data != nullptr; }
  int64_t numel() const;
  // True when the strides are those of a packed row-major tensor of these sizes.
  bool is_contiguous() const;
  // "[2, 4, 64, 8, 32]"; the sizes only.
  std::string shape_string() const;

  // A packed row-major view of `data` with the given sizes.
  static TensorView contiguous(const void* data, DType dtype, std::initializer_list<int64_t> sizes,
                               Device device = Device::kCpu);
  // A view with explicit sizes and strides (both of the same length).
  static TensorView strided(const void* data, DType dtype, std::initializer_list<int64_t> sizes,
                            std::initializer_list<int64_t> strides, Device device = Device::kCpu);
};

}  // namespace sciattn
