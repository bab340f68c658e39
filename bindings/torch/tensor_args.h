// What every kernel of the sciattn torch ops shares: tensors as the library's TensorViews, the
// ops' string enums as the library's enums, a Status as a Python exception, and one call of an op
// with its workspace as a tensor on the current stream. Binding layer (public API only).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/string_view.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "sciattn/block_sparse_ops.h"
#include "sciattn/device.h"
#include "sciattn/evoformer.h"
#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

#ifdef SCIATTN_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace sciattn::torch_ext {

using OptTensor = std::optional<at::Tensor>;

// Raises the Python exception of a failed Status: ValueError for invalid arguments,
// NotImplementedError for what this build or device cannot run, torch.OutOfMemoryError when the
// host ran out of memory, RuntimeError otherwise. The
// library's messages already name the argument (its Params field names are the Python argument
// names) and say what is accepted.
void check_status(const Status& s, const char* op);

// A view of t. Tensors whose last dimension is not unit-stride are copied first (unless
// any_strides): autograd hands out expanded (stride 0) gradients, and the library wants stride 1
// on the innermost dimension. An empty tensor is an error naming `name`, except where the op takes
// one (allow_empty: the sparse tensors of a layout without blocks).
TensorView view_of(at::Tensor& t, const char* name, bool any_strides = false,
                   bool allow_empty = false);
TensorView optional_view(OptTensor& t, const char* name, bool any_strides = false);

// Every tensor argument on q's device (the library only knows cpu vs cuda).
void check_same_device(const at::Tensor& q, const char* q_name,
                       std::initializer_list<std::pair<const at::Tensor*, const char*>> others);
const at::Tensor* opt_ptr(const OptTensor& t);
void check_dim(const at::Tensor& t, int64_t dim, const char* name, const char* shape);

// ATen's thread count, which the CPU paths use.
int num_threads();

// A finite scale as float, or none.
std::optional<float> scale_of(std::optional<double> scale, const char* name = "scale");

// The ops' enum arguments, given as strings ("tiled", "sdd", "add", "fused"); a ValueError names
// the argument and the accepted values.
EvoformerCpuAlgorithm evoformer_algorithm(c10::string_view name);
BlockSparseMatMulMode matmul_mode(c10::string_view name);
MaskMode mask_mode(c10::string_view name, const char* argument);
SparseAttentionAlgorithm attention_algorithm(c10::string_view name);

// Runs one op: validates (raising its message), allocates the workspace as a byte tensor on the
// op's device (none when the call needs none), and runs on the current stream of `like`'s device.
template <typename Params>
void run_op(const Params& p, const at::Tensor& like, const char* op) {
  std::string why;
  check_status(can_implement(p, &why), op);
  const size_t bytes = workspace_size(p);
  at::Tensor ws;
  if (bytes > 0) ws = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
  Stream stream;
#ifdef SCIATTN_TORCH_CUDA
  std::optional<c10::cuda::CUDAGuard> guard;
  if (like.is_cuda()) {
    guard.emplace(like.device());
    stream.handle = c10::cuda::getCurrentCUDAStream(like.device().index()).stream();
  }
#endif
  check_status(run(p, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream), op);
}

}  // namespace sciattn::torch_ext
