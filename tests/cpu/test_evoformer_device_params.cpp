// The per-launch decisions the Evoformer CUDA dispatch makes on the host
// (src/cuda/evoformer/evoformer_device_params_of.h), checked without a GPU: when whole tiles may
// take the lean copies (lean_tiles, bias2_lean), when head dims 64 and 128 run the warpgroup-MMA
// kernels (wgmma_tiles), when outputs are written as aligned pairs
// (vec_out, grads_paired), and the grid decoders' divisors. The kernels trust these flags
// without re-checking them, so a wrong "yes" here would read or write out of bounds on the GPU;
// the GPU tests use small tensors and cannot reach the 2^31-byte bounds.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/evoformer_checks.h"
#include "cuda/evoformer/evoformer_device_params_of.h"

namespace {

using namespace sciattn;

// Fake device addresses: the decisions read pointer values (alignment), never the memory.
void* address(uintptr_t offset_bytes) {
  return reinterpret_cast<void*>((uintptr_t{1} << 32) + offset_bytes);
}

struct Shape {
  int64_t B, N, L, H, D;
  detail::EvoformerShape evo() const { return {B, N, L, H, D}; }
};

TensorView qkv(const Shape& s, DType dtype, uintptr_t offset = 0) {
  return TensorView::contiguous(address(offset), dtype, {s.B, s.N, s.L, s.H, s.D});
}

struct Views {
  EvoformerForwardParams f;
  EvoformerBackwardParams b;
};

Views views(const Shape& s, DType dtype) {
  Views v;
  v.f.q = qkv(s, dtype);
  v.f.k = qkv(s, dtype, 1 << 24);
  v.f.v = qkv(s, dtype, 2 << 24);
  v.f.out = qkv(s, dtype, 3 << 24);
  v.f.bias1 = TensorView::contiguous(address(4 << 24), dtype, {s.B, s.N, 1, 1, s.L});
  v.f.bias2 = TensorView::contiguous(address(5 << 24), dtype, {s.B, 1, s.H, s.L, s.L});
  v.f.lse = TensorView::contiguous(address(6 << 24), DType::kF32, {s.B * s.N, s.H, s.L});
  v.b.q = v.f.q;
  v.b.k = v.f.k;
  v.b.v = v.f.v;
  v.b.bias1 = v.f.bias1;
  v.b.bias2 = v.f.bias2;
  v.b.out = v.f.out;
  v.b.lse = v.f.lse;
  v.b.dout = qkv(s, dtype, 7 << 24);
  v.b.dq = qkv(s, dtype, 8 << 24);
  v.b.dk = qkv(s, dtype, 9 << 24);
  v.b.dv = qkv(s, dtype, 10 << 24);
  return v;
}

cuda::EvoformerDeviceParams backward(const Views& v, const Shape& s) {
  return cuda::backward_device_params(v.b, s.evo(), address(11 << 24));
}

TEST(EvoformerDeviceParams, PackedTensorsTakeTheLeanPaths) {
  const Shape s{1, 2, 192, 2, 32};  // bias2 rows of 384 bytes: staged
  const Views v = views(s, DType::kBF16);
  const cuda::EvoformerDeviceParams f = cuda::forward_device_params(v.f, s.evo());
  EXPECT_EQ(f.lean_tiles, 1);
  EXPECT_EQ(f.bias2_staged, 1);
  EXPECT_EQ(f.bias2_lean, 1);
  EXPECT_EQ(f.vec_out, 1);
  const cuda::EvoformerDeviceParams b = backward(v, s);
  EXPECT_EQ(b.lean_tiles, 1);
  EXPECT_EQ(b.grads_paired, 1);
  // The grids' divisors: 64-row tiles of L, heads, N, batch, and the dbias2 kernel's query
  // blocks (128 rows up to head dim 64).
  EXPECT_EQ(f.tiles64_div.divisor, 3u);
  EXPECT_EQ(f.heads_div.divisor, 2u);
  EXPECT_EQ(f.n_div.divisor, 2u);
  EXPECT_EQ(f.batch_div.divisor, 1u);
  EXPECT_EQ(f.dbias2_rows_div.divisor, 2u);
  EXPECT_EQ(cuda::backward_device_params(v.b, Shape{1, 2, 192, 2, 128}.evo(), address(0))
                .dbias2_rows_div.divisor,
            3u);  // 64 rows at head dim 128
}

TEST(EvoformerDeviceParams, PaddedHeadDimsKeepTheGenericCopies) {
  // D = 24 runs in the 32-wide instantiation: its tiles have a zero-filled chunk, and its rows
  // are not whole pairs of the instantiated width.
  const Shape s24{1, 2, 128, 2, 24};
  const Views v24 = views(s24, DType::kF16);
  EXPECT_EQ(cuda::forward_device_params(v24.f, s24.evo()).lean_tiles, 0);
  EXPECT_EQ(backward(v24, s24).grads_paired, 0);
  // D = 8 runs in 16-wide tiles (no lean copy) but writes whole 8-wide rows.
  const Shape s8{1, 2, 128, 2, 8};
  const Views v8 = views(s8, DType::kBF16);
  EXPECT_EQ(cuda::forward_device_params(v8.f, s8.evo()).lean_tiles, 0);
  EXPECT_EQ(backward(v8, s8).grads_paired, 1);
}

TEST(EvoformerDeviceParams, OffsetsBeyond31BitsKeepTheGenericCopies) {
  const Shape s{1, 1, 128, 1, 32};
  Views v = views(s, DType::kBF16);
  // Rows of K 2^24 elements (32 MiB) apart: a 128-row tile spans 4 GiB.
  v.f.k = TensorView::strided(address(1 << 24), DType::kBF16, {1, 1, 128, 1, 32},
                              {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 24, 32, 1});
  const cuda::EvoformerDeviceParams f = cuda::forward_device_params(v.f, s.evo());
  EXPECT_EQ(f.vec_k, 1);  // still 16-byte copies, through the generic path
  EXPECT_EQ(f.lean_tiles, 0);
  // The largest row stride that fits: 128 rows x stride x 2 bytes < 2^31.
  const int64_t fits = (int64_t{1} << 31) / 128 / 2 - 8;
  v.f.k = TensorView::strided(address(1 << 24), DType::kBF16, {1, 1, 128, 1, 32},
                              {int64_t{1} << 31, int64_t{1} << 31, fits, 32, 1});
  EXPECT_EQ(cuda::forward_device_params(v.f, s.evo()).lean_tiles, 1);
  // bias2 rows 2^24 elements apart: still staged, not lean.
  v = views(s, DType::kBF16);
  v.f.bias2 = TensorView::strided(
      address(5 << 24), DType::kBF16, {1, 1, 1, 128, 128},
      {int64_t{1} << 32, int64_t{1} << 32, int64_t{1} << 32, int64_t{1} << 24, 1});
  const cuda::EvoformerDeviceParams g = cuda::forward_device_params(v.f, s.evo());
  EXPECT_EQ(g.bias2_staged, 1);
  EXPECT_EQ(g.bias2_lean, 0);
}

TEST(EvoformerDeviceParams, MisalignedTensorsKeepTheGenericPaths) {
  const Shape s{1, 2, 128, 2, 32};
  Views v = views(s, DType::kBF16);
  v.f.out = qkv(s, DType::kBF16, (3 << 24) + 2);  // one element past a 16-byte boundary
  v.b.out = v.f.out;
  const cuda::EvoformerDeviceParams f = cuda::forward_device_params(v.f, s.evo());
  EXPECT_EQ(f.vec_out, 0);
  EXPECT_EQ(f.lean_tiles, 0);
  v = views(s, DType::kBF16);
  v.b.dk = qkv(s, DType::kBF16, (9 << 24) + 2);
  const cuda::EvoformerDeviceParams b = backward(v, s);
  EXPECT_EQ(b.lean_tiles, 1);  // dK is written, not copied
  EXPECT_EQ(b.grads_paired, 0);
  v = views(s, DType::kBF16);
  v.b.dout = qkv(s, DType::kBF16, (7 << 24) + 2);
  EXPECT_EQ(backward(v, s).lean_tiles, 0);
}

TEST(EvoformerDeviceParams, WarpgroupKernelsTakeHeadDims32To128OnLeanTiles) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t d : {32, 64, 128}) {
      for (const int64_t len : {1, 17, 64, 300}) {  // any L: rows past L are zero-filled
        const Shape s{1, 2, len, 2, d};
        const Views v = views(s, dtype);
        EXPECT_EQ(cuda::forward_device_params(v.f, s.evo()).wgmma_tiles, 1) << d << " " << len;
        EXPECT_EQ(backward(v, s).wgmma_tiles, 1) << d << " " << len;
      }
    }
  }
  // Other head dims (also those padded to 32, 64 or 128), fp32 inputs, and tiles that are not
  // lean keep the mma.sync (or fp32) kernels.
  for (const int64_t d : {8, 16, 24, 48, 96}) {
    const Shape s{1, 2, 128, 2, d};
    const Views v = views(s, DType::kBF16);
    EXPECT_EQ(cuda::forward_device_params(v.f, s.evo()).wgmma_tiles, 0) << d;
    EXPECT_EQ(backward(v, s).wgmma_tiles, 0) << d;
  }
  const Shape s{1, 2, 128, 2, 64};
  EXPECT_EQ(cuda::forward_device_params(views(s, DType::kF32).f, s.evo()).wgmma_tiles, 0);
  Views v = views(s, DType::kBF16);
  v.f.q = qkv(s, DType::kBF16, 2);  // Q one element past a 16-byte boundary
  EXPECT_EQ(cuda::forward_device_params(v.f, s.evo()).wgmma_tiles, 0);
  v = views(s, DType::kBF16);
  v.b.dout = qkv(s, DType::kBF16, (7 << 24) + 2);
  EXPECT_EQ(cuda::forward_device_params(v.f, s.evo()).wgmma_tiles, 1);
  EXPECT_EQ(backward(v, s).wgmma_tiles, 0);  // dO is copied like Q
}

}  // namespace
