// The problems the block-sparse op suites share, CPU (tests/cpu) and GPU (tests/cuda) alike: the
// MatMul case, how a case's tensors are stored and filled, problem builders and the Params of one
// call. Test layer; the fp64 oracle these problems are checked against is block_sparse_test_util.h.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "block_sparse_test_util.h"

namespace sciattn::bstest {

// ---- MatMul -------------------------------------------------------------------------------------

// How the dense operands and outputs are stored: packed, a view into a padded buffer (every
// stride differs from the packed one, unaligned start), or with the last two dimensions swapped
// in memory (a stride-1 dimension that is not the last).
enum class DenseStorage { kPacked, kPadded, kPermuted };

// One MatMul case. `small` (the GPU suite's quick subset for compute-sanitizer) and `split` are
// off in the CPU suite, and then take no part in the name.
struct MMCase {
  BlockSparseMatMulMode mode = BlockSparseMatMulMode::kSdd;
  bool ta = false, tb = false;
  DType dtype = DType::kF32;
  int64_t block = 16, Z = 2, H = 2, R = 3, C = 2;
  int64_t extra = 24;  // K for sdd, N for dsd, M for dds
  DenseStorage storage = DenseStorage::kPacked;
  bool small = false;
  // > 0: the index's work split re-made with pieces of at most this many blocks
  // (split_block_sparse_work), so that dsd / dds combine split lines from partial sums.
  int64_t split = 0;
  uint64_t seed = kBaseSeed;

