// What the commands that run an op share: host buffers with packed views, timing, error against a
// reference and the measurement fields of their reports. Tools layer (public API only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn::tools {

// A host buffer and a packed row-major view of it.
// A host tensor: its storage and a view into it. A copy gets its own storage and a view into
// that storage (the default copy would keep pointing at the original's bytes, and a device upload,
// which places the view by its offset into `bytes`, would then read outside the copy).
struct HostBuffer {
  std::vector<std::byte> bytes;
  TensorView view;

  HostBuffer() = default;
  HostBuffer(const HostBuffer& other) : bytes(other.bytes), view(other.view) { rebase(other); }
  HostBuffer& operator=(const HostBuffer& other) {
    if (this != &other) {
      bytes = other.bytes;
      view = other.view;
      rebase(other);
    }
    return *this;
  }
  // A moved vector keeps its storage, so the view stays valid.
  HostBuffer(HostBuffer&&) noexcept = default;
  HostBuffer& operator=(HostBuffer&&) noexcept = default;
  ~HostBuffer() = default;

 private:
  void rebase(const HostBuffer& other) {
    if (other.view.data == nullptr) return;
    view.data =
        bytes.data() + (static_cast<const std::byte*>(other.view.data) - other.bytes.data());
  }
};

HostBuffer make_host_buffer(DType dtype, const std::vector<int64_t>& sizes);
int64_t element_count(const HostBuffer& b);

// Calls `call` once (a warm-up that also checks it runs), then `repeat` times; stores the median
// wall time in milliseconds. Returns the first failing Status.
Status time_calls(int repeat, const std::function<Status()>& call, double* ms);

// max |a - b| / max |b| over two buffers of one dtype and size; a NaN counts as infinite.
double relative_error(const HostBuffer& a, const HostBuffer& b);

// How far two correct implementations may differ, relative to an output's largest value: a few
// units in the last place of the storage dtype (fp32 sums in another order differ by far less
// than 1e-4 at the sizes the commands run).
double tolerance_for(DType dtype);

// The measurements every run reports.
struct RunMeasurements {
  double forward_ms = 0, backward_ms = 0;  // median of `repeat` calls
  double reference_forward_ms = 0, reference_backward_ms = 0;
  size_t forward_bytes = 0, backward_bytes = 0;  // extra memory (workspace) of each call
  size_t reference_forward_bytes = 0, reference_backward_bytes = 0;
  double forward_flops = 0, backward_flops = 0;
  // Largest relative error over every output (and gradient) against the reference.
  double max_error = 0;
  double tolerance = 0;
  std::string worst_output;  // the output with the largest error
  bool checked = false;
  bool passed = true;
};

// Adds the measurement fields (times, extra bytes, GFLOP/s, errors) to a JSON report.
void add_measurements(const RunMeasurements& m, bool backward, nlohmann::json* j);

}  // namespace sciattn::tools
