// Shared helpers for the Evoformer test suites: an independent fp64 Evoformer (forward and
// backward), seeded random tensors, strided tensor builders, library runners and the tolerance rule
// of docs/conventions.md. Test layer (tests/cpu); it uses only the public API in include/sciattn.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "sciattn/dtype.h"
#include "sciattn/evoformer.h"
#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn::test {

// Every random test seeds its generator with kBaseSeed plus an index of its own and prints the
// seed, so that a failure can be reproduced by rerunning that single test.
constexpr uint64_t kBaseSeed = 0x5C1A77E0ull;

inline std::string seed_note(uint64_t seed) {
  return "seed = " + std::to_string(seed);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

inline int64_t numel_of(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

inline std::vector<int64_t> packed_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t running = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = running;
    running *= sizes[d];
  }
  return strides;
}

inline std::string dims_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The bit pattern written into every storage element before a run. A NaN shows up in any output
// element the library forgets to write; for inputs it poisons padding the library must not read.
inline uint32_t poison_bits(DType t) {
  switch (t) {
    case DType::kF32:
      return 0x7fc0dead;  // a quiet NaN with a recognisable payload
    case DType::kF16:
      return 0x7e5a;  // a quiet f16 NaN
    case DType::kBF16:
      return 0x7fda;  // a quiet bf16 NaN
    case DType::kBool:
      return 0x5a;  // not 0 or 1: never produced by the tests
  }
  return 0;
}

// An owning strided host tensor: storage plus a view (sizes, strides, element offset) into it.
// Element access is by the logical row-major index of the view, whatever the strides are.
// A default-constructed HostTensor is "absent" and its view has a null data pointer.
class HostTensor {
 public:
  HostTensor() = default;

  // A packed row-major tensor.
  static HostTensor packed(DType dtype, const std::vector<int64_t>& sizes) {
    return with_layout(dtype, sizes, packed_strides(sizes), 0, numel_of(sizes));
  }

  // A view with explicit strides, starting `offset` elements into a storage of `storage_elems`.
  static HostTensor with_layout(DType dtype, const std::vector<int64_t>& sizes,
                                const std::vector<int64_t>& strides, int64_t offset,
                                int64_t storage_elems) {
    HostTensor t;
    t.present_ = true;
    t.dtype_ = dtype;
    t.sizes_ = sizes;
    t.strides_ = strides;
    t.offset_ = offset;
    t.storage_elems_ = storage_elems;
    const size_t bytes = static_cast<size_t>(storage_elems) * dtype_size(dtype);
    // uint64_t storage keeps the base 8-byte aligned; views may start at any element offset.
    t.storage_.assign(bytes / 8 + 1, 0);
    t.poison();
    return t;
  }

  // A view into a larger buffer: every dimension d is padded to sizes[d] + pads[d] elements, and
  // the view starts `offset` elements into the storage. No stride is packed, the last dim's
  // stride stays 1, and the start is (for offset % 4 != 0) not 16-byte aligned.
  static HostTensor padded(DType dtype, const std::vector<int64_t>& sizes,
                           const std::vector<int64_t>& pads, int64_t offset) {
    std::vector<int64_t> extents(sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d) extents[d] = sizes[d] + pads[d];
    return with_layout(dtype, sizes, packed_strides(extents), offset, offset + numel_of(extents));
  }

  // A packed tensor whose dimensions are laid out in memory in `order` (outermost first); for
  // example {0, 2, 1, 3, 4} stores a [B, N, L, H, D] view as a packed [B, L, N, H, D] buffer,
  // which is the triangle-attention "ending node" transposed view.
  static HostTensor permuted(DType dtype, const std::vector<int64_t>& sizes,
                             const std::vector<int>& order) {
    std::vector<int64_t> strides(sizes.size());
    int64_t running = 1;
    for (size_t k = order.size(); k-- > 0;) {
      strides[static_cast<size_t>(order[k])] = running;
      running *= sizes[static_cast<size_t>(order[k])];
    }
    return with_layout(dtype, sizes, strides, 0, numel_of(sizes));
  }

  bool present() const { return present_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t numel() const { return present_ ? numel_of(sizes_) : 0; }

  std::byte* base() { return reinterpret_cast<std::byte*>(storage_.data()); }
  const std::byte* base() const { return reinterpret_cast<const std::byte*>(storage_.data()); }
  void* data() { return base() + static_cast<size_t>(offset_) * dtype_size(dtype_); }
  const void* data() const { return base() + static_cast<size_t>(offset_) * dtype_size(dtype_); }
  size_t storage_bytes() const { return static_cast<size_t>(storage_elems_) * dtype_size(dtype_); }

  TensorView view() const {
    TensorView v;
    if (!present_) return v;
    v.data = const_cast<void*>(data());
    v.dtype = dtype_;
    v.device = Device::kCpu;
    v.rank = static_cast<int>(sizes_.size());
    for (size_t d = 0; d < sizes_.size(); ++d) {
      v.sizes[d] = sizes_[d];
      v.strides[d] = strides_[d];
    }
    return v;
  }

  // Storage index (in elements, from the storage start) of logical row-major element `linear`.
  int64_t storage_index(int64_t linear) const {
    int64_t off = offset_;
    for (size_t d = sizes_.size(); d-- > 0;) {
      off += (linear % sizes_[d]) * strides_[d];
      linear /= sizes_[d];
    }
    return off;
  }

  double get(int64_t linear) const {
    return static_cast<double>(load_as_float(base(), dtype_, storage_index(linear)));
  }
  // Stores v rounded to nearest even in the tensor's dtype (kBool stores v != 0).
  void set(int64_t linear, double v) {
    store_from_float(base(), dtype_, storage_index(linear), static_cast<float>(v));
  }
  std::vector<double> values() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get(i);
    return out;
  }

