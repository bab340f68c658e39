// The per-call decisions the fused block-sparse CUDA dispatch makes on the host
// (src/cuda/block_sparse/sparse_attention_device_params_of.h), checked without a GPU: when whole
// tiles take the lean copies (lean_tiles), when whole 64-token tiles run the warpgroup-MMA
// kernels (wgmma_tiles), and when outputs are written as aligned pairs (out_paired,
// grads_paired). The kernels trust these flags without re-checking them: a wrong "yes" would read
// or write out of bounds on the GPU, and a wrong "no" for wgmma_tiles would go unnoticed by the GPU
// tests (the mma.sync kernels give the same results, only slower).
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "cuda/block_sparse/sparse_attention_device_params_of.h"

namespace {

using namespace sciattn;

// Fake device addresses: the decisions read pointer values (alignment), never the memory.
void* address(uintptr_t offset_bytes) {
  return reinterpret_cast<void*>((uintptr_t{1} << 32) + offset_bytes);
}

struct Shape {
  int64_t B, H, L, D;
  detail::AttentionShape attention() const { return {B, H, L, D}; }
};

TensorView bhld(const Shape& s, DType dtype, uintptr_t offset) {
  return TensorView::contiguous(address(offset), dtype, {s.B, s.H, s.L, s.D});
}

struct Calls {
  SparseAttentionForwardParams f;
  SparseAttentionBackwardParams b;
};

Calls calls(const Shape& s, DType dtype) {
  Calls c;
  c.f.q = bhld(s, dtype, 0);
  c.f.k = bhld(s, dtype, 1 << 24);
  c.f.v = bhld(s, dtype, 2 << 24);
  c.f.out = bhld(s, dtype, 3 << 24);
  c.f.lse = TensorView::contiguous(address(4 << 24), DType::kF32, {s.B, s.H, s.L});
  c.b.q = c.f.q;
  c.b.k = c.f.k;
  c.b.v = c.f.v;
  c.b.out = c.f.out;
  c.b.lse = c.f.lse;
  c.b.dout = bhld(s, dtype, 5 << 24);
  c.b.dq = bhld(s, dtype, 6 << 24);
  c.b.dk = bhld(s, dtype, 7 << 24);
  c.b.dv = bhld(s, dtype, 8 << 24);
  return c;
}

// The kernel head dim a full build runs D with (the dispatch asks the build).
int64_t kernel_dim(int64_t d) {
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

cuda::SparseAttentionDeviceParams forward(const Calls& c, const Shape& s) {
  return cuda::sparse_forward_device_params(c.f, s.attention(), kernel_dim(s.D));
}
cuda::SparseAttentionDeviceParams backward(const Calls& c, const Shape& s) {
  return cuda::sparse_backward_device_params(c.b, s.attention(), kernel_dim(s.D));
}

TEST(SparseAttentionDeviceParams, WholeTilesOfHeadDims64And128RunTheWarpgroupKernels) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t d : {64, 128}) {
      const Shape s{1, 2, 4096, d};
      const Calls c = calls(s, dtype);
      const cuda::SparseAttentionDeviceParams f = forward(c, s);
      EXPECT_EQ(f.lean_tiles, 1) << d;
      EXPECT_EQ(f.wgmma_tiles, 1) << d;
      EXPECT_EQ(f.out_paired, 1) << d;
      const cuda::SparseAttentionDeviceParams b = backward(c, s);
      EXPECT_EQ(b.lean_tiles, 1) << d;
      EXPECT_EQ(b.wgmma_tiles, 1) << d;
      EXPECT_EQ(b.grads_paired, 1) << d;
    }
  }
}

TEST(SparseAttentionDeviceParams, OtherShapesKeepTheMmaSyncKernels) {
  // Head dim 32 (lean, but no warpgroup form), L not a multiple of 64 (partial tiles), and head
  // dims run padded in a wider instantiation (neither lean nor paired).
  {
    const Shape s{1, 2, 4096, 32};
    const Calls c = calls(s, DType::kBF16);
    EXPECT_EQ(forward(c, s).lean_tiles, 1);
    EXPECT_EQ(forward(c, s).wgmma_tiles, 0);
  }
  {
    const Shape s{1, 2, 4000, 64};
    const Calls c = calls(s, DType::kBF16);
    EXPECT_EQ(forward(c, s).lean_tiles, 1);
    EXPECT_EQ(forward(c, s).wgmma_tiles, 0);
    EXPECT_EQ(backward(c, s).wgmma_tiles, 0);
  }
  for (const int64_t d : {48, 96}) {
    const Shape s{1, 2, 4096, d};
    const Calls c = calls(s, DType::kBF16);
    const cuda::SparseAttentionDeviceParams f = forward(c, s);
    EXPECT_EQ(f.lean_tiles, 0) << d;
    EXPECT_EQ(f.wgmma_tiles, 0) << d;
    EXPECT_EQ(f.out_paired, 0) << d;
    EXPECT_EQ(backward(c, s).grads_paired, 0) << d;
  }
  // A build without the 64 instantiation runs head dim 64 in the 128 one: not lean.
  const Shape s{1, 2, 4096, 64};
  const Calls c = calls(s, DType::kBF16);
  EXPECT_EQ(cuda::sparse_forward_device_params(c.f, s.attention(), 128).wgmma_tiles, 0);
}

