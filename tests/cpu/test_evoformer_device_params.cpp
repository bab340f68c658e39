// The per-launch decisions the Evoformer CUDA dispatch makes on the host
// (src/cuda/evoformer/evoformer_device_params_of.h), checked without a GPU: when whole tiles may
// take the lean copies (lean_tiles, bias2_lean), when head dims 64 and 128 run the warpgroup-MMA
// kernels (wgmma_tiles), when outputs are written as aligned pairs
// (vec_out, grads_paired), and the grid decoders' divisors. The kernels trust these flags
// without re-checking them, so a wrong "yes" here would read or write out of bounds on the GPU;
// the GPU tests use small tensors and cannot reach the 2^31-byte bounds.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

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

// The kernels' arguments with the workspace at a fake address (the staged copies' regions).
cuda::EvoformerDeviceParams forward(const Views& v, const Shape& s) {
  return cuda::forward_device_params(v.f, s.evo(), address(12 << 24));
}
cuda::EvoformerDeviceParams backward(const Views& v, const Shape& s) {
  return cuda::backward_device_params(v.b, s.evo(), address(11 << 24));
}

TEST(EvoformerDeviceParams, PackedTensorsTakeTheLeanPaths) {
  const Shape s{1, 2, 192, 2, 32};  // bias2 rows of 384 bytes: staged
  const Views v = views(s, DType::kBF16);
  const cuda::EvoformerDeviceParams f = forward(v, s);
  EXPECT_EQ(f.lean_tiles, 1);
  EXPECT_EQ(f.bias2_staged, 1);
  EXPECT_EQ(f.bias2_lean, 1);
  EXPECT_EQ(f.vec_out, 1);
  EXPECT_EQ(f.out_paired, 1);
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
  // D = 24 runs in the 32-wide instantiation: its tiles have a zero-filled chunk; its gradient
  // rows are whole aligned pairs (store_rows stops at D).
  const Shape s24{1, 2, 128, 2, 24};
  const Views v24 = views(s24, DType::kF16);
  EXPECT_EQ(forward(v24, s24).lean_tiles, 0);
  EXPECT_EQ(backward(v24, s24).grads_paired, 1);
  // An odd D has no whole pairs: element by element.
  const Shape s33{1, 2, 128, 2, 33};
  EXPECT_EQ(backward(views(s33, DType::kBF16), s33).grads_paired, 0);
  EXPECT_EQ(forward(views(s33, DType::kBF16), s33).out_paired, 0);
  EXPECT_EQ(forward(v24, s24).out_paired, 1);
  // D = 8 runs in 16-wide tiles (no lean copy) but writes whole 8-wide rows.
  const Shape s8{1, 2, 128, 2, 8};
  const Views v8 = views(s8, DType::kBF16);
  EXPECT_EQ(forward(v8, s8).lean_tiles, 0);
  EXPECT_EQ(backward(v8, s8).grads_paired, 1);
}

TEST(EvoformerDeviceParams, OffsetsBeyond31BitsKeepTheGenericCopies) {
  const Shape s{1, 1, 128, 1, 32};
  Views v = views(s, DType::kBF16);
  // Rows of K 2^24 elements (32 MiB) apart: a 128-row tile spans 4 GiB.
  v.f.k = TensorView::strided(address(1 << 24), DType::kBF16, {1, 1, 128, 1, 32},
                              {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 24, 32, 1});
  const cuda::EvoformerDeviceParams f = forward(v, s);
  EXPECT_EQ(f.vec_k, 1);  // still 16-byte copies, through the generic path
  EXPECT_EQ(f.lean_tiles, 0);
  // The largest row stride that fits: 128 rows x stride x 2 bytes < 2^31.
  const int64_t fits = (int64_t{1} << 31) / 128 / 2 - 8;
  v.f.k = TensorView::strided(address(1 << 24), DType::kBF16, {1, 1, 128, 1, 32},
                              {int64_t{1} << 31, int64_t{1} << 31, fits, 32, 1});
  EXPECT_EQ(forward(v, s).lean_tiles, 1);
  // bias2 rows 2^24 elements apart: still staged, not lean.
  v = views(s, DType::kBF16);
  v.f.bias2 = TensorView::strided(
      address(5 << 24), DType::kBF16, {1, 1, 1, 128, 128},
      {int64_t{1} << 32, int64_t{1} << 32, int64_t{1} << 32, int64_t{1} << 24, 1});
  const cuda::EvoformerDeviceParams g = forward(v, s);
  EXPECT_EQ(g.bias2_staged, 1);
  EXPECT_EQ(g.bias2_lean, 0);
}