  uint32_t raw_bits(int64_t storage_idx) const {
    const std::byte* p = base() + static_cast<size_t>(storage_idx) * dtype_size(dtype_);
    uint32_t u = 0;
    if (dtype_size(dtype_) == 4) {
      std::memcpy(&u, p, 4);
    } else if (dtype_size(dtype_) == 2) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      u = h;
    } else {
      u = static_cast<uint8_t>(*p);
    }
    return u;
  }
  void set_raw_bits(int64_t storage_idx, uint32_t u) {
    std::byte* p = base() + static_cast<size_t>(storage_idx) * dtype_size(dtype_);
    if (dtype_size(dtype_) == 4) {
      std::memcpy(p, &u, 4);
    } else if (dtype_size(dtype_) == 2) {
      const uint16_t h = static_cast<uint16_t>(u);
      std::memcpy(p, &h, 2);
    } else {
      *p = static_cast<std::byte>(u);
    }
  }

  // Fills every storage element, inside and outside the view, with the poison pattern.
  void poison() {
    for (int64_t i = 0; i < storage_elems_; ++i) set_raw_bits(i, poison_bits(dtype_));
  }

  // Storage elements outside the view that no longer hold the poison pattern: a write out of
  // bounds of the view (it must stay 0 for every output).
  int64_t touched_outside_view() const {
    if (!present_) return 0;
    std::vector<char> inside(static_cast<size_t>(storage_elems_), 0);
    for (int64_t i = 0; i < numel(); ++i) inside[static_cast<size_t>(storage_index(i))] = 1;
    int64_t touched = 0;
    for (int64_t i = 0; i < storage_elems_; ++i) {
      if (!inside[static_cast<size_t>(i)] && raw_bits(i) != poison_bits(dtype_)) ++touched;
    }
    return touched;
  }

  // True when no storage element was written since the last poison().
  bool untouched() const {
    for (int64_t i = 0; i < storage_elems_; ++i) {
      if (raw_bits(i) != poison_bits(dtype_)) return false;
    }
    return true;
  }

  // Whole storage, padding included, byte for byte.
  bool same_bytes(const HostTensor& other) const {
    if (present_ != other.present_) return false;
    if (!present_) return true;
    return storage_bytes() == other.storage_bytes() &&
           std::memcmp(base(), other.base(), storage_bytes()) == 0;
  }

 private:
  bool present_ = false;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> sizes_, strides_;
  int64_t offset_ = 0;
  int64_t storage_elems_ = 0;
  std::vector<uint64_t> storage_;
};

// ------------------------------------------------------------------------------------------------
// The independent fp64 Evoformer. Plain loops over packed row-major arrays, written from the math
// in docs/evoformer.md, sharing no code with the library. It is the oracle for the library's
// fp32 reference (kReference) and, through it, for everything else.
// ------------------------------------------------------------------------------------------------

struct EvoShape {
  int64_t B = 1, N = 1, L = 1, H = 1, D = 1;

  std::vector<int64_t> qkv() const { return {B, N, L, H, D}; }
  std::vector<int64_t> bias1() const { return {B, N, 1, 1, L}; }
  std::vector<int64_t> bias2() const { return {B, 1, H, L, L}; }
  std::vector<int64_t> lse() const { return {B * N, H, L}; }
  std::string str() const {
    return "B=" + std::to_string(B) + " N=" + std::to_string(N) + " L=" + std::to_string(L) +
           " H=" + std::to_string(H) + " D=" + std::to_string(D);
  }
};

struct NaiveProblem {
  EvoShape s;
  double scale = 1.0;
  std::vector<double> q, k, v;  // [B, N, L, H, D] packed
  std::vector<double> bias1;    // empty, or [B, N, L] packed; -inf for a masked key
  std::vector<double> bias2;    // empty, or [B, H, L, L] packed
};

struct NaiveForward {
  std::vector<double> out;  // [B, N, L, H, D]
  std::vector<double> lse;  // [B*N, H, L]; -inf for a fully masked row
};

struct NaiveGrads {
  std::vector<double> dq, dk, dv;  // [B, N, L, H, D]
  std::vector<double> dbias1;      // [B, N, L] when the problem has bias1
  std::vector<double> dbias2;      // [B, H, L, L] when the problem has bias2
};

inline size_t qkv_at(const EvoShape& s, int64_t b, int64_t n, int64_t l, int64_t h, int64_t d) {
  return static_cast<size_t>((((b * s.N + n) * s.L + l) * s.H + h) * s.D + d);
}

