// float64 implementations of the sciattn torch ops in plain ATen, for torch.autograd.gradcheck.
// Binding layer. The library stores f32, f16 and bf16 only; these functions follow the same
// formulas (docs/evoformer.md, docs/block_sparse_ops.md) with fp64 storage and arithmetic, so
// that finite differences in fp64 can check the ops' autograd formulas and wiring. See
// docs/python.md ("float64 and gradcheck").
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "sciattn/block_sparse_ops.h"

namespace sciattn::torch_ext::fp64 {

using OptTensor = std::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor> evoformer_fwd(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const OptTensor& bias1,
                                                 const OptTensor& bias2,
                                                 std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> evoformer_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const OptTensor& bias1, const OptTensor& bias2, const at::Tensor& out, const at::Tensor& lse,
    std::optional<double> scale, bool need_dbias1, bool need_dbias2);

at::Tensor bsmm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout, int64_t block,
                BlockSparseMatMulMode mode, bool trans_a, bool trans_b);
std::tuple<at::Tensor, at::Tensor> bsmm_bwd(const at::Tensor& dc, const at::Tensor& a,
                                            const at::Tensor& b, const at::Tensor& layout,
                                            int64_t block, BlockSparseMatMulMode mode, bool trans_a,
                                            bool trans_b, bool need_da, bool need_db);

at::Tensor bs_softmax(const at::Tensor& x, const at::Tensor& layout, int64_t block, double scale,
                      const OptTensor& rpe, const OptTensor& key_padding_mask,
                      const OptTensor& attn_mask, MaskMode key_padding_mask_mode,
                      MaskMode attn_mask_mode);
at::Tensor bs_softmax_bwd(const at::Tensor& dy, const at::Tensor& y, const at::Tensor& layout,
                          int64_t block, double scale);

std::tuple<at::Tensor, at::Tensor> sparse_attention_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& layout,
    int64_t block, const OptTensor& rpe, const OptTensor& key_padding_mask,
    const OptTensor& attn_mask, std::optional<double> scale, bool causal,
    MaskMode key_padding_mask_mode, MaskMode attn_mask_mode);
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attention_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& layout, int64_t block, const OptTensor& rpe,
    const OptTensor& key_padding_mask, const OptTensor& attn_mask, std::optional<double> scale,
    bool causal, MaskMode key_padding_mask_mode, MaskMode attn_mask_mode);

}  // namespace sciattn::torch_ext::fp64
