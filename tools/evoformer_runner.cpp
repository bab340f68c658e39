// Runs one Evoformer attention configuration on random inputs (see evoformer_runner.h).
// Tools layer: builds TensorViews over host buffers and calls the public API only.
#include "evoformer_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <vector>

namespace sciattn::tools {
namespace {

// A host buffer and a view of it.
struct HostTensor {
  std::vector<std::byte> bytes;
  TensorView view;
};

HostTensor make_tensor(DType dtype, std::vector<int64_t> sizes) {
  HostTensor t;
  int64_t count = 1;
  for (int64_t s : sizes) count *= s;
  t.bytes.resize(static_cast<size_t>(count) * dtype_size(dtype));
  t.view.data = t.bytes.data();
  t.view.dtype = dtype;
  t.view.rank = static_cast<int>(sizes.size());
  int64_t stride = 1;
  for (int d = t.view.rank - 1; d >= 0; --d) {
    t.view.sizes[d] = sizes[static_cast<size_t>(d)];
    t.view.strides[d] = stride;
    stride *= sizes[static_cast<size_t>(d)];
  }
  return t;
}

void fill(HostTensor& t, const std::function<float()>& draw) {
  const int64_t count = static_cast<int64_t>(t.bytes.size() / dtype_size(t.view.dtype));
  for (int64_t i = 0; i < count; ++i) store_from_float(t.bytes.data(), t.view.dtype, i, draw());
}

// Q, K or V: [B, N, L, H, D], or for the triangle ending node a [B, N, L, H, D] view of a
// [B, L, N, H, D] tensor (N and L strides swapped), which is how that attention reads the
// transposed pair representation without a copy.
HostTensor make_qkv(const EvoformerRunConfig& c) {
  if (!c.transposed) return make_tensor(c.dtype, {c.batch, c.n, c.len, c.heads, c.dim});
  HostTensor t = make_tensor(c.dtype, {c.batch, c.len, c.n, c.heads, c.dim});
  std::swap(t.view.sizes[1], t.view.sizes[2]);
  std::swap(t.view.strides[1], t.view.strides[2]);
  return t;
}

double median_ms(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Times `repeat` calls of `call` (after one warm-up) and returns the median in milliseconds.
Status time_calls(int repeat, const std::function<Status()>& call, double* ms) {
  Status status = call();  // warm-up, and the check that it runs at all
  if (!status.ok()) return status;
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    status = call();
    const auto stop = std::chrono::steady_clock::now();
    if (!status.ok()) return status;
    times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  *ms = median_ms(times);
  return Status::ok_status();
}

float to_float(const HostTensor& t, int64_t i) {
  return load_as_float(t.bytes.data(), t.view.dtype, i);
}

// max |a - b| / max(max |b|, tiny) over two buffers of the same layout.
double relative_error(const HostTensor& a, const HostTensor& b) {
  const int64_t count = static_cast<int64_t>(a.bytes.size() / dtype_size(a.view.dtype));
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = to_float(a, i), y = to_float(b, i);
    diff = std::max(diff, std::isnan(x - y) ? INFINITY : std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return diff / std::max(scale, 1e-30);
}

// How far two correct implementations may differ, relative to the output's largest value:
// a few units in the last place of the storage dtype (fp32 sums in another order differ by far
// less than 1e-4 at these lengths).
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

Status workspace_for(size_t bytes, std::vector<std::byte>* ws) {
  ws->assign(bytes, std::byte{0});
  return Status::ok_status();
}

}  // namespace

std::string shape_of(const EvoformerRunConfig& c) {
  return "[" + std::to_string(c.batch) + ", " + std::to_string(c.n) + ", " + std::to_string(c.len) +
         ", " + std::to_string(c.heads) + ", " + std::to_string(c.dim) + "]";
}

Status run_evoformer_config(const EvoformerRunConfig& c, EvoformerRunResult* result) {
  if (c.device != Device::kCpu) {
    return Status::not_supported(
        "Evoformer attention has no CUDA kernels in this version yet (they are planned); run with "
        "--device cpu");
  }
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  auto gauss = [&] { return normal(rng); };

  HostTensor q = make_qkv(c), k = make_qkv(c), v = make_qkv(c);
  fill(q, gauss);
  fill(k, gauss);
  fill(v, gauss);
  HostTensor bias1, bias2;
  if (c.bias1) {
    // About one key in ten is masked, as padding in an MSA would be.
    if (c.bool_mask) {
      bias1 = make_tensor(DType::kBool, {c.batch, c.n, 1, 1, c.len});
      fill(bias1, [&] { return uniform(rng) < 0.1f ? 0.0f : 1.0f; });
    } else {
      bias1 = make_tensor(c.dtype, {c.batch, c.n, 1, 1, c.len});
      fill(bias1, [&] { return uniform(rng) < 0.1f ? -1e9f : 0.0f; });  // OpenFold's 1e9*(mask-1)
    }
  }
  if (c.bias2) {
    bias2 = make_tensor(c.dtype, {c.batch, 1, c.heads, c.len, c.len});
    fill(bias2, gauss);
  }
  const std::vector<int64_t> qkv = {c.batch, c.n, c.len, c.heads, c.dim};
  HostTensor out = make_tensor(c.dtype, qkv),
             lse = make_tensor(DType::kF32, {c.batch * c.n, c.heads, c.len});
  HostTensor ref_out = make_tensor(c.dtype, qkv),
             ref_lse = make_tensor(DType::kF32, {c.batch * c.n, c.heads, c.len});

  EvoformerForwardParams fwd;
  fwd.q = q.view;
  fwd.k = k.view;
  fwd.v = v.view;
  fwd.bias1 = bias1.view;
  fwd.bias2 = bias2.view;
  fwd.out = out.view;
  fwd.lse = lse.view;
  fwd.options.scale = c.scale;
  fwd.options.num_threads = c.threads;
  std::string why;
  Status status = can_implement(fwd, &why);
  if (!status.ok()) return status;

  std::vector<std::byte> ws;
  result->forward_flops = evoformer_forward_flops(fwd);
  result->forward_bytes = workspace_size(fwd);
  workspace_for(result->forward_bytes, &ws);
  status = time_calls(
      c.repeat, [&] { return run(fwd, ws.data(), ws.size()); }, &result->forward_ms);
  if (!status.ok()) return status;

  EvoformerForwardParams ref_fwd = fwd;
  ref_fwd.out = ref_out.view;
  ref_fwd.lse = ref_lse.view;
  ref_fwd.options.cpu_algorithm = EvoformerCpuAlgorithm::kReference;
  if (c.check) {
    result->reference_forward_bytes = workspace_size(ref_fwd);
    workspace_for(result->reference_forward_bytes, &ws);
    status = time_calls(
        std::min(c.repeat, 1), [&] { return run(ref_fwd, ws.data(), ws.size()); },
        &result->reference_forward_ms);
    if (!status.ok()) return status;
  }

  struct Compared {
    const char* name;
    const HostTensor* ours;
    const HostTensor* reference;
  };
  std::vector<Compared> compared = {{"out", &out, &ref_out}};

  HostTensor dout, dq, dk, dv, dbias1, dbias2, rdq, rdk, rdv, rdbias1, rdbias2;
  if (c.backward) {
    dout = make_tensor(c.dtype, qkv);
    fill(dout, gauss);
    dq = make_tensor(c.dtype, qkv), dk = make_tensor(c.dtype, qkv), dv = make_tensor(c.dtype, qkv);
    rdq = make_tensor(c.dtype, qkv), rdk = make_tensor(c.dtype, qkv),
    rdv = make_tensor(c.dtype, qkv);
    const bool want_dbias1 = c.bias1 && !c.bool_mask;
    if (want_dbias1) {
      dbias1 = make_tensor(c.dtype, {c.batch, c.n, 1, 1, c.len});
      rdbias1 = make_tensor(c.dtype, {c.batch, c.n, 1, 1, c.len});
    }
    if (c.bias2) {
      dbias2 = make_tensor(c.dtype, {c.batch, 1, c.heads, c.len, c.len});
      rdbias2 = make_tensor(c.dtype, {c.batch, 1, c.heads, c.len, c.len});
    }
    EvoformerBackwardParams bwd;
    bwd.q = q.view;
    bwd.k = k.view;
    bwd.v = v.view;
    bwd.bias1 = bias1.view;
    bwd.bias2 = bias2.view;
    bwd.out = out.view;
    bwd.lse = lse.view;
    bwd.dout = dout.view;
    bwd.dq = dq.view;
    bwd.dk = dk.view;
    bwd.dv = dv.view;
    bwd.dbias1 = dbias1.view;
    bwd.dbias2 = dbias2.view;
    bwd.options = fwd.options;
    result->backward_flops = evoformer_backward_flops(bwd);
    result->backward_bytes = workspace_size(bwd);
    workspace_for(result->backward_bytes, &ws);
    status = time_calls(
        c.repeat, [&] { return run(bwd, ws.data(), ws.size()); }, &result->backward_ms);
    if (!status.ok()) return status;
    if (c.check) {
      EvoformerBackwardParams ref_bwd = bwd;
      ref_bwd.dq = rdq.view;
      ref_bwd.dk = rdk.view;
      ref_bwd.dv = rdv.view;
      ref_bwd.dbias1 = rdbias1.view;
      ref_bwd.dbias2 = rdbias2.view;
      ref_bwd.options.cpu_algorithm = EvoformerCpuAlgorithm::kReference;
      result->reference_backward_bytes = workspace_size(ref_bwd);
      workspace_for(result->reference_backward_bytes, &ws);
      status = time_calls(
          std::min(c.repeat, 1), [&] { return run(ref_bwd, ws.data(), ws.size()); },
          &result->reference_backward_ms);
      if (!status.ok()) return status;
      compared.push_back({"dq", &dq, &rdq});
      compared.push_back({"dk", &dk, &rdk});
      compared.push_back({"dv", &dv, &rdv});
      if (want_dbias1) compared.push_back({"dbias1", &dbias1, &rdbias1});
      if (c.bias2) compared.push_back({"dbias2", &dbias2, &rdbias2});
    }
  }

  if (c.check) {
    result->checked = true;
    result->tolerance = tolerance_for(c.dtype);
    for (const Compared& cmp : compared) {
      const double err = relative_error(*cmp.ours, *cmp.reference);
      if (err >= result->max_error) {
        result->max_error = err;
        result->worst_output = cmp.name;
      }
    }
    result->passed = result->max_error <= result->tolerance;
  }
  return Status::ok_status();
}

nlohmann::json to_json(const EvoformerRunConfig& c, const EvoformerRunResult& r) {
  nlohmann::json j;
  j["name"] = c.name;
  j["shape"] = {c.batch, c.n, c.len, c.heads, c.dim};
  j["dtype"] = dtype_name(c.dtype);
  j["bias1"] = c.bias1 ? (c.bool_mask ? "bool" : "float") : "none";
  j["bias2"] = c.bias2;
  j["transposed"] = c.transposed;
  j["device"] = device_name(c.device);
  j["threads"] = c.threads;
  j["forward_ms"] = r.forward_ms;
  j["forward_extra_bytes"] = r.forward_bytes;
  j["forward_gflops"] = r.forward_ms > 0 ? r.forward_flops / (r.forward_ms * 1e6) : 0.0;
  if (c.backward) {
    j["backward_ms"] = r.backward_ms;
    j["backward_extra_bytes"] = r.backward_bytes;
    j["backward_gflops"] = r.backward_ms > 0 ? r.backward_flops / (r.backward_ms * 1e6) : 0.0;
  }
  if (r.checked) {
    j["reference_forward_ms"] = r.reference_forward_ms;
    j["reference_forward_extra_bytes"] = r.reference_forward_bytes;
    if (c.backward) {
      j["reference_backward_ms"] = r.reference_backward_ms;
      j["reference_backward_extra_bytes"] = r.reference_backward_bytes;
    }
    j["max_relative_error"] = r.max_error;
    j["worst_output"] = r.worst_output;
    j["tolerance"] = r.tolerance;
    j["passed"] = r.passed;
  }
  return j;
}

}  // namespace sciattn::tools
