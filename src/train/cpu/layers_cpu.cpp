// The GPT trainer's layers on the CPU (fp32, OpenMP, OpenBLAS). CPU layer of the trainer.
#include "train/cpu/layers_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "train/cpu/blas.h"

namespace sciattn::train::cpu {
namespace {

// Channels one thread owns while it walks every token in order (weight-gradient sums): a few
// cache lines, so that threads never share a line of the accumulators.
constexpr int64_t kChannelBlock = 64;

// Runs body(c0, c1) over channel blocks of [0, C) in parallel. Each block is visited by one
// thread, which loops over the tokens in order, so the sums are the same for any thread count.
template <class Body>
void for_channel_blocks(int64_t C, Body body) {
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < blocks; ++k) {
    body(k * kChannelBlock, std::min(C, (k + 1) * kChannelBlock));
  }
}

// sqrt(2 / pi) and the cubic coefficient of the tanh approximation.
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t L, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B * L; ++i) {
    const float* te = wte + static_cast<int64_t>(tokens[i]) * C;
    float* o = out + i * C;
    if (wpe != nullptr) {
      const float* pe = wpe + (i % L) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = te[c] + pe[c];
    } else {
      std::memcpy(o, te, static_cast<size_t>(C) * sizeof(float));
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t L, int64_t C) {
  for_channel_blocks(C, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < B * L; ++i) {
      const float* d = dout + i * C;
      float* te = dwte + static_cast<int64_t>(tokens[i]) * C;
      for (int64_t c = c0; c < c1; ++c) te[c] += d[c];
      if (dwpe != nullptr) {
        float* pe = dwpe + (i % L) * C;
        for (int64_t c = c0; c < c1; ++c) pe[c] += d[c];
      }
    }
  });
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* x = in + t * C;
    // Mean and biased variance in double: two passes, no cancellation.
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const double m = sum / static_cast<double>(C);
    double var = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = x[c] - m;
      var += d * d;
    }
    var /= static_cast<double>(C);
    const float mf = static_cast<float>(m);
    const float s = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    float* o = out + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - mf) * s * w[c] + b[c];
    mean[t] = mf;
    rstd[t] = s;
  }
}

void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
  // Input gradient, row by row: with xhat = (x - mean) * rstd and g = dout * w,
  //   din = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* x = in + t * C;
    const float* d = dout + t * C;
    const float m = mean[t], s = rstd[t];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      const float g = d[c] * w[c];
      sum_g += g;
      sum_gx += static_cast<double>(g) * xhat;
    }
    const float mean_g = static_cast<float>(sum_g / static_cast<double>(C));
    const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(C));
    float* di = din + t * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      di[c] += s * (d[c] * w[c] - mean_g - xhat * mean_gx);
    }
  }
  // Weight and bias gradients: sums over tokens, in token order per channel.
  for_channel_blocks(C, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < N; ++t) {
      const float* x = in + t * C;
      const float* d = dout + t * C;
      const float m = mean[t], s = rstd[t];
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] += d[c] * ((x[c] - m) * s);
        db[c] += d[c];
      }
    }
  });
}

void linear_forward(float* out, const float* in, const float* w, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, int64_t chunk) {
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    sgemm(false, true, rows, OC, IC, 1.0f, in + r0 * IC, IC, w, IC, 0.0f, out + r0 * OC, OC);
  }
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      float* o = out + t * OC;
      for (int64_t c = 0; c < OC; ++c) o[c] += bias[c];
    }
  }
}

void linear_backward(float* din, float* dw, float* dbias, const float* dout, const float* in,
                     const float* w, int64_t N, int64_t IC, int64_t OC, int64_t chunk) {
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    if (din != nullptr) {
      sgemm(false, false, rows, IC, OC, 1.0f, dout + r0 * OC, OC, w, IC, 0.0f, din + r0 * IC, IC);
    }
    // dw [OC, IC] += dout_chunk^T [OC, rows] * in_chunk [rows, IC], chunk after chunk.
    sgemm(true, false, OC, IC, rows, 1.0f, dout + r0 * OC, OC, in + r0 * IC, IC, 1.0f, dw, IC);
  }
  if (dbias != nullptr) {
    for_channel_blocks(OC, [&](int64_t c0, int64_t c1) {
      for (int64_t t = 0; t < N; ++t) {
        const float* d = dout + t * OC;
        for (int64_t c = c0; c < c1; ++c) dbias[c] += d[c];
      }
    });
  }
}

void gelu_forward(float* out, const float* in, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + std::tanh(u));
  }
}

void gelu_backward(float* din, const float* in, const float* dout, int64_t n) {
  // d/dx [x/2 (1 + tanh u)] = (1 + tanh u) / 2 + x/2 (1 - tanh^2 u) du/dx,
  // du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2). 1 - tanh^2 instead of sech^2 = 1/cosh^2, which
  // overflows for large |u|.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = std::tanh(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    din[i] = grad * dout[i];
  }
}

