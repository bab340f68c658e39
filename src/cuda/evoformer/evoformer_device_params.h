// The arguments of the Evoformer CUDA kernels: raw pointers, element strides and sizes, copied by
// value into each launch. CUDA layer; a plain struct so host code can fill it without nvcc.
#pragma once

#include <cstdint>

#include "cuda/common/bias_type.h"
#include "cuda/common/fast_divisor.h"

namespace sciattn::cuda {

struct EvoformerDeviceParams {
  // Sizes: Q, K, V are [B, N, L, H, D]; `dim` is the real head dim, the kernel's kHeadDim >= dim.
  int64_t batch, n, len, heads, dim;
  // Columns of a Q, K, V (and dO) row that the tile copies read: `dim`, or their rows' width where
  // those tensors are read from staged copies (detail::cuda_staged_row: D rounded up to 16, or to
  // 8 below 8; their columns past D are zeros). Outputs (O, dQ, dK, dV) are written at `dim`, and
  // delta reads `dim` columns.
  int64_t load_dim;
  float scale;  // multiplies <q, k>
  // The forwards' probabilities are 2^(s - max - prob_shift_log2)
  // (cuda/common/probability_shift.h).
  float prob_shift_log2;

  // Element strides of [B, N, L, H, D] tensors over (B, N, L, H); the D stride is 1.
  const void* q;
  int64_t q_stride[4];
  const void* k;
  int64_t k_stride[4];
  const void* v;
  int64_t v_stride[4];
  void* out;  // forward: written; backward: read
  int64_t out_stride[4];

  const void* bias1;  // [B, N, 1, 1, L] strides over (B, N, L)
  BiasType bias1_type;
  int64_t bias1_stride[3];
  const void* bias2;  // [B, 1, H, L, L] strides over (B, H, Lq, Lk)
  BiasType bias2_type;
  int64_t bias2_stride[4];
  // Columns of each bias row that may be read: L, or a padded copy's whole row (its columns past L
  // are zeros, as the copies' zero-fill would give), so that its last tile ends on a 16-byte chunk.
  int64_t bias1_cols, bias2_cols;
  // bias2's lowest and highest element offsets from p.bias2 (common/tensor_checks.h's
  // element_extent; a padded copy: its whole region): a CTA of the last query rows may read rows
  // past L of its (b, h) slice where they still lie between the two (the next slice's rows; what
  // they hold only reaches score rows past L, which are never written).
  int64_t bias2_reach[2];

  float* lse;  // [B*N, H, L] strides over (B*N, H, L)
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
  void* dbias1;  // [B, N, 1, 1, L] in bias1's type, strides over (B, N, L)
  int64_t dbias1_stride[3];
  void* dbias2;  // [B, 1, H, L, L] in bias2's type, strides over (B, H, Lq, Lk)
  int64_t dbias2_stride[4];

