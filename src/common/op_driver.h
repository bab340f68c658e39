// The op protocol, written once: can_implement, workspace_size and run of an op described by a
// small traits struct (below). Each public function of src/<op>.cpp forwards to OpDriver, so
// every call validates its Params once, computes their shape once, and then sizes or runs the
// work on the back end that owns the tensors. Host-only common layer; include it only from the
// sciattn library's own sources, whose SCIATTN_WITH_CUDA says whether the CUDA back end exists.
#pragma once

#include <cstddef>
#include <string>

#include "common/tensor_checks.h"
#include "sciattn/device.h"
#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn::detail {

#ifdef SCIATTN_WITH_CUDA
inline constexpr bool kBuiltWithCuda = true;
#else
inline constexpr bool kBuiltWithCuda = false;
#endif

// What an op's traits struct provides (all static):
//   using Params = ...;  using Shape = ...;    the public Params and what validation derives
//   static constexpr const char* kName         the op in messages ("the block-sparse MatMul")
//   const TensorView& placement(const Params&) the tensor whose device chooses the back end
//   Status check(const Params&, Shape*)        every check that does not depend on the back end
//   size_t cpu_workspace(const Params&, const Shape&)
//   void run_cpu(const Params&, const Shape&, void* workspace)
// and, in a build with CUDA (SCIATTN_WITH_CUDA):
//   Status check_cuda(const Params&, const Shape&)      what the CUDA back end accepts on top
//   size_t cuda_workspace(const Params&, const Shape&)
//   Status run_cuda(const Params&, const Shape&, void* workspace, Stream)
template <typename Op>
class OpDriver {
 public:
  using Params = typename Op::Params;
  using Shape = typename Op::Shape;

  static Status can_implement(const Params& p, std::string* why) {
    Shape shape{};
    const Status status = validate(p, &shape);
    if (why != nullptr) *why = status.ok() ? std::string() : status.message();
    return status;
  }

  // 0 for Params that can_implement rejects.
  static size_t workspace_size(const Params& p) {
    Shape shape{};
    return validate(p, &shape).ok() ? workspace(p, shape) : 0;
  }

  static Status run(const Params& p, void* workspace_ptr, size_t workspace_bytes, Stream stream) {
    Shape shape{};
    Status status = validate(p, &shape);
    if (status.ok()) status = check_workspace(workspace(p, shape), workspace_ptr, workspace_bytes);
    if (!status.ok()) return status;
    if (on_cuda(p)) {
      if constexpr (kBuiltWithCuda) return Op::run_cuda(p, shape, workspace_ptr, stream);
    }
    Op::run_cpu(p, shape, workspace_ptr);
    return Status::ok_status();
  }

 private:
  static bool on_cuda(const Params& p) { return Op::placement(p).device == Device::kCuda; }

  static Status validate(const Params& p, Shape* shape) {
    Status status = Op::check(p, shape);
    if (!status.ok() || !on_cuda(p)) return status;
    if constexpr (kBuiltWithCuda) {
      return Op::check_cuda(p, *shape);
    } else {
      return Status::not_supported(
          std::string("the tensors are on a CUDA device but this build of sciattn has no CUDA "
                      "support; configure with the `cuda` or `gpu` preset (SCIATTN_WITH_CUDA=ON), "
                      "or pass CPU tensors to run ") +
          Op::kName + " on the CPU");
    }
  }

  // Only for Params that passed validate.
  static size_t workspace(const Params& p, const Shape& shape) {
    if (on_cuda(p)) {
      if constexpr (kBuiltWithCuda) return Op::cuda_workspace(p, shape);
    }
    return Op::cpu_workspace(p, shape);
  }
};

}  // namespace sciattn::detail

// Defines the public protocol functions of Op::Params (declared in include/sciattn/):
// can_implement, workspace_size and run, each forwarding to detail::OpDriver<Op>. Written once
// per op direction in its src/<op>.cpp, inside namespace sciattn.
#define SCIATTN_DEFINE_OP_PROTOCOL(Op)                                                      \
  Status can_implement(const Op::Params& p, std::string* why) {                             \
    return detail::OpDriver<Op>::can_implement(p, why);                                     \
  }                                                                                         \
  size_t workspace_size(const Op::Params& p) {                                              \
    return detail::OpDriver<Op>::workspace_size(p);                                         \
  }                                                                                         \
  Status run(const Op::Params& p, void* workspace, size_t workspace_bytes, Stream stream) { \
    return detail::OpDriver<Op>::run(p, workspace, workspace_bytes, stream);                \
  }
