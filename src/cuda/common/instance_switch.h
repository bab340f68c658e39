// The static switch of a kernel family's dispatch: the call's runtime (dtype, head dim) become the
// template arguments of the one instantiation that runs it, found in the family's table of what
// this build instantiated (instances.h). Each listed pair is one branch; a pair the build does not
// have is never named, so nothing links against a missing instantiation. CUDA layer (host code of
// the dispatch files; needs the CUDA element types).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/instances.h"
#include "sciattn/dtype.h"

namespace sciattn::cuda {

// The CUDA element type of a 16-bit dtype.
template <DType kType>
struct CudaElement;
template <>
struct CudaElement<DType::kF16> {
  using type = __half;
};
template <>
struct CudaElement<DType::kBF16> {
  using type = __nv_bfloat16;
};

// A type as a value, for generic lambdas: decltype(tag)::type.
template <typename T>
struct TypeTag {
  using type = T;
};

namespace switch_detail {

// The branches of one dtype: its element type T with each listed head dim.
template <typename T, typename Result, typename Fn, int... kDims>
bool run_head_dim(HeadDims<kDims...>, [[maybe_unused]] int64_t head_dim,
                  [[maybe_unused]] Result* result, [[maybe_unused]] const Fn& fn) {
  return ((head_dim == kDims &&
           (*result = fn(TypeTag<T>{}, std::integral_constant<int, kDims>{}), true)) ||
          ...);
}

// The branches of every listed dtype.
template <typename Dims, typename Result, typename Fn, DType... kTypes>
bool run_dtype(DTypes<kTypes...>, [[maybe_unused]] DType dtype, [[maybe_unused]] int64_t head_dim,
               [[maybe_unused]] Result* result, [[maybe_unused]] const Fn& fn) {
  return ((dtype == kTypes &&
           run_head_dim<typename CudaElement<kTypes>::type>(Dims{}, head_dim, result, fn)) ||
          ...);
}

}  // namespace switch_detail

// Calls fn(TypeTag<T>{}, std::integral_constant<int, kHeadDim>{}) for the instantiation of
// `Table` (an Instances<HeadDims<...>, DTypes<...>>) whose dtype is `dtype` and head dim
// `head_dim`, and returns its result; returns `missing` when the table has no such instantiation
// (the family's checks refuse those calls before any launch).
template <typename Table, typename Result, typename Fn>
Result with_instance(DType dtype, int64_t head_dim, Result missing, const Fn& fn) {
  Result result = missing;
  switch_detail::run_dtype<typename Table::HeadDimList>(typename Table::DTypeList{}, dtype,
                                                        head_dim, &result, fn);
  return result;
}

}  // namespace sciattn::cuda