  // 1 when 16-byte copies are safe for that tensor's rows: D % 8 == 0, every stride over
  // (B, N, L, H) a multiple of 8 elements and the data 16-byte aligned (vec_out: as the backward
  // reads out).
  int vec_q, vec_k, vec_v, vec_dout, vec_out;
  // 1 when out is pairable (D even, rows and pairs 4-byte aligned): the forward writes its rows as
  // aligned 32-bit pairs.
  int out_paired;
  // 1 when a thread's two adjacent bias2 columns can be read with one load from global memory (the
  // dbias2 kernel's one read of its tile): bias2 is contiguous along keys and every row starts at
  // an even element of an aligned buffer. (bias1 is always read from shared memory or per key.)
  int bias2_pairs;
  // 1 when the tiles of that bias can be staged in shared memory with 16-byte cp.async (unit
  // stride along keys, every other stride and the buffer 16-byte aligned): the kernels then copy
  // the next tile's bias with the next K/V (or Q/dO) tile instead of loading it per thread.
  int bias1_staged, bias2_staged;
  // 1 when whole tiles take the lean copies (common/tile_copies.cuh): Q, K, V, O (and dO in the
  // backward) vectorizable (vec_*), D a whole tile (dim == kTileDim: no zero-filled chunk), and
  // every byte offset inside a 128-row tile of them below 2^31, so that a thread's addresses are
  // a per-tile base plus a 32-bit offset. bias2_lean: the same for bias2's tiles (staged, and 128
  // rows of it below 2^31 bytes).
  int lean_tiles, bias2_lean;
  // 1 when head dims 32, 64 and 128 run the warpgroup-MMA kernels (evoformer_*_wgmma_kernel*.cuh):
  // 16-bit inputs with offsets inside a tile of Q, K, V, O (and dO) below 2^31, and lean_tiles or
  // padded_tiles (set_warpgroup_tiles in evoformer_device_params_of.h; a D below the head dim with
  // another bias pair runs the mma.sync kernels).
  int wgmma_tiles;
  // 1 when the warpgroup kernels run as PaddedDimTypes (evoformer_bias_types.cuh): Q, K, V (and
  // dO) vectorizable, as they are or through their staged copies, without lean_tiles (D below the
  // head dim, or O not vectorizable), each bias absent or in the inputs' type; whole tiles take the
  // lean copies, a thread's chunk past load_dim zero-filled, the outputs written at D.
  int padded_tiles;
  // Forward only. 1 when the warpgroup forward runs as InPlaceDimTypes (evoformer_bias_types.cuh):
  // Q, K and V read where they are, in 4-byte pieces (evoformer_params::forward_reads_in_place:
  // rows on 4-byte boundaries, D below the head dim and near it, each bias absent or in the
  // inputs' type), load_dim = dim. shifted_slices: 1 when that D is odd, so that a slice that
  // starts on a 2-byte boundary is read from one element before (SliceSource::shift; Q, K and V
  // shift alike, slice by slice).
  int in_place_tiles, shifted_slices;
  // Backward only. 1 when the warpgroup dQ kernel, or the fused kernel at its first key tile,
  // computes delta = rowsum(dO * O) from O's rows, copied as tiles beside its dO tiles
  // (wgmma_tiles, O vectorizable and load_dim = D, so that O's rows are read as Q's and dO's are);
  // else the delta kernel runs before them (backward_device_params in
  // evoformer_device_params_of.h).
  int delta_from_out_tiles;
  // 1 when dQ, dK and dV are pairable (D even, rows and pairs 4-byte aligned): the backward writes
  // their rows as aligned 32-bit pairs (store_rows), else element by element.
  int grads_paired;
  // Bytes of shared memory per block the launches may use (the device's limit, or less under
  // SCIATTN_CUDA_KERNELS=portable-99k; 0: not given, take the two-stage forms): the mma.sync
  // kernels with one stage of streamed tiles where two do not fit (launch_staged).
  int smem_limit;
  // 1 when the 16-bit path's kernels are launched overlapped with the kernel before them
  // (common/overlapped_launch.h; devices of sm_90 and later): each starts with
  // enter_overlapped_grid().
  int overlap_launches;

  // Workspace regions of the backward (fp32, packed).
  float* delta;           // [B*N, H, L]: <dO_i, O_i>
  float* dbias1_partial;  // [B, N, H, L]: sum over query rows of dS, per head
  float* dbias2_partial;  // [chunks, B, H, L, L]: sum over this chunk's N of dS (chunks > 1)
  int64_t dbias2_chunks;  // N is split into this many chunks (1..N); 1 writes dbias2 directly

  // The kernels' 1-D grids are decoded with these (common/fast_divisor.h): the 64-row tiles of L,
  // the heads, N, the batch, and the dbias2 kernel's blocks of query rows (cuda_dbias2_rows).
  FastDivisor tiles64_div, heads_div, n_div, batch_div, dbias2_rows_div;
};

// One padded copy (detail::CudaInputCopies): rows of `len` elements, `len_stride` apart inside a
// row, at `src` plus the outer indices' strides (bias1: B, N; bias2: B, H, L; Q, K, V, dO: B, N,
// L, H; unused outer dims have size 1), into packed rows of `row` elements at `dst` (a multiple of
// 16 bytes), the elements past `len` zero. `reach`: the lowest and highest element offsets from
// `src` of the tensor's elements (common/tensor_checks.h's element_extent): the copy reads whole
// aligned 16-byte blocks that lie between them. `row_chunks_div`, `outer_div`: the divisors that
// turn a chunk's index into its row's coordinates (16-byte chunks per row, outer[1], outer[2],
// outer[3]), for copies whose chunks number below 2^31 (else unused).
struct EvoformerRowCopyArgs {
  const void* src;
  void* dst;
  int elem_bytes;
  int64_t outer[4], outer_stride[4];
  int64_t len, len_stride, row;
  int64_t reach[2];
  FastDivisor row_chunks_div, outer_div[3];
};

// The copies a launch makes before its kernels (at most both biases and Q, K, V, dO), in order:
// the dispatch makes them in one launch (launch_evoformer_row_copies), the kernel emulator on the
// host.
struct EvoformerCopyJobs {
  static constexpr int kMax = 6;
  EvoformerRowCopyArgs job[kMax];
  int count = 0;
};

}  // namespace sciattn::cuda