TEST(EvoformerDeviceParams, MisalignedOutputsKeepTheGenericStores) {
  const Shape s{1, 2, 128, 2, 32};
  Views v = views(s, DType::kBF16);
  v.f.out = qkv(s, DType::kBF16, (3 << 24) + 2);  // one element past a 16-byte boundary
  v.b.out = v.f.out;
  const cuda::EvoformerDeviceParams f = forward(v, s);
  EXPECT_EQ(f.vec_out, 0);
  EXPECT_EQ(f.out_paired, 0);  // its pairs are off 4-byte boundaries
  EXPECT_EQ(f.lean_tiles, 0);
  EXPECT_EQ(f.padded_tiles, 1);  // stores (and the backward's delta) at any alignment
  EXPECT_EQ(backward(v, s).padded_tiles, 1);
  v = views(s, DType::kBF16);
  v.b.dk = qkv(s, DType::kBF16, (9 << 24) + 2);
  const cuda::EvoformerDeviceParams b = backward(v, s);
  EXPECT_EQ(b.lean_tiles, 1);  // dK is written, not copied
  EXPECT_EQ(b.grads_paired, 0);
  // Two elements past a 16-byte boundary: the pairs stay 4-byte aligned.
  v.b.dk = qkv(s, DType::kBF16, (9 << 24) + 4);
  EXPECT_EQ(backward(v, s).grads_paired, 1);
  // Rows an odd number of elements apart: every other row starts off a 4-byte boundary.
  v.b.dk = TensorView::strided(address(9 << 24), DType::kBF16, {1, 2, 128, 2, 32},
                               {2 * 128 * 65, 128 * 65, 65, 32, 1});
  EXPECT_EQ(backward(v, s).grads_paired, 0);
  // An input off a 16-byte boundary is read through its staged copy (next test).
  v = views(s, DType::kBF16);
  v.b.dout = qkv(s, DType::kBF16, (7 << 24) + 2);
  EXPECT_EQ(backward(v, s).lean_tiles, 1);
}

