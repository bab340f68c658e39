// The public block-sparse functions (MatMul, Softmax, sparse attention, padding): validate, then
// hand the call to the back end that owns the tensors. The one dispatch point of these ops.
#include <cmath>
#include <limits>
#include <string>

#include "common/block_sparse_checks.h"
#include "common/tensor_checks.h"
#include "cpu/block_sparse_cpu.h"
#include "cpu/block_sparse_reference.h"
#include "sciattn/block_sparse_ops.h"

#ifdef SCIATTN_WITH_CUDA
#include "common/block_sparse_device_index.h"
#include "cuda/block_sparse/block_sparse_ops_cuda.h"
#include "cuda/block_sparse/sparse_attention_cuda.h"
#endif

namespace sciattn {
namespace {

Status report(Status status, std::string* why) {
  if (why != nullptr) *why = status.ok() ? std::string() : status.message();
  return status;
}

// CUDA tensors: a build with the kernels and an index uploaded to the GPU; then what the kernels
// themselves accept (`kernel_check`, called only when the rest is fine).
// SCIATTN_CUDA_ONLY(statement): the statement in a CUDA build, nothing otherwise (where the
// kernel checks are never called). SCIATTN_ON_CUDA(tensor, statement): runs the statement when
// the tensor is on a CUDA device (only possible in a CUDA build, can_implement having passed).
#ifdef SCIATTN_WITH_CUDA
#define SCIATTN_CUDA_ONLY(statement) statement
#define SCIATTN_ON_CUDA(tensor, statement) \
  if ((tensor).device == Device::kCuda) {  \
    statement;                             \
  }
#else
#define SCIATTN_CUDA_ONLY(statement) return Status::ok_status()
#define SCIATTN_ON_CUDA(tensor, statement) ((void)0)
#endif

template <typename KernelCheck>
Status check_device(const TensorView& tensor, const BlockSparseIndex* index,
                    [[maybe_unused]] const char* op, KernelCheck kernel_check) {
  if (tensor.device == Device::kCpu) return Status::ok_status();
#ifdef SCIATTN_WITH_CUDA
  Status status = detail::check_device_index(*index, tensor.data);
  if (status.ok()) status = kernel_check();
  return status;
#else
  (void)index;
  (void)kernel_check;
  return Status::not_supported(
      std::string("the tensors are on a CUDA device but this build of sciattn has no CUDA "
                  "support; configure with the `cuda` or `gpu` preset (SCIATTN_WITH_CUDA=ON), "
                  "or pass CPU tensors to run ") +
      op + " on the CPU");
#endif
}

#ifdef SCIATTN_WITH_CUDA
// Sparse attention on the GPU: the fused kernels or the composite of the GPU ops; the reference
// algorithm is the CPU's specification only.
template <typename Params>
Status check_attention_cuda(const Params& p, const detail::AttentionShape& s) {
  switch (p.options.algorithm) {
    case SparseAttentionAlgorithm::kFused:
      return cuda::check_sparse_attention_fused_cuda(p, s);
    case SparseAttentionAlgorithm::kComposite:
      return cuda::check_sparse_attention_composite_cuda(p, s);
    case SparseAttentionAlgorithm::kReference:
      break;
  }
  return Status::not_supported(
      "options.algorithm: the reference algorithm runs on CPU tensors only; on CUDA tensors use "
      "fused (the default) or composite");
}

template <typename Params>
size_t attention_workspace_size_cuda(const Params& p, const detail::AttentionShape& s) {
  return p.options.algorithm == SparseAttentionAlgorithm::kFused
             ? cuda::sparse_attention_fused_workspace_size_cuda(p, s)
             : cuda::sparse_attention_composite_workspace_size_cuda(p, s);
}

template <typename Params>
Status run_attention_cuda(const Params& p, const detail::AttentionShape& s, void* workspace,
                          Stream stream) {
  return p.options.algorithm == SparseAttentionAlgorithm::kFused
             ? cuda::run_sparse_attention_fused_cuda(p, s, workspace, stream)
             : cuda::run_sparse_attention_composite_cuda(p, s, workspace, stream);
}
#endif

cpu::ScoreTerms softmax_terms(const BlockSparseSoftmaxParams& p) {
  cpu::ScoreTerms t;
  t.scale = p.scale;
  t.rpe = &p.rpe;
  t.key_padding_mask = &p.key_padding_mask;
  t.attn_mask = &p.attn_mask;
  t.key_padding_mask_mode = p.key_padding_mask_mode;
  t.attn_mask_mode = p.attn_mask_mode;
  t.causal = p.causal;
  return t;
}

}  // namespace

// ---- names --------------------------------------------------------------------------------------

const char* mask_mode_name(MaskMode mode) {
  switch (mode) {
    case MaskMode::kAdd:
      return "add";
    case MaskMode::kMul:
      return "mul";
  }
  return "?";
}

std::optional<MaskMode> parse_mask_mode(std::string_view name) {
  if (name == "add") return MaskMode::kAdd;
  if (name == "mul") return MaskMode::kMul;
  return std::nullopt;
}

const char* matmul_mode_name(BlockSparseMatMulMode mode) {
  switch (mode) {
    case BlockSparseMatMulMode::kSdd:
      return "sdd";
    case BlockSparseMatMulMode::kDsd:
      return "dsd";
    case BlockSparseMatMulMode::kDds:
      return "dds";
  }
  return "?";
}

std::optional<BlockSparseMatMulMode> parse_matmul_mode(std::string_view name) {
  if (name == "sdd") return BlockSparseMatMulMode::kSdd;
  if (name == "dsd") return BlockSparseMatMulMode::kDsd;
  if (name == "dds") return BlockSparseMatMulMode::kDds;
  return std::nullopt;
}

const char* sparse_attention_algorithm_name(SparseAttentionAlgorithm a) {
  switch (a) {
    case SparseAttentionAlgorithm::kFused:
      return "fused";
    case SparseAttentionAlgorithm::kComposite:
      return "composite";
    case SparseAttentionAlgorithm::kReference:
      return "reference";
  }
  return "?";
}

// ---- MatMul -------------------------------------------------------------------------------------

Status can_implement(const BlockSparseMatMulParams& p, std::string* why) {
  detail::MatMulShape s;
  Status status = detail::check_matmul(p, &s);
  if (status.ok()) {
    status = check_device(p.a, p.index, "the block-sparse MatMul", [&] {
      SCIATTN_CUDA_ONLY(return cuda::check_block_sparse_matmul_cuda(p));
    });
  }
  return report(status, why);
}

Status can_implement(const BlockSparseMatMulBackwardParams& p, std::string* why) {
  detail::MatMulShape s;
  Status status = detail::check_matmul_backward(p, &s);
  if (status.ok()) {
    status = check_device(p.a, p.index, "the block-sparse MatMul", [&] {
      SCIATTN_CUDA_ONLY(return cuda::check_block_sparse_matmul_cuda(p));
    });
  }
  return report(status, why);
}

size_t workspace_size(const BlockSparseMatMulParams& p) {
  detail::MatMulShape s;
  if (!can_implement(p).ok()) return 0;
  SCIATTN_ON_CUDA(p.a, return cuda::block_sparse_matmul_workspace_size_cuda(p));
  detail::check_matmul(p, &s);
  return cpu::matmul_workspace_size(p, s, cpu::block_sparse_threads(p.num_threads));
}

size_t workspace_size(const BlockSparseMatMulBackwardParams& p) {
  detail::MatMulShape s;
  if (!can_implement(p).ok()) return 0;
  SCIATTN_ON_CUDA(p.a, return cuda::block_sparse_matmul_workspace_size_cuda(p));
  detail::check_matmul_backward(p, &s);
  return cpu::matmul_backward_workspace_size(p, s, cpu::block_sparse_threads(p.num_threads));
}

Status run(const BlockSparseMatMulParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  SCIATTN_ON_CUDA(p.a, return cuda::run_block_sparse_matmul_cuda(p, workspace, stream));
  cpu::run_matmul(p, cpu::block_sparse_threads(p.num_threads), workspace);
  return Status::ok_status();
}

Status run(const BlockSparseMatMulBackwardParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  SCIATTN_ON_CUDA(p.a, return cuda::run_block_sparse_matmul_cuda(p, workspace, stream));
  cpu::run_matmul_backward(p, cpu::block_sparse_threads(p.num_threads), workspace);
  return Status::ok_status();
}

double block_sparse_matmul_flops(const BlockSparseMatMulParams& p) {
  detail::MatMulShape s;
  if (!detail::check_matmul(p, &s).ok()) return 0.0;
  const BlockSparseIndex& ix = *p.index;
  // sdd computes every element of nnz blocks over K; dsd and dds multiply each stored block with
  // the N (or M) columns (rows) of the dense operand.
  const double inner = p.mode == BlockSparseMatMulMode::kSdd   ? static_cast<double>(s.k)
                       : p.mode == BlockSparseMatMulMode::kDsd ? static_cast<double>(s.n)
                                                               : static_cast<double>(s.m);
  return 2.0 * static_cast<double>(s.batch) * static_cast<double>(ix.nnz) *
         static_cast<double>(ix.block * ix.block) * inner;
}

// ---- Softmax ------------------------------------------------------------------------------------

Status can_implement(const BlockSparseSoftmaxParams& p, std::string* why) {
  int64_t batch = 0;
  Status status = detail::check_softmax(p, &batch);
  if (status.ok()) {
    status = check_device(p.x, p.index, "the block-sparse Softmax", [&] {
      SCIATTN_CUDA_ONLY(return cuda::check_block_sparse_softmax_cuda(p));
    });
  }
  return report(status, why);
}

Status can_implement(const BlockSparseSoftmaxBackwardParams& p, std::string* why) {
  int64_t batch = 0;
  Status status = detail::check_softmax_backward(p, &batch);
  if (status.ok()) {
    status = check_device(p.y, p.index, "the block-sparse Softmax", [&] {
      SCIATTN_CUDA_ONLY(return cuda::check_block_sparse_softmax_cuda(p));
    });
  }
  return report(status, why);
}

size_t workspace_size(const BlockSparseSoftmaxParams& p) {
  if (!can_implement(p).ok()) return 0;
  SCIATTN_ON_CUDA(p.x, return cuda::block_sparse_softmax_workspace_size_cuda(p));
  return cpu::softmax_workspace_size(*p.index, cpu::block_sparse_threads(p.num_threads));
}

size_t workspace_size(const BlockSparseSoftmaxBackwardParams& p) {
  if (!can_implement(p).ok()) return 0;
  SCIATTN_ON_CUDA(p.y, return cuda::block_sparse_softmax_workspace_size_cuda(p));
  return cpu::softmax_backward_workspace_size(*p.index, cpu::block_sparse_threads(p.num_threads));
}

Status run(const BlockSparseSoftmaxParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  SCIATTN_ON_CUDA(p.x, return cuda::run_block_sparse_softmax_cuda(p, workspace, stream));
  const cpu::ScoreTerms terms = softmax_terms(p);
  cpu::softmax_forward(*p.index, p.x.sizes[0], p.x, p.y, terms, nullptr,
                       cpu::block_sparse_threads(p.num_threads), workspace);
  return Status::ok_status();
}

Status run(const BlockSparseSoftmaxBackwardParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  SCIATTN_ON_CUDA(p.y, return cuda::run_block_sparse_softmax_cuda(p, workspace, stream));
  cpu::softmax_backward(*p.index, p.y.sizes[0], p.y, p.dy, p.dx, p.scale,
                        cpu::block_sparse_threads(p.num_threads), workspace);
  return Status::ok_status();
}

// ---- Sparse attention ---------------------------------------------------------------------------

Status can_implement(const SparseAttentionForwardParams& p, std::string* why) {
  detail::AttentionShape s;
  Status status = detail::check_attention_forward(p, &s);
  if (status.ok()) {
    status = check_device(p.q, p.index, "sparse attention",
                          [&] { SCIATTN_CUDA_ONLY(return check_attention_cuda(p, s)); });
  }
  return report(status, why);
}

Status can_implement(const SparseAttentionBackwardParams& p, std::string* why) {
  detail::AttentionShape s;
  Status status = detail::check_attention_backward(p, &s);
  if (status.ok()) {
    status = check_device(p.q, p.index, "sparse attention",
                          [&] { SCIATTN_CUDA_ONLY(return check_attention_cuda(p, s)); });
  }
  return report(status, why);
}

size_t workspace_size(const SparseAttentionForwardParams& p) {
  detail::AttentionShape s;
  if (!can_implement(p).ok()) return 0;
  detail::check_attention_forward(p, &s);
  SCIATTN_ON_CUDA(p.q, return attention_workspace_size_cuda(p, s));
  const int threads = cpu::block_sparse_threads(p.options.num_threads);
  switch (p.options.algorithm) {
    case SparseAttentionAlgorithm::kFused:
      return cpu::fused_forward_workspace_size(p, s, threads);
    case SparseAttentionAlgorithm::kComposite:
      return cpu::composite_forward_workspace_size(p, s, threads);
    case SparseAttentionAlgorithm::kReference:
      return cpu::reference_forward_workspace_size(s);
  }
  return 0;
}

size_t workspace_size(const SparseAttentionBackwardParams& p) {
  detail::AttentionShape s;
  if (!can_implement(p).ok()) return 0;
  detail::check_attention_backward(p, &s);
  SCIATTN_ON_CUDA(p.q, return attention_workspace_size_cuda(p, s));
  const int threads = cpu::block_sparse_threads(p.options.num_threads);
  switch (p.options.algorithm) {
    case SparseAttentionAlgorithm::kFused:
      return cpu::fused_backward_workspace_size(p, s, threads);
    case SparseAttentionAlgorithm::kComposite:
      return cpu::composite_backward_workspace_size(p, s, threads);
    case SparseAttentionAlgorithm::kReference:
      return cpu::reference_backward_workspace_size(s);
  }
  return 0;
}

Status run(const SparseAttentionForwardParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  detail::AttentionShape s;
  detail::check_attention_forward(p, &s);
  SCIATTN_ON_CUDA(p.q, return run_attention_cuda(p, s, workspace, stream));
  const int threads = cpu::block_sparse_threads(p.options.num_threads);
  switch (p.options.algorithm) {
    case SparseAttentionAlgorithm::kFused:
      cpu::fused_forward(p, s, threads, workspace);
      break;
    case SparseAttentionAlgorithm::kComposite:
      cpu::composite_forward(p, s, threads, workspace);
      break;
    case SparseAttentionAlgorithm::kReference:
      cpu::run_reference_forward(p, s, workspace);
      break;
  }
  return Status::ok_status();
}

Status run(const SparseAttentionBackwardParams& p, void* workspace, size_t workspace_bytes,
           [[maybe_unused]] Stream stream) {
  Status status = can_implement(p);
  if (!status.ok()) return status;
  status = detail::check_workspace(workspace_size(p), workspace, workspace_bytes);
  if (!status.ok()) return status;
  detail::AttentionShape s;
  detail::check_attention_backward(p, &s);
  SCIATTN_ON_CUDA(p.q, return run_attention_cuda(p, s, workspace, stream));
  const int threads = cpu::block_sparse_threads(p.options.num_threads);
  switch (p.options.algorithm) {
    case SparseAttentionAlgorithm::kFused:
      cpu::fused_backward(p, s, threads, workspace);
      break;
    case SparseAttentionAlgorithm::kComposite:
      cpu::composite_backward(p, s, threads, workspace);
      break;
    case SparseAttentionAlgorithm::kReference:
      cpu::run_reference_backward(p, s, workspace);
      break;
  }
  return Status::ok_status();
}

namespace {

double attention_block_flops(const BlockSparseIndex* index, const detail::AttentionShape& s) {
  return static_cast<double>(s.batch) * static_cast<double>(index->nnz) *
         static_cast<double>(index->block * index->block) * static_cast<double>(s.dim);
}

}  // namespace

double sparse_attention_forward_flops(const SparseAttentionForwardParams& p) {
  detail::AttentionShape s;
  if (!detail::check_attention_forward(p, &s).ok()) return 0.0;
  return 4.0 * attention_block_flops(p.index, s);
}

double sparse_attention_backward_flops(const SparseAttentionBackwardParams& p) {
  detail::AttentionShape s;
  if (!detail::check_attention_backward(p, &s).ok()) return 0.0;
  return 10.0 * attention_block_flops(p.index, s);
}

// ---- Padding ------------------------------------------------------------------------------------

int64_t block_pad_length(int64_t seq_len, int64_t block) {
  if (block < 1 || seq_len < 0) return 0;
  return (block - seq_len % block) % block;
}

namespace {

// Calls f(dst_offset, index) for every element of a view, index being its multi-index.
template <typename F>
void for_each_index(const TensorView& t, F&& f) {
  int64_t idx[TensorView::kMaxRank] = {};
  const int64_t n = t.numel();
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, offset = 0;
    for (int d = t.rank - 1; d >= 0; --d) {
      idx[d] = rest % t.sizes[d];
      rest /= t.sizes[d];
      offset += idx[d] * t.strides[d];
    }
    f(offset, idx);
  }
}

int64_t offset_of(const TensorView& t, const int64_t* idx) {
  int64_t offset = 0;
  for (int d = 0; d < t.rank; ++d) offset += idx[d] * t.strides[d];
  return offset;
}

}  // namespace

