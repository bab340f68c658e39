// The CUDA back end's and GPU optimizer's entry points in every build (label cpu): without CUDA,
// or without a device, they fail with kNotSupported and say why; they never crash. Test layer
// (cpu).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "sciattn/device.h"
#include "sciattn/train/cuda_backend.h"
#include "sciattn/train/cuda_optimizer.h"

namespace sciattn::train {
namespace {

TEST(TrainCudaEntry, MakeCudaBackendSaysWhyWhenItCannot) {
  std::unique_ptr<Backend> be;
  const Status s = make_cuda_backend(CudaBackendOptions{}, &be);
  if (cuda_device_count() > 0) {
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(be->device(), Device::kCuda);
    EXPECT_EQ(be->compute_dtype(), DType::kBF16);
    return;
  }
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.to_string();
  EXPECT_EQ(be, nullptr);
  const std::string want = built_with_cuda() ? "no CUDA device" : "no CUDA";
  EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
}

TEST(TrainCudaEntry, OptimizerKernelsWithoutCuda) {
  if (built_with_cuda()) GTEST_SKIP() << "a CUDA build: test_train_cuda covers these";
  AdamWHyperparams h;
  EXPECT_EQ(cuda_adamw_step(h, 1, 1.0f, nullptr, nullptr, nullptr, nullptr, 0, nullptr,
                            DType::kBF16, Stream{})
                .code(),
            StatusCode::kNotSupported);
  SumSquares out;
  EXPECT_EQ(cuda_sum_squares(nullptr, 0, nullptr, 0, Stream{}, &out).code(),
            StatusCode::kNotSupported);
  bool overflow = true;
  EXPECT_EQ(cuda_unscale_and_check(nullptr, 0, 1.0f, nullptr, 0, Stream{}, &overflow).code(),
            StatusCode::kNotSupported);
  EXPECT_FALSE(overflow);
  EXPECT_EQ(cuda_cast(nullptr, DType::kF32, nullptr, DType::kBF16, 0, Stream{}).code(),
            StatusCode::kNotSupported);
  EXPECT_EQ(cuda_scale_in_place(nullptr, 0, 1.0f, Stream{}).code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace sciattn::train
