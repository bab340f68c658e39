// What the commands that run an op share (see run_support.h). Tools layer.
#include "run_support.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "sciattn/dtype.h"

namespace sciattn::tools {

HostBuffer make_host_buffer(DType dtype, const std::vector<int64_t>& sizes) {
  HostBuffer b;
  int64_t count = 1;
  for (int64_t s : sizes) count *= s;
  b.bytes.resize(static_cast<size_t>(count) * dtype_size(dtype));
  b.view.data = b.bytes.data();
  b.view.dtype = dtype;
  b.view.rank = static_cast<int>(sizes.size());
  int64_t stride = 1;
  for (int d = b.view.rank - 1; d >= 0; --d) {
    b.view.sizes[d] = sizes[static_cast<size_t>(d)];
    b.view.strides[d] = stride;
    stride *= sizes[static_cast<size_t>(d)];
  }
  return b;
}

int64_t element_count(const HostBuffer& b) {
  return static_cast<int64_t>(b.bytes.size() / dtype_size(b.view.dtype));
}

Status time_calls(int repeat, const std::function<Status()>& call, double* ms) {
  Status status = call();
  if (!status.ok()) return status;
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    status = call();
    const auto stop = std::chrono::steady_clock::now();
    if (!status.ok()) return status;
    times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(times.begin(), times.end());
  *ms = times[times.size() / 2];
  return Status::ok_status();
}

double relative_error(const HostBuffer& a, const HostBuffer& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < element_count(a); ++i) {
    const double x = load_as_float(a.bytes.data(), a.view.dtype, i);
    const double y = load_as_float(b.bytes.data(), b.view.dtype, i);
    diff = std::max(diff, std::isnan(x - y) ? INFINITY : std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return diff / std::max(scale, 1e-30);
}

double tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 4e-3;
    case DType::kBF16:
      return 3e-2;
    default:
      return 1e-4;
  }
}

void add_measurements(const RunMeasurements& m, bool backward, nlohmann::json* j) {
  nlohmann::json& o = *j;
  o["forward_ms"] = m.forward_ms;
  o["forward_extra_bytes"] = m.forward_bytes;
  o["forward_gflops"] = m.forward_ms > 0 ? m.forward_flops / (m.forward_ms * 1e6) : 0.0;
  if (backward) {
    o["backward_ms"] = m.backward_ms;
    o["backward_extra_bytes"] = m.backward_bytes;
    o["backward_gflops"] = m.backward_ms > 0 ? m.backward_flops / (m.backward_ms * 1e6) : 0.0;
  }
  if (m.checked) {
    o["reference_forward_ms"] = m.reference_forward_ms;
    o["reference_forward_extra_bytes"] = m.reference_forward_bytes;
    if (backward) {
      o["reference_backward_ms"] = m.reference_backward_ms;
      o["reference_backward_extra_bytes"] = m.reference_backward_bytes;
    }
    o["max_relative_error"] = m.max_error;
    o["worst_output"] = m.worst_output;
    o["tolerance"] = m.tolerance;
    o["passed"] = m.passed;
  }
}

}  // namespace sciattn::tools