// Scores s_ij of query row i against every key j for one (b, n, h).
inline void naive_score_row(const NaiveProblem& p, int64_t b, int64_t n, int64_t h, int64_t i,
                            std::vector<double>& row) {
  const EvoShape& s = p.s;
  row.assign(static_cast<size_t>(s.L), 0.0);
  for (int64_t j = 0; j < s.L; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < s.D; ++d)
      dot += p.q[qkv_at(s, b, n, i, h, d)] * p.k[qkv_at(s, b, n, j, h, d)];
    double x = p.scale * dot;
    if (!p.bias1.empty()) x += p.bias1[static_cast<size_t>((b * s.N + n) * s.L + j)];
    if (!p.bias2.empty()) x += p.bias2[static_cast<size_t>(((b * s.H + h) * s.L + i) * s.L + j)];
    row[static_cast<size_t>(j)] = x;
  }
}

// Probabilities of one row, and its log-sum-exp. A row whose every score is -inf has no
// probability mass at all: all P are 0 and the lse is -inf (the documented masked-row result).
inline double naive_softmax_row(const std::vector<double>& row, std::vector<double>& prob) {
  double m = -kInf;
  for (double x : row) m = std::max(m, x);
  prob.assign(row.size(), 0.0);
  if (m == -kInf) return -kInf;
  double sum = 0.0;
  for (double x : row) sum += std::exp(x - m);
  const double lse = m + std::log(sum);
  for (size_t j = 0; j < row.size(); ++j) prob[j] = std::exp(row[j] - lse);
  return lse;
}

inline NaiveForward naive_forward(const NaiveProblem& p) {
  const EvoShape& s = p.s;
  NaiveForward f;
  f.out.assign(static_cast<size_t>(numel_of(s.qkv())), 0.0);
  f.lse.assign(static_cast<size_t>(numel_of(s.lse())), 0.0);
  std::vector<double> row, prob;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.L; ++i) {
          naive_score_row(p, b, n, h, i, row);
          f.lse[static_cast<size_t>(((b * s.N + n) * s.H + h) * s.L + i)] =
              naive_softmax_row(row, prob);
          for (int64_t d = 0; d < s.D; ++d) {
            double acc = 0.0;
            for (int64_t j = 0; j < s.L; ++j) {
              acc += prob[static_cast<size_t>(j)] * p.v[qkv_at(s, b, n, j, h, d)];
            }
            f.out[qkv_at(s, b, n, i, h, d)] = acc;
          }
        }
  return f;
}

// Gradients of sum(dout * out). With P the softmax, dP_ij = <dO_i, V_j>,
// dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik); dQ_i = scale sum_j dS_ij K_j, dK_j = scale sum_i dS_ij
// Q_i, dV_j = sum_i P_ij dO_i; dbias1 sums dS over heads and query rows, dbias2 over N.
inline NaiveGrads naive_backward(const NaiveProblem& p, const std::vector<double>& dout) {
  const EvoShape& s = p.s;
  const size_t n_qkv = static_cast<size_t>(numel_of(s.qkv()));
  NaiveGrads g;
  g.dq.assign(n_qkv, 0.0);
  g.dk.assign(n_qkv, 0.0);
  g.dv.assign(n_qkv, 0.0);
  if (!p.bias1.empty()) g.dbias1.assign(p.bias1.size(), 0.0);
  if (!p.bias2.empty()) g.dbias2.assign(p.bias2.size(), 0.0);
  std::vector<double> row, prob, dp(static_cast<size_t>(s.L));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.L; ++i) {
          naive_score_row(p, b, n, h, i, row);
          naive_softmax_row(row, prob);
          double row_dot = 0.0;
          for (int64_t j = 0; j < s.L; ++j) {
            double acc = 0.0;
            for (int64_t d = 0; d < s.D; ++d) {
              acc += dout[qkv_at(s, b, n, i, h, d)] * p.v[qkv_at(s, b, n, j, h, d)];
            }
            dp[static_cast<size_t>(j)] = acc;
            row_dot += prob[static_cast<size_t>(j)] * acc;
          }
          for (int64_t j = 0; j < s.L; ++j) {
            const double pj = prob[static_cast<size_t>(j)];
            const double ds = pj * (dp[static_cast<size_t>(j)] - row_dot);
            for (int64_t d = 0; d < s.D; ++d) {
              g.dq[qkv_at(s, b, n, i, h, d)] += p.scale * ds * p.k[qkv_at(s, b, n, j, h, d)];
              g.dk[qkv_at(s, b, n, j, h, d)] += p.scale * ds * p.q[qkv_at(s, b, n, i, h, d)];
              g.dv[qkv_at(s, b, n, j, h, d)] += pj * dout[qkv_at(s, b, n, i, h, d)];
            }
            if (!g.dbias1.empty()) g.dbias1[static_cast<size_t>((b * s.N + n) * s.L + j)] += ds;
            if (!g.dbias2.empty()) {
              g.dbias2[static_cast<size_t>(((b * s.H + h) * s.L + i) * s.L + j)] += ds;
            }
          }
        }
  return g;
}

// ------------------------------------------------------------------------------------------------
// Test cases: shapes, dtypes, biases and layouts, turned into seeded random inputs.
// ------------------------------------------------------------------------------------------------

enum class Bias1Kind { kNone, kSameAsQ, kF32, kBool };
enum class Bias2Kind { kNone, kSameAsQ, kF32 };
// kPadded: a view into a larger buffer (padding in every dim, unaligned start).
// kTransposedNL: [B, N, L, H, D] views of a packed [B, L, N, H, D] buffer (the N and L strides
// swapped), the layout of triangle attention around the ending node.
// kWideRows: rows of D elements at the start of rows of D + 8 (the first D columns of a wider
// tensor), the 8 past D poisoned; aligned like a packed tensor (16-bit rows stay whole 16-byte
// chunks), so the kernels that pad D read past it unless they zero-fill there.
enum class Layout { kPacked, kPadded, kTransposedNL, kWideRows };

