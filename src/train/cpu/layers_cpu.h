// The GPT trainer's layers on the CPU, fp32: plain forward and backward functions per layer on
// packed row-major arrays, threaded with OpenMP, matrix products on OpenBLAS. CPU layer of the
// trainer; the CPU back end (cpu_backend.cpp) checks its TensorViews and calls these. They are the
// reference the CUDA layers are tested against.
//
// Determinism: every sum over tokens runs in token order (per output element, whatever the thread
// count), and matrix products over tokens are issued per chunk of `chunk` rows, starting at row 0
// of the call. A call on rows [0, N) therefore equals, bit for bit, calls on consecutive tiles
// whose sizes are multiples of `chunk`.
#pragma once

#include <cstdint>

namespace sciattn::train::cpu {

// out[b*L + t] = wte[tokens[b*L + t]] + (wpe ? wpe[t] : 0).   out [B*L, C]
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t L, int64_t C);
// dwte[tokens[i]] += dout[i]; dwpe[i % L] += dout[i] (if dwpe). Parallel over channels.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t L, int64_t C);

// out = (in - mean) * rstd * w + b per row of C; mean and rstd [N] are saved.
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w,
                       const float* b, int64_t N, int64_t C, float eps);
// din += ..., dw += sum_t dout * xhat, db += sum_t dout.
void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);

// out [N, OC] = in [N, IC] * w[OC, IC]^T + bias (bias may be null).
void linear_forward(float* out, const float* in, const float* w, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, int64_t chunk);
// din [N, IC] = dout * w (skipped when din is null); dw += dout^T * in; dbias += sum_t dout (if
// dbias).
void linear_backward(float* din, float* dw, float* dbias, const float* dout, const float* in,
                     const float* w, int64_t N, int64_t IC, int64_t OC, int64_t chunk);

// GELU, tanh approximation; out may equal in, din may equal dout.
void gelu_forward(float* out, const float* in, int64_t n);
void gelu_backward(float* din, const float* in, const float* dout, int64_t n);

// Rotary embedding on the q and k parts of qkv [B, L, 3, H, D], in place (inverse: the negative
// angle). D must be even.
void rotary(float* qkv, int64_t B, int64_t L, int64_t H, int64_t D, float base, bool inverse);

// out = a + b, n elements (out may be a or b).
void add(float* out, const float* a, const float* b, int64_t n);

// The LM head over rows [0, N) in tiles of tile_rows (a multiple of chunk): logits of a tile in
// `logits` [tile_rows, V], losses [N] written, and when din and dw are given din [N, C] written and
// dw [V, C] += dlogits^T * in.
void lm_head_loss(float* losses, float* din, float* dw, float* logits, const float* in,
                  const float* w, const int32_t* targets, int64_t N, int64_t C, int64_t V,
                  float grad_scale, int64_t tile_rows, int64_t chunk);
// Untiled: logits [N, V] kept, losses [N] written.
void lm_head_forward(float* losses, float* logits, const float* in, const float* w,
                     const int32_t* targets, int64_t N, int64_t C, int64_t V, int64_t chunk);
// From the forward's logits (overwritten with dlogits): din written, dw +=.
void lm_head_backward(float* din, float* dw, float* logits, const float* in, const float* w,
                      const int32_t* targets, int64_t N, int64_t C, int64_t V, float grad_scale,
                      int64_t chunk);

}  // namespace sciattn::train::cpu
