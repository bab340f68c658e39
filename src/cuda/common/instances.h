// What a build instantiated of a kernel family, as types: the head dims and the dtypes of its
// per-instantiation .cu files. CMake writes one table per family from SCIATTN_HEAD_DIMS and
// SCIATTN_DTYPES (sciattn_cuda_instances in src/cuda/CMakeLists.txt, into the generated header
// cuda/<family>/<name>_instances.h), and both the checks (which calls this build can run, and
// what the message lists) and the dispatch (instance_switch.h) read it, so the two cannot
// disagree. CUDA layer; plain C++ (host code).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "sciattn/dtype.h"

namespace sciattn::cuda {

template <int... kDims>
struct HeadDims {};

template <DType... kTypes>
struct DTypes {};

template <typename Dims, typename Types>
struct Instances {
  using HeadDimList = Dims;
  using DTypeList = Types;
};

template <int... kDims>
constexpr bool contains(HeadDims<kDims...>, [[maybe_unused]] int64_t dim) {
  return ((dim == kDims) || ...);
}

template <DType... kTypes>
constexpr bool contains(DTypes<kTypes...>, [[maybe_unused]] DType dtype) {
  return ((dtype == kTypes) || ...);
}

// The smallest listed head dim that holds `dim` (the list ascending), 0 when none does.
template <int... kDims>
constexpr int64_t smallest_holding(HeadDims<kDims...>, int64_t dim) {
  for (const int listed : std::initializer_list<int>{kDims...}) {
    if (listed >= dim) return listed;
  }
  return 0;
}

// "32, 64" / "bf16" for the messages; "none" for an empty list.
template <int... kDims>
std::string list_names(HeadDims<kDims...>) {
  std::string names;
  ((names += (names.empty() ? "" : ", ") + std::to_string(kDims)), ...);
  return names.empty() ? "none" : names;
}

template <DType... kTypes>
std::string list_names(DTypes<kTypes...>) {
  std::string names;
  ((names += (names.empty() ? "" : ", ") + std::string(dtype_name(kTypes))), ...);
  return names.empty() ? "none" : names;
}

// Whether the table has the instantiation of (dtype, head dim).
template <typename Table>
constexpr bool has_instance(DType dtype, int64_t head_dim) {
  return contains(typename Table::DTypeList{}, dtype) &&
         contains(typename Table::HeadDimList{}, head_dim);
}

// "head dims 32 and dtypes bf16": what the table holds, for a message.
template <typename Table>
std::string describe_instances() {
  return "head dims " + list_names(typename Table::HeadDimList{}) + " and dtypes " +
         list_names(typename Table::DTypeList{});
}

}  // namespace sciattn::cuda
