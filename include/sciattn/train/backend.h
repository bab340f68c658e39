// The layer calls of the GPT trainer: one interface, implemented on the CPU (fp32, OpenBLAS and
// OpenMP: the reference) and later with CUDA (cuBLASLt, 16-bit activations). Public API of the
// trainer (plain C++17).
//
// The model (gpt.h) plans its buffers and calls only these functions, in the same order on every
// back end, so a back end is a set of layers plus memory management. Tensors are TensorViews of
// the back end's memory (device() says where): activations and the weights' compute copy in
// compute_dtype(), gradients and norm statistics (mean, rstd, lse, losses) in f32; token ids are
// int32 arrays in the back end's memory (TensorView has no integer dtype).
// Shapes use T = B * L tokens, C = d_model, H heads of D = C / H, F = MLP width, V = vocabulary.
//
// Conventions every back end keeps (the CPU one is the specification):
//   - "+=" outputs (weight and bias gradients, din of layernorm) accumulate into what is there;
//     other outputs are overwritten.
//   - Sums over tokens (weight and bias gradients) are accumulated in token order over fixed
//     chunks of rows, so a call on rows [0, T) equals calls on consecutive tiles of rows whose
//     sizes are multiples of token_chunk(), bit for bit. The memory techniques (tiled MLP and LM
//     head, activation checkpointing) depend on this to give the same gradients on and off.
//   - Results do not depend on the number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sciattn/block_sparse_ops.h"
#include "sciattn/status.h"
#include "sciattn/tensor_view.h"
#include "sciattn/train/adamw.h"
#include "sciattn/train/gradients.h"