inline const char* bias1_name(Bias1Kind k) {
  switch (k) {
    case Bias1Kind::kNone:
      return "none";
    case Bias1Kind::kSameAsQ:
      return "qdtype";
    case Bias1Kind::kF32:
      return "f32";
    case Bias1Kind::kBool:
      return "bool";
  }
  return "?";
}
inline const char* bias2_name(Bias2Kind k) {
  switch (k) {
    case Bias2Kind::kNone:
      return "none";
    case Bias2Kind::kSameAsQ:
      return "qdtype";
    case Bias2Kind::kF32:
      return "f32";
  }
  return "?";
}
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kPacked:
      return "packed";
    case Layout::kPadded:
      return "padded";
    case Layout::kTransposedNL:
      return "transposedNL";
    case Layout::kWideRows:
      return "widerows";
  }
  return "?";
}

struct EvoConfig {
  EvoShape shape;
  DType dtype = DType::kF32;
  Bias1Kind bias1 = Bias1Kind::kNone;
  Bias2Kind bias2 = Bias2Kind::kNone;
  Layout in_layout = Layout::kPacked;   // q, k, v, dout (biases are padded when this is kPadded)
  Layout out_layout = Layout::kPacked;  // out, dq, dk, dv, dbias1, dbias2
  std::optional<float> scale;
  double mask_false_fraction = 0.2;  // for a bool bias1: fraction of keys masked out
  uint64_t seed = kBaseSeed;

  std::optional<DType> bias1_dtype() const {
    switch (bias1) {
      case Bias1Kind::kNone:
        return std::nullopt;
      case Bias1Kind::kSameAsQ:
        return dtype;
      case Bias1Kind::kF32:
        return DType::kF32;
      case Bias1Kind::kBool:
        return DType::kBool;
    }
    return std::nullopt;
  }
  std::optional<DType> bias2_dtype() const {
    switch (bias2) {
      case Bias2Kind::kNone:
        return std::nullopt;
      case Bias2Kind::kSameAsQ:
        return dtype;
      case Bias2Kind::kF32:
        return DType::kF32;
    }
    return std::nullopt;
  }
  std::string str() const {
    std::string s = shape.str() + " dtype=" + dtype_name(dtype) + " bias1=" + bias1_name(bias1) +
                    " bias2=" + bias2_name(bias2) + " in=" + layout_name(in_layout) +
                    " out=" + layout_name(out_layout);
    if (scale) s += " scale=" + std::to_string(*scale);
    return s + " " + seed_note(seed);
  }
  // A name usable as a GoogleTest parameter name (letters, digits, underscores).
  std::string test_name() const {
    std::string s = "B" + std::to_string(shape.B) + "N" + std::to_string(shape.N) + "L" +
                    std::to_string(shape.L) + "H" + std::to_string(shape.H) + "D" +
                    std::to_string(shape.D) + "_" + dtype_name(dtype) + "_b1" + bias1_name(bias1) +
                    "_b2" + bias2_name(bias2) + "_" + layout_name(in_layout) + "_" +
                    layout_name(out_layout);
    if (scale) s += "_scaled";
    return s + "_s" + std::to_string(seed - kBaseSeed);
  }
};

// Allocates a tensor of `sizes` in `layout`. Only rank-5 [B, N, L, H, D] tensors can be
// transposed; smaller-rank tensors in that layout are packed.
inline HostTensor make_tensor(DType dtype, const std::vector<int64_t>& sizes, Layout layout) {
  switch (layout) {
    case Layout::kPacked:
      return HostTensor::packed(dtype, sizes);
    case Layout::kPadded: {
      // Pads of 1..3 elements (a different amount per dim) and a start 3 elements in.
      std::vector<int64_t> pads(sizes.size());
      for (size_t d = 0; d < sizes.size(); ++d) pads[d] = 1 + static_cast<int64_t>(d % 3);
      return HostTensor::padded(dtype, sizes, pads, 3);
    }
    case Layout::kTransposedNL:
      if (sizes.size() == 5) return HostTensor::permuted(dtype, sizes, {0, 2, 1, 3, 4});
      return HostTensor::packed(dtype, sizes);
    case Layout::kWideRows: {
      std::vector<int64_t> pads(sizes.size(), 0);
      pads.back() = 8;
      return HostTensor::padded(dtype, sizes, pads, 0);
    }
  }
  return HostTensor::packed(dtype, sizes);
}

struct EvoInputs {
  EvoConfig cfg;
  HostTensor q, k, v, bias1, bias2, dout;
};