TEST(EvoformerDeviceParams, WarpgroupKernelsTakeLeanTilesAndRowsOfAnyAlignment) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t d : {32, 64, 128}) {
      for (const int64_t len : {1, 17, 64, 300}) {  // any L: rows past L are zero-filled
        const Shape s{1, 2, len, 2, d};
        const Views v = views(s, dtype);
        EXPECT_EQ(forward(v, s).wgmma_tiles, 1) << d << " " << len;
        EXPECT_EQ(backward(v, s).wgmma_tiles, 1) << d << " " << len;
      }
    }
  }
  // Any other D (24, 40, 48, 96, 120, and through staged copies those that are not multiples of
  // 8) takes them as PaddedDimTypes when each bias is absent or in the inputs' type (the pairs
  // FixedBiasTypes compiles), and keeps the mma.sync kernels with any other pair; the forward at
  // D 127 (near its head dim, rows on 4-byte boundaries in shifted slices) as InPlaceDimTypes.
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t d : {24, 40, 48, 96, 120, 20, 33, 127}) {
      const Shape s{1, 2, 300, 2, d};
      Views v = views(s, dtype);
      for (int absent = 0; absent < 4; ++absent) {  // bit 0: no bias1, bit 1: no bias2
        v = views(s, dtype);
        if (absent & 1) v.f.bias1 = v.b.bias1 = TensorView{};
        if (absent & 2) v.f.bias2 = v.b.bias2 = TensorView{};
        const cuda::EvoformerDeviceParams f = forward(v, s);
        const cuda::EvoformerDeviceParams b = backward(v, s);
        const int in_place = d == 127 ? 1 : 0;
        EXPECT_EQ(f.wgmma_tiles, 1) << d << " " << absent;
        EXPECT_EQ(f.padded_tiles, 1 - in_place) << d << " " << absent;
        EXPECT_EQ(f.in_place_tiles, in_place) << d << " " << absent;
        EXPECT_EQ(f.lean_tiles, 0) << d << " " << absent;
        EXPECT_EQ(b.wgmma_tiles, 1) << d << " " << absent;
        EXPECT_EQ(b.padded_tiles, 1) << d << " " << absent;
      }
      v = views(s, dtype);
      v.f.bias1 = v.b.bias1 =
          TensorView::contiguous(address(4 << 24), DType::kBool, {s.B, s.N, 1, 1, s.L});
      EXPECT_EQ(forward(v, s).wgmma_tiles, 0) << d;
      EXPECT_EQ(forward(v, s).padded_tiles, 0) << d;
      EXPECT_EQ(forward(v, s).in_place_tiles, 0) << d;
      EXPECT_EQ(backward(v, s).wgmma_tiles, 0) << d;
      v = views(s, dtype);
      v.f.bias2 = v.b.bias2 =
          TensorView::contiguous(address(5 << 24), DType::kF32, {s.B, 1, s.H, s.L, s.L});
      EXPECT_EQ(forward(v, s).wgmma_tiles, 0) << d;
      EXPECT_EQ(backward(v, s).padded_tiles, 0) << d;
    }
  }
  // The head dim itself is never padded.
  for (const int64_t d : {32, 64, 128}) {
    const Shape s{1, 2, 300, 2, d};
    EXPECT_EQ(forward(views(s, DType::kBF16), s).padded_tiles, 0);
  }
  // Rows that are not whole aligned chunks take the warpgroup kernels (below three quarters of the
  // head dim, and in the backward) only through their staged copies (load_dim: D rounded up to
  // 8); read as they are (a call without the copies' workspace, which the dispatch never makes)
  // they would keep the mma.sync kernels' element-wise copies.
  for (const int64_t d : {20, 36, 34, 33}) {
    const Shape s{1, 2, 300, 2, d};
    const Views v = views(s, DType::kBF16);
    cuda::EvoformerDeviceParams f = cuda::evoformer_params::common_params(
        v.f.q, v.f.k, v.f.v, v.f.bias1, v.f.bias2, v.f.out, v.f.lse, v.f.options, s.evo());
    EXPECT_EQ(f.wgmma_tiles, 0) << d;
    EXPECT_EQ(f.load_dim, d) << d;
    f = forward(v, s);
    EXPECT_EQ(f.wgmma_tiles, 1) << d;
    EXPECT_EQ(f.lean_tiles, 0) << d;
    EXPECT_EQ(f.padded_tiles, 1) << d;
    EXPECT_EQ(f.in_place_tiles, 0) << d;
    EXPECT_EQ(f.load_dim, detail::cuda_staged_row(d)) << d;
    const cuda::EvoformerDeviceParams b = backward(v, s);
    EXPECT_EQ(b.padded_tiles, 1) << d;
    EXPECT_EQ(b.load_dim, detail::cuda_staged_row(d)) << d;
  }
  // Head dims 8 and 16 (and the D padded to them) keep the mma.sync kernels, as do fp32 inputs.
  for (const int64_t d : {1, 7, 8, 12, 16}) {
    const Shape s{1, 2, 128, 2, d};
    const Views v = views(s, DType::kBF16);
    EXPECT_EQ(forward(v, s).wgmma_tiles, 0) << d;
    EXPECT_EQ(backward(v, s).wgmma_tiles, 0) << d;
  }
  const Shape s{1, 2, 128, 2, 64};
  EXPECT_EQ(forward(views(s, DType::kF32), s).wgmma_tiles, 0);
  // A tensor one element past a 16-byte boundary: read from its staged copy, so the lean tiles.
  Views v = views(s, DType::kBF16);
  v.f.q = qkv(s, DType::kBF16, 2);
  const cuda::EvoformerDeviceParams f = forward(v, s);
  EXPECT_EQ(f.wgmma_tiles, 1);
  EXPECT_EQ(f.lean_tiles, 1);
  EXPECT_EQ(f.padded_tiles, 0);
  v = views(s, DType::kBF16);
  v.b.dout = qkv(s, DType::kBF16, (7 << 24) + 4);  // dO is staged like Q
  EXPECT_EQ(backward(v, s).wgmma_tiles, 1);
  EXPECT_EQ(backward(v, s).lean_tiles, 1);
  // Rows 2^24 elements apart keep the mma.sync kernels (tile offsets past 31 bits).
  v = views(s, DType::kBF16);
  v.f.k = TensorView::strided(address(1 << 24), DType::kBF16, {1, 2, 128, 2, 64},
                              {int64_t{1} << 33, int64_t{1} << 32, int64_t{1} << 24, 64, 1});
  EXPECT_EQ(forward(v, s).wgmma_tiles, 0);
}

