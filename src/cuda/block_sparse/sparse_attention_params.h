// The arguments of the fused block-sparse attention kernels: raw pointers, element strides and
// sizes, the device tile index and the workspace regions, copied by value into each launch. CUDA
// layer; a plain struct (no CUDA syntax) so that host code fills it without device headers.
#pragma once

#include <cstdint>

#include "common/block_sparse_device_index.h"
#include "cuda/common/bias_type.h"  // the storage types of rpe / masks

namespace sciattn::cuda {

struct SparseAttentionDeviceParams {
  // Q, K, V, O are [B, H, L, D]; `dim` is the real head dim (the kernel's kHeadDim >= dim).
  int64_t batch, heads, len, dim;
  float scale;  // multiplies <q, k>
  // The forwards' probabilities are 2^(s - max - prob_shift_log2)
  // (cuda/common/probability_shift.h).
  float prob_shift_log2;
  int causal;  // remove key j > query i

  // Element strides over (B, H, L, D) of the inputs (any values, 0 included).
  const void* q;
  int64_t q_stride[4];
  const void* k;
  int64_t k_stride[4];
  const void* v;
  int64_t v_stride[4];
  // 1 when that tensor's tile rows may be copied with 16-byte cp.async: unit stride on D,
  // D % 8 == 0, every other stride a multiple of 8 elements and the data 16-byte aligned.
  int vec_q, vec_k, vec_v, vec_dout;
  int vec_out;  // the same for out as the backward reads it (the delta kernel)
  // 1 when whole 64-row tiles of Q, K, V (and dO in the backward) take the lean copy
  // (common/tile_copies.cuh's copy_tile_lean): all vectorizable, D the instantiated head dim
  // (no zero-filled chunk), and every byte offset inside a tile of rows below 2^31.
  int lean_tiles;
  // 1 when the rows of out (forward) or of dQ, dK and dV (backward) are vectorizable and D is the
  // instantiated head dim: they are written as aligned 32-bit pairs with no per-pair test.
  int out_paired, grads_paired;
  // 1 when the entries (whole tiles of layout blocks of 64 and more, or packed blocks of 16 and
  // 32) may run on the warpgroup MMA kernels (sparse_attention_{fwd,bwd}_wgmma_kernel*.cuh):
  // lean_tiles (dO included in the backward), head dim 64 or 128, and L a multiple of 64, so that
  // every tile of Q, K, V and dO is whole and every token of a used slot inside L.
  int wgmma_tiles;
  // Bytes of shared memory per block the launches may use (the device's limit, or less under
  // SCIATTN_CUDA_KERNELS=portable-99k; 0: not given): the backward's mma.sync kernels with one
  // stage of streamed tiles where two do not fit.
  int smem_limit;

  // Score terms (BiasType::kNone when absent). A kMul mask (not bool) turns 0 into -inf and
  // anything else into 0; a bool mask reads as 0 (true) or -inf (false) in either mode.
  const void* rpe;  // [B, H, L, L]
  BiasType rpe_type;
  int64_t rpe_stride[4];
  const void* kpm;  // [B, L]
  BiasType kpm_type;
  int64_t kpm_stride[2];
  int kpm_mul;
  const void* attn;  // [L, L]
  BiasType attn_type;
  int64_t attn_stride[2];
  int attn_mul;
  int has_terms;  // any of the three present

  void* out;  // forward: written (D stride 1); backward: read (any strides)
  int64_t out_stride[4];
  float* lse;  // [B, H, L] strides over (B, H, L); may be null in the forward
  int64_t lse_stride[3];

  // Backward only.
  const void* dout;
  int64_t dout_stride[4];
  void* dq;
  int64_t dq_stride[4];
  void* dk;
  int64_t dk_stride[4];
  void* dv;
  int64_t dv_stride[4];

  BlockSparseDeviceIndex::Tiles tiles;

  // Workspace regions (fp32, packed). part_dim is the head dim of a partial row (the kernel's
  // kHeadDim): forward slots hold [64 x part_dim] unnormalised O, then 64 row maxima and 64 row
  // sums; backward slots hold [64 x part_dim] of dQ (row pieces) or of dK and dV (column pieces).
  // B' = B * tiles.head_repeat: the stored heads' slots repeat for each head they serve.
  float* delta;        // [B, H, L]: <dO_i, O_i>
  float* fwd_partial;  // [B', row slots, 64 * part_dim + 128]
  float* dq_partial;   // [B', row slots, 64 * part_dim]
  float* dk_partial;   // [B', column slots, 64 * part_dim]
  float* dv_partial;   // [B', column slots, 64 * part_dim]
  int part_dim;
};

}  // namespace sciattn::cuda
