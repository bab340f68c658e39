// The kernels' arguments (EvoformerDeviceParams) from the public Params: pointers, strides over
// (B, N, L, H), bias types and the copy-width flags, and the backward's workspace regions as the
// host plan lays them out. Host-only C++ of the CUDA layer (no CUDA headers), so that the dispatch
// and the kernel emulator (tests/cuda/emulation) build the same arguments.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "common/evoformer_checks.h"
#include "common/evoformer_cuda_plan.h"
#include "cuda/common/bias_type_of.h"
#include "cuda/evoformer/evoformer_device_params.h"
#include "sciattn/evoformer.h"

namespace sciattn::cuda::evoformer_params {

inline void copy_strides(const TensorView& t, int64_t* dst, std::initializer_list<int> dims) {
  int i = 0;
  for (int d : dims) dst[i++] = t.present() ? t.strides[d] : 0;
}

// [B, N, L, H, D] -> strides over (B, N, L, H).
inline void qkv_strides(const TensorView& t, int64_t dst[4]) {
  copy_strides(t, dst, {0, 1, 2, 3});
}

// A thread's two adjacent bias columns are one aligned load: unit stride along keys, every other
// stride even (so each row starts at an even element) and the buffer aligned to a pair.
inline int bias_pairs(const TensorView& t) {
  if (!t.present() || t.strides[4] != 1) return 0;
  const size_t pair_bytes = 2 * dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % pair_bytes != 0) return 0;
  for (int d = 0; d < 4; ++d) {
    if (t.sizes[d] > 1 && t.strides[d] % 2 != 0) return 0;
  }
  return 1;
}

// Bias tiles may be staged with 16-byte cp.async: unit stride along keys, every other stride a
// whole number of 16-byte chunks, the buffer 16-byte aligned.
inline int bias_staged(const TensorView& t) {
  if (!t.present() || t.strides[4] != 1) return 0;
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return 0;
  for (int d = 0; d < 4; ++d) {
    if (t.sizes[d] > 1 && (t.strides[d] * elem) % 16 != 0) return 0;
  }
  return 1;
}

// Every byte offset inside a tile of 128 rows of t is below 2^31 (t's rows are strides[row_dim]
// elements apart).
inline bool tile_offsets_fit_32_bits(const TensorView& t, int row_dim) {
  if (!t.present()) return true;
  const int64_t stride = t.strides[row_dim] < 0 ? -t.strides[row_dim] : t.strides[row_dim];
  return stride <= (int64_t{1} << 31) / 128 / static_cast<int64_t>(dtype_size(t.dtype)) - 1;
}

