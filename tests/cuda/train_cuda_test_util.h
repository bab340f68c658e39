// Helpers of the CUDA back end's tests (label gpu): device tensors allocated through a Backend
// (uploaded from and downloaded to float vectors, in any dtype), rounding to a dtype, and the
// tolerance rule of CONVENTIONS.md. Test layer (tests/cuda).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "sciattn/device.h"
#include "sciattn/dtype.h"
#include "sciattn/tensor_view.h"
#include "sciattn/train/backend.h"

namespace sciattn::train::testing {

#define SKIP_WITHOUT_GPU() \
  if (sciattn::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine"

inline std::vector<float> rounded(std::vector<float> v, DType t) {
  for (float& x : v) x = round_to(t, x);
  return v;
}

// A packed row-major view of `data` with runtime sizes.
inline TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& sizes,
                            Device device) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(sizes.size());
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.sizes[d] = sizes[static_cast<size_t>(d)];
    t.strides[d] = stride;
    stride *= sizes[static_cast<size_t>(d)];
  }
  return t;
}

// Memory of a back end holding a tensor of `dtype`, moved to and from float vectors.
class DeviceTensor {
 public:
  DeviceTensor(Backend& backend, DType dtype, std::vector<int64_t> sizes)
      : backend_(&backend), dtype_(dtype), sizes_(std::move(sizes)) {
    for (int64_t s : sizes_) numel_ *= s;
    const Status s = backend_->allocate(bytes(), &data_);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { backend_->release(data_); }

  size_t bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  void* data() const { return data_; }
  TensorView view() const { return make_view(data_, dtype_, sizes_, backend_->device()); }
  // The same memory seen with other sizes (the bad-shape tests), or from element `offset` on.
  TensorView view(const std::vector<int64_t>& sizes, int64_t offset = 0) const {
    return make_view(
        static_cast<std::byte*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_)), dtype_,
        sizes, backend_->device());
  }

  void upload(const std::vector<float>& values) {
    ASSERT_EQ(static_cast<int64_t>(values.size()), numel_);
    std::vector<std::byte> host(bytes());
    for (int64_t i = 0; i < numel_; ++i) {
      store_from_float(host.data(), dtype_, i, values[static_cast<size_t>(i)]);
    }
    const Status s = backend_->copy_to_device(data_, host.data(), bytes());
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  // NaN everywhere, so that elements a kernel should write but does not show.
  void poison() { upload(std::vector<float>(static_cast<size_t>(numel_), NAN)); }

  std::vector<std::byte> raw() const {
    std::vector<std::byte> host(bytes());
    const Status s = backend_->copy_to_host(host.data(), data_, bytes());
    EXPECT_TRUE(s.ok()) << s.to_string();
    return host;
  }
  std::vector<float> download() const {
    const std::vector<std::byte> host = raw();
    std::vector<float> v(static_cast<size_t>(numel_));
    for (int64_t i = 0; i < numel_; ++i)
      v[static_cast<size_t>(i)] = load_as_float(host.data(), dtype_, i);
    return v;
  }

 private:
  Backend* backend_;
  DType dtype_;
  std::vector<int64_t> sizes_;
  int64_t numel_ = 1;
  void* data_ = nullptr;
};

// int32 token ids in a back end's memory.
class DeviceTokens {
 public:
  DeviceTokens(Backend& backend, const std::vector<int32_t>& ids) : backend_(&backend) {
    const size_t bytes = std::max<size_t>(ids.size(), 1) * sizeof(int32_t);
    Status s = backend_->allocate(bytes, &data_);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!ids.empty()) {
      s = backend_->copy_to_device(data_, ids.data(), ids.size() * sizeof(int32_t));
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
  }
  DeviceTokens(const DeviceTokens&) = delete;
  DeviceTokens& operator=(const DeviceTokens&) = delete;
  ~DeviceTokens() { backend_->release(data_); }
  const int32_t* data() const { return static_cast<const int32_t*>(data_); }

 private:
  Backend* backend_;
  void* data_ = nullptr;
};

// atol of the tolerance rule, relative to max(1, max|ref64|) (the tested values are about 1):
// f32 2e-5 (fp32 summation noise over a few hundred terms in another order, far below a real
// bug); f16 1e-3 and bf16 8e-3, about one ulp at 1, because the GPU and the reference may round a
// value near a rounding boundary to opposite neighbours (the 2 * lowp term covers the rest).
inline double atol_of(DType kernel_dtype, double max_ref) {
  double rel = 2e-5;
  if (kernel_dtype == DType::kF16) rel = 1e-3;
  if (kernel_dtype == DType::kBF16) rel = 8e-3;
  return rel * std::max(1.0, max_ref);
}

// The tolerance rule of CONVENTIONS.md: max|out - ref64| <= 2 max|lowp_ref - ref64| + atol, with
// atol that of `kernel_dtype` (the dtype the result went through); non-finite values fail.
inline ::testing::AssertionResult within_tolerance(const std::string& what,
                                                   const std::vector<float>& out,
                                                   const std::vector<float>& lowp_ref,
                                                   const std::vector<float>& ref64,
                                                   DType kernel_dtype) {
  if (out.size() != ref64.size() || lowp_ref.size() != ref64.size()) {
    return ::testing::AssertionFailure() << what << ": sizes differ (" << out.size() << ", "
                                         << lowp_ref.size() << ", " << ref64.size() << ")";
  }
  double max_ref = 0, err = 0, sum_err = 0, lowp_err = 0;
  size_t worst = 0, nonfinite = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double r = ref64[i];
    if (!std::isfinite(out[i])) {
      ++nonfinite;
      continue;
    }
    const double e = std::fabs(static_cast<double>(out[i]) - r);
    if (e > err) {
      err = e;
      worst = i;
    }
    sum_err += e;
    max_ref = std::max(max_ref, std::fabs(r));
    lowp_err = std::max(lowp_err, std::fabs(static_cast<double>(lowp_ref[i]) - r));
  }
  const double atol = atol_of(kernel_dtype, max_ref);
  const double bound = 2.0 * lowp_err + atol;
  if (nonfinite == 0 && err <= bound) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << what << " (" << dtype_name(kernel_dtype) << "): " << nonfinite
     << " non-finite elements; max error " << err << " at " << worst << " (got " << out[worst]
     << ", ref64 " << ref64[worst] << "), mean error "
     << sum_err / static_cast<double>(std::max<size_t>(1, out.size())) << ", bound 2 * " << lowp_err
     << " + " << atol << " = " << bound << " (max |ref64| " << max_ref << ")";
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace sciattn::train::testing
