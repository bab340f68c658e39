// The fused block-sparse attention on the GPU: not written yet (issue 5); every entry point
// reports kNotSupported. CUDA layer (host code).
#include "cuda/sparse_attention_cuda.h"

namespace sciattn::cuda {
namespace {
Status not_yet() {
  return Status::not_supported(
      "fused sparse attention has no CUDA kernels in this version yet; pass CPU tensors");
}
}  // namespace

Status check_sparse_attention_fused_cuda(const SparseAttentionForwardParams&,
                                         const detail::AttentionShape&) {
  return not_yet();
}
Status check_sparse_attention_fused_cuda(const SparseAttentionBackwardParams&,
                                         const detail::AttentionShape&) {
  return not_yet();
}
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionForwardParams&,
                                                  const detail::AttentionShape&) {
  return 0;
}
size_t sparse_attention_fused_workspace_size_cuda(const SparseAttentionBackwardParams&,
                                                  const detail::AttentionShape&) {
  return 0;
}
Status run_sparse_attention_fused_cuda(const SparseAttentionForwardParams&,
                                       const detail::AttentionShape&, void*, Stream) {
  return not_yet();
}
Status run_sparse_attention_fused_cuda(const SparseAttentionBackwardParams&,
                                       const detail::AttentionShape&, void*, Stream) {
  return not_yet();
}

}  // namespace sciattn::cuda