  std::string name() const {
    static const char* storages[] = {"", "_padded", "_permuted"};
    return std::string(small ? "Small_" : "") + matmul_mode_name(mode) + (ta ? "_ta" : "") +
           (tb ? "_tb" : "") + "_" + dtype_name(dtype) + "_b" + std::to_string(block) + "_Z" +
           std::to_string(Z) + "H" + std::to_string(H) + "R" + std::to_string(R) + "C" +
           std::to_string(C) + "x" + std::to_string(extra) + storages[static_cast<int>(storage)] +
           (split > 0 ? "_split" + std::to_string(split) : "") + "_s" +
           std::to_string(seed - kBaseSeed);
  }
};

// GoogleTest prints a failing case's parameter with this.
inline void PrintTo(const MMCase& c, std::ostream* os) {
  *os << c.name() << " " << seed_note(c.seed);
}

inline HostTensor dense_tensor(DType dt, const std::vector<int64_t>& sizes, DenseStorage st) {
  switch (st) {
    case DenseStorage::kPadded:
      return test::make_tensor(dt, sizes, test::Layout::kPadded);
    case DenseStorage::kPermuted:
      return HostTensor::permuted(dt, sizes, {0, 1, 3, 2});
    case DenseStorage::kPacked:
      break;
  }
  return HostTensor::packed(dt, sizes);
}

struct MMProblem {
  MMCase c;
  Layout layout;
  BlockSparseIndex ix;
  HostTensor a, b, dc;
  bool a_sparse = false, b_sparse = false, c_sparse = false;
  std::vector<int64_t> c_sizes;
};

// The tensors of p's case (mode, ta, tb, dtype, Z, H, R, C, block, and `extra`: K for sdd, N for
// dsd, M for dds) on its index p.ix: the dense operands and a dense dC in the case's storage, the
// sparse ones packed [Z, nnz, b, b]; sets which are sparse (p.a_sparse, p.b_sparse, p.c_sparse)
// and the output's sizes (p.c_sizes), and fills A, B and dC from rng.
inline void make_matmul_tensors(MMProblem& p, std::mt19937_64& rng) {
  const MMCase& c = p.c;
  const int64_t rb = c.R * c.block, cb = c.C * c.block, b = c.block;
  const std::vector<int64_t> sparse = {c.Z, p.ix.nnz, b, b};
  const auto dense = [&](std::initializer_list<int64_t> sizes) {
    return dense_tensor(c.dtype, std::vector<int64_t>(sizes), c.storage);
  };
  switch (c.mode) {
    case BlockSparseMatMulMode::kSdd: {
      const int64_t k = c.extra;
      p.a = c.ta ? dense({c.Z, c.H, k, rb}) : dense({c.Z, c.H, rb, k});
      p.b = c.tb ? dense({c.Z, c.H, cb, k}) : dense({c.Z, c.H, k, cb});
      p.c_sparse = true;
      p.c_sizes = sparse;
      break;
    }
    case BlockSparseMatMulMode::kDsd: {
      const int64_t n = c.extra, kin = c.ta ? rb : cb, m = c.ta ? cb : rb;
      p.a = HostTensor::packed(c.dtype, sparse);
      p.a_sparse = true;
      p.b = c.tb ? dense({c.Z, c.H, n, kin}) : dense({c.Z, c.H, kin, n});
      p.c_sizes = {c.Z, c.H, m, n};
      break;
    }
    case BlockSparseMatMulMode::kDds: {
      const int64_t m = c.extra, kin = c.tb ? cb : rb, n = c.tb ? rb : cb;
      p.a = c.ta ? dense({c.Z, c.H, kin, m}) : dense({c.Z, c.H, m, kin});
      p.b = HostTensor::packed(c.dtype, sparse);
      p.b_sparse = true;
      p.c_sizes = {c.Z, c.H, m, n};
      break;
    }
  }
  p.dc = p.c_sparse ? HostTensor::packed(c.dtype, p.c_sizes)
                    : dense_tensor(c.dtype, p.c_sizes, c.storage);
  test::fill_normal(p.a, rng);
  test::fill_normal(p.b, rng);
  test::fill_normal(p.dc, rng);
}

// The problem of case c: a per-head layout with an empty block row (head 0) and an empty block
// column (last head), whose dense outputs must come out as zeros, its index (re-split when
// c.split > 0) and tensors, all drawn from c.seed. A GPU suite uploads the index.
inline MMProblem make_matmul_problem(const MMCase& c) {
  MMProblem p;
  p.c = c;
  std::mt19937_64 rng(c.seed);
  p.layout = random_layout(c.H, c.R, c.C, 0.5, rng, /*empty_row=*/true, /*empty_col=*/true);
  p.layout = maybe_shared_heads(p.layout, c.seed);
  p.ix = make_index(p.layout, c.block);
  if (c.split > 0) {
    EXPECT_TRUE(split_block_sparse_work(c.split, &p.ix).ok());
  }
  make_matmul_tensors(p, rng);
  return p;
}

// A fresh (poisoned) output of these sizes: sparse packed, dense in the case's storage.
inline HostTensor matmul_output(const MMProblem& p, const std::vector<int64_t>& sizes,
                                bool sparse) {
  return sparse ? HostTensor::packed(p.c.dtype, sizes)
                : dense_tensor(p.c.dtype, sizes, p.c.storage);
}

inline BlockSparseMatMulParams matmul_forward_params(const MMProblem& p, const TensorView& a,
                                                     const TensorView& b, const TensorView& c) {
  BlockSparseMatMulParams f;
  f.index = &p.ix;
  f.mode = p.c.mode;
  f.trans_a = p.c.ta;
  f.trans_b = p.c.tb;
  f.a = a;
  f.b = b;
  f.c = c;
  return f;
}

inline BlockSparseMatMulBackwardParams matmul_backward_params(
    const MMProblem& p, const TensorView& a, const TensorView& b, const TensorView& dc,
    const TensorView& da, const TensorView& db) {
  BlockSparseMatMulBackwardParams g;
  g.index = &p.ix;
  g.mode = p.c.mode;
  g.trans_a = p.c.ta;
  g.trans_b = p.c.tb;
  g.a = a;
  g.b = b;
  g.dc = dc;
  g.da = da;
  g.db = db;
  return g;
}

// ---- score terms (Softmax and attention) --------------------------------------------------------

// The rpe of a case: none, in the scores' dtype, in f32, or one table broadcast to every batch
// and head through 0 strides.
enum class RpeKind { kNone, kSameDtype, kF32, kBroadcast };

inline const char* rpe_name(RpeKind k) {
  static const char* names[] = {"none", "dtype", "f32", "bcast"};
  return names[static_cast<int>(k)];
}

// Makes query row `row` of an attention mask [rows, cols] of kind `kind` remove every key: the
// row is fully masked (its output 0, not NaN, and its gradients 0).
inline void mask_query_row(HostTensor& attn, MaskKind kind, int64_t row) {
  const int64_t cols = attn.sizes()[1];
  for (int64_t j = 0; j < cols; ++j) {
    attn.set(row * cols + j, kind == MaskKind::kAdd ? -kInf : 0.0);
  }
}

// ---- Softmax ------------------------------------------------------------------------------------

// The problem of a Softmax suite's case (its own case type: the suites store rpe and masks
// differently).
template <class Case>
struct SoftmaxSuiteProblem {
  Case c;
  Layout layout;
  BlockSparseIndex ix;
  HostTensor x, rpe, kpm, attn, dy;
};

// The problem of a Softmax case c (dtype, Z, H, R, C, block, kpm and attn as MaskKinds, seed),
// drawn from c.seed: a random layout (density 0.6, block row 0 of head 0 empty), its index; x and
// dy from sparse_tensor(nnz), x drawn with standard deviation 2; rpe from rpe_tensor() (absent
// when not present()); the masks in mask_dtype (bool masks stay bool), padded views when
// `strided_masks`, a fifth of their entries removing their key; and, when there is an attention
// mask, query row 1 fully masked. A GPU suite uploads the index.
template <class Case, class SparseTensor, class RpeTensor>
SoftmaxSuiteProblem<Case> make_softmax_problem(const Case& c, const SparseTensor& sparse_tensor,
                                               const RpeTensor& rpe_tensor, DType mask_dtype,
                                               bool strided_masks) {
  SoftmaxSuiteProblem<Case> p;
  p.c = c;
  std::mt19937_64 rng(c.seed);
  p.layout = random_layout(c.H, c.R, c.C, 0.6, rng, /*empty_row=*/true);
  p.layout = maybe_shared_heads(p.layout, c.seed);
  p.ix = make_index(p.layout, c.block);
  const int64_t rows = c.R * c.block, cols = c.C * c.block;
  p.x = sparse_tensor(p.ix.nnz);
  p.dy = sparse_tensor(p.ix.nnz);
  test::fill_normal(p.x, rng, 2.0);
  test::fill_normal(p.dy, rng);
  p.rpe = rpe_tensor();
  if (p.rpe.present()) test::fill_normal(p.rpe, rng);
  p.kpm = make_mask(c.kpm, mask_dtype, {c.Z, cols}, 0.2, rng, strided_masks);
  p.attn = make_mask(c.attn, mask_dtype, {rows, cols}, 0.2, rng, strided_masks);
  if (p.attn.present()) mask_query_row(p.attn, c.attn, 1);
  return p;
}

// The forward Params of a Softmax problem's case on these tensors (in place, x = y, when the
// case says so).
template <class Problem>
BlockSparseSoftmaxParams softmax_forward_params(const Problem& p, const TensorView& x,
                                                const TensorView& y, const TensorView& rpe,
                                                const TensorView& kpm, const TensorView& attn) {
  BlockSparseSoftmaxParams f;
  f.index = &p.ix;
  f.x = p.c.in_place ? y : x;
  f.y = y;
  f.scale = p.c.scale;
  f.rpe = rpe;
  f.key_padding_mask = kpm;
  f.attn_mask = attn;
  f.key_padding_mask_mode = mode_of(p.c.kpm);
  f.attn_mask_mode = mode_of(p.c.attn);
  f.causal = p.c.causal;
  return f;
}

template <class Problem>
BlockSparseSoftmaxBackwardParams softmax_backward_params(const Problem& p, const TensorView& y,
                                                         const TensorView& dy,
                                                         const TensorView& dx) {
  BlockSparseSoftmaxBackwardParams g;
  g.index = &p.ix;
  g.y = y;
  g.dy = dy;
  g.dx = dx;
  g.scale = p.c.scale;
  return g;
}

// ---- sparse attention ---------------------------------------------------------------------------

// How q, k, v, dout and the outputs [B, H, L, D] are stored. kPadded: views into padded buffers
// (padded strides, an unaligned start). kBLHD: views of a packed [B, L, H, D] buffer (heads
// interleaved, as a projection reshaped without a transpose gives them). kKeyT: K and V stored
// [B, H, D, L] (DeepSpeed's pre-transposed key), viewed as [B, H, L, D] with a non-unit stride on
// D; the other tensors packed.
enum class QkvStorage { kPacked, kPadded, kBLHD, kKeyT };

inline const char* qkv_storage_name(QkvStorage s) {
  static const char* names[] = {"packed", "padded", "blhd", "keyt"};
  return names[static_cast<int>(s)];
}

// A [B, H, L, D] tensor of an attention case (its dtype, B, H, L(), D and storage);
// `key_or_value` for k and v.
template <class Case>
HostTensor qkv_tensor(const Case& c, bool key_or_value = false) {
  const std::vector<int64_t> sizes = {c.B, c.H, c.L(), c.D};
  switch (c.storage) {
    case QkvStorage::kPadded:
      return test::make_tensor(c.dtype, sizes, test::Layout::kPadded);
    case QkvStorage::kBLHD:
      return HostTensor::permuted(c.dtype, sizes, {0, 2, 1, 3});
    case QkvStorage::kKeyT:
      if (key_or_value) return HostTensor::permuted(c.dtype, sizes, {0, 1, 3, 2});
      break;
    case QkvStorage::kPacked:
      break;
  }
  return HostTensor::packed(c.dtype, sizes);
}

// The lse [B, H, L] of an attention case, in f32.
template <class Case>
HostTensor lse_tensor(const Case& c) {
  return HostTensor::packed(DType::kF32, {c.B, c.H, c.L()});
}

// The rpe [B, H, L, L] of an attention case of this kind (absent for kNone), packed or broadcast.
inline HostTensor attention_rpe(RpeKind kind, DType dtype, int64_t B, int64_t H, int64_t L) {
  switch (kind) {
    case RpeKind::kNone:
      break;
    case RpeKind::kSameDtype:
      return HostTensor::packed(dtype, {B, H, L, L});
    case RpeKind::kF32:
      return HostTensor::packed(DType::kF32, {B, H, L, L});
    case RpeKind::kBroadcast:
      return HostTensor::with_layout(dtype, {B, H, L, L}, {0, 0, L, 1}, 0, L * L);
  }
  return HostTensor();
}

// The problem of an attention suite's case (its own case type: the suites draw their layouts
// and cases differently).
template <class Case>
struct AttentionSuiteProblem {
  Case c;
  Layout layout;
  BlockSparseIndex ix;
  HostTensor q, k, v, dout, rpe, kpm, attn;
};

// q, k, v and dout of p's case, filled from rng in that order.
template <class Problem>
void make_qkv_inputs(Problem& p, std::mt19937_64& rng) {
  p.q = qkv_tensor(p.c);
  p.k = qkv_tensor(p.c, /*key_or_value=*/true);
  p.v = qkv_tensor(p.c, /*key_or_value=*/true);
  p.dout = qkv_tensor(p.c);
  test::fill_normal(p.q, rng);
  test::fill_normal(p.k, rng);
  test::fill_normal(p.v, rng);
  test::fill_normal(p.dout, rng);
}

// The problem of an attention case c (dtype, B, H, N, block, D, L(), layout as an AttnLayoutKind,
// storage, rpe, kpm and attn as MaskKinds, seed), drawn from c.seed: its layout and index, q, k, v
// and dout, rpe (attention_rpe), the masks with a fraction `removed` of their entries removing
// their key, and, when there is an attention mask, query 2 seeing no key at all (out 0, lse -inf,
// zero gradients). A GPU suite re-splits and uploads the index.
template <class Case>
AttentionSuiteProblem<Case> make_attention_problem(const Case& c, double removed) {
  AttentionSuiteProblem<Case> p;
  p.c = c;
  std::mt19937_64 rng(c.seed);
  p.layout = attention_case_layout(c.layout, c.H, c.N, c.block, c.seed, rng);
  p.layout = maybe_shared_heads(p.layout, c.seed);
  p.ix = make_index(p.layout, c.block);
  make_qkv_inputs(p, rng);
  const int64_t L = c.L();
  p.rpe = attention_rpe(c.rpe, c.dtype, c.B, c.H, L);
  if (p.rpe.present()) test::fill_normal(p.rpe, rng);
  p.kpm = make_mask(c.kpm, c.dtype, {c.B, L}, removed, rng);
  p.attn = make_mask(c.attn, c.dtype, {L, L}, removed, rng);
  if (p.attn.present() && L > 2) mask_query_row(p.attn, c.attn, 2);
  return p;
}

// The options of an attention case (scale, causal, the masks' modes) with this algorithm.
template <class Case>
SparseAttentionOptions attention_options(const Case& c, SparseAttentionAlgorithm algorithm,
                                         int threads = 0) {
  SparseAttentionOptions o;
  o.scale = c.scale;
  o.causal = c.causal;
  o.key_padding_mask_mode = mode_of(c.kpm);
  o.attn_mask_mode = mode_of(c.attn);
  o.num_threads = threads;
  o.algorithm = algorithm;
  return o;
}

// The inputs of one attention call: host or device views of a problem's tensors.
struct AttnViews {
  TensorView q, k, v, rpe, kpm, attn, dout;
};

template <class Problem>
AttnViews host_views(const Problem& p) {
  return {p.q.view(),   p.k.view(),    p.v.view(),   p.rpe.view(),
          p.kpm.view(), p.attn.view(), p.dout.view()};
}

inline SparseAttentionForwardParams attention_forward_params(const BlockSparseIndex& ix,
                                                             const AttnViews& in,
                                                             const TensorView& out,
                                                             const TensorView& lse,
                                                             const SparseAttentionOptions& o) {
  SparseAttentionForwardParams f;
  f.index = &ix;
  f.q = in.q;
  f.k = in.k;
  f.v = in.v;
  f.rpe = in.rpe;
  f.key_padding_mask = in.kpm;
  f.attn_mask = in.attn;
  f.out = out;
  f.lse = lse;
  f.options = o;
  return f;
}

inline SparseAttentionBackwardParams attention_backward_params(
    const BlockSparseIndex& ix, const AttnViews& in, const TensorView& out, const TensorView& lse,
    const TensorView& dq, const TensorView& dk, const TensorView& dv,
    const SparseAttentionOptions& o) {
  SparseAttentionBackwardParams g;
  g.index = &ix;
  g.q = in.q;
  g.k = in.k;
  g.v = in.v;
  g.rpe = in.rpe;
  g.key_padding_mask = in.kpm;
  g.attn_mask = in.attn;
  g.out = out;
  g.lse = lse;
  g.dout = in.dout;
  g.dq = dq;
  g.dk = dk;
  g.dv = dv;
  g.options = o;
  return g;
}

}  // namespace sciattn::bstest
