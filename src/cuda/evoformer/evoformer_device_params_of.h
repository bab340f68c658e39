// The kernels' arguments (EvoformerDeviceParams) from the public Params: pointers, strides over
// (B, N, L, H), bias types and the copy-width flags, and the backward's workspace regions as the
// host plan lays them out. Host-only C++ of the CUDA layer (no CUDA headers), so that the dispatch
// and the kernel emulator (tests/cuda/emulation) build the same arguments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/evoformer_checks.h"
#include "common/evoformer_cuda_plan.h"
#include "common/tensor_checks.h"
#include "cuda/common/bias_type_of.h"
#include "cuda/common/probability_shift.h"
#include "cuda/evoformer/evoformer_device_params.h"
#include "sciattn/evoformer.h"

namespace sciattn::cuda::evoformer_params {

inline void copy_strides(const TensorView& t, int64_t* dst, std::initializer_list<int> dims) {
  int i = 0;
  for (int d : dims) dst[i++] = t.present() ? t.strides[d] : 0;
}

// bias2_reach of `bias2` as the call passes it (both 0 when absent).
inline void set_bias2_reach(EvoformerDeviceParams& p, const TensorView& bias2) {
  const detail::ElementExtent e =
      bias2.present() ? detail::element_extent(bias2) : detail::ElementExtent{};
  p.bias2_reach[0] = e.lo;
  p.bias2_reach[1] = e.hi;
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

// 32-bit stores of element pairs are safe: D is even and every row and pair starts 4-byte
// aligned (16-bit elements, even strides).
inline int pairable(const TensorView& t) {
  if (t.sizes[4] % 2 != 0 || reinterpret_cast<uintptr_t>(t.data) % 4 != 0) return 0;
  for (int d = 0; d < 4; ++d) {
    if (t.sizes[d] > 1 && t.strides[d] % 2 != 0) return 0;
  }
  return 1;
}

// Rows of an odd D that the forward may read in shifted slices (EvoformerDeviceParams::
// shifted_slices): 16-bit, the data 4-byte aligned, every stride non-negative and the row (L)
// stride even, so that every row of a (b, n, h) slice starts on its first row's 4-byte parity and
// the element before a slice that starts on a 2-byte boundary lies inside the tensor's span.
inline bool shiftable(const TensorView& t) {
  if (dtype_size(t.dtype) != 2 || t.sizes[4] % 2 == 0) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % 4 != 0) return false;
  for (int d = 0; d < 4; ++d) {
    if (t.strides[d] < 0) return false;
  }
  return t.sizes[2] <= 1 || t.strides[2] % 2 == 0;
}

// Whether every (b, n, h) slice of two shiftable tensors of one shape starts on the same 4-byte
// parity, so that a slice's shift is the same in both (as the products over D need).
inline bool same_slice_parity(const TensorView& a, const TensorView& b) {
  for (int d : {0, 1, 3}) {
    const bool a_odd = a.sizes[d] > 1 && a.strides[d] % 2 != 0;
    const bool b_odd = b.sizes[d] > 1 && b.strides[d] % 2 != 0;
    if (a_odd != b_odd) return false;
  }
  return true;
}

// Whether the warpgroup forward reads a call's Q, K and V where they are, in 4-byte pieces
// (InPlaceDimTypes; p.in_place_tiles), instead of from staged copies: 16-bit inputs on a device
// with the warpgroup kernels (`warpgroup`), some of Q, K, V not whole aligned chunks, D at least
// three quarters of its head dim (32, 64 or 128: below that the four copies per chunk of the
// whole padded row cost more than the staged copy, which scales with D; measured on an H100, D 33
// and 34 at head dim 64 lost 7-9% in the forward, D 58 and up gained 5-22%), each bias absent or
// in the inputs' type, every tile offset below 2^31, and rows on 4-byte boundaries: all three
// pairable (an even D), or, for an odd D, all three shiftable with slices that shift alike.
inline bool forward_reads_in_place(const EvoformerForwardParams& params,
                                   const detail::EvoformerShape& s, bool warpgroup) {
  const TensorView &q = params.q, &k = params.k, &v = params.v;
  if (!warpgroup || q.dtype == DType::kF32) return false;
  const int64_t head_dim = detail::cuda_evoformer_head_dim(s.dim);
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) return false;
  if (4 * s.dim < 3 * head_dim) return false;
  if (vectorizable(q) && vectorizable(k) && vectorizable(v)) return false;
  const BiasType inputs = q.dtype == DType::kF16 ? BiasType::kF16 : BiasType::kBF16;
  for (const TensorView* bias : {&params.bias1, &params.bias2}) {
    const BiasType t = bias_type_of(*bias);
    if (t != inputs && t != BiasType::kNone) return false;
  }
  for (const TensorView* t : {&q, &k, &v, &params.out}) {
    if (!tile_offsets_fit_32_bits(*t, 2)) return false;
  }
  if (s.dim % 2 == 0) return pairable(q) && pairable(k) && pairable(v);
  return shiftable(q) && shiftable(k) && shiftable(v) && same_slice_parity(q, k) &&
         same_slice_parity(q, v);
}

