// Building blocks of the CPU block-sparse kernels: strided 4-D tile loads and stores that convert
// to and from fp32, the score terms (scale, rpe, masks, causal) shared by the Softmax and the
// fused attention, and per-thread scratch (their multiply-accumulate is cpu/gemm_acc.h's). CPU
// layer.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "common/cpu_threads.h"
#include "common/workspace_layout.h"
#include "cpu/cpu_clones.h"
#include "cpu/gemm_acc.h"
#include "cpu/strided_access.h"
#include "sciattn/block_sparse_ops.h"

namespace sciattn::cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Threads a call may use: the request, or all hardware threads for 0. Its workspace holds scratch
// for that many; each loop runs on block_loop_threads() of them. Results never depend on either.
inline int block_sparse_threads(int requested) {
  return requested > 0 ? requested : std::max(1, omp_get_max_threads());
}

// The block-sparse kernels' rate on one core in cpu_threads.h's units (their x86-64-v4 clones on
// the 2-core CPU machine, 2026-12-04): the fused forward took 6.2 ns per score at D 64 (62 per
// ns), the composite forward 7.9 ns (49 per ns), the fused backward 12.8 ns (90 per ns). The
// vectorised exponential (cpu/vector_exp.h) has since made them 1.2-1.4x faster (BigBird at
// L 4096: fused forward 1.4x, backward 1.2x, composite forward 1.4x), so this rate undercounts
// by that much: a loop takes its second thread at 2.1-2.5 ms of one core rather than 3. The
// baseline clone is 2-3x slower, so there a loop needs 2-3x the time before it takes a second
// thread.
constexpr double kBlockSparseFlopsPerNs = 60.0;

// Threads of one loop of a call that may use `threads`: the loop has `tasks` tasks, which together
// handle `blocks` b x b blocks at `flops_per_element` FLOP per block element (an exponential
// counted as detail::kCpuExpFlops). No more than the work keeps busy (common/cpu_threads.h).
inline int block_loop_threads(int threads, int64_t tasks, int64_t blocks, int64_t b,
                              double flops_per_element) {
  return detail::cpu_loop_threads(
      threads, tasks, static_cast<double>(blocks) * static_cast<double>(b * b) * flops_per_element,
      kBlockSparseFlopsPerNs);
}

// Element offset of (i0, i1, i2, i3) in a rank-4 view.
inline int64_t off4(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

// A view with its last two dimensions swapped: op(X) = X^T without a copy. Every kernel reads
// and writes dense operands through their strides, so a transposed operand is just a view.
inline TensorView transposed(const TensorView& t) {
  TensorView r = t;
  std::swap(r.sizes[2], r.sizes[3]);
  std::swap(r.strides[2], r.strides[3]);
  return r;
}

// Whether a tile of t is read faster column by column: its rows are further apart in memory than
// its columns (a transposed view, e.g. K^T of a [.., L, D] tensor). Reading along the unit stride
// keeps the loads contiguous; the scatter into the small fp32 tile stays in L1.
inline bool column_major(const TensorView& t) {
  return t.strides[3] != 1 && std::abs(t.strides[2]) < std::abs(t.strides[3]);
}

// Elements moved per step when a tile is read or written column by column.
constexpr int64_t kColumnChunk = 64;

// dst[r * ld + c] = t[i0, i1, row0 + r, col0 + c] for r < rows, c < cols, as float.
SCIATTN_CPU_INLINE void load_tile(const TensorView& t, int64_t i0, int64_t i1, int64_t row0,
                                  int64_t rows, int64_t col0, int64_t cols, float* dst,
                                  int64_t ld) {
  if (!column_major(t)) {
    for (int64_t r = 0; r < rows; ++r) {
      load_row(t, off4(t, i0, i1, row0 + r, col0), t.strides[3], cols, dst + r * ld);
    }
    return;
  }
  float chunk[kColumnChunk];
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r0 = 0; r0 < rows; r0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, rows - r0);
      load_row(t, off4(t, i0, i1, row0 + r0, col0 + c), t.strides[2], n, chunk);
      for (int64_t r = 0; r < n; ++r) dst[(r0 + r) * ld + c] = chunk[r];
    }
  }
}

// The transpose of that tile: dst[c * ld + r] = t[i0, i1, row0 + r, col0 + c].
SCIATTN_CPU_INLINE void load_tile_transposed(const TensorView& t, int64_t i0, int64_t i1,
                                             int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                                             float* dst, int64_t ld) {
  if (column_major(t) || t.strides[3] != 1) {
    for (int64_t c = 0; c < cols; ++c) {
      load_row(t, off4(t, i0, i1, row0, col0 + c), t.strides[2], rows, dst + c * ld);
    }
    return;
  }
  float chunk[kColumnChunk];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, cols - c0);
      load_row(t, off4(t, i0, i1, row0 + r, col0 + c0), 1, n, chunk);
      for (int64_t c = 0; c < n; ++c) dst[(c0 + c) * ld + r] = chunk[c];
    }
  }
}

