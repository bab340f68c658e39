// Helpers of the trainer's tests: an fp64 reference of every GPT layer written independently of
// src/train (plain loops, forward only), central finite differences, seeded random arrays, and
// tiny configs. Test layer (cpu).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sciattn/train/backend.h"
#include "sciattn/train/gpt.h"

namespace sciattn::train::testing {

inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<int32_t> random_tokens(size_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = static_cast<int32_t>(gen() % static_cast<uint64_t>(vocab));
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Central differences of f at x: (f(x + h e_i) - f(x - h e_i)) / 2h for every `stride`-th
// element i (NaN elsewhere; expect_close skips those).
inline std::vector<double> finite_differences(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    double h = 1e-6, size_t stride = 1) {
  std::vector<double> g(x.size(), NAN);
  for (size_t i = 0; i < x.size(); i += stride) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// Compares an fp32 gradient with an fp64 one: max |a - b| <= rel * max(1, max |b|). Reports
// both errors on failure.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_err = 0.0, sum_err = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) continue;  // not sampled
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    max_err = std::max(max_err, e);
    sum_err += e;
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  EXPECT_LE(max_err, rel * std::max(1.0, max_ref))
      << what << ": max error " << max_err << ", mean error "
      << sum_err / static_cast<double>(std::max<size_t>(1, got.size())) << ", max |ref| "
      << max_ref;
}

// ---- fp64 reference layers (row-major, packed) ----

inline std::vector<double> ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                         const std::vector<double>& b, int64_t N, int64_t C,
                                         double eps) {
  std::vector<double> y(x.size());
  for (int64_t t = 0; t < N; ++t) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[t * C + c];
    m /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) v += (x[t * C + c] - m) * (x[t * C + c] - m);
    v /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c)
      y[t * C + c] = (x[t * C + c] - m) / std::sqrt(v + eps) * w[c] + b[c];
  }
  return y;
}

// y [N, OC] = x [N, IC] w[OC, IC]^T + b.
inline std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                                      const std::vector<double>* b, int64_t N, int64_t IC,
                                      int64_t OC) {
  std::vector<double> y(static_cast<size_t>(N * OC));
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t o = 0; o < OC; ++o) {
      double s = b != nullptr ? (*b)[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += x[t * IC + i] * w[o * IC + i];
      y[t * OC + o] = s;
    }
  }
  return y;
}

inline double ref_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// Rotary "rotate half" on q and k of qkv [B, L, 3, H, D].
inline std::vector<double> ref_rotary(std::vector<double> qkv, int64_t B, int64_t L, int64_t H,
                                      int64_t D, double base) {
  const int64_t C = H * D;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t p = 0; p < L; ++p) {
      for (int64_t part = 0; part < 2; ++part) {
        for (int64_t h = 0; h < H; ++h) {
          double* x = qkv.data() + ((b * L + p) * 3 + part) * C + h * D;
          for (int64_t k = 0; k < D / 2; ++k) {
            const double angle =
                static_cast<double>(p) *
                std::pow(base, -2.0 * static_cast<double>(k) / static_cast<double>(D));
            const double a = x[k], c = x[k + D / 2];
            x[k] = a * std::cos(angle) - c * std::sin(angle);
            x[k + D / 2] = c * std::cos(angle) + a * std::sin(angle);
          }
        }
      }
    }
  }
  return qkv;
}

// Causal attention over qkv [B, L, 3, H, D] -> [B, L, H, D], keys j allowed when keep(j, i).
inline std::vector<double> ref_attention(const std::vector<double>& qkv, int64_t B, int64_t L,
                                         int64_t H, int64_t D,
                                         const std::function<bool(int64_t, int64_t)>& keep) {
  const int64_t C = H * D;
  std::vector<double> out(static_cast<size_t>(B * L * C), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < L; ++i) {
        const double* q = qkv.data() + ((b * L + i) * 3 + 0) * C + h * D;
        std::vector<double> s(static_cast<size_t>(L), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          if (!keep(i, j)) continue;
          const double* k = qkv.data() + ((b * L + j) * 3 + 1) * C + h * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx);
        double* o = out.data() + (b * L + i) * C + h * D;
        for (int64_t j = 0; j <= i; ++j) {
          if (std::isinf(s[j])) continue;
          const double p = std::exp(s[j] - mx) / z;
          const double* v = qkv.data() + ((b * L + j) * 3 + 2) * C + h * D;
          for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
        }
      }
    }
  }
  return out;
}

// Sum over tokens of cross-entropy(logits = x w^T, target).
inline double ref_lm_loss(const std::vector<double>& x, const std::vector<double>& w,
                          const std::vector<int32_t>& targets, int64_t N, int64_t C, int64_t V) {
  const std::vector<double> logits = ref_linear(x, w, nullptr, N, C, V);
  double total = 0;
  for (int64_t t = 0; t < N; ++t) {
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[t * V + v]);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(logits[t * V + v] - mx);
    total += mx + std::log(z) - logits[t * V + targets[t]];
  }
  return total;
}

inline std::unique_ptr<Backend> cpu_backend(int64_t chunk = 4, int threads = 0) {
  std::unique_ptr<Backend> be;
  CpuBackendOptions o;
  o.token_chunk = chunk;
  o.threads = threads;
  EXPECT_TRUE(make_cpu_backend(o, &be).ok());
  return be;
}

inline TensorView view(std::vector<float>& v, std::initializer_list<int64_t> sizes) {
  return TensorView::contiguous(v.data(), DType::kF32, sizes);
}

// A tiny GPT for whole-model tests.
inline GptConfig tiny_config(PositionEncoding positions = PositionEncoding::kLearned,
                             bool tied = true, int64_t length = 12) {
  GptConfig c;
  c.vocab_size = 37;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.sequence_length = length;
  c.max_position_embeddings = length + 3;
  c.positions = positions;
  c.tie_embeddings = tied;
  c.seed = 7;
  c.mlp_ratio = 4.0;
  return c;
}

}  // namespace sciattn::train::testing
