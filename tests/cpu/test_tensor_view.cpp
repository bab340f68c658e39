// Tests of TensorView, the public non-owning strided tensor type: construction, element counts,
// contiguity and printing. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sciattn/tensor_view.h"

namespace sciattn {
namespace {

TEST(TensorView, DefaultIsAbsent) {
  TensorView v;
  EXPECT_FALSE(v.present());
  EXPECT_EQ(v.data, nullptr);
  EXPECT_EQ(v.rank, 0);
  EXPECT_EQ(v.device, Device::kCpu);
}

TEST(TensorView, ContiguousHasRowMajorStrides) {
  std::vector<float> buf(2 * 4 * 64 * 8 * 32);
  const TensorView v = TensorView::contiguous(buf.data(), DType::kBF16, {2, 4, 64, 8, 32});
  EXPECT_TRUE(v.present());
  EXPECT_EQ(v.data, buf.data());
  EXPECT_EQ(v.dtype, DType::kBF16);
  EXPECT_EQ(v.device, Device::kCpu);
  ASSERT_EQ(v.rank, 5);
  const int64_t sizes[] = {2, 4, 64, 8, 32};
  const int64_t strides[] = {4 * 64 * 8 * 32, 64 * 8 * 32, 8 * 32, 32, 1};
  for (int d = 0; d < 5; ++d) {
    EXPECT_EQ(v.sizes[d], sizes[d]) << "dim " << d;
    EXPECT_EQ(v.strides[d], strides[d]) << "dim " << d;
  }
  EXPECT_EQ(v.numel(), 2 * 4 * 64 * 8 * 32);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.shape_string(), "[2, 4, 64, 8, 32]");
}

TEST(TensorView, ContiguousKeepsDevice) {
  int dummy = 0;
  const TensorView v = TensorView::contiguous(&dummy, DType::kF32, {3}, Device::kCuda);
  EXPECT_EQ(v.device, Device::kCuda);
  EXPECT_EQ(v.numel(), 3);
  EXPECT_EQ(v.shape_string(), "[3]");
}

TEST(TensorView, NumelCountsZeroSizesAndScalars) {
  int dummy = 0;
  EXPECT_EQ(TensorView::contiguous(&dummy, DType::kF32, {4, 0, 3}).numel(), 0);
  // Rank 0 is a scalar: one element, printed as [].
  const TensorView scalar = TensorView::contiguous(&dummy, DType::kF32, {});
  EXPECT_EQ(scalar.rank, 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.shape_string(), "[]");
}

TEST(TensorView, StridedViewsAreNotContiguous) {
  std::vector<float> buf(1024);
  // The triangle-attention ending-node view: [B, N, L, H, D] over a packed [B, L, N, H, D]
  // buffer, that is, the N and L strides swapped.
  const int64_t B = 2, N = 3, L = 5, H = 2, D = 4;
  const TensorView t = TensorView::strided(buf.data(), DType::kF32, {B, N, L, H, D},
                                           {L * N * H * D, H * D, N * H * D, D, 1});
  ASSERT_EQ(t.rank, 5);
  EXPECT_EQ(t.strides[1], H * D);
  EXPECT_EQ(t.strides[2], N * H * D);
  EXPECT_EQ(t.numel(), B * N * L * H * D);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.shape_string(), "[2, 3, 5, 2, 4]");
  // Padding on the last dim (a row stride larger than the row) is not contiguous either.
  EXPECT_FALSE(TensorView::strided(buf.data(), DType::kF32, {4, 6}, {8, 1}).is_contiguous());
  // Nor is a non-unit innermost stride.
  EXPECT_FALSE(TensorView::strided(buf.data(), DType::kF32, {4, 6}, {12, 2}).is_contiguous());
  // Explicit packed strides are contiguous.
  EXPECT_TRUE(TensorView::strided(buf.data(), DType::kF32, {4, 6}, {6, 1}).is_contiguous());
}

TEST(TensorView, SizeOneDimsIgnoreTheirStride) {
  // A dimension of size 1 is never stepped over, so its stride does not affect the layout; a
  // [B, N, 1, 1, L] mask built by unsqueezing keeps arbitrary strides there.
  std::vector<float> buf(64);
  const TensorView v =
      TensorView::strided(buf.data(), DType::kF32, {2, 3, 1, 1, 5}, {15, 5, 999, 0, 1});
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.numel(), 30);
}

TEST(TensorView, MismatchedStrideListGivesRankMinusOne) {
  std::vector<float> buf(64);
  // More strides than sizes, and fewer: both are recorded as rank -1, which validation rejects.
  const TensorView more = TensorView::strided(buf.data(), DType::kF32, {4, 4}, {4, 1, 1});
  EXPECT_EQ(more.rank, -1);
  const TensorView fewer = TensorView::strided(buf.data(), DType::kF32, {2, 4, 4}, {4, 1});
  EXPECT_EQ(fewer.rank, -1);
  // The pointer, dtype and device are still recorded.
  EXPECT_EQ(fewer.data, buf.data());
  EXPECT_EQ(fewer.dtype, DType::kF32);
}

TEST(TensorView, RankAboveMaximumIsRecorded) {
  // A rank above kMaxRank cannot be stored, but the view remembers the rank so that validation
  // can reject it with a message instead of silently dropping dimensions.
  std::vector<float> buf(64);
  const TensorView v = TensorView::contiguous(buf.data(), DType::kF32, {1, 2, 1, 2, 1, 2, 1});
  EXPECT_EQ(v.rank, TensorView::kMaxRank + 1);
  EXPECT_EQ(v.shape_string().rfind("[1, 2, 1, 2, 1, 2", 0), 0u) << v.shape_string();
}

}  // namespace
}  // namespace sciattn
