// The gradient path between the backward and the optimizer: reduction across ranks, overflow
// check, unscaling and the global norm. Trainer layer (host code).
#include "sciattn/train/gradients.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sciattn/train/backend.h"

namespace sciattn::train {

SumSquares sum_squares(const float* data, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  std::vector<char> finite(static_cast<size_t>(chunks), 1);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t begin = k * kNormChunk, end = std::min(n, begin + kNormChunk);
    double sum = 0.0;
    bool ok = true;
    for (int64_t i = begin; i < end; ++i) {
      const double x = data[i];
      ok = ok && std::isfinite(x);
      sum += x * x;
    }
    partial[static_cast<size_t>(k)] = sum;
    finite[static_cast<size_t>(k)] = ok ? 1 : 0;
  }
  SumSquares out;
  for (int64_t k = 0; k < chunks; ++k) {
    out.sum += partial[static_cast<size_t>(k)];
    out.finite = out.finite && finite[static_cast<size_t>(k)] != 0;
  }
  return out;
}

void scale_in_place(float* data, int64_t n, float factor) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) data[i] *= factor;
}

namespace {

// The gradient path over two elementwise operations on wherever the gradients live:
// sum_sq(data, n, SumSquares*) and scale(data, n, factor).
template <class SumSq, class Scale>
Status reduce_with(Communicator& comm, Fp16Scaling scaling, double loss_scale, float* grads,
                   int64_t n, SumSq sum_sq, Scale scale, ReducedGradients* out) {
  if (!(loss_scale > 0.0) || !std::isfinite(loss_scale)) {
    return Status::invalid_argument("reduce_gradients: loss_scale must be a finite number > 0");
  }
  *out = ReducedGradients{};
  const float inv_scale = static_cast<float>(1.0 / loss_scale);
  SumSquares total;
  if (scaling == Fp16Scaling::kDsEnhanced) {
    // Per rank, before any reduction: detect overflow on this rank's own scaled gradients, then
    // unscale them in place.
    SumSquares local;
    Status s = sum_sq(grads, n, &local);
    if (!s.ok()) return s;
    double overflow = local.finite ? 0.0 : 1.0;
    s = comm.all_reduce_max(&overflow);
    if (!s.ok()) return s;
    out->overflow = overflow != 0.0;
    if (out->overflow) return Status::ok_status();
    if (loss_scale != 1.0) {
      s = scale(grads, n, inv_scale);
      if (!s.ok()) return s;
    }
    s = comm.all_reduce_mean(grads, n);
    if (!s.ok()) return s;
    s = sum_sq(grads, n, &total);
    if (!s.ok()) return s;
    out->norm = std::sqrt(total.sum);
    out->pending_scale = 1.0f;
    return Status::ok_status();
  }
  // Standard: reduce the scaled gradients, then look at the result.
  Status s = comm.all_reduce_mean(grads, n);
  if (!s.ok()) return s;
  s = sum_sq(grads, n, &total);
  if (!s.ok()) return s;
  out->overflow = !total.finite;
  if (out->overflow) return Status::ok_status();
  out->norm = std::sqrt(total.sum) / loss_scale;
  out->pending_scale = inv_scale;
  return Status::ok_status();
}

}  // namespace

Status reduce_gradients(Communicator& comm, Fp16Scaling scaling, double loss_scale, float* grads,
                        int64_t n, ReducedGradients* out) {
  return reduce_with(
      comm, scaling, loss_scale, grads, n,
      [](const float* d, int64_t k, SumSquares* r) {
        *r = sum_squares(d, k);
        return Status::ok_status();
      },
      [](float* d, int64_t k, float f) {
        scale_in_place(d, k, f);
        return Status::ok_status();
      },
      out);
}

Status reduce_gradients(Communicator& comm, Backend& backend, Fp16Scaling scaling,
                        double loss_scale, float* grads, int64_t n, ReducedGradients* out) {
  return reduce_with(
      comm, scaling, loss_scale, grads, n,
      [&](const float* d, int64_t k, SumSquares* r) { return backend.sum_squares(d, k, r); },
      [&](float* d, int64_t k, float f) { return backend.scale_in_place(d, k, f); }, out);
}

}  // namespace sciattn::train