void rotary(float* qkv, int64_t B, int64_t L, int64_t H, int64_t D, float base, bool inverse) {
  const int64_t half = D / 2;
  const int64_t C = H * D;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B * L; ++i) {
    const double position = static_cast<double>(i % L);
    float* row = qkv + i * 3 * C;
    for (int64_t k = 0; k < half; ++k) {
      // The angle in double, rounded once: p * base^(-2k/D).
      const double angle =
          position * std::pow(static_cast<double>(base),
                              -2.0 * static_cast<double>(k) / static_cast<double>(D));
      const float c = static_cast<float>(std::cos(angle));
      const float s = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
      for (int64_t part = 0; part < 2; ++part) {  // q, then k
        for (int64_t h = 0; h < H; ++h) {
          float* x = row + part * C + h * D;
          const float a = x[k], b = x[k + half];
          x[k] = a * c - b * s;
          x[k + half] = b * c + a * s;
        }
      }
    }
  }
}

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

namespace {

// Cross-entropy of `rows` rows of logits [rows, V]: losses written (when not null); with `grad`,
// the logits are overwritten with grad_scale * (softmax - onehot). One row per thread; the row's
// sum of exponentials in double.
void softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t rows,
                           int64_t V, float grad_scale, bool grad) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits + r * V;
    float mx = l[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, l[v]);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v] - mx));
    const int64_t target = targets[r];
    const double lse = static_cast<double>(mx) + std::log(sum);
    if (losses != nullptr) losses[r] = static_cast<float>(lse - static_cast<double>(l[target]));
    if (grad) {
      const double inv = 1.0 / sum;
      for (int64_t v = 0; v < V; ++v) {
        const float p = static_cast<float>(std::exp(static_cast<double>(l[v] - mx)) * inv);
        l[v] = grad_scale * (v == target ? p - 1.0f : p);
      }
    }
  }
}

// logits [rows, V] = in [rows, C] * w[V, C]^T.
void lm_logits(float* logits, const float* in, const float* w, int64_t rows, int64_t C, int64_t V) {
  sgemm(false, true, rows, V, C, 1.0f, in, C, w, C, 0.0f, logits, V);
}

// din [rows, C] = dlogits * w; dw += dlogits^T * in.
void lm_backward_chunk(float* din, float* dw, const float* dlogits, const float* in, const float* w,
                       int64_t rows, int64_t C, int64_t V) {
  sgemm(false, false, rows, C, V, 1.0f, dlogits, V, w, C, 0.0f, din, C);
  sgemm(true, false, V, C, rows, 1.0f, dlogits, V, in, C, 1.0f, dw, C);
}

}  // namespace

void lm_head_loss(float* losses, float* din, float* dw, float* logits, const float* in,
                  const float* w, const int32_t* targets, int64_t N, int64_t C, int64_t V,
                  float grad_scale, int64_t tile_rows, int64_t chunk) {
  const bool grad = din != nullptr && dw != nullptr;
  for (int64_t t0 = 0; t0 < N; t0 += tile_rows) {
    const int64_t tile = std::min(tile_rows, N - t0);
    for (int64_t r0 = t0; r0 < t0 + tile; r0 += chunk) {
      const int64_t rows = std::min(chunk, t0 + tile - r0);
      float* l = logits + (r0 - t0) * V;
      lm_logits(l, in + r0 * C, w, rows, C, V);
      softmax_cross_entropy(l, losses + r0, targets + r0, rows, V, grad_scale, grad);
      if (grad) lm_backward_chunk(din + r0 * C, dw, l, in + r0 * C, w, rows, C, V);
    }
  }
}

void lm_head_forward(float* losses, float* logits, const float* in, const float* w,
                     const int32_t* targets, int64_t N, int64_t C, int64_t V, int64_t chunk) {
  // Losses only; the logits stay for the backward, which recomputes the softmax from them.
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    float* l = logits + r0 * V;
    lm_logits(l, in + r0 * C, w, rows, C, V);
    softmax_cross_entropy(l, losses + r0, targets + r0, rows, V, 1.0f, false);
  }
}

void lm_head_backward(float* din, float* dw, float* logits, const float* in, const float* w,
                      const int32_t* targets, int64_t N, int64_t C, int64_t V, float grad_scale,
                      int64_t chunk) {
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    float* l = logits + r0 * V;
    softmax_cross_entropy(l, nullptr, targets + r0, rows, V, grad_scale, true);
    lm_backward_chunk(din + r0 * C, dw, l, in + r0 * C, w, rows, C, V);
  }
}

}  // namespace sciattn::train::cpu
