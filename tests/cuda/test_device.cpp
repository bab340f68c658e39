// GPU-machine checks of the CUDA build (label gpu): the device is found, and the public
// device-memory helpers work and report runtime failures as statuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sciattn/device.h"

namespace {

using namespace sciattn;

TEST(CudaDevice, BuildAndDeviceAreVisible) {
  EXPECT_TRUE(built_with_cuda());
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  EXPECT_GE(cuda_device_count(), 1);
}

TEST(CudaDevice, MemoryHelpersRoundTrip) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  EXPECT_NE(cuda_device_description().find("sm_"), std::string::npos) << cuda_device_description();
  std::vector<float> host(1000), back(1000, -1.0f);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  void* device = nullptr;
  ASSERT_TRUE(cuda_allocate(host.size() * sizeof(float), &device).ok());
  ASSERT_NE(device, nullptr);
  EXPECT_TRUE(cuda_copy_to_device(device, host.data(), host.size() * sizeof(float)).ok());
  EXPECT_TRUE(cuda_synchronize().ok());
  EXPECT_TRUE(cuda_copy_to_host(back.data(), device, back.size() * sizeof(float)).ok());
  EXPECT_EQ(host, back);
  EXPECT_TRUE(cuda_free(device).ok());
  // Zero bytes allocate nothing; freeing nullptr is fine.
  void* none = &device;
  EXPECT_TRUE(cuda_allocate(0, &none).ok());
  EXPECT_EQ(none, nullptr);
  EXPECT_TRUE(cuda_free(nullptr).ok());
}

TEST(CudaDevice, RuntimeErrorsComeBackAsDeviceError) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  void* huge = nullptr;
  const Status s = cuda_allocate(size_t{1} << 62, &huge);  // no GPU has 4 EiB
  EXPECT_EQ(s.code(), StatusCode::kDeviceError);
  EXPECT_NE(s.message().find("cudaMalloc"), std::string::npos) << s.message();
  EXPECT_EQ(huge, nullptr);
}

}  // namespace