// 16-byte copies of whole rows of 8 elements are safe: every row starts 16-byte aligned and D
// comes in whole 8-element chunks.
inline int vectorizable(const TensorView& t) {
  if (t.sizes[4] % 8 != 0 || reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return 0;
  for (int d = 0; d < 4; ++d) {
    if (t.sizes[d] > 1 && t.strides[d] % 8 != 0) return 0;
  }
  return 1;
}

inline EvoformerDeviceParams common_params(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& bias1,
                                           const TensorView& bias2, const TensorView& out,
                                           const TensorView& lse, const EvoformerOptions& options,
                                           const detail::EvoformerShape& s) {
  EvoformerDeviceParams p{};
  p.batch = s.batch;
  p.n = s.n;
  p.len = s.len;
  p.heads = s.heads;
  p.dim = s.dim;
  p.scale = detail::evoformer_scale(options, s.dim);
  p.q = q.data;
  qkv_strides(q, p.q_stride);
  p.vec_q = vectorizable(q);
  p.vec_k = vectorizable(k);
  p.vec_v = vectorizable(v);
  p.k = k.data;
  qkv_strides(k, p.k_stride);
  p.v = v.data;
  qkv_strides(v, p.v_stride);
  p.out = out.data;
  qkv_strides(out, p.out_stride);
  p.bias1 = bias1.data;
  p.bias1_type = bias_type_of(bias1);
  copy_strides(bias1, p.bias1_stride, {0, 1, 4});
  p.bias1_staged = bias_staged(bias1);
  p.bias2 = bias2.data;
  p.bias2_type = bias_type_of(bias2);
  copy_strides(bias2, p.bias2_stride, {0, 2, 3, 4});
  p.bias2_pairs = bias_pairs(bias2);
  p.bias2_staged = bias_staged(bias2);
  p.bias2_lean = p.bias2_staged && tile_offsets_fit_32_bits(bias2, 3);
  p.lse = static_cast<float*>(lse.data);
  copy_strides(lse, p.lse_stride, {0, 1, 2});
  p.dbias2_chunks = 1;
  p.vec_out = vectorizable(out);
  p.lean_tiles = p.vec_q && p.vec_k && p.vec_v && p.vec_out &&
                 s.dim == detail::cuda_evoformer_head_dim(s.dim) && s.dim >= 16;
  for (const TensorView* t : {&q, &k, &v, &out}) {
    if (!tile_offsets_fit_32_bits(*t, 2)) p.lean_tiles = 0;
  }
  p.wgmma_tiles =
      p.lean_tiles && q.dtype != DType::kF32 && (s.dim == 32 || s.dim == 64 || s.dim == 128);
  // Grid decoders. Every grid has fewer than 2^31 CTAs (the launchers check), so each quotient
  // fits fast_divide's range; divisors are at least 1 (an empty shape launches nothing).
  const auto divisor = [](int64_t d) {
    return make_fast_divisor(static_cast<uint32_t>(d < 1 ? 1 : d));
  };
  p.tiles64_div = divisor((s.len + 63) / 64);
  p.heads_div = divisor(s.heads);
  p.n_div = divisor(s.n);
  p.batch_div = divisor(s.batch);
  const int64_t rows = detail::cuda_dbias2_rows(detail::cuda_evoformer_head_dim(s.dim));
  p.dbias2_rows_div = divisor((s.len + rows - 1) / rows);
  return p;
}

}  // namespace sciattn::cuda::evoformer_params

namespace sciattn::cuda {

inline EvoformerDeviceParams forward_device_params(const EvoformerForwardParams& params,
                                                   const detail::EvoformerShape& s) {
  return evoformer_params::common_params(params.q, params.k, params.v, params.bias1, params.bias2,
                                         params.out, params.lse, params.options, s);
}

// `workspace` holds detail::plan_cuda_backward's regions (workspace_size bytes).
inline EvoformerDeviceParams backward_device_params(const EvoformerBackwardParams& params,
                                                    const detail::EvoformerShape& s,
                                                    void* workspace) {
  using namespace evoformer_params;
  EvoformerDeviceParams p = common_params(params.q, params.k, params.v, params.bias1, params.bias2,
                                          params.out, params.lse, params.options, s);
  p.dout = params.dout.data;
  qkv_strides(params.dout, p.dout_stride);
  p.vec_dout = vectorizable(params.dout);
  if (!p.vec_dout || !tile_offsets_fit_32_bits(params.dout, 2)) p.lean_tiles = p.wgmma_tiles = 0;
  p.dq = params.dq.data;
  qkv_strides(params.dq, p.dq_stride);
  p.dk = params.dk.data;
  qkv_strides(params.dk, p.dk_stride);
  p.dv = params.dv.data;
  qkv_strides(params.dv, p.dv_stride);
  p.grads_paired = vectorizable(params.dq) && vectorizable(params.dk) && vectorizable(params.dv) &&
                   s.dim == detail::cuda_evoformer_head_dim(s.dim);
  p.dbias1 = params.dbias1.data;
  copy_strides(params.dbias1, p.dbias1_stride, {0, 1, 4});
  p.dbias2 = params.dbias2.data;
  copy_strides(params.dbias2, p.dbias2_stride, {0, 2, 3, 4});
  const bool f32 = params.q.dtype == DType::kF32;
  const detail::CudaBackwardWorkspace w =
      detail::plan_cuda_backward(s, params.dbias1.present(), params.dbias2.present(), !f32);
  p.delta = w.layout.at<float>(workspace, w.delta);
  p.dbias1_partial =
      params.dbias1.present() ? w.layout.at<float>(workspace, w.dbias1_partial) : nullptr;
  p.dbias2_partial = params.dbias2.present() && w.chunks > 1
                         ? w.layout.at<float>(workspace, w.dbias2_partial)
                         : nullptr;
  p.dbias2_chunks = w.chunks;
  return p;
}

}  // namespace sciattn::cuda
