// The Evoformer attention forward kernel: one CTA per (64 query rows, h, b*n), four warps of 16
// rows each, streaming over 64-key tiles with an online softmax on tensor cores (m16n8k16).
// Writes O and the fp32 log-sum-exp. CUDA layer; instantiated per (dtype, head dim) in generated
// evoformer_fwd_hd<D>_<dtype>_sm90.cu files.
#pragma once

#include "cuda/evoformer/evoformer_device_utils.cuh"

namespace sciattn::cuda {

struct EvoformerFwdTile {
  static constexpr int kBlockM = 64;  // query rows per CTA (16 per warp)
  static constexpr int kBlockN = 64;  // keys per tile
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
};

template <typename T, int kHeadDim>
struct EvoformerFwdSmem {
  // Rows padded by 8 elements (16 bytes) so that the fragment reads of one warp, which walk down
  // 8 rows, fall in different banks.
  static constexpr int kPitch = kHeadDim + 8;
  T q[EvoformerFwdTile::kBlockM * kPitch];
  T k[EvoformerFwdTile::kBlockN * kPitch];
  T v[EvoformerFwdTile::kBlockN * kPitch];
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(EvoformerFwdTile::kThreads)
    evoformer_fwd_kernel(const EvoformerDeviceParams p) {
  using Tile = EvoformerFwdTile;
  using Smem = EvoformerFwdSmem<T, kHeadDim>;
  constexpr int kPitch = Smem::kPitch;
  constexpr int kSteps = kHeadDim / 16;        // k-steps of S = Q K^T
  constexpr int kScoreTiles = Tile::kBlockN / 8;  // n8 tiles of one score row block
  constexpr int kOutTiles = kHeadDim / 8;       // n8 tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  // A 1-D grid decoded here, so that B*N is not bounded by a grid dimension's 65535.
  const int64_t m_blocks = (p.len + Tile::kBlockM - 1) / Tile::kBlockM;
  int64_t block = blockIdx.x;
  const int64_t m_block = block % m_blocks;
  block /= m_blocks;
  const int64_t h = block % p.heads;
  const int64_t bn = block / p.heads;
  const int64_t b = bn / p.n, n = bn % p.n;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = m_block * Tile::kBlockM;
  const int64_t my_rows[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};

  load_tile<T, Tile::kBlockM, kHeadDim, kPitch, Tile::kThreads>(smem.q, p.q, p.q_stride, b, n, h,
                                                                row0, p.len, p.dim);
  __syncthreads();
  // Q stays in registers as A fragments for the whole key loop.
  uint32_t q_frag[kSteps][4];
  {
    const T* qw = smem.q + warp * 16 * kPitch;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      q_frag[s][0] = load_pair(qw + g * kPitch + s * 16 + 2 * t);
      q_frag[s][1] = load_pair(qw + (g + 8) * kPitch + s * 16 + 2 * t);
      q_frag[s][2] = load_pair(qw + g * kPitch + s * 16 + 2 * t + 8);
      q_frag[s][3] = load_pair(qw + (g + 8) * kPitch + s * 16 + 2 * t + 8);
    }
  }

  // The softmax runs in base 2: scores are multiplied by log2(e) once, exp2 is one instruction.
  const float scale_log2 = p.scale * kLog2e;
  float row_max[2] = {kNegInf, kNegInf};  // running max of the scaled log2 scores
  float row_sum[2] = {0.0f, 0.0f};        // this thread's share of the running sum
  float o_acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;

  const bool has_bias1 = p.bias1_type != BiasType::kNone;
  const bool has_bias2 = p.bias2_type != BiasType::kNone;
  const int64_t bias1_base = b * p.bias1_stride[0] + n * p.bias1_stride[1];
  const int64_t bias2_base = b * p.bias2_stride[0] + h * p.bias2_stride[1];

  for (int64_t col0 = 0; col0 < p.len; col0 += Tile::kBlockN) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_tile<T, Tile::kBlockN, kHeadDim, kPitch, Tile::kThreads>(smem.k, p.k, p.k_stride, b, n, h,
                                                                  col0, p.len, p.dim);
    load_tile<T, Tile::kBlockN, kHeadDim, kPitch, Tile::kThreads>(smem.v, p.v, p.v_stride, b, n, h,
                                                                  col0, p.len, p.dim);
    __syncthreads();