// The forward reads Q, K and V where they are (InPlaceDimTypes, 4-byte pieces) when D is at least
// three quarters of its head dim, their rows start on 4-byte boundaries (an even D; an odd D in
// slices that shift alike) and the device runs the warpgroup kernels; then its workspace holds no
// input copies. The backward always reads the staged copies.
TEST(EvoformerDeviceParams, ForwardReadsRowsNearTheHeadDimInPlace) {
  const auto in_place = [](const Views& v, const Shape& s, bool warpgroup = true) {
    const cuda::EvoformerDeviceParams f =
        cuda::forward_device_params(v.f, s.evo(), address(12 << 24), warpgroup);
    const detail::CudaForwardWorkspace w = cuda::forward_workspace(v.f, s.evo(), warpgroup);
    bool staged = false;
    for (bool st : w.copies.staged) staged = staged || st;
    EXPECT_FALSE(staged && f.in_place_tiles != 0) << s.D;
    return f;
  };
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t d : {25, 26, 30, 31, 49, 50, 58, 63, 97, 100, 116, 126, 127}) {
      const Shape s{1, 2, 300, 2, d};
      const Views v = views(s, dtype);
      const cuda::EvoformerDeviceParams f = in_place(v, s);
      EXPECT_EQ(f.in_place_tiles, 1) << d;
      EXPECT_EQ(f.shifted_slices, d % 2) << d;
      EXPECT_EQ(f.wgmma_tiles, 1) << d;
      EXPECT_EQ(f.padded_tiles, 0) << d;
      EXPECT_EQ(f.lean_tiles, 0) << d;
      EXPECT_EQ(f.load_dim, d) << d;
      EXPECT_EQ(f.q, v.f.q.data) << d;
      EXPECT_EQ(f.k, v.f.k.data) << d;
      EXPECT_EQ(f.v, v.f.v.data) << d;
      // Only the biases are copied (L 300: rows off 16-byte boundaries).
      EXPECT_EQ(cuda::forward_copy_jobs(v.f, s.evo(), address(12 << 24)).count, 2) << d;
      const cuda::EvoformerDeviceParams b = backward(v, s);
      EXPECT_EQ(b.padded_tiles, 1) << d;
      EXPECT_EQ(b.load_dim, detail::cuda_staged_row(d)) << d;
      // A device without the warpgroup kernels: the staged copies.
      const cuda::EvoformerDeviceParams portable = in_place(v, s, false);
      EXPECT_EQ(portable.in_place_tiles, 0) << d;
      EXPECT_EQ(portable.load_dim, detail::cuda_staged_row(d)) << d;
    }
  }
  // Below three quarters of the head dim, multiples of 8 (whole chunks), head dims 8 and 16,
  // fp32 inputs: no in-place reads.
  for (const int64_t d : {23, 24, 33, 47, 56, 95, 120, 128, 12, 15}) {
    const Shape s{1, 2, 300, 2, d};
    EXPECT_EQ(in_place(views(s, DType::kBF16), s).in_place_tiles, 0) << d;
  }
  const Shape s{1, 2, 300, 2, 63};
  EXPECT_EQ(in_place(views(s, DType::kF32), s).in_place_tiles, 0);
  // An odd D with an odd H (rows an odd number of elements apart, so a slice's rows alternate
  // 4-byte parity): staged.
  const Shape odd_h{1, 2, 300, 3, 63};
  EXPECT_EQ(in_place(views(odd_h, DType::kBF16), odd_h).in_place_tiles, 0);
  const Shape even{1, 2, 300, 3, 62};  // an even D's rows stay 4-byte aligned at any H
  EXPECT_EQ(in_place(views(even, DType::kBF16), even).shifted_slices, 0);
  EXPECT_EQ(in_place(views(even, DType::kBF16), even).in_place_tiles, 1);
  // Data off a 4-byte boundary, for an even and an odd D: staged.
  for (const Shape& t : {Shape{1, 2, 300, 2, 62}, s}) {
    Views v = views(t, DType::kBF16);
    v.f.k = qkv(t, DType::kBF16, (1 << 24) + 2);
    EXPECT_EQ(in_place(v, t).in_place_tiles, 0) << t.D;
  }
  // Slices that would not shift alike: K's N stride odd where Q's is even.
  Views v = views(s, DType::kBF16);
  const int64_t n_stride = 300 * 2 * 63 + 1;
  v.f.k = TensorView::strided(address(1 << 24), DType::kBF16, {1, 2, 300, 2, 63},
                              {2 * n_stride, n_stride, 2 * 63, 63, 1});
  EXPECT_EQ(in_place(v, s).in_place_tiles, 0);
  // ... and the same strides in all three: in place.
  v.f.q = TensorView::strided(address(0), DType::kBF16, {1, 2, 300, 2, 63},
                              {2 * n_stride, n_stride, 2 * 63, 63, 1});
  v.f.v = TensorView::strided(address(2 << 24), DType::kBF16, {1, 2, 300, 2, 63},
                              {2 * n_stride, n_stride, 2 * 63, 63, 1});
  EXPECT_EQ(in_place(v, s).in_place_tiles, 1);
  // A bias pair FixedBiasTypes does not compile keeps the mma.sync kernels and the copies.
  v = views(s, DType::kBF16);
  v.f.bias1 = TensorView::contiguous(address(4 << 24), DType::kBool, {1, 2, 1, 1, 300});
  EXPECT_EQ(in_place(v, s).in_place_tiles, 0);
  EXPECT_EQ(in_place(v, s).wgmma_tiles, 0);
}