inline void fill_normal(HostTensor& t, std::mt19937_64& rng, double stddev = 1.0) {
  std::normal_distribution<double> dist(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
}

// Random inputs for a case: q, k, v, dout ~ N(0, 1); float biases ~ N(0, 1); a bool bias1 is
// true with probability 1 - mask_false_fraction. With scale 1/sqrt(D) the scores have unit
// spread, so the softmax is neither one-hot nor uniform.
inline EvoInputs make_inputs(const EvoConfig& cfg) {
  std::mt19937_64 rng(cfg.seed);
  EvoInputs in;
  in.cfg = cfg;
  const EvoShape& s = cfg.shape;
  in.q = make_tensor(cfg.dtype, s.qkv(), cfg.in_layout);
  in.k = make_tensor(cfg.dtype, s.qkv(), cfg.in_layout);
  in.v = make_tensor(cfg.dtype, s.qkv(), cfg.in_layout);
  in.dout = make_tensor(cfg.dtype, s.qkv(), cfg.in_layout);
  fill_normal(in.q, rng);
  fill_normal(in.k, rng);
  fill_normal(in.v, rng);
  fill_normal(in.dout, rng);
  const Layout bias_layout = cfg.in_layout == Layout::kPadded ? Layout::kPadded : Layout::kPacked;
  if (auto t = cfg.bias1_dtype()) {
    in.bias1 = make_tensor(*t, s.bias1(), bias_layout);
    if (*t == DType::kBool) {
      std::bernoulli_distribution attend(1.0 - cfg.mask_false_fraction);
      for (int64_t i = 0; i < in.bias1.numel(); ++i) in.bias1.set(i, attend(rng) ? 1.0 : 0.0);
    } else {
      fill_normal(in.bias1, rng);
    }
  }
  if (auto t = cfg.bias2_dtype()) {
    in.bias2 = make_tensor(*t, s.bias2(), bias_layout);
    fill_normal(in.bias2, rng);
  }
  return in;
}

inline double effective_scale(const EvoConfig& cfg) {
  return cfg.scale ? static_cast<double>(*cfg.scale)
                   : 1.0 / std::sqrt(static_cast<double>(cfg.shape.D));
}

// The problem exactly as the library sees it: the stored (rounded) input values in fp64, with a
// bool bias1 turned into its additive meaning (0 to attend, -inf to mask).
inline NaiveProblem to_naive(const EvoInputs& in) {
  NaiveProblem p;
  p.s = in.cfg.shape;
  p.scale = effective_scale(in.cfg);
  p.q = in.q.values();
  p.k = in.k.values();
  p.v = in.v.values();
  if (in.bias1.present()) {
    p.bias1 = in.bias1.values();
    if (in.bias1.dtype() == DType::kBool) {
      for (double& x : p.bias1) x = x != 0.0 ? 0.0 : -kInf;
    }
  }
  if (in.bias2.present()) p.bias2 = in.bias2.values();
  return p;
}

// The additive meaning of a bool mask in a float dtype: 0 where the mask is true and `masked`
// where it is false. With masked = -inf this is exactly the bool mask; OpenFold's
// 1e9 * (mask - 1) is the same in f16, where -1e9 rounds to -inf.
inline HostTensor additive_mask(const HostTensor& mask, DType dtype, double masked = -kInf) {
  HostTensor t = HostTensor::packed(dtype, mask.sizes());
  for (int64_t i = 0; i < mask.numel(); ++i) t.set(i, mask.get(i) != 0.0 ? 0.0 : masked);
  return t;
}

// ------------------------------------------------------------------------------------------------
// Running the library.
// ------------------------------------------------------------------------------------------------

struct ForwardRun {
  Status status;
  size_t workspace_bytes = 0;
  HostTensor out, lse;
};

struct BackwardRun {
  Status status;
  size_t workspace_bytes = 0;
  HostTensor dq, dk, dv, dbias1, dbias2;
};

inline EvoformerOptions make_options(const EvoConfig& cfg, EvoformerCpuAlgorithm algo,
                                     int num_threads) {
  EvoformerOptions o;
  o.scale = cfg.scale;
  o.num_threads = num_threads;
  o.cpu_algorithm = algo;
  return o;
}

// Allocates a workspace of exactly workspace_size(p) bytes. When `misalign` is set the workspace
// starts one byte past an 8-byte boundary, which the library accepts (any alignment).
template <class Params>
inline Status run_with_workspace(const Params& p, size_t* bytes_out, bool misalign = false) {
  const size_t bytes = workspace_size(p);
  if (bytes_out) *bytes_out = bytes;
  std::vector<std::byte> ws(bytes + (misalign ? 1 : 0));
  void* ptr = ws.empty() ? nullptr : ws.data() + (misalign ? 1 : 0);
  return run(p, ptr, bytes);
}

// The forward's params over a case's host inputs and the given outputs (options left default).
inline EvoformerForwardParams forward_params_of(const EvoInputs& in, const TensorView& out,
                                                const TensorView& lse) {
  EvoformerForwardParams p;
  p.q = in.q.view();
  p.k = in.k.view();
  p.v = in.v.view();
  p.bias1 = in.bias1.view();
  p.bias2 = in.bias2.view();
  p.out = out;
  p.lse = lse;
  return p;
}

// Runs the forward on fresh outputs that are poisoned with NaN first.
inline ForwardRun run_forward(const EvoInputs& in, EvoformerCpuAlgorithm algo, int num_threads = 0,
                              bool with_lse = true, bool misalign_workspace = false) {
  const EvoConfig& cfg = in.cfg;
  ForwardRun r;
  r.out = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  if (with_lse) r.lse = HostTensor::packed(DType::kF32, cfg.shape.lse());
  EvoformerForwardParams p = forward_params_of(in, r.out.view(), r.lse.view());
  p.options = make_options(cfg, algo, num_threads);
  r.status = run_with_workspace(p, &r.workspace_bytes, misalign_workspace);
  return r;
}

// The backward's params over a forward's inputs and outputs (f), its dout and the gradients to
// write (views on any device; an absent dbias view is not requested).
inline EvoformerBackwardParams backward_params_of(const EvoformerForwardParams& f,
                                                  const TensorView& dout, const TensorView& dq,
                                                  const TensorView& dk, const TensorView& dv,
                                                  const TensorView& dbias1,
                                                  const TensorView& dbias2) {
  EvoformerBackwardParams p;
  p.q = f.q;
  p.k = f.k;
  p.v = f.v;
  p.bias1 = f.bias1;
  p.bias2 = f.bias2;
  p.out = f.out;
  p.lse = f.lse;
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.dbias1 = dbias1;
  p.dbias2 = dbias2;
  p.options = f.options;
  return p;
}

// Runs the backward on fresh, poisoned gradient tensors. dbias1 / dbias2 are requested when
// asked for (they take the dtype of their bias).
inline BackwardRun run_backward(const EvoInputs& in, const HostTensor& out, const HostTensor& lse,
                                EvoformerCpuAlgorithm algo, int num_threads, bool want_dbias1,
                                bool want_dbias2, bool misalign_workspace = false) {
  const EvoConfig& cfg = in.cfg;
  BackwardRun r;
  r.dq = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  r.dk = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  r.dv = make_tensor(cfg.dtype, cfg.shape.qkv(), cfg.out_layout);
  if (want_dbias1) r.dbias1 = make_tensor(in.bias1.dtype(), cfg.shape.bias1(), cfg.out_layout);
  if (want_dbias2) r.dbias2 = make_tensor(in.bias2.dtype(), cfg.shape.bias2(), cfg.out_layout);
  EvoformerForwardParams f = forward_params_of(in, out.view(), lse.view());
  f.options = make_options(cfg, algo, num_threads);
  const EvoformerBackwardParams p = backward_params_of(
      f, in.dout.view(), r.dq.view(), r.dk.view(), r.dv.view(), r.dbias1.view(), r.dbias2.view());
  r.status = run_with_workspace(p, &r.workspace_bytes, misalign_workspace);
  return r;
}

// ------------------------------------------------------------------------------------------------
// Comparing results.
// ------------------------------------------------------------------------------------------------

struct ErrorStats {
  double max_err = 0.0;
  double mean_err = 0.0;
  double max_ref = 0.0;   // largest finite |ref|
  int64_t worst = -1;     // logical index of the largest error
  int64_t nonfinite = 0;  // elements with a NaN, or an infinity the reference does not have
};

// Elementwise |got - ref|. An infinite reference (the -inf lse of a masked row) must be matched
// exactly; any NaN, or a non-finite value where the reference is finite, is an infinite error.
inline ErrorStats error_stats(const std::vector<double>& got, const std::vector<double>& ref) {
  ErrorStats e;
  double sum = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double err;
    if (std::isnan(got[i]) || std::isnan(ref[i])) {
      err = kInf;
    } else if (std::isinf(ref[i]) || std::isinf(got[i])) {
      err = got[i] == ref[i] ? 0.0 : kInf;
    } else {
      err = std::fabs(got[i] - ref[i]);
    }
    if (std::isfinite(ref[i])) e.max_ref = std::max(e.max_ref, std::fabs(ref[i]));
    if (std::isinf(err)) ++e.nonfinite;
    if (err > e.max_err || e.worst < 0) {
      e.max_err = err;
      e.worst = static_cast<int64_t>(i);
    }
    sum += err;
  }
  e.mean_err = ref.empty() ? 0.0 : sum / static_cast<double>(ref.size());
  return e;
}