// The element size of a bias the tensor-core kernels read through a padded copy (its rows are
// not 16-byte aligned: detail::CudaInputCopies), or 0: absent, staged as it is, or fp32 inputs
// (whose kernels read biases per element).
inline int64_t bias_copy_bytes(const TensorView& bias, DType inputs) {
  if (!bias.present() || inputs == DType::kF32 || bias_staged(bias)) return 0;
  return static_cast<int64_t>(dtype_size(bias.dtype));
}

// The copies a call's kernels read (detail::CudaCopyNeeds): its unaligned biases, and each of Q,
// K, V (and dO: `dout`, absent in the forward) of 16-bit inputs whose rows are not whole aligned
// 16-byte chunks, unless the kernels read them in place (`in_place`: forward_reads_in_place).
inline detail::CudaCopyNeeds copy_needs(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const TensorView& dout,
                                        const TensorView& bias1, const TensorView& bias2,
                                        bool in_place = false) {
  detail::CudaCopyNeeds n;
  n.bias1_bytes = bias_copy_bytes(bias1, q.dtype);
  n.bias2_bytes = bias_copy_bytes(bias2, q.dtype);
  if (q.dtype == DType::kF32 || in_place) return n;
  const TensorView* inputs[detail::kStagedInputs] = {&q, &k, &v, &dout};
  for (int i = 0; i < detail::kStagedInputs; ++i) {
    if (inputs[i]->present() && !vectorizable(*inputs[i])) n.inputs |= 1u << i;
  }
  n.input_bytes = static_cast<int64_t>(dtype_size(q.dtype));
  return n;
}

// The copy job of rows of `t`'s last dim over its dims `outer` (-1: a dim of one) into workspace
// region `region`, rows of `row` elements of `bytes` bytes.
inline EvoformerRowCopyArgs row_copy_args(const TensorView& t, const int (&outer)[4], size_t region,
                                          int64_t bytes, int64_t row,
                                          const detail::WorkspaceLayout& layout, void* workspace) {
  EvoformerRowCopyArgs a{t.data,
                         layout.at<unsigned char>(workspace, region),
                         static_cast<int>(bytes),
                         {},
                         {},
                         t.sizes[4],
                         t.strides[4],
                         row,
                         {},
                         {},
                         {}};
  const detail::ElementExtent extent = detail::element_extent(t);
  a.reach[0] = extent.lo;
  a.reach[1] = extent.hi;
  for (int d = 0; d < 4; ++d) {
    a.outer[d] = outer[d] < 0 ? 1 : t.sizes[outer[d]];
    a.outer_stride[d] = outer[d] < 0 ? 0 : t.strides[outer[d]];
  }
  // The divisors, where each is below 2^31 (a copy of fewer than 2^31 chunks, the only kind that
  // uses them, has all of them there).
  const auto divisor = [](int64_t d) {
    return make_fast_divisor(static_cast<uint32_t>(d >= 1 && d < (int64_t{1} << 31) ? d : 1));
  };
  a.row_chunks_div = divisor(row * bytes / 16);
  for (int d = 0; d < 3; ++d) a.outer_div[d] = divisor(a.outer[d + 1]);
  return a;
}

