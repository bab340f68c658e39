// GPU-machine checks of the CUDA build (label gpu): the device is found, and Evoformer attention on
// CUDA tensors answers with a clear status until its kernels land.
#include <gtest/gtest.h>

#include "sciattn/device.h"
#include "sciattn/evoformer.h"

namespace {

using namespace sciattn;

TEST(CudaDevice, BuildAndDeviceAreVisible) {
  EXPECT_TRUE(built_with_cuda());
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  EXPECT_GE(cuda_device_count(), 1);
}

TEST(CudaDevice, EvoformerOnCudaTensorsSaysItIsNotSupportedYet) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  // Only the pointers' device tag matters to validation; nothing is dereferenced on rejection.
  alignas(16) static float dummy[64];
  EvoformerForwardParams p;
  p.q = TensorView::contiguous(dummy, DType::kF32, {1, 1, 2, 1, 4}, Device::kCuda);
  p.k = TensorView::contiguous(dummy + 8, DType::kF32, {1, 1, 2, 1, 4}, Device::kCuda);
  p.v = TensorView::contiguous(dummy + 16, DType::kF32, {1, 1, 2, 1, 4}, Device::kCuda);
  p.out = TensorView::contiguous(dummy + 24, DType::kF32, {1, 1, 2, 1, 4}, Device::kCuda);
  std::string why;
  const Status s = can_implement(p, &why);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
}

}  // namespace
