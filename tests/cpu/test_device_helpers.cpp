// The device-memory helpers of sciattn/device.h in a build without CUDA (label cpu): every call
// answers kNotSupported with a message that says how to get CUDA support, and nothing crashes.
// (The CUDA build's own behaviour is tested in tests/cuda/test_device.cpp.)
#include <gtest/gtest.h>

#include "sciattn/device.h"

namespace {

using namespace sciattn;

TEST(DeviceHelpers, WithoutCudaEveryCallSaysSo) {
  if (built_with_cuda()) GTEST_SKIP() << "a CUDA build; see tests/cuda/test_device.cpp";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_EQ(cuda_device_description(), "");
  void* ptr = &ptr;
  const Status alloc = cuda_allocate(64, &ptr);
  EXPECT_EQ(alloc.code(), StatusCode::kNotSupported);
  EXPECT_NE(alloc.message().find("SCIATTN_WITH_CUDA"), std::string::npos) << alloc.message();
  EXPECT_EQ(ptr, nullptr);
  float host[4] = {1, 2, 3, 4};
  EXPECT_EQ(cuda_copy_to_device(host, host, sizeof(host)).code(), StatusCode::kNotSupported);
  EXPECT_EQ(cuda_copy_to_host(host, host, sizeof(host)).code(), StatusCode::kNotSupported);
  EXPECT_EQ(cuda_synchronize().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(cuda_free(nullptr).ok());
  EXPECT_EQ(cuda_free(host).code(), StatusCode::kNotSupported);
  std::string kernels = "stale";
  const Status check = cuda_check_kernels(&kernels);
  EXPECT_EQ(check.code(), StatusCode::kNotSupported);
  EXPECT_NE(check.message().find("SCIATTN_WITH_CUDA"), std::string::npos) << check.message();
  EXPECT_EQ(kernels, "");
}

}  // namespace
