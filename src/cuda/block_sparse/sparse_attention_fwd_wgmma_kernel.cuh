// The fused block-sparse attention forward on Hopper's warpgroup MMA (wgmma, sm_90a), for whole
// 64-token tiles (layout blocks of 64 and more, L a multiple of 64, aligned tensors of the
// instantiated head dim 64 or 128: the host's `wgmma_tiles`). One CTA per (piece of a 64-query
// tile row, batch) as sparse_attention_fwd_kernel, whose score, online-softmax and output code it
// shares; what differs is how the two products run: the four warps issue them together as one
// warpgroup, S = Q K^T as head dim / 16 m64n64k16 steps reading Q and K straight from shared
// memory, and O += P V as four m64nDk16 steps with P from registers, instead of per-warp
// mma.sync m16n8k16 with ldmatrix fragment loads (at head dim 128: 128 MMAs and 72 ldmatrix per
// warp and tile become 12 instructions). Tiles are stored in the 128-byte swizzled layout
// (cuda/wgmma.cuh). CUDA layer.
#pragma once

#include "cuda/block_sparse/sparse_attention_fwd_kernel.cuh"
#include "cuda/wgmma.cuh"

namespace sciattn::cuda {

// Its shared memory: Q, then K and V double-buffered, each tile on a 1024-byte boundary (the
// dynamic shared memory is rounded up to one inside the kernel, hence the extra 1024 bytes).
template <typename T, int kHeadDim>
struct SparseFwdWgmmaSmem {
  static constexpr uint32_t kTileBytes = SparseTile::kSize * kHeadDim * 2;
  static_assert(kTileBytes % 1024 == 0, "every tile must start on a swizzle-pattern boundary");
  static constexpr uint32_t kQ = 0, kK = kTileBytes, kV = 3 * kTileBytes;
  static constexpr size_t kLaunchBytes = 5 * size_t{kTileBytes} + 1024;
};

// Starts cp.async copies of 64 whole rows (64 x kHeadDim, inside the tensor) whose first element is
// at `rows` (rows `row_bytes` apart) into the swizzled tile at shared address `tile`. Thread x
// owns chunk column x % (kHeadDim / 8) of every (128 / (kHeadDim / 8))-th row, so its swizzle
// (row % 8 is the same for all its rows) and both its offsets are fixed across the copy.
template <int kHeadDim>
__device__ __forceinline__ void copy_tile_swizzled(uint32_t tile, const char* rows,
                                                   int32_t row_bytes) {
  constexpr int kChunks = kHeadDim / 8, kRowStep = SparseTile::kThreads / kChunks;
  static_assert(kRowStep % 8 == 0, "a thread's rows must share their swizzle");
  const int c = static_cast<int>(threadIdx.x) % kChunks,
            r0 = static_cast<int>(threadIdx.x) / kChunks;
  const char* src = rows + (r0 * row_bytes + c * 16);
  const uint32_t dst = tile + swizzled_chunk_offset<SparseTile::kSize>(r0, c);
#pragma unroll
  for (int i = 0; i < SparseTile::kSize / kRowStep; ++i) {
    cp_async_16_to(dst + i * kRowStep * 128, src + i * kRowStep * row_bytes, 16);
  }
}

// The compiler sees a wgmma's accumulators written when the instruction is issued; this empty
// statement, placed after the wait, keeps every later read (and, before the issue, every earlier
// write) of them on its side.
template <int kTiles>
__device__ __forceinline__ void wgmma_pin(float (&d)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// The pipeline's step at entry e (buffer buf): start entry e + 1's copies into the other
// buffer (freed by the barrier that ended the previous iteration), wait for this entry's, make
// them visible to the async proxy (wgmma reads shared memory through it) and, through the
// barrier, to the whole warpgroup.
template <typename Load>
__device__ __forceinline__ void next_stage(int e, int end, int buf, const Load& load) {
  if (e + 1 < end) {
    load(e + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  fence_proxy_async_shared();
  __syncthreads();
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(SparseTile::kThreads, kHeadDim <= 64 ? 4 : 2)
    sparse_attention_fwd_wgmma_kernel(const SparseAttentionDeviceParams p) {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "128-byte swizzled rows: head dim 64 or 128");
  static_assert(SparseTile::kThreads == 128, "one warpgroup");
  using Smem = SparseFwdWgmmaSmem<T, kHeadDim>;
  constexpr int kSteps = kHeadDim / 16;              // k-steps of S = Q K^T
  constexpr int kKeySteps = SparseTile::kSize / 16;  // k-steps of O += P V
  constexpr int kScoreTiles = SparseTile::kSize / 8;
  constexpr int kOutTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (shared_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t q_tile = base + Smem::kQ;
  // Buffer `buf` of K and V (arithmetic, not an array a runtime index would put on the stack).
  const auto k_tile = [&](int buf) { return base + Smem::kK + buf * Smem::kTileBytes; };
  const auto v_tile = [&](int buf) { return base + Smem::kV + buf * Smem::kTileBytes; };

  const PieceOf at = decode_piece(p.tiles.rows, p.tiles);
  const int64_t b = at.b, h = at.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = at.tile * SparseTile::kSize;
  const int my_r[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int64_t my_rows[2] = {row0 + my_r[0], row0 + my_r[1]};
  const EntrySlots<false> slots(p.tiles.row_slots, p.tiles);

  // Whole tiles of aligned rows (the host's wgmma_tiles): per-tile bases, 32-bit row steps.
  const char* q_base =
      static_cast<const char*>(p.q) + (b * p.q_stride[0] + h * p.q_stride[1]) * sizeof(T);
  const char* k_base =
      static_cast<const char*>(p.k) + (b * p.k_stride[0] + h * p.k_stride[1]) * sizeof(T);
  const char* v_base =
      static_cast<const char*>(p.v) + (b * p.v_stride[0] + h * p.v_stride[1]) * sizeof(T);
  const int32_t q_row = static_cast<int32_t>(p.q_stride[2] * sizeof(T)),
                k_row = static_cast<int32_t>(p.k_stride[2] * sizeof(T)),
                v_row = static_cast<int32_t>(p.v_stride[2] * sizeof(T));
  auto load_kv = [&](int e, int buf) {
    const int64_t key0 = slots.token(slots.of(e), 0);
    copy_tile_swizzled<kHeadDim>(k_tile(buf), k_base + key0 * k_row, k_row);
    copy_tile_swizzled<kHeadDim>(v_tile(buf), v_base + key0 * v_row, v_row);
  };

  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.0f, 0.0f};
  float o_acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;

  if (at.begin < at.end) {
    copy_tile_swizzled<kHeadDim>(q_tile, q_base + row0 * q_row, q_row);
    load_kv(at.begin, 0);
    cp_async_commit();
  }

  for (int e = at.begin; e < at.end; ++e) {
    const int buf = (e - at.begin) & 1;
    next_stage(e, at.end, buf, load_kv);

    float s[kScoreTiles][4];
    wgmma_pin(s);
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      wgmma_m64n64k16_ss<T>(s, k_major_step<SparseTile::kSize>(q_tile, st),
                            k_major_step<SparseTile::kSize>(k_tile(buf), st), st > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(s);

    tile_scores<false>(s, p, 0xFFu, slots, slots.of(e), p.tiles.row_masks[e], row0, my_r, b, h, t);
    online_softmax_step<kOutTiles>(s, row_max, row_sum, o_acc);

    // O += P V: P (rounded to T) is the A operand straight from the score registers; all four
    // k-steps' fragments are formed before the fence, so no register changes between the
    // products (ptxas would otherwise fence before each).
    uint32_t pa[kKeySteps][4];
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      pa[kk][0] = ElementTraits<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = ElementTraits<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = ElementTraits<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = ElementTraits<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    wgmma_pin(o_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      wgmma_m64nNk16_rs_tb<T, kHeadDim>(o_acc, pa[kk],
                                        mn_major_step<SparseTile::kSize>(v_tile(buf), kk), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(o_acc);
    __syncthreads();  // every warp's products have read this buffer before it is refilled
  }

  finish_forward_rows<T, kHeadDim>(p, at, o_acc, row_max, row_sum, my_r, my_rows, warp, g, t);
}

}  // namespace sciattn::cuda