inline std::string describe(const ErrorStats& e, const std::vector<double>& got,
                            const std::vector<double>& ref) {
  std::ostringstream os;
  os.precision(6);
  os << "max err " << e.max_err << ", mean err " << e.mean_err << ", max |ref| " << e.max_ref
     << ", non-finite " << e.nonfinite;
  if (e.worst >= 0) {
    const size_t w = static_cast<size_t>(e.worst);
    os.precision(9);
    os << ", worst at index " << e.worst << " (got " << got[w] << ", ref64 " << ref[w] << ")";
  }
  return os.str();
}

// atol of the tolerance rule, relative to max(1, max|ref64|) because the tested values have
// magnitude about 1. f32: 1e-5 is ~80 fp32 ulps at 1, well above fp32 summation noise over a few
// hundred terms yet far below any real bug. f16 / bf16: about one ulp at magnitude 1 (2^-10 and
// 2^-7), because the tiled path and the reference may round a value lying near a rounding
// boundary to opposite neighbours; the 2 * lowp term covers the rest.
inline double tolerance_atol(DType out_dtype, double max_ref) {
  double rel = 1e-5;
  if (out_dtype == DType::kF16) rel = 1e-3;
  if (out_dtype == DType::kBF16) rel = 8e-3;
  return rel * std::max(1.0, max_ref);
}

// The unit roundoff of a storage dtype (half an ulp at 1).
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::kF16:
      return std::ldexp(1.0, -11);
    case DType::kBF16:
      return std::ldexp(1.0, -8);
    default:
      return std::ldexp(1.0, -24);
  }
}