// Every copy plan `c` lists, in the order the launch makes them: bias1 [B, N, 1, 1, L], bias2
// [B, 1, H, L, L], then the staged Q, K, V and dO ([B, N, L, H, D]; `dout` absent in the
// forward).
inline EvoformerCopyJobs copy_jobs(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& dout, const TensorView& bias1,
                                   const TensorView& bias2, const detail::CudaInputCopies& c,
                                   const detail::WorkspaceLayout& layout, void* workspace) {
  static_assert(EvoformerCopyJobs::kMax == 2 + detail::kStagedInputs, "two biases, the inputs");
  EvoformerCopyJobs jobs;
  if (c.bias1_bytes > 0) {
    jobs.job[jobs.count++] = row_copy_args(bias1, {0, 1, -1, -1}, c.bias1, c.bias1_bytes,
                                           c.bias1_row, layout, workspace);
  }
  if (c.bias2_bytes > 0) {
    jobs.job[jobs.count++] =
        row_copy_args(bias2, {0, 2, 3, -1}, c.bias2, c.bias2_bytes, c.bias2_row, layout, workspace);
  }
  const TensorView* inputs[detail::kStagedInputs] = {&q, &k, &v, &dout};
  for (int i = 0; i < detail::kStagedInputs; ++i) {
    if (!c.staged[i]) continue;
    jobs.job[jobs.count++] = row_copy_args(*inputs[i], {0, 1, 2, 3}, c.input[i], c.input_bytes,
                                           c.input_row, layout, workspace);
  }
  return jobs;
}

// The staged copy of input i that plan `c` lists (packed [B, N, L, H, input_row] in the
// workspace), or `t` itself where it is read as it is.
inline TensorView staged_view(const TensorView& t, int i, const detail::CudaInputCopies& c,
                              const detail::WorkspaceLayout& layout, void* workspace) {
  if (!c.staged[i]) return t;
  return TensorView::contiguous(layout.at<unsigned char>(workspace, c.input[i]), t.dtype,
                                {t.sizes[0], t.sizes[1], t.sizes[2], t.sizes[3], c.input_row},
                                t.device);
}

// Points the kernels' bias arguments at the padded copies of plan `c` (made before the launch)
// and sets their copy flags as for any packed bias with 16-byte rows.
inline void use_bias_copies(EvoformerDeviceParams& p, const detail::CudaInputCopies& c,
                            const detail::WorkspaceLayout& layout, void* workspace) {
  if (c.bias1_bytes > 0) {
    p.bias1 = layout.at<unsigned char>(workspace, c.bias1);
    p.bias1_stride[0] = p.n * c.bias1_row;
    p.bias1_stride[1] = c.bias1_row;
    p.bias1_stride[2] = 1;
    p.bias1_staged = 1;
    p.bias1_cols = c.bias1_row;
  }
  if (c.bias2_bytes > 0) {
    p.bias2 = layout.at<unsigned char>(workspace, c.bias2);
    p.bias2_stride[0] = p.heads * p.len * c.bias2_row;
    p.bias2_stride[1] = p.len * c.bias2_row;
    p.bias2_stride[2] = c.bias2_row;
    p.bias2_stride[3] = 1;
    p.bias2_cols = c.bias2_row;
    p.bias2_pairs = 1;
    p.bias2_staged = 1;
    p.bias2_lean = c.bias2_row <= (int64_t{1} << 31) / 128 / c.bias2_bytes - 1;
    p.bias2_reach[0] = 0;
    p.bias2_reach[1] = p.batch * p.heads * p.len * c.bias2_row - 1;
  }
}

// Which kernels run a 16-bit call at head dims 32, 64 and 128 (offsets_fit: every tile's offsets
// below 2^31; aligned_inputs: the Q, K, V (and dO) rows the kernels copy are vectorizable, which
// the dispatch's staged copies make them, detail::CudaInputCopies):
// - the warpgroup kernels on lean tiles (D the head dim, rows 16-byte aligned, O too);
// - the warpgroup kernels as PaddedDimTypes (padded_tiles) for any other D or an unaligned O with
//   aligned inputs and a bias pair FixedBiasTypes compiles (each bias absent or in the inputs'
//   type): the lean tiles' copies of load_dim columns, a thread's chunk past them zero-filled; the
//   outputs written and delta read at D in any alignment;
// - the mma.sync kernels for any other bias pair, and for inputs read as they are in rows that
//   are not whole aligned 16-byte chunks (element-wise copies, 15-30x slower: only a call made
//   without the staged copies' workspace; the dispatch never makes one).
inline void set_warpgroup_tiles(EvoformerDeviceParams& p, DType dtype,
                                const detail::EvoformerShape& s, bool offsets_fit,
                                bool aligned_inputs) {
  const int64_t head_dim = detail::cuda_evoformer_head_dim(s.dim);
  const bool eligible =
      offsets_fit && dtype != DType::kF32 && (head_dim == 32 || head_dim == 64 || head_dim == 128);
  const BiasType inputs = dtype == DType::kF16 ? BiasType::kF16 : BiasType::kBF16;
  const auto fixed = [&](BiasType t) { return t == inputs || t == BiasType::kNone; };
  const bool padded =
      eligible && aligned_inputs && !p.lean_tiles && fixed(p.bias1_type) && fixed(p.bias2_type);
  p.wgmma_tiles = eligible && (p.lean_tiles || padded);
  p.padded_tiles = padded;
}