// Biases whose rows do not start on 16-byte boundaries (L not a multiple of 8 for 16-bit ones)
// are copied into the workspace with padded rows, and the kernels read the copy as a staged,
// lean bias; aligned biases, and fp32 inputs (per-element kernels), take no copy.
TEST(EvoformerDeviceParams, UnalignedBiasesAreReadThroughPaddedCopies) {
  const Shape s{1, 2, 300, 2, 32};
  Views v = views(s, DType::kBF16);
  const detail::CudaForwardWorkspace w = cuda::forward_workspace(v.f, s.evo());
  EXPECT_EQ(w.copies.bias1_bytes, 2);
  EXPECT_EQ(w.copies.bias1_row, 304);
  EXPECT_EQ(w.copies.bias2_bytes, 2);
  EXPECT_EQ(w.copies.bias2_row, 304);
  // bias1 [1, 2, 304] then bias2 [1, 2, 300, 304], each region rounded to 64 bytes, plus the
  // base's alignment slack.
  EXPECT_EQ(w.layout.total_bytes(), size_t{1216 + 364800 + 64});
  void* const ws = address(12 << 24);
  const cuda::EvoformerDeviceParams f = cuda::forward_device_params(v.f, s.evo(), ws);
  EXPECT_EQ(f.bias1, w.layout.at<unsigned char>(ws, w.copies.bias1));
  EXPECT_EQ(f.bias2, w.layout.at<unsigned char>(ws, w.copies.bias2));
  EXPECT_EQ(f.bias1_staged, 1);
  EXPECT_EQ(f.bias2_staged, 1);
  EXPECT_EQ(f.bias2_lean, 1);
  EXPECT_EQ(f.bias2_pairs, 1);
  EXPECT_EQ(f.bias1_stride[0], 2 * 304);
  EXPECT_EQ(f.bias1_stride[1], 304);
  EXPECT_EQ(f.bias2_stride[0], 2 * 300 * 304);
  EXPECT_EQ(f.bias2_stride[1], 300 * 304);
  EXPECT_EQ(f.bias2_stride[2], 304);
  EXPECT_EQ(f.bias2_stride[3], 1);
  // The copy jobs: bias1, then bias2's rows over (B, H, L) in the caller's strides, into rows of
  // 304.
  const cuda::EvoformerCopyJobs jobs = cuda::forward_copy_jobs(v.f, s.evo(), ws);
  ASSERT_EQ(jobs.count, 2);
  const cuda::EvoformerRowCopyArgs& a = jobs.job[1];
  EXPECT_EQ(a.src, v.f.bias2.data);
  EXPECT_EQ(a.dst, f.bias2);
  EXPECT_EQ(a.outer[1], 2);
  EXPECT_EQ(a.outer[2], 300);
  EXPECT_EQ(a.outer_stride[2], 300);
  EXPECT_EQ(a.outer[3], 1);
  EXPECT_EQ(a.len, 300);
  EXPECT_EQ(a.row, 304);
  // The tensor's element extent, inside which the copy reads whole aligned 16-byte blocks.
  EXPECT_EQ(a.reach[0], 0);
  EXPECT_EQ(a.reach[1], 2 * 300 * 300 - 1);
  // The divisors that decode a chunk's index: 38 chunks of 16 bytes per row, then (B, H, L, 1).
  EXPECT_EQ(a.row_chunks_div.divisor, 38u);
  EXPECT_EQ(a.outer_div[0].divisor, 2u);
  EXPECT_EQ(a.outer_div[1].divisor, 300u);
  EXPECT_EQ(a.outer_div[2].divisor, 1u);
  const uint32_t x = 5 * 38 + 7;  // chunk 7 of row 5 (h = 0, query row 5)
  EXPECT_EQ(cuda::fast_divmod(x, a.row_chunks_div).remainder, 7u);
  EXPECT_EQ(
      cuda::fast_divmod(cuda::fast_divmod(x, a.row_chunks_div).quotient, a.outer_div[1]).remainder,
      5u);
  const cuda::EvoformerRowCopyArgs& a1 = jobs.job[0];
  EXPECT_EQ(a1.dst, f.bias1);
  EXPECT_EQ(a1.outer[0] * a1.outer[1] * a1.outer[2] * a1.outer[3], 2);  // [B = 1, N = 2, 1, 1]
  EXPECT_EQ(a1.outer_stride[1], 300);
  EXPECT_EQ(a1.outer_stride[2], 0);
  EXPECT_EQ(a1.elem_bytes, 2);
  // The backward copies them after its own regions, and reads the copies.
  const detail::CudaBackwardWorkspace bw = cuda::backward_workspace(v.b, s.evo());
  EXPECT_EQ(bw.copies.bias2_row, 304);
  EXPECT_GT(bw.copies.bias1, bw.delta);
  const cuda::EvoformerDeviceParams b = backward(v, s);
  EXPECT_EQ(b.bias2_staged, 1);
  EXPECT_EQ(b.bias2, bw.layout.at<unsigned char>(address(11 << 24), bw.copies.bias2));

  // A boolean mask pads to 16 elements, an fp32 bias to 4 (L = 300 is aligned for it).
  v.f.bias1 = TensorView::contiguous(address(4 << 24), DType::kBool, {1, 2, 1, 1, 300});
  v.f.bias2 = TensorView::contiguous(address(5 << 24), DType::kF32, {1, 1, 2, 300, 300});
  const detail::CudaForwardWorkspace mixed = cuda::forward_workspace(v.f, s.evo());
  EXPECT_EQ(mixed.copies.bias1_row, 304);
  EXPECT_EQ(mixed.copies.bias1_bytes, 1);
  EXPECT_EQ(mixed.copies.bias2_bytes, 0);
  // Aligned lengths and fp32 inputs take no copy.
  const Shape aligned{1, 2, 320, 2, 32};
  EXPECT_EQ(
      cuda::forward_workspace(views(aligned, DType::kBF16).f, aligned.evo()).layout.total_bytes(),
      0u);
  EXPECT_EQ(cuda::forward_workspace(views(s, DType::kF32).f, s.evo()).layout.total_bytes(), 0u);
}