    float s[kScoreTiles][4];
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const T* kr = smem.k + (j * 8 + g) * kPitch + st * 16 + 2 * t;
        const uint32_t bf[2] = {load_pair(kr), load_pair(kr + 8)};
        mma_16816<T>(s[j], q_frag[st], bf);
      }
    }

    // Scale, biases and the key bound, in the log2 domain; then the tile's row maxima.
    float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const int64_t col = col0 + j * 8 + 2 * t + (e % 2);
        float x = kNegInf;
        if (col < p.len) {
          x = s[j][e] * scale_log2;
          if (has_bias1) x += load_bias(p.bias1, p.bias1_type, bias1_base + col * p.bias1_stride[2]) * kLog2e;
          if (has_bias2 && my_rows[r] < p.len) {
            x += load_bias(p.bias2, p.bias2_type,
                           bias2_base + my_rows[r] * p.bias2_stride[2] + col * p.bias2_stride[3]) *
                 kLog2e;
          }
        }
        s[j][e] = x;
        tile_max[r] = fmaxf(tile_max[r], x);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // The four threads of a row (t = 0..3) hold its 64 columns between them.
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    }
    float rescale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float new_max = fmaxf(row_max[r], tile_max[r]);
      // While every key so far is masked the max stays -inf; use 0 as the shift so that exp2 of
      // -inf scores gives 0 instead of exp2(-inf - -inf) = NaN.
      const float shift = new_max == kNegInf ? 0.0f : new_max;
      rescale[r] = exp2f(row_max[r] - shift);
      row_max[r] = new_max;
      row_sum[r] *= rescale[r];
#pragma unroll
      for (int j = 0; j < kScoreTiles; ++j) {
        s[j][2 * r] = exp2f(s[j][2 * r] - shift);
        s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - shift);
        row_sum[r] += s[j][2 * r] + s[j][2 * r + 1];
      }
    }
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      o_acc[i][0] *= rescale[0];
      o_acc[i][1] *= rescale[0];
      o_acc[i][2] *= rescale[1];
      o_acc[i][3] *= rescale[1];
    }

    // O += P V. The accumulators of two adjacent n8 score tiles are exactly an A fragment.
#pragma unroll
    for (int kk = 0; kk < Tile::kBlockN / 16; ++kk) {
      const uint32_t a[4] = {ElementTraits<T>::pack(s[2 * kk][0], s[2 * kk][1]),
                             ElementTraits<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                             ElementTraits<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             ElementTraits<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int i = 0; i < kOutTiles; ++i) {
        const T* vr = smem.v + (kk * 16 + 2 * t) * kPitch + i * 8 + g;
        const uint32_t bf[2] = {load_column_pair(vr, kPitch), load_column_pair(vr + 8 * kPitch, kPitch)};
        mma_16816<T>(o_acc[i], a, bf);
      }
    }
  }

  // Finish: the row sums are spread over the four threads of each row.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + n * p.out_stride[1] + h * p.out_stride[3];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = my_rows[r];
    if (row >= p.len) continue;
    // A fully masked row has sum 0: output 0, lse -inf.
    const float inv = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      const int d = i * 8 + 2 * t;
      if (d < p.dim) out[row * p.out_stride[2] + d] = ElementTraits<T>::from_float(o_acc[i][2 * r] * inv);
      if (d + 1 < p.dim) out[row * p.out_stride[2] + d + 1] = ElementTraits<T>::from_float(o_acc[i][2 * r + 1] * inv);
    }
    if (p.lse != nullptr && t == 0) {
      const float lse = row_sum[r] > 0.0f ? (row_max[r] + log2f(row_sum[r])) * kLn2 : kNegInf;
      p.lse[bn * p.lse_stride[0] + h * p.lse_stride[1] + row * p.lse_stride[2]] = lse;
    }
  }
}

}  // namespace sciattn::cuda
