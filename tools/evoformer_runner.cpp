// Runs one Evoformer attention configuration on random inputs (see evoformer_runner.h).
// Tools layer: builds TensorViews over host buffers and calls the public API only.
#include "evoformer_runner.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <random>
#include <vector>

namespace sciattn::tools {
namespace {

// Q, K or V: [B, N, L, H, D], or for the triangle ending node a [B, N, L, H, D] view of a
// [B, L, N, H, D] tensor (N and L strides swapped), which is how that attention reads the
// transposed pair representation without a copy.
HostBuffer make_qkv(const EvoformerRunConfig& c) {
  if (!c.transposed) return make_host_buffer(c.dtype, {c.batch, c.n, c.len, c.heads, c.dim});
  HostBuffer t = make_host_buffer(c.dtype, {c.batch, c.len, c.n, c.heads, c.dim});
  std::swap(t.view.sizes[1], t.view.sizes[2]);
  std::swap(t.view.strides[1], t.view.strides[2]);
  return t;
}

void fill(HostBuffer& t, const std::function<float()>& draw) {
  for (int64_t i = 0; i < element_count(t); ++i) {
    store_from_float(t.bytes.data(), t.view.dtype, i, draw());
  }
}

}  // namespace

std::string shape_of(const EvoformerRunConfig& c) {
  return "[" + std::to_string(c.batch) + ", " + std::to_string(c.n) + ", " + std::to_string(c.len) +
         ", " + std::to_string(c.heads) + ", " + std::to_string(c.dim) + "]";
}

Status run_evoformer_config(const EvoformerRunConfig& c, EvoformerRunResult* result) {
  if (c.device != Device::kCpu) {
    return Status::not_supported(
        "the command-line program does not drive the Evoformer CUDA kernels yet (it has no device "
        "memory handling); run with --device cpu, or call the C++ API with device tensors");
  }
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  auto gauss = [&] { return normal(rng); };

  HostBuffer q = make_qkv(c), k = make_qkv(c), v = make_qkv(c);
  fill(q, gauss);
  fill(k, gauss);
  fill(v, gauss);
  HostBuffer bias1, bias2;
  if (c.bias1) {
    // About one key in ten is masked, as padding in an MSA would be.
    if (c.bool_mask) {
      bias1 = make_host_buffer(DType::kBool, {c.batch, c.n, 1, 1, c.len});
      fill(bias1, [&] { return uniform(rng) < 0.1f ? 0.0f : 1.0f; });
    } else {
      bias1 = make_host_buffer(c.dtype, {c.batch, c.n, 1, 1, c.len});
      fill(bias1, [&] { return uniform(rng) < 0.1f ? -1e9f : 0.0f; });  // OpenFold's 1e9*(mask-1)
    }
  }
  if (c.bias2) {
    bias2 = make_host_buffer(c.dtype, {c.batch, 1, c.heads, c.len, c.len});
    fill(bias2, gauss);
  }
  const std::vector<int64_t> qkv = {c.batch, c.n, c.len, c.heads, c.dim};
  HostBuffer out = make_host_buffer(c.dtype, qkv),
             lse = make_host_buffer(DType::kF32, {c.batch * c.n, c.heads, c.len});
  HostBuffer ref_out = make_host_buffer(c.dtype, qkv),
             ref_lse = make_host_buffer(DType::kF32, {c.batch * c.n, c.heads, c.len});

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
  ws.assign(result->forward_bytes, std::byte{0});
  status = time_calls(
      c.repeat, [&] { return run(fwd, ws.data(), ws.size()); }, &result->forward_ms);
  if (!status.ok()) return status;

  EvoformerForwardParams ref_fwd = fwd;
  ref_fwd.out = ref_out.view;
  ref_fwd.lse = ref_lse.view;
  ref_fwd.options.cpu_algorithm = EvoformerCpuAlgorithm::kReference;
  if (c.check) {
    result->reference_forward_bytes = workspace_size(ref_fwd);
    ws.assign(result->reference_forward_bytes, std::byte{0});
    status = time_calls(
        std::min(c.repeat, 1), [&] { return run(ref_fwd, ws.data(), ws.size()); },
        &result->reference_forward_ms);
    if (!status.ok()) return status;
  }

  struct Compared {
    const char* name;
    const HostBuffer* ours;
    const HostBuffer* reference;
  };
  std::vector<Compared> compared = {{"out", &out, &ref_out}};

  HostBuffer dout, dq, dk, dv, dbias1, dbias2, rdq, rdk, rdv, rdbias1, rdbias2;
  if (c.backward) {
    dout = make_host_buffer(c.dtype, qkv);
    fill(dout, gauss);
    dq = make_host_buffer(c.dtype, qkv), dk = make_host_buffer(c.dtype, qkv),
    dv = make_host_buffer(c.dtype, qkv);
    rdq = make_host_buffer(c.dtype, qkv), rdk = make_host_buffer(c.dtype, qkv),
    rdv = make_host_buffer(c.dtype, qkv);
    const bool want_dbias1 = c.bias1 && !c.bool_mask;
    if (want_dbias1) {
      dbias1 = make_host_buffer(c.dtype, {c.batch, c.n, 1, 1, c.len});
      rdbias1 = make_host_buffer(c.dtype, {c.batch, c.n, 1, 1, c.len});
    }
    if (c.bias2) {
      dbias2 = make_host_buffer(c.dtype, {c.batch, 1, c.heads, c.len, c.len});
      rdbias2 = make_host_buffer(c.dtype, {c.batch, 1, c.heads, c.len, c.len});
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
    ws.assign(result->backward_bytes, std::byte{0});
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
      ws.assign(result->reference_backward_bytes, std::byte{0});
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
  add_measurements(r, c.backward, &j);
  return j;
}

}  // namespace sciattn::tools