namespace sciattn::train {

struct EmbeddingParams {
  const int32_t* tokens = nullptr;  // [B, L]
  int64_t batch = 0, seq_len = 0;   // B, L
  TensorView wte;                   // [V, C]
  TensorView wpe;                   // [P, C] learned positions, P >= L; absent for rotary positions
  TensorView out;                   // [T, C] written: wte[token] + wpe[position in the sequence]
};
struct EmbeddingBackwardParams {
  const int32_t* tokens = nullptr;  // [B, L]
  int64_t batch = 0, seq_len = 0;
  TensorView dout;  // [T, C]
  TensorView dwte;  // [V, C] +=
  TensorView dwpe;  // [P, C] += (absent for rotary positions)
};

struct LayerNormParams {
  TensorView in;      // [N, C]
  TensorView weight;  // [C]
  TensorView bias;    // [C]
  TensorView out;     // [N, C] written
  TensorView mean;    // [N] f32 written
  TensorView rstd;    // [N] f32 written: 1 / sqrt(var + eps), biased variance
  float eps = 1e-5f;
};
struct LayerNormBackwardParams {
  TensorView in, weight, mean, rstd;  // as in the forward
  TensorView dout;                    // [N, C]
  TensorView din;                     // [N, C] +=
  TensorView dweight, dbias;          // [C] +=
};

// out = in * weight^T + bias (nn.Linear).
struct LinearParams {
  TensorView in;      // [N, IC]
  TensorView weight;  // [OC, IC]
  TensorView bias;    // [OC] or absent
  TensorView out;     // [N, OC] written
};
struct LinearBackwardParams {
  TensorView in, weight;  // as in the forward
  TensorView dout;        // [N, OC]
  TensorView din;         // [N, IC] written (absent: not computed)
  TensorView dweight;     // [OC, IC] +=
  TensorView dbias;       // [OC] += (absent: no bias)
};

// GELU, tanh approximation (GPT-2's "gelu_new"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
struct GeluParams {
  TensorView in;   // [N, F]
  TensorView out;  // [N, F] written (may be `in`)
};
struct GeluBackwardParams {
  TensorView in;    // [N, F] the forward's input
  TensorView dout;  // [N, F]
  TensorView din;   // [N, F] written (may be dout)
};

// Rotary position embedding (GPT-NeoX's "rotate half") on the query and key parts of a packed
// qkv, in place. For head-dim index i < D/2, position p, angle p * base^(-2i/D):
//   (x_i, x_{i+D/2}) <- (x_i cos - x_{i+D/2} sin, x_{i+D/2} cos + x_i sin)
// inverse = true rotates by the negative angle: the backward of the forward rotation (it is
// orthogonal), applied to the gradients dq, dk.
struct RotaryParams {
  TensorView qkv;  // [B, L, 3, H, D] in place; the v part is untouched
  float base = 10000.0f;
  bool inverse = false;
};

// Causal attention (block-sparse: only the index's blocks at or below the diagonal exist) through
// sciattn's sparse attention op, scale 1 / sqrt(D). qkv packs q, k, v per token as
// [B, L, 3, H, D] (3C per token). L need not be a multiple of the block: the back end pads to
// Lp = index->num_row_blocks * block positions in its own scratch, which does not change the
// result for real positions (they never attend to later ones) and gives padded rows no gradient.
struct AttentionParams {
  const BlockSparseIndex* index = nullptr;  // [H, Lp / b, Lp / b], block-causal
  TensorView qkv;                           // [B, L, 3, H, D]
  TensorView out;                           // [B, L, H, D] written
  TensorView lse;                           // [B, H, Lp] f32 written
};
struct AttentionBackwardParams {
  const BlockSparseIndex* index = nullptr;
  TensorView qkv, out, lse;  // as in the forward
  TensorView dout;           // [B, L, H, D]
  TensorView dqkv;           // [B, L, 3, H, D] written
};

// dst = src between two views of the same sizes and dtype with any strides (rank 1 to 6; the two
// must not overlap). Ulysses sequence parallelism (gpt.h) moves activations between a token split
// and a head split with such copies, on either side of its all-to-alls.
struct StridedCopyParams {
  TensorView src;  // [sizes] any strides
  TensorView dst;  // [sizes] written
};
// The argument checks both back ends' strided_copy make, with the same messages: src and dst
// present, both in `device`'s memory (`memory` names it: "host memory", "CUDA memory"), ranks 1
// to 6, the same sizes and dtype.
Status check_strided_copy(const StridedCopyParams& p, Device device, const char* memory);

// out = a + b (elementwise; out may be a or b).
struct AddParams {
  TensorView a, b, out;  // [N, C]
};

// The LM head and cross-entropy: logits = in * weight^T ([N, V]), per token
//   loss_t = logsumexp(logits_t) - logits_t[target_t]
//   dlogits_t = grad_scale * (softmax(logits_t) - onehot(target_t))
// processed over consecutive tiles of tile_rows tokens (a multiple of token_chunk()), so that
// only [tile_rows, V] logits exist at once. With din and dweight present the gradients are formed
// in the same pass (din written, dweight +=): the loss gradient needs nothing from later layers.
struct LmHeadParams {
  TensorView in;                     // [N, C]
  TensorView weight;                 // [V, C]
  const int32_t* targets = nullptr;  // [N], each in [0, V)
  TensorView losses;                 // [N] f32 written
  TensorView din;                    // [N, C] written, or absent (loss only)
  TensorView dweight;                // [V, C] +=, or absent
  TensorView logits;                 // [tile_rows, V] scratch
  float grad_scale = 1.0f;
  int64_t tile_rows = 0;
};
// The untiled form, for comparison and for small vocabularies: the forward keeps all [N, V]
// logits; the backward turns them into gradients later.
struct LmHeadForwardParams {
  TensorView in, weight, losses;  // as above
  const int32_t* targets = nullptr;
  TensorView logits;  // [N, V] written (kept for the backward)
};
struct LmHeadBackwardParams {
  TensorView in, weight;  // as in the forward
  const int32_t* targets = nullptr;
  TensorView logits;   // [N, V] the forward's; overwritten with dlogits
  TensorView din;      // [N, C] written
  TensorView dweight;  // [V, C] +=
  float grad_scale = 1.0f;
};

// A copy queued by Backend::copy_async; the waits below take it. Copies of one direction run in
// the order they were queued, so a finished copy implies every earlier one of its direction.
enum class CopyDirection { kToHost, kToDevice };
struct CopyTicket {
  CopyDirection direction = CopyDirection::kToHost;
  uint64_t id = 0;  // 0: no copy (the waits return at once)
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual DType compute_dtype() const = 0;
  // "cpu: 2 threads, OpenBLAS 0.3.21 (OpenMP)".
  virtual std::string description() const = 0;
  // Rows per BLAS call over tokens; tiles must be multiples of it (see the conventions above).
  virtual int64_t token_chunk() const = 0;