Status pad_to_block_size(const TensorView& src, int dim, int64_t block, double pad_value,
                         const TensorView& dst) {
  Status status = detail::check_pad(src, dim, block, dst);
  if (!status.ok()) return status;
  const int64_t len = src.sizes[dim];
  const auto pad = static_cast<float>(pad_value);
  // Every value converts through float exactly (the 16-bit formats and bool are subsets of it).
  for_each_index(dst, [&](int64_t dst_offset, const int64_t* idx) {
    const float v = idx[dim] < len ? load_as_float(src.data, src.dtype, offset_of(src, idx)) : pad;
    store_from_float(dst.data, dst.dtype, dst_offset, v);
  });
  return Status::ok_status();
}

Status padding_key_mask(int64_t valid_len, MaskMode mode, const TensorView& dst) {
  Status status = detail::check_padding_key_mask(valid_len, mode, dst);
  if (!status.ok()) return status;
  // keep / remove in the mask's own terms (spec 2.3): a bool mask is true / false whatever the
  // mode; kAdd adds 0 / -inf; kMul keeps any non-zero value and removes 0.
  float keep = 1.0f, remove = 0.0f;
  if (dst.dtype != DType::kBool && mode == MaskMode::kAdd) {
    keep = 0.0f;
    remove = -std::numeric_limits<float>::infinity();
  }
  for_each_index(dst, [&](int64_t offset, const int64_t* idx) {
    store_from_float(dst.data, dst.dtype, offset, idx[1] < valid_len ? keep : remove);
  });
  return Status::ok_status();
}

Status unpad_sequence_output(const TensorView& src, int dim, const TensorView& dst) {
  Status status = detail::check_unpad(src, dim, dst);
  if (!status.ok()) return status;
  for_each_index(dst, [&](int64_t dst_offset, const int64_t* idx) {
    store_from_float(dst.data, dst.dtype, dst_offset,
                     load_as_float(src.data, src.dtype, offset_of(src, idx)));
  });
  return Status::ok_status();
}

}  // namespace sciattn