// The tolerance rule of docs/conventions.md:
//   max|out - ref64| <= 2 * max|lowp_ref - ref64| + atol
// where lowp_ref is the library's fp32 reference (kReference) writing into the same dtype.
inline ::testing::AssertionResult within_tolerance(const std::string& what,
                                                   const std::vector<double>& got,
                                                   const std::vector<double>& lowp_ref,
                                                   const std::vector<double>& ref64,
                                                   DType out_dtype) {
  const ErrorStats e = error_stats(got, ref64);
  const ErrorStats el = error_stats(lowp_ref, ref64);
  const double atol = tolerance_atol(out_dtype, e.max_ref);
  const double bound = 2.0 * el.max_err + atol;
  if (e.nonfinite == 0 && e.max_err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << " (" << dtype_name(out_dtype) << "): " << describe(e, got, ref64)
         << "; bound 2 * " << el.max_err << " + " << atol << " = " << bound
         << " (reference: " << describe(el, lowp_ref, ref64) << ")";
}

// The tolerance rule for a bias gradient. Its storage may be fp32 while the computation runs in
// q's dtype: the backward reads the forward's output O in q's dtype (D_i = <dO_i, O_i>, as every
// flash-style backward does), so an f16/bf16 call cannot give an fp32-exact bias gradient. The
// rule's "kernel's dtype" is q's dtype, so lowp_ref is the fp32 reference rounded to q's dtype
// and atol is q's dtype's. For f32 q this is within_tolerance itself.
inline ::testing::AssertionResult bias_grad_within_tolerance(const std::string& what,
                                                             const std::vector<double>& got,
                                                             std::vector<double> lowp_ref,
                                                             const std::vector<double>& ref64,
                                                             DType q_dtype) {
  for (double& x : lowp_ref) x = static_cast<double>(round_to(q_dtype, static_cast<float>(x)));
  return within_tolerance(what, got, lowp_ref, ref64, q_dtype);
}

// Checks the library's reference itself against the fp64 oracle, elementwise:
//   |ref - ref64| <= u * |ref64| + (1e-5 + extra_rel) * max(1, max|ref64|)
// u * |ref64| is the rounding of the result into its dtype (u = unit roundoff), the 1e-5 term is
// fp32 arithmetic, and extra_rel covers inputs that the library reads in low precision beyond
// those of the fp64 problem (the backward reads the forward's output rounded to q's dtype). For
// f16 the subnormal spacing 2^-24 adds an absolute half-step.
inline ::testing::AssertionResult reference_accurate(const std::string& what,
                                                     const std::vector<double>& got,
                                                     const std::vector<double>& ref64,
                                                     DType out_dtype, double extra_rel = 0.0) {
  const ErrorStats e = error_stats(got, ref64);
  const double u = out_dtype == DType::kF32 ? 0.0 : unit_roundoff(out_dtype);
  const double floor_term = (1e-5 + extra_rel) * std::max(1.0, e.max_ref) +
                            (out_dtype == DType::kF16 ? std::ldexp(1.0, -25) : 0.0);
  int64_t bad = 0, first_bad = -1;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < ref64.size(); ++i) {
    double err;
    if (std::isnan(got[i]) || std::isnan(ref64[i])) {
      err = kInf;
    } else if (std::isinf(ref64[i]) || std::isinf(got[i])) {
      err = got[i] == ref64[i] ? 0.0 : kInf;
    } else {
      err = std::fabs(got[i] - ref64[i]);
    }
    const double bound = std::isfinite(ref64[i]) ? u * std::fabs(ref64[i]) + floor_term : 0.0;
    if (err > bound) {
      if (first_bad < 0) first_bad = static_cast<int64_t>(i);
      ++bad;
    }
    if (bound > 0.0) worst_ratio = std::max(worst_ratio, err / bound);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const size_t fb = static_cast<size_t>(first_bad);
  return ::testing::AssertionFailure()
         << what << " (" << dtype_name(out_dtype) << "): " << bad << " of " << ref64.size()
         << " elements off the fp64 oracle; first at index " << first_bad << " (got " << got[fb]
         << ", ref64 " << ref64[fb] << "); worst error/bound " << worst_ratio << "; "
         << describe(e, got, ref64);
}

inline int64_t count_nan(const std::vector<double>& x) {
  int64_t n = 0;
  for (double v : x) n += std::isnan(v) ? 1 : 0;
  return n;
}

// ------------------------------------------------------------------------------------------------
// Case lists shared by the reference and tiled suites. Shapes come from a generator seeded per
// case; the lists are fixed by the code, so every run checks the same cases.
// ------------------------------------------------------------------------------------------------

// Every combination of bias kinds and dtypes (with f32 q a "same as q" bias is the f32 bias),
// on small random shapes whose L is not a multiple of any tile.
inline std::vector<EvoConfig> bias_dtype_cases(uint64_t first_seed, bool backward) {
  std::vector<EvoConfig> cases;
  uint64_t seed = first_seed;
  const Bias1Kind b1s[] = {Bias1Kind::kNone, Bias1Kind::kSameAsQ, Bias1Kind::kF32,
                           Bias1Kind::kBool};
  const Bias2Kind b2s[] = {Bias2Kind::kNone, Bias2Kind::kSameAsQ, Bias2Kind::kF32};
  const int64_t ls[] = {17, 33, 65};
  const int64_t ds[] = {8, 16, 32};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Bias1Kind b1 : b1s) {
      for (Bias2Kind b2 : b2s) {
        if (dt == DType::kF32 && (b1 == Bias1Kind::kSameAsQ || b2 == Bias2Kind::kSameAsQ)) continue;
        std::mt19937_64 rng(seed);
        EvoConfig c;
        c.seed = seed++;
        c.dtype = dt;
        c.bias1 = b1;
        c.bias2 = b2;
        c.shape.B = 1 + static_cast<int64_t>(rng() % 2);
        c.shape.N = 1 + static_cast<int64_t>(rng() % 3);
        c.shape.H = 1 + static_cast<int64_t>(rng() % 3);
        c.shape.L = ls[rng() % 3];
        c.shape.D = ds[rng() % 3];
        if (backward && c.shape.L > 33) c.shape.N = 1;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// Lengths that break tiling (1, 2, one below / at / above a power of two, a long one) and head
// dims from 1 to 128, plus strided layouts and explicit scales.
inline std::vector<EvoConfig> shape_layout_cases(uint64_t first_seed, bool backward) {
  std::vector<EvoConfig> cases;
  uint64_t seed = first_seed;
  auto add = [&](EvoShape s, DType dt, Bias1Kind b1, Bias2Kind b2, Layout in = Layout::kPacked,
                 Layout out = Layout::kPacked, std::optional<float> scale = std::nullopt) {
    EvoConfig c;
    c.shape = s;
    c.dtype = dt;
    c.bias1 = b1;
    c.bias2 = b2;
    c.in_layout = in;
    c.out_layout = out;
    c.scale = scale;
    c.seed = seed++;
    cases.push_back(c);
  };
  // L sweep. The long L keeps B*N*H small: the reference is O(L^2) per head.
  for (int64_t L : {1, 2, 17, 63, 64, 65, 300}) {
    const bool big = L > 65;
    EvoShape s{big ? 1 : 2, big ? 1 : 2, L, big ? 1 : 2, 32};
    add(s, DType::kF32, Bias1Kind::kF32, Bias2Kind::kF32);
    add(s, DType::kBF16, Bias1Kind::kBool, Bias2Kind::kSameAsQ);
    if (!backward) add(s, DType::kF16, Bias1Kind::kSameAsQ, Bias2Kind::kF32);
  }
  // D sweep, each head dim at a length that is not a tile multiple.
  for (int64_t D : {1, 8, 31, 32, 64, 128}) {
    EvoShape s{1, 2, D >= 64 ? 33 : 65, 2, D};
    add(s, DType::kF32, Bias1Kind::kBool, Bias2Kind::kF32);
    add(s, DType::kF16, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ);
    if (!backward) add(s, DType::kBF16, Bias1Kind::kF32, Bias2Kind::kSameAsQ);
  }
  // Strided inputs and outputs: padded views and the transposed (N <-> L) triangle-end view.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    add({2, 3, 19, 2, 16}, dt, Bias1Kind::kSameAsQ, Bias2Kind::kSameAsQ, Layout::kPadded,
        Layout::kPacked);
    add({2, 3, 19, 2, 16}, dt, Bias1Kind::kBool, Bias2Kind::kF32, Layout::kTransposedNL,
        Layout::kPacked);
    add({1, 5, 7, 2, 8}, dt, Bias1Kind::kF32, Bias2Kind::kSameAsQ, Layout::kPadded,
        Layout::kPadded);
    add({2, 4, 9, 2, 8}, dt, Bias1Kind::kSameAsQ, Bias2Kind::kF32, Layout::kTransposedNL,
        Layout::kTransposedNL);
  }
  // Explicit scales, including one far from 1/sqrt(D) that makes the softmax sharp.
  add({2, 2, 23, 3, 16}, DType::kF32, Bias1Kind::kF32, Bias2Kind::kF32, Layout::kPacked,
      Layout::kPacked, 0.37f);
  add({2, 2, 23, 3, 16}, DType::kF32, Bias1Kind::kBool, Bias2Kind::kNone, Layout::kPacked,
      Layout::kPacked, 2.0f);
  add({1, 2, 23, 3, 16}, DType::kBF16, Bias1Kind::kNone, Bias2Kind::kSameAsQ, Layout::kPacked,
      Layout::kPacked, 0.05f);
  // Several tiles in both directions with more heads.
  add({1, 2, 130, 4, 32}, DType::kF32, Bias1Kind::kF32, Bias2Kind::kF32);
  return cases;
}

inline std::vector<EvoConfig> all_cases(uint64_t first_seed, bool backward) {
  std::vector<EvoConfig> cases = bias_dtype_cases(first_seed, backward);
  std::vector<EvoConfig> more = shape_layout_cases(first_seed + 1000, backward);
  cases.insert(cases.end(), more.begin(), more.end());
  return cases;
}

// Prints a case readably in GoogleTest's failure messages (instead of its bytes).
inline void PrintTo(const EvoConfig& c, std::ostream* os) {
  *os << c.str();
}

struct CaseName {
  std::string operator()(const ::testing::TestParamInfo<EvoConfig>& info) const {
    return info.param.test_name();
  }
};

}  // namespace sciattn::test
