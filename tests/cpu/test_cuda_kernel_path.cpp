// SCIATTN_CUDA_KERNELS, the switch between the fastest kernels and the portable (mma.sync) ones
// (src/cuda/common/kernel_path.h), read without a GPU: the accepted values and the error for the
// others, which must name the variable, the value and what is accepted.
#include <gtest/gtest.h>

#include <string>

#include "cuda/common/kernel_path.h"

namespace {

using sciattn::Status;
using sciattn::StatusCode;
using sciattn::cuda::kernel_path_of;
using sciattn::cuda::KernelPath;

TEST(CudaKernelPath, UnsetEmptyAndAutoTakeTheFastestKernels) {
  for (const char* value : {static_cast<const char*>(nullptr), "", "auto"}) {
    KernelPath path = KernelPath::kPortable;
    ASSERT_TRUE(kernel_path_of(value, &path).ok()) << (value ? value : "(unset)");
    EXPECT_EQ(path, KernelPath::kAuto);
  }
}

TEST(CudaKernelPath, PortableKeepsToTheMmaSyncKernels) {
  KernelPath path = KernelPath::kAuto;
  ASSERT_TRUE(kernel_path_of("portable", &path).ok());
  EXPECT_EQ(path, KernelPath::kPortable);
}

TEST(CudaKernelPath, Portable99kAlsoKeepsTo99KiBOfSharedMemory) {
  KernelPath path = KernelPath::kAuto;
  ASSERT_TRUE(kernel_path_of("portable-99k", &path).ok());
  EXPECT_EQ(path, KernelPath::kPortable99k);
  EXPECT_EQ(sciattn::cuda::kSmem99k, 99 * 1024);
}

TEST(CudaKernelPath, OtherValuesAreNamed) {
  for (const char* value : {"Portable", "wgmma", " auto", "sm80", "portable-96k"}) {
    KernelPath path = KernelPath::kAuto;
    const Status s = kernel_path_of(value, &path);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << value;
    EXPECT_NE(s.message().find(std::string("SCIATTN_CUDA_KERNELS is '") + value + "'"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("auto"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("portable"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("portable-99k"), std::string::npos) << s.message();
  }
}

}  // namespace