// bias2_reach: the lowest and highest element offsets the kernels may read bias2 at, which let
// the CTAs of the last query rows read rows past L of a (b, h) slice that still lie inside bias2
// (the next slice's). A wrong upper end would read past the tensor on the GPU.
TEST(EvoformerDeviceParams, Bias2ReachIsTheViewsWholeExtent) {
  const Shape s{2, 2, 296, 3, 32};  // 592-byte rows: bias2 read in place
  Views v = views(s, DType::kBF16);
  cuda::EvoformerDeviceParams f = forward(v, s);
  EXPECT_EQ(f.bias2, v.f.bias2.data);
  EXPECT_EQ(f.bias2_reach[0], 0);
  EXPECT_EQ(f.bias2_reach[1], 2 * 3 * 296 * 296 - 1);
  EXPECT_EQ(backward(v, s).bias2_reach[1], 2 * 3 * 296 * 296 - 1);
  // Broadcast over the batch (stride 0) and the heads in reverse (a negative stride): the reach
  // spans heads 2 .. 0 below the first element.
  v.f.bias2.strides[0] = 0;
  v.f.bias2.strides[2] = -296 * 296;
  f = forward(v, s);
  EXPECT_EQ(f.bias2_reach[0], -2 * 296 * 296);
  EXPECT_EQ(f.bias2_reach[1], 296 * 296 - 1);
  // No bias2: nothing to reach.
  v.f.bias2 = TensorView{};
  f = forward(v, s);
  EXPECT_EQ(f.bias2_reach[0], 0);
  EXPECT_EQ(f.bias2_reach[1], 0);
  // A padded copy: its whole region, [B, H, L, padded row].
  const Shape odd{2, 2, 300, 3, 32};
  const Views u = views(odd, DType::kBF16);
  const cuda::EvoformerDeviceParams g = forward(u, odd);
  EXPECT_EQ(g.bias2_stride[2], 304);
  EXPECT_EQ(g.bias2_reach[0], 0);
  EXPECT_EQ(g.bias2_reach[1], 2 * 3 * 300 * 304 - 1);
  EXPECT_EQ(backward(u, odd).bias2_reach[1], 2 * 3 * 300 * 304 - 1);
}

