// GPU-machine checks of the CUDA build (label gpu): the device is found, the public
// device-memory helpers work and report runtime failures as statuses, and the dispatch knows which
// kernels the device runs (cuda/common/device_arch.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/common/build_archs.h"
#include "cuda/common/device_arch.h"
#include "cuda/common/kernel_path.h"
#include "sciattn/device.h"
#include "sciattn/evoformer.h"

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

// Sets SCIATTN_CUDA_KERNELS for one scope and restores what was there.
class KernelPathVariable {
 public:
  explicit KernelPathVariable(const char* value) {
    const char* old = std::getenv(cuda::kKernelPathVariable);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(cuda::kKernelPathVariable, value, 1);
  }
  ~KernelPathVariable() {
    if (had_) {
      setenv(cuda::kKernelPathVariable, old_.c_str(), 1);
    } else {
      unsetenv(cuda::kKernelPathVariable);
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

// The warpgroup kernels run exactly where the build has sm_90a code and the device is a 9.0 one,
// unless SCIATTN_CUDA_KERNELS asks for the portable ones; the code the runtime picked is at least
// sm_80.
TEST(CudaDevice, KernelsForThisDevice) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const KernelPathVariable automatic("auto");
  cuda::DeviceKernels k;
  const Status s = cuda::current_device_kernels(&k);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_GE(k.major, 8) << k.name;
  EXPECT_GE(k.binary_arch, 80) << k.name;
  EXPECT_GE(k.ptx_arch, 80) << k.name;
  EXPECT_EQ(k.warpgroup_mma, cuda::kBuildHasWarpgroupMma && k.major == 9 && k.minor == 0)
      << k.name << " with the build's " << cuda::kBuildCudaArchs;
  EXPECT_GE(k.smem_limit, 99 * 1024) << k.name;
  {
    const KernelPathVariable portable("portable");
    cuda::DeviceKernels p;
    ASSERT_TRUE(cuda::current_device_kernels(&p).ok());
    EXPECT_FALSE(p.warpgroup_mma);
    EXPECT_EQ(p.major, k.major);
    EXPECT_EQ(p.smem_limit, k.smem_limit);
  }
  std::string kernels;
  ASSERT_TRUE(cuda_check_kernels(&kernels).ok());
  EXPECT_EQ(kernels, k.warpgroup_mma ? "warpgroup" : "portable");
  const KernelPathVariable small("portable-99k");
  cuda::DeviceKernels q;
  ASSERT_TRUE(cuda::current_device_kernels(&q).ok());
  EXPECT_FALSE(q.warpgroup_mma);
  EXPECT_EQ(q.smem_limit, cuda::kSmem99k);
}

// A bad value is an error naming the variable and the value, from the query and from an op.
TEST(CudaDevice, BadKernelPathVariableIsNamed) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const KernelPathVariable bad("wgmma");
  cuda::DeviceKernels k;
  const Status s = cuda::current_device_kernels(&k);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("SCIATTN_CUDA_KERNELS is 'wgmma'"), std::string::npos) << s.message();
  EXPECT_EQ(cuda_check_kernels().code(), StatusCode::kInvalidArgument);
  // An Evoformer forward on device tensors reports the same.
  const int64_t n = 1 * 1 * 8 * 1 * 8;
  void* buffers[4] = {};
  for (void*& b : buffers) ASSERT_TRUE(cuda_allocate(n * 2, &b).ok());
  void* lse = nullptr;
  ASSERT_TRUE(cuda_allocate(8 * sizeof(float), &lse).ok());
  EvoformerForwardParams f;
  f.q = TensorView::contiguous(buffers[0], DType::kBF16, {1, 1, 8, 1, 8}, Device::kCuda);
  f.k = TensorView::contiguous(buffers[1], DType::kBF16, {1, 1, 8, 1, 8}, Device::kCuda);
  f.v = TensorView::contiguous(buffers[2], DType::kBF16, {1, 1, 8, 1, 8}, Device::kCuda);
  f.out = TensorView::contiguous(buffers[3], DType::kBF16, {1, 1, 8, 1, 8}, Device::kCuda);
  f.lse = TensorView::contiguous(lse, DType::kF32, {1, 1, 8}, Device::kCuda);
  const Status op = run(f, nullptr, 0);
  EXPECT_EQ(op.code(), StatusCode::kInvalidArgument) << op.to_string();
  EXPECT_NE(op.message().find("SCIATTN_CUDA_KERNELS"), std::string::npos) << op.message();
  for (void* b : buffers) EXPECT_TRUE(cuda_free(b).ok());
  EXPECT_TRUE(cuda_free(lse).ok());
}

}  // namespace
