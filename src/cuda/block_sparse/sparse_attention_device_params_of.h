// The arguments the fused block-sparse CUDA dispatch builds for a call, and the per-call
// decisions among them (which tiles take the lean copies, which run the warpgroup-MMA kernels,
// which outputs are written as aligned pairs): host-only C++ of the CUDA layer, kept out of
// sparse_attention_dispatch.cu so that tests/cpu/test_sparse_attention_device_params.cpp checks
// the decisions without a GPU (the kernels trust them without re-checking) and the emulator cannot
// drift from what the GPU is given. The device tile index and the workspace regions are the
// dispatch's to add.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "common/block_sparse_checks.h"
#include "cuda/block_sparse/sparse_attention_params.h"
#include "cuda/common/bias_type_of.h"
#include "cuda/common/probability_shift.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cuda::sparse_params {

inline void copy_strides(const TensorView& t, int64_t* dst, int n) {
  for (int d = 0; d < n; ++d) dst[d] = t.present() ? t.strides[d] : 0;
}

// 16-byte copies of whole rows of 8 elements are safe: unit stride on D, D in whole 8-element
// chunks, every row start 16-byte aligned.
inline int vectorizable(const TensorView& t) {
  if (t.strides[3] != 1 || t.sizes[3] % 8 != 0) return 0;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return 0;
  for (int d = 0; d < 3; ++d) {
    if (t.sizes[d] > 1 && t.strides[d] % 8 != 0) return 0;
  }
  return 1;
}

// A 64-row tile of t (rows strides[2] elements apart) has all its byte offsets below 2^31.
inline bool tile_offsets_fit_32_bits(const TensorView& t) {
  const int64_t stride = t.strides[2] < 0 ? -t.strides[2] : t.strides[2];
  return stride <= (int64_t{1} << 31) / 64 / static_cast<int64_t>(dtype_size(t.dtype)) - 1;
}

// The lean-copy condition of SparseAttentionDeviceParams::lean_tiles over these tensors, for a
// head dim `dim` run by the kernel instantiated for `kernel_dim`.
inline bool lean_tiles(std::initializer_list<const TensorView*> tensors, int64_t dim,
                       int64_t kernel_dim) {
  if (dim != kernel_dim) return false;
  for (const TensorView* t : tensors) {
    if (!vectorizable(*t) || !tile_offsets_fit_32_bits(*t)) return false;
  }
  return true;
}

// The fields forward and backward share (Params: SparseAttentionForwardParams or
// SparseAttentionBackwardParams, which name them alike).
template <typename Params>
SparseAttentionDeviceParams common_params(const Params& params, const detail::AttentionShape& s,
                                          int64_t kernel_dim) {
  SparseAttentionDeviceParams p{};
  p.batch = s.batch;
  p.heads = s.heads;
  p.len = s.len;
  p.dim = s.dim;
  p.scale = detail::attention_scale(params.options, s.dim);
  p.prob_shift_log2 = probability_shift_log2(params.q.dtype, s.len);
  p.causal = params.options.causal ? 1 : 0;
  p.q = params.q.data;
  copy_strides(params.q, p.q_stride, 4);
  p.k = params.k.data;
  copy_strides(params.k, p.k_stride, 4);
  p.v = params.v.data;
  copy_strides(params.v, p.v_stride, 4);
  p.vec_q = vectorizable(params.q);
  p.vec_k = vectorizable(params.k);
  p.vec_v = vectorizable(params.v);
  p.lean_tiles = lean_tiles({&params.q, &params.k, &params.v}, s.dim, kernel_dim);
  p.out_paired = vectorizable(params.out) && s.dim == kernel_dim;
  p.wgmma_tiles = p.lean_tiles && s.len % 64 == 0 && (s.dim == 64 || s.dim == 128);
  const TensorView& rpe = params.rpe;
  const TensorView& kpm = params.key_padding_mask;
  const TensorView& attn = params.attn_mask;
  p.rpe = rpe.data;
  p.rpe_type = bias_type_of(rpe);
  copy_strides(rpe, p.rpe_stride, 4);
  p.kpm = kpm.data;
  p.kpm_type = bias_type_of(kpm);
  copy_strides(kpm, p.kpm_stride, 2);
  p.kpm_mul = kpm.present() && kpm.dtype != DType::kBool &&
              params.options.key_padding_mask_mode == MaskMode::kMul;
  p.attn = attn.data;
  p.attn_type = bias_type_of(attn);
  copy_strides(attn, p.attn_stride, 2);
  p.attn_mul = attn.present() && attn.dtype != DType::kBool &&
               params.options.attn_mask_mode == MaskMode::kMul;
  p.has_terms = rpe.present() || kpm.present() || attn.present();
  p.out = params.out.data;
  copy_strides(params.out, p.out_stride, 4);
  p.lse = static_cast<float*>(params.lse.data);
  copy_strides(params.lse, p.lse_stride, 3);
  return p;
}

}  // namespace sciattn::cuda::sparse_params

namespace sciattn::cuda {

// `kernel_dim`: the instantiated head dim that runs s.dim (the dispatch's kernel_head_dim, which
// depends on what the build instantiates). p.tiles and the workspace regions are left empty.
inline SparseAttentionDeviceParams sparse_forward_device_params(
    const SparseAttentionForwardParams& params, const detail::AttentionShape& s,
    int64_t kernel_dim) {
  return sparse_params::common_params(params, s, kernel_dim);
}

inline SparseAttentionDeviceParams sparse_backward_device_params(
    const SparseAttentionBackwardParams& params, const detail::AttentionShape& s,
    int64_t kernel_dim) {
  using namespace sparse_params;
  SparseAttentionDeviceParams p = common_params(params, s, kernel_dim);
  p.dout = params.dout.data;
  copy_strides(params.dout, p.dout_stride, 4);
  p.vec_dout = vectorizable(params.dout);
  p.lean_tiles = p.lean_tiles && lean_tiles({&params.dout}, s.dim, kernel_dim);
  p.wgmma_tiles = p.wgmma_tiles && p.lean_tiles;  // dO too
  p.grads_paired = vectorizable(params.dq) && vectorizable(params.dk) && vectorizable(params.dv) &&
                   s.dim == kernel_dim;
  p.vec_out = vectorizable(params.out);
  p.dq = params.dq.data;
  copy_strides(params.dq, p.dq_stride, 4);
  p.dk = params.dk.data;
  copy_strides(params.dk, p.dk_stride, 4);
  p.dv = params.dv.data;
  copy_strides(params.dv, p.dv_stride, 4);
  return p;
}

}  // namespace sciattn::cuda