// t[i0, i1, row0 + r, col0 + c] = src[r * ld + c], rounded to t's dtype.
SCIATTN_CPU_INLINE void store_tile(const TensorView& t, int64_t i0, int64_t i1, int64_t row0,
                                   int64_t rows, int64_t col0, int64_t cols, const float* src,
                                   int64_t ld) {
  if (!column_major(t)) {
    for (int64_t r = 0; r < rows; ++r) {
      store_row(t, off4(t, i0, i1, row0 + r, col0), t.strides[3], cols, src + r * ld);
    }
    return;
  }
  float chunk[kColumnChunk];
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r0 = 0; r0 < rows; r0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, rows - r0);
      for (int64_t r = 0; r < n; ++r) chunk[r] = src[(r0 + r) * ld + c];
      store_row(t, off4(t, i0, i1, row0 + r0, col0 + c), t.strides[2], n, chunk);
    }
  }
}

// What is added to a raw score x = <q_i, k_j> before the softmax (spec 2.3):
//   v = x * scale + rpe[z, h, i, j] + kpm(key_padding_mask[z, j]) + am(attn_mask[i, j]),
//   v = -inf where causal and j > i.
// The Softmax op and the fused attention both go through apply(), so a score gets the same
// terms in the same order on either path.
struct ScoreTerms {
  float scale = 1.0f;
  const TensorView* rpe = nullptr;               // [Z, H, rows, cols] or absent
  const TensorView* key_padding_mask = nullptr;  // [Z, cols] or absent
  const TensorView* attn_mask = nullptr;         // [rows, cols] or absent
  MaskMode key_padding_mask_mode = MaskMode::kAdd;
  MaskMode attn_mask_mode = MaskMode::kAdd;
  bool causal = false;

  // Loads `count` mask values starting at `offset`, `stride` apart, as additive terms.
  static SCIATTN_CPU_INLINE void mask_row(const TensorView& m, MaskMode mode, int64_t offset,
                                          int64_t stride, int64_t count, float* dst) {
    load_row(m, offset, stride, count, dst);  // a kBool mask already reads as 0 / -inf
    if (mode == MaskMode::kMul && m.dtype != DType::kBool) {
      for (int64_t c = 0; c < count; ++c) dst[c] = dst[c] == 0.0f ? kNegInf : 0.0f;
    }
  }

  // v[c] holds the raw score of (row i, column j0 + c) of batch z, head h; `tmp` is scratch of
  // `count` floats.
  SCIATTN_CPU_INLINE void apply(int64_t z, int64_t h, int64_t i, int64_t j0, int64_t count,
                                float* v, float* tmp) const {
    // DeepSpeed skips the multiplication when scale is 1; x * 1 == x, so this only saves time.
    if (scale != 1.0f) {
      for (int64_t c = 0; c < count; ++c) v[c] *= scale;
    }
    if (rpe != nullptr && rpe->present()) {
      load_row(*rpe, off4(*rpe, z, h, i, j0), rpe->strides[3], count, tmp);
      for (int64_t c = 0; c < count; ++c) v[c] += tmp[c];
    }
    if (key_padding_mask != nullptr && key_padding_mask->present()) {
      const TensorView& m = *key_padding_mask;
      mask_row(m, key_padding_mask_mode, z * m.strides[0] + j0 * m.strides[1], m.strides[1], count,
               tmp);
      for (int64_t c = 0; c < count; ++c) v[c] += tmp[c];
    }
    if (attn_mask != nullptr && attn_mask->present()) {
      const TensorView& m = *attn_mask;
      mask_row(m, attn_mask_mode, i * m.strides[0] + j0 * m.strides[1], m.strides[1], count, tmp);
      for (int64_t c = 0; c < count; ++c) v[c] += tmp[c];
    }
    if (causal) {
      for (int64_t c = std::max<int64_t>(0, i + 1 - j0); c < count; ++c) v[c] = kNegInf;
    }
  }
};

// Per-thread scratch: `threads` regions of `per_thread` bytes each, carved from one workspace.
// The plan functions of each kernel report per_thread; the total is what workspace_size() adds.
struct ThreadScratch {
  size_t per_thread = 0;  // a multiple of WorkspaceLayout::kAlignment
  int threads = 1;

  size_t total_bytes() const {
    return per_thread == 0
               ? 0
               : per_thread * static_cast<size_t>(threads) + detail::WorkspaceLayout::kAlignment;
  }
  // The calling OpenMP thread's region (aligned) of a workspace of total_bytes().
  std::byte* mine(void* workspace) const {
    const detail::WorkspaceLayout aligner;
    return aligner.at<std::byte>(workspace, 0) +
           static_cast<size_t>(omp_get_thread_num()) * per_thread;
  }
};

}  // namespace sciattn::cpu