// Q, K, V and dO of 16-bit inputs whose rows are not whole aligned 16-byte chunks (D not a
// multiple of 8, or a tensor off a 16-byte boundary) are copied into the workspace as packed
// rows of D rounded up to 8, zeros past D; the kernels read those copies (load_dim columns,
// 16-byte copies) and write the outputs at D where they are.
TEST(EvoformerDeviceParams, UnalignedInputsAreReadThroughStagedCopies) {
  const Shape s{1, 2, 300, 2, 33};
  const Views v = views(s, DType::kBF16);
  const detail::CudaForwardWorkspace w = cuda::forward_workspace(v.f, s.evo());
  EXPECT_EQ(w.copies.input_bytes, 2);
  EXPECT_EQ(w.copies.input_row, 48);  // whole 32-byte sectors
  EXPECT_TRUE(w.copies.staged[detail::kStagedQ]);
  EXPECT_TRUE(w.copies.staged[detail::kStagedK]);
  EXPECT_TRUE(w.copies.staged[detail::kStagedV]);
  EXPECT_FALSE(w.copies.staged[detail::kStagedDout]);
  // The two bias copies (L = 300), then Q, K, V of 1 x 2 x 300 x 2 rows of 48 bf16 (115,200
  // bytes each, a multiple of 64), plus the base's alignment slack.
  EXPECT_EQ(w.layout.total_bytes(), size_t{1216 + 364800 + 3 * 115200 + 64});
  void* const ws = address(12 << 24);
  const cuda::EvoformerDeviceParams f = cuda::forward_device_params(v.f, s.evo(), ws);
  EXPECT_EQ(f.q, w.layout.at<unsigned char>(ws, w.copies.input[detail::kStagedQ]));
  EXPECT_EQ(f.v, w.layout.at<unsigned char>(ws, w.copies.input[detail::kStagedV]));
  EXPECT_EQ(f.out, v.f.out.data);  // written where it is, at D
  EXPECT_EQ(f.q_stride[0], 2 * 300 * 2 * 48);
  EXPECT_EQ(f.q_stride[1], 300 * 2 * 48);
  EXPECT_EQ(f.q_stride[2], 2 * 48);
  EXPECT_EQ(f.q_stride[3], 48);
  EXPECT_EQ(f.dim, 33);
  EXPECT_EQ(f.load_dim, 48);
  EXPECT_EQ(f.vec_q + f.vec_k + f.vec_v, 3);
  EXPECT_EQ(f.vec_out, 0);
  EXPECT_EQ(f.padded_tiles, 1);
  const cuda::EvoformerCopyJobs jobs = cuda::forward_copy_jobs(v.f, s.evo(), ws);
  ASSERT_EQ(jobs.count, 5);  // bias1, bias2, Q, K, V
  const cuda::EvoformerRowCopyArgs& k = jobs.job[3];
  EXPECT_EQ(k.src, v.f.k.data);
  EXPECT_EQ(k.dst, f.k);
  EXPECT_EQ(k.elem_bytes, 2);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(k.outer[d], v.f.k.sizes[d]) << d;
    EXPECT_EQ(k.outer_stride[d], v.f.k.strides[d]) << d;
  }
  EXPECT_EQ(k.len, 33);
  EXPECT_EQ(k.len_stride, 1);
  EXPECT_EQ(k.row, 48);
  // The backward stages dO as well, after its own regions.
  const detail::CudaBackwardWorkspace bw = cuda::backward_workspace(v.b, s.evo());
  EXPECT_TRUE(bw.copies.staged[detail::kStagedDout]);
  EXPECT_GT(bw.copies.input[detail::kStagedQ], bw.delta);
  const cuda::EvoformerDeviceParams b = backward(v, s);
  EXPECT_EQ(b.dout,
            bw.layout.at<unsigned char>(address(11 << 24), bw.copies.input[detail::kStagedDout]));
  EXPECT_EQ(b.dout_stride[3], 48);
  EXPECT_EQ(b.vec_dout, 1);
  EXPECT_EQ(b.load_dim, 48);
  EXPECT_EQ(b.padded_tiles, 1);
  EXPECT_EQ(cuda::backward_copy_jobs(v.b, s.evo(), address(11 << 24)).count, 6);

  // One misaligned input of an aligned D: only it is staged, in rows of D.
  const Shape s8{1, 2, 64, 2, 8};
  Views v8 = views(s8, DType::kF16);
  v8.f.k = qkv(s8, DType::kF16, (1 << 24) + 2);
  const detail::CudaForwardWorkspace w8 = cuda::forward_workspace(v8.f, s8.evo());
  EXPECT_FALSE(w8.copies.staged[detail::kStagedQ]);
  EXPECT_TRUE(w8.copies.staged[detail::kStagedK]);
  EXPECT_EQ(w8.copies.input_row, 8);
  const cuda::EvoformerDeviceParams f8 = forward(v8, s8);
  EXPECT_EQ(f8.vec_k, 1);
  EXPECT_EQ(f8.load_dim, 8);
  EXPECT_EQ(cuda::forward_copy_jobs(v8.f, s8.evo(), address(12 << 24)).count, 1);
  // Head dims 1..16 (the mma.sync kernels) are staged too; fp32 inputs and aligned rows never.
  const Shape s5{1, 2, 64, 2, 5};
  EXPECT_EQ(forward(views(s5, DType::kBF16), s5).load_dim, 8);
  EXPECT_EQ(forward(views(s5, DType::kBF16), s5).vec_q, 1);
  EXPECT_EQ(cuda::forward_workspace(views(s5, DType::kF32).f, s5.evo()).copies.input_bytes, 0);
  EXPECT_EQ(forward(views(s5, DType::kF32), s5).load_dim, 5);
  const Shape s32{1, 2, 64, 2, 32};
  EXPECT_EQ(cuda::forward_workspace(views(s32, DType::kBF16).f, s32.evo()).layout.total_bytes(),
            0u);
}

// Staged rows: D where it is a multiple of 8, else whole 32-byte sectors of 16-bit elements (D
// rounded up to 16; 8 below 8), never wider than the head dim that reads them.
TEST(EvoformerDeviceParams, StagedRowsAreWholeSectors) {
  for (const auto& [d, row] : std::initializer_list<std::pair<int64_t, int64_t>>{
           {1, 8},   {5, 8},   {8, 8},   {9, 16},   {15, 16},   {16, 16},   {17, 32},
           {23, 32}, {24, 24}, {26, 32}, {33, 48},  {40, 40},   {41, 48},   {49, 64},
           {58, 64}, {63, 64}, {65, 80}, {99, 112}, {116, 128}, {127, 128}, {128, 128}}) {
    EXPECT_EQ(detail::cuda_staged_row(d), row) << d;
    EXPECT_LE(detail::cuda_staged_row(d), detail::cuda_evoformer_head_dim(d)) << d;
  }
  // A backward at D 58 reads the staged rows of 64 columns (the kernels' load_dim).
  const Shape s{1, 2, 100, 2, 58};
  EXPECT_EQ(backward(views(s, DType::kBF16), s).load_dim, 64);
}