TEST(SparseAttentionDeviceParams, MisalignedOrStridedTensorsKeepTheGenericCopies) {
  const Shape s{1, 2, 4096, 64};
  Calls c = calls(s, DType::kBF16);
  c.f.k = bhld(s, DType::kBF16, (1 << 24) + 2);  // one element past a 16-byte boundary
  EXPECT_EQ(forward(c, s).vec_k, 0);
  EXPECT_EQ(forward(c, s).lean_tiles, 0);
  EXPECT_EQ(forward(c, s).wgmma_tiles, 0);
  // DeepSpeed's pre-transposed key: a [B, H, L, D] view with the last two strides swapped.
  c = calls(s, DType::kBF16);
  c.f.k = TensorView::strided(address(1 << 24), DType::kBF16, {1, 2, 4096, 64},
                              {2 * 4096 * 64, 4096 * 64, 1, 4096});
  EXPECT_EQ(forward(c, s).wgmma_tiles, 0);
  // dO is copied like Q: only the backward loses the lean and warpgroup paths.
  c = calls(s, DType::kBF16);
  c.b.dout = bhld(s, DType::kBF16, (5 << 24) + 2);
  EXPECT_EQ(forward(c, s).wgmma_tiles, 1);
  EXPECT_EQ(backward(c, s).lean_tiles, 0);
  EXPECT_EQ(backward(c, s).wgmma_tiles, 0);
  // dK is written, not copied: the tiles stay lean, the gradients are not paired.
  c = calls(s, DType::kBF16);
  c.b.dk = bhld(s, DType::kBF16, (7 << 24) + 2);
  EXPECT_EQ(backward(c, s).wgmma_tiles, 1);
  EXPECT_EQ(backward(c, s).grads_paired, 0);
  // An output one element off: the forward's stores are not paired, its tiles still lean.
  c = calls(s, DType::kBF16);
  c.f.out = bhld(s, DType::kBF16, (3 << 24) + 2);
  EXPECT_EQ(forward(c, s).out_paired, 0);
  EXPECT_EQ(forward(c, s).wgmma_tiles, 1);
}

TEST(SparseAttentionDeviceParams, OffsetsBeyond31BitsKeepTheGenericCopies) {
  const Shape s{1, 1, 128, 64};
  Calls c = calls(s, DType::kBF16);
  // Rows of V 2^24 elements (32 MiB) apart: a 64-row tile spans 2 GiB.
  c.f.v = TensorView::strided(address(2 << 24), DType::kBF16, {1, 1, 128, 64},
                              {int64_t{1} << 32, int64_t{1} << 32, int64_t{1} << 24, 1});
  EXPECT_EQ(forward(c, s).vec_v, 1);  // still 16-byte copies, through the generic path
  EXPECT_EQ(forward(c, s).lean_tiles, 0);
  EXPECT_EQ(forward(c, s).wgmma_tiles, 0);
  // The largest row stride that fits: 64 rows x stride x 2 bytes < 2^31.
  const int64_t fits = (int64_t{1} << 31) / 64 / 2 - 8;
  c.f.v = TensorView::strided(address(2 << 24), DType::kBF16, {1, 1, 128, 64},
                              {int64_t{1} << 32, int64_t{1} << 32, fits, 1});
  EXPECT_EQ(forward(c, s).lean_tiles, 1);
  EXPECT_EQ(forward(c, s).wgmma_tiles, 1);
}

// The forwards' probability shift (cuda/common/probability_shift.h): ceil(log2 L) with bf16
// inputs (no row sees more than L keys), 0 with f16.
TEST(SparseAttentionDeviceParams, Bf16ProbabilitiesAreShiftedByTheKeysLog2) {
  for (const auto& [L, k] : std::initializer_list<std::pair<int64_t, float>>{
           {16, 4.0f}, {4096, 12.0f}, {4097, 13.0f}, {1 << 20, 20.0f}}) {
    const Shape s{1, 2, L, 64};
    EXPECT_EQ(forward(calls(s, DType::kBF16), s).prob_shift_log2, k) << L;
    EXPECT_EQ(forward(calls(s, DType::kF16), s).prob_shift_log2, 0.0f) << L;
  }
}

}  // namespace
