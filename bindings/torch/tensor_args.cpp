// The helpers every kernel of the sciattn torch ops shares (see tensor_args.h). Binding layer.
#include "tensor_args.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <string_view>

namespace sciattn::torch_ext {
namespace {

DType to_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kBool:
      return DType::kBool;
    default:
      TORCH_CHECK_TYPE(false, name, " has dtype ", t.scalar_type(),
                       "; sciattn accepts float32, float16, bfloat16 or float64 (masks also bool)");
  }
}

std::string_view as_std(c10::string_view s) {
  return std::string_view(s.data(), s.size());
}

}  // namespace

// TORCH_CHECK_VALUE raises ValueError, TORCH_CHECK_TYPE TypeError, TORCH_CHECK_NOT_IMPLEMENTED
// NotImplementedError (a RuntimeError) and OutOfMemoryError torch.OutOfMemoryError in Python.
void check_status(const Status& s, const char* op) {
  if (s.ok()) return;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, "sciattn.", op, ": ", s.message());
    case StatusCode::kNotSupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "sciattn.", op, ": ", s.message());
    case StatusCode::kOutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, "sciattn.", op, ": ", s.message());
    default:
      TORCH_CHECK(false, "sciattn.", op, ": ", s.to_string());
  }
}

TensorView view_of(at::Tensor& t, const char* name, bool any_strides, bool allow_empty) {
  TensorView v;
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.dim() <= TensorView::kMaxRank, name, " must have 1 to ",
                    TensorView::kMaxRank, " dimensions; got shape ", t.sizes());
  TORCH_CHECK_VALUE(allow_empty || t.numel() > 0, name, " must not be empty; got shape ",
                    t.sizes());
  if (!any_strides && t.stride(-1) != 1) t = t.contiguous();
  v.dtype = to_dtype(t, name);
  if (t.is_cuda()) {
    v.device = Device::kCuda;
  } else {
    TORCH_CHECK_VALUE(t.is_cpu(), name, " is on device ", t.device(),
                      "; sciattn runs on cpu and cuda tensors");
    v.device = Device::kCpu;
  }
  v.data = t.data_ptr();
  v.rank = static_cast<int>(t.dim());
  for (int d = 0; d < v.rank; ++d) {
    v.sizes[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

TensorView optional_view(OptTensor& t, const char* name, bool any_strides) {
  if (!t.has_value() || !t->defined()) return {};
  return view_of(*t, name, any_strides);
}

void check_same_device(const at::Tensor& q, const char* q_name,
                       std::initializer_list<std::pair<const at::Tensor*, const char*>> others) {
  for (const auto& [t, name] : others) {
    if (t == nullptr || !t->defined()) continue;
    TORCH_CHECK_VALUE(t->device() == q.device(), name, " is on ", t->device(), " but ", q_name,
                      " is on ", q.device(), "; every tensor must be on the same device");
  }
}

const at::Tensor* opt_ptr(const OptTensor& t) {
  return t.has_value() ? &*t : nullptr;
}

void check_dim(const at::Tensor& t, int64_t dim, const char* name, const char* shape) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must have shape ", shape, " (", dim,
                    " dimensions); got shape ", t.sizes());
}

int num_threads() {
  return at::get_num_threads();
}

std::optional<float> scale_of(std::optional<double> scale, const char* name) {
  if (!scale.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE(std::isfinite(*scale), name, " must be a finite number; got ", *scale);
  return static_cast<float>(*scale);
}

EvoformerCpuAlgorithm evoformer_algorithm(c10::string_view name) {
  if (as_std(name) == "tiled") return EvoformerCpuAlgorithm::kTiled;
  TORCH_CHECK_VALUE(as_std(name) == "reference", "algorithm must be 'tiled' or 'reference'; got '",
                    as_std(name), "'");
  return EvoformerCpuAlgorithm::kReference;
}

BlockSparseMatMulMode matmul_mode(c10::string_view name) {
  const std::optional<BlockSparseMatMulMode> mode = parse_matmul_mode(as_std(name));
  TORCH_CHECK_VALUE(mode.has_value(), "mode must be 'sdd', 'dsd' or 'dds'; got '", as_std(name),
                    "'");
  return *mode;
}

MaskMode mask_mode(c10::string_view name, const char* argument) {
  const std::optional<MaskMode> mode = parse_mask_mode(as_std(name));
  TORCH_CHECK_VALUE(mode.has_value(), argument, " must be 'add' or 'mul'; got '", as_std(name),
                    "'");
  return *mode;
}

SparseAttentionAlgorithm attention_algorithm(c10::string_view name) {
  for (SparseAttentionAlgorithm a :
       {SparseAttentionAlgorithm::kFused, SparseAttentionAlgorithm::kComposite,
        SparseAttentionAlgorithm::kReference}) {
    if (as_std(name) == sparse_attention_algorithm_name(a)) return a;
  }
  TORCH_CHECK_VALUE(false, "algorithm must be 'fused', 'composite' or 'reference'; got '",
                    as_std(name), "'");
}

}  // namespace sciattn::torch_ext