// The warpgroup dQ kernel (or the fused backward) sums delta from O's rows copied as tiles beside
// dO's (delta_from_out_tiles) only where O's rows are whole aligned 16-byte chunks of D columns
// and the staged inputs are no wider; every other call runs the delta kernel first. A wrong 1 would
// copy O's rows as chunks they are not (past the row, or off 16-byte boundaries).
TEST(EvoformerDeviceParams, DeltaFromOutTilesOnlyWhereORowsAreChunks) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t d : {8, 16, 24, 32, 40, 48, 64, 96, 120, 128}) {
      const Shape s{1, 2, 300, 2, d};
      const cuda::EvoformerDeviceParams b = backward(views(s, dtype), s);
      // Head dim 16 and below run the mma.sync kernels (delta kernel); 24 and up the warpgroup's.
      EXPECT_EQ(b.delta_from_out_tiles, d > 16 ? 1 : 0) << d;
      EXPECT_EQ(b.delta_from_out_tiles, b.wgmma_tiles) << d;
    }
    // D not a multiple of 8: Q, K, V and dO staged in rows of 48, O read at 33.
    const Shape s33{1, 2, 300, 2, 33};
    EXPECT_EQ(backward(views(s33, dtype), s33).delta_from_out_tiles, 0);
    // O one element past a 16-byte boundary (padded tiles, its rows not whole chunks).
    const Shape s32{1, 2, 300, 2, 32};
    Views v = views(s32, dtype);
    v.b.out = qkv(s32, dtype, (3 << 24) + 2);
    const cuda::EvoformerDeviceParams misaligned = backward(v, s32);
    EXPECT_EQ(misaligned.padded_tiles, 1);
    EXPECT_EQ(misaligned.delta_from_out_tiles, 0);
    // O aligned, dO off its boundary (staged in rows of D): O still read as tiles.
    v = views(s32, dtype);
    v.b.dout = qkv(s32, dtype, (7 << 24) + 2);
    EXPECT_EQ(backward(v, s32).delta_from_out_tiles, 1);
    // The mma.sync kernels never read it.
    cuda::EvoformerDeviceParams portable = backward(views(s32, dtype), s32);
    cuda::evoformer_params::use_mma_sync_kernels(portable);
    EXPECT_EQ(portable.delta_from_out_tiles, 0);
  }
  const Shape s{1, 2, 300, 2, 32};
  EXPECT_EQ(backward(views(s, DType::kF32), s).delta_from_out_tiles,
            0);  // fp32: no warpgroup kernels
}

// The forwards' probability shift (cuda/common/probability_shift.h): with bf16 inputs 2^k is the
// smallest power of two at least L, so a row's sum of P |v| stays below max |v|; f16 (and fp32)
// keep k = 0. The kernels add k ln 2 back to lse, so the field must equal what they assume.
TEST(EvoformerDeviceParams, Bf16ProbabilitiesAreShiftedByTheKeysLog2) {
  for (const auto& [L, k] : std::initializer_list<std::pair<int64_t, float>>{
           {1, 0.0f}, {2, 1.0f}, {3, 2.0f}, {64, 6.0f}, {65, 7.0f}, {300, 9.0f}, {2048, 11.0f}}) {
    const Shape s{1, 1, L, 2, 32};
    EXPECT_EQ(forward(views(s, DType::kBF16), s).prob_shift_log2, k) << L;
    EXPECT_EQ(forward(views(s, DType::kF16), s).prob_shift_log2, 0.0f) << L;
  }
  EXPECT_EQ(cuda::probability_shift_log2(DType::kBF16, int64_t{1} << 40), 40.0f);
  EXPECT_EQ(cuda::probability_shift_log2(DType::kBF16, (int64_t{1} << 40) + 1), 41.0f);
  EXPECT_EQ(cuda::probability_shift_log2(DType::kF32, 1000), 0.0f);
}

// Without the warpgroup kernels (a device or build without sm_90a code, or
// SCIATTN_CUDA_KERNELS=portable) a call keeps to the mma.sync kernels, whatever the host chose:
// lean and unaligned rows alike.
TEST(EvoformerDeviceParams, PortableCallsKeepToTheMmaSyncKernels) {
  for (const int64_t d : {32, 33, 64, 128}) {
    const Shape s{1, 2, 256, 2, d};
    const Views v = views(s, DType::kBF16);
    cuda::EvoformerDeviceParams f = forward(v, s);
    cuda::EvoformerDeviceParams b = backward(v, s);
    EXPECT_EQ(f.wgmma_tiles, 1) << d;  // the host's choice for a Hopper GPU
    EXPECT_EQ(b.wgmma_tiles, 1) << d;
    cuda::evoformer_params::use_mma_sync_kernels(f);
    cuda::evoformer_params::use_mma_sync_kernels(b);
    EXPECT_EQ(f.wgmma_tiles, 0) << d;
    EXPECT_EQ(b.wgmma_tiles, 0) << d;
  }
}

}  // namespace