// Keeps a call on the mma.sync kernels, which take every shape the warpgroup kernels take: for a
// device or build without the warpgroup kernels, or SCIATTN_CUDA_KERNELS=portable
// (cuda/common/device_arch.h).
inline void use_mma_sync_kernels(EvoformerDeviceParams& p) {
  p.wgmma_tiles = 0;
  p.delta_from_out_tiles = 0;
  p.padded_tiles = 0;
  p.in_place_tiles = 0;
  p.shifted_slices = 0;
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
  // A staged copy's rows are detail::cuda_staged_row(D) wide (any of Q, K, V staged with D not a
  // multiple of 8 means all are: none is vectorizable then).
  p.load_dim = std::max({q.sizes[4], k.sizes[4], v.sizes[4]});
  p.scale = detail::evoformer_scale(options, s.dim);
  p.prob_shift_log2 = probability_shift_log2(q.dtype, s.len);
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
  p.bias1_cols = p.bias2_cols = s.len;
  set_bias2_reach(p, bias2);
  p.lse = static_cast<float*>(lse.data);
  copy_strides(lse, p.lse_stride, {0, 1, 2});
  p.dbias2_chunks = 1;
  p.vec_out = vectorizable(out);
  p.out_paired = pairable(out);
  bool offsets_fit = true;
  for (const TensorView* t : {&q, &k, &v, &out}) {
    if (!tile_offsets_fit_32_bits(*t, 2)) offsets_fit = false;
  }
  const int64_t head_dim = detail::cuda_evoformer_head_dim(s.dim);
  p.lean_tiles =
      p.vec_q && p.vec_k && p.vec_v && p.vec_out && offsets_fit && s.dim == head_dim && s.dim >= 16;
  set_warpgroup_tiles(p, q.dtype, s, offsets_fit, p.vec_q && p.vec_k && p.vec_v);
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

// The forward's workspace plan: the padded copies of its unaligned biases and inputs (none of the
// inputs where the forward reads them in place). `warpgroup`: the device runs the warpgroup
// kernels (the dispatch asks the device; the same value for the plan, the copies and the
// parameters of one call).
inline detail::CudaForwardWorkspace forward_workspace(const EvoformerForwardParams& params,
                                                      const detail::EvoformerShape& s,
                                                      bool warpgroup = true) {
  return detail::plan_cuda_forward(
      s, evoformer_params::copy_needs(
             params.q, params.k, params.v, TensorView{}, params.bias1, params.bias2,
             evoformer_params::forward_reads_in_place(params, s, warpgroup)));
}

// The copies the forward's kernels read, into `workspace` (forward_workspace's regions).
inline EvoformerCopyJobs forward_copy_jobs(const EvoformerForwardParams& params,
                                           const detail::EvoformerShape& s, void* workspace,
                                           bool warpgroup = true) {
  const detail::CudaForwardWorkspace w = forward_workspace(params, s, warpgroup);
  return evoformer_params::copy_jobs(params.q, params.k, params.v, TensorView{}, params.bias1,
                                     params.bias2, w.copies, w.layout, workspace);
}

// `workspace` holds forward_workspace's regions (workspace_size bytes; nullptr where there are
// none), filled by forward_copy_jobs before the launch: the kernels read the copies, or Q, K and
// V in place (in_place_tiles).
inline EvoformerDeviceParams forward_device_params(const EvoformerForwardParams& params,
                                                   const detail::EvoformerShape& s, void* workspace,
                                                   bool warpgroup = true) {
  using namespace evoformer_params;
  const detail::CudaForwardWorkspace w = forward_workspace(params, s, warpgroup);
  const auto staged = [&](const TensorView& t, int i) {
    return staged_view(t, i, w.copies, w.layout, workspace);
  };
  EvoformerDeviceParams p =
      common_params(staged(params.q, detail::kStagedQ), staged(params.k, detail::kStagedK),
                    staged(params.v, detail::kStagedV), params.bias1, params.bias2, params.out,
                    params.lse, params.options, s);
  use_bias_copies(p, w.copies, w.layout, workspace);
  if (forward_reads_in_place(params, s, warpgroup)) {
    p.in_place_tiles = 1;
    p.shifted_slices = static_cast<int>(s.dim % 2);
    p.wgmma_tiles = 1;
    p.padded_tiles = 0;
    p.lean_tiles = 0;
    p.load_dim = s.dim;
  }
  return p;
}

// The backward's workspace plan: detail::plan_cuda_backward with the padded copies.
inline detail::CudaBackwardWorkspace backward_workspace(const EvoformerBackwardParams& params,
                                                        const detail::EvoformerShape& s) {
  return detail::plan_cuda_backward(
      s, params.dbias1.present(), params.dbias2.present(), params.q.dtype != DType::kF32,
      evoformer_params::copy_needs(params.q, params.k, params.v, params.dout, params.bias1,
                                   params.bias2));
}

// The copies the backward's kernels read, into `workspace` (backward_workspace's regions).
inline EvoformerCopyJobs backward_copy_jobs(const EvoformerBackwardParams& params,
                                            const detail::EvoformerShape& s, void* workspace) {
  const detail::CudaBackwardWorkspace w = backward_workspace(params, s);
  return evoformer_params::copy_jobs(params.q, params.k, params.v, params.dout, params.bias1,
                                     params.bias2, w.copies, w.layout, workspace);
}

// `workspace` holds backward_workspace's regions (workspace_size bytes), filled by
// backward_copy_jobs before the launch.
inline EvoformerDeviceParams backward_device_params(const EvoformerBackwardParams& params,
                                                    const detail::EvoformerShape& s,
                                                    void* workspace) {
  using namespace evoformer_params;
  const detail::CudaBackwardWorkspace w = backward_workspace(params, s);
  const auto staged = [&](const TensorView& t, int i) {
    return staged_view(t, i, w.copies, w.layout, workspace);
  };
  const TensorView q = staged(params.q, detail::kStagedQ), k = staged(params.k, detail::kStagedK),
                   v = staged(params.v, detail::kStagedV),
                   dout = staged(params.dout, detail::kStagedDout);
  EvoformerDeviceParams p =
      common_params(q, k, v, params.bias1, params.bias2, params.out, params.lse, params.options, s);
  p.dout = dout.data;
  qkv_strides(dout, p.dout_stride);
  p.vec_dout = vectorizable(dout);
  p.load_dim = std::max(p.load_dim, dout.sizes[4]);
  const bool dout_fits = tile_offsets_fit_32_bits(dout, 2);
  if (!p.vec_dout || !dout_fits) p.lean_tiles = 0;
  bool offsets_fit = dout_fits;
  for (const TensorView* t : {&q, &k, &v, &params.out}) {
    if (!tile_offsets_fit_32_bits(*t, 2)) offsets_fit = false;
  }
  set_warpgroup_tiles(p, params.q.dtype, s, offsets_fit,
                      p.vec_q && p.vec_k && p.vec_v && p.vec_dout);
  // The warpgroup dQ kernel, or the fused kernel at its first key tile, reads O's rows as it
  // reads dO's (whole 16-byte chunks of load_dim columns: O vectorizable and no wider staged
  // rows) and sums delta from the two tiles; the delta kernel (O read element by element where
  // it must) serves every other call.
  p.delta_from_out_tiles = p.wgmma_tiles && p.vec_out && p.load_dim == s.dim ? 1 : 0;
  p.dq = params.dq.data;
  qkv_strides(params.dq, p.dq_stride);
  p.dk = params.dk.data;
  qkv_strides(params.dk, p.dk_stride);
  p.dv = params.dv.data;
  qkv_strides(params.dv, p.dv_stride);
  p.grads_paired = pairable(params.dq) && pairable(params.dk) && pairable(params.dv);
  p.dbias1 = params.dbias1.data;
  copy_strides(params.dbias1, p.dbias1_stride, {0, 1, 4});
  p.dbias2 = params.dbias2.data;
  copy_strides(params.dbias2, p.dbias2_stride, {0, 2, 3, 4});
  use_bias_copies(p, w.copies, w.layout, workspace);
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