  // Memory of the back end's device. allocate returns zeroed memory aligned to 64 bytes.
  virtual Status allocate(size_t bytes, void** ptr) = 0;
  virtual void release(void* ptr) = 0;
  virtual Status copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual Status fill_zero(void* dst, size_t bytes) = 0;
  // Waits for queued work (a no-op on the CPU).
  virtual Status synchronize() = 0;
  // Bytes the back end holds for its own scratch (the attention op's workspace, padded copies),
  // grown on first use; the memory ledger reports it.
  virtual size_t scratch_bytes() const = 0;
  // The most bytes of the device's memory the back end held at once (its allocations and its
  // scratch) since it was made; 0 on the CPU (the process's peak resident memory tells there).
  virtual uint64_t peak_device_bytes() const = 0;

  // Host memory that copy_async reads and writes (page-locked on CUDA, so that the copies run
  // beside the computation; ordinary memory on the CPU): zeroed, aligned to 64 bytes.
  virtual Status allocate_host(size_t bytes, void** ptr) = 0;
  virtual void release_host(void* ptr) = 0;
  // Copies `bytes` between the back end's memory and host memory from allocate_host, on a copy
  // stream of its own per direction, after all the work queued so far (so the copy reads what
  // that work wrote). On the CPU the copy is done when the call returns. The ticket is for:
  virtual Status copy_async(void* dst, const void* src, size_t bytes, CopyDirection direction,
                            CopyTicket* ticket) = 0;
  // ... work queued after this call starts after the copy has finished (the device waits; the
  // host does not): the copy's destination may then be read, and its source overwritten.
  virtual Status wait_for_copy(const CopyTicket& ticket) = 0;
  // ... the host waits until the copy has finished.
  virtual Status finish_copy(const CopyTicket& ticket) = 0;

  // The optimizer step's elementwise work on f32 buffers in the back end's memory (trainer.h
  // runs the gradient path and AdamW through these; adamw.h and gradients.h say what each
  // computes). adamw_step is cpu_adamw_step / cpu_adamw_step_copy with the same bits on every
  // back end; param_copy (n elements of copy_dtype, kF16 or kBF16) may be null. sum_squares waits
  // for queued work and gives the sum over kNormChunk-element chunks in double (on the GPU in a
  // fixed tree order, equal to the CPU's to double rounding). cast converts n elements between
  // f32, f16 and bf16 (nearest even).
  virtual Status adamw_step(const AdamWHyperparams& h, int64_t step, float grad_scale,
                            float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                            int64_t n, void* param_copy, DType copy_dtype) = 0;
  virtual Status sum_squares(const float* data, int64_t n, SumSquares* out) = 0;
  virtual Status scale_in_place(float* data, int64_t n, float factor) = 0;
  virtual Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) = 0;

  virtual Status embedding_forward(const EmbeddingParams& p) = 0;
  virtual Status embedding_backward(const EmbeddingBackwardParams& p) = 0;
  virtual Status layernorm_forward(const LayerNormParams& p) = 0;
  virtual Status layernorm_backward(const LayerNormBackwardParams& p) = 0;
  virtual Status linear_forward(const LinearParams& p) = 0;
  virtual Status linear_backward(const LinearBackwardParams& p) = 0;
  virtual Status gelu_forward(const GeluParams& p) = 0;
  virtual Status gelu_backward(const GeluBackwardParams& p) = 0;
  virtual Status rotary(const RotaryParams& p) = 0;
  // Makes `index` readable by this back end's attention once, before the first attention call
  // (CUDA: uploads it to the device, upload_block_sparse_index; the CPU: nothing), so that the
  // back end need not keep a copy of its own.
  virtual Status prepare_index(BlockSparseIndex* index) = 0;
  virtual Status attention_forward(const AttentionParams& p) = 0;
  virtual Status attention_backward(const AttentionBackwardParams& p) = 0;
  virtual Status add(const AddParams& p) = 0;
  virtual Status strided_copy(const StridedCopyParams& p) = 0;
  virtual Status lm_head_loss(const LmHeadParams& p) = 0;
  virtual Status lm_head_forward(const LmHeadForwardParams& p) = 0;
  virtual Status lm_head_backward(const LmHeadBackwardParams& p) = 0;
};

struct CpuBackendOptions {
  int threads = 0;            // OpenMP threads (and OpenBLAS's); 0 = all
  int64_t token_chunk = 256;  // rows per BLAS call over tokens
};
// The CPU back end (fp32). Fails when token_chunk < 1 or threads < 0.
Status make_cpu_backend(const CpuBackendOptions& options, std::unique_ptr<Backend>* out);

}  // namespace sciattn::train
