// Runs one Evoformer attention configuration on random inputs (see evoformer_runner.h).
// Tools layer: builds TensorViews over host buffers and calls the public API only.
#include "evoformer_runner.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "device_mirror.h"

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

ByteCount reference_bytes(const EvoformerRunConfig& c) {
  return ByteCount::of_tensor({c.batch, c.n, c.heads, c.len, c.len}, sizeof(float))
      .times(c.backward ? 2 : 1);
}

bool reference_too_large(const EvoformerRunConfig& c) {
  return reference_bytes(c) > (uint64_t{2} << 30);
}

Status estimate_evoformer_memory(const EvoformerRunConfig& c, EvoformerRunMemory* m) {
  const bool on_gpu = c.device == Device::kCuda;
  const std::vector<int64_t> qkv = {c.batch, c.n, c.len, c.heads, c.dim};
  const std::vector<int64_t> bias1 = {c.batch, c.n, 1, 1, c.len};
  const std::vector<int64_t> bias2 = {c.batch, 1, c.heads, c.len, c.len};
  // A B*N past int64 saturates; q's byte count then says that the run cannot fit.
  int64_t bn = 0;
  if (__builtin_mul_overflow(c.batch, c.n, &bn)) bn = INT64_MAX;
  const std::vector<int64_t> lse = {bn, c.heads, c.len};
  const DType bias1_dtype = c.bool_mask ? DType::kBool : c.dtype;
  const bool want_dbias1 = c.bias1 && !c.bool_mask;

  // The run's tensors as run_evoformer_config makes them: every one on the host, and on the GPU a
  // device copy of each as well. The library's Params are built on the copies it runs on.
  ViewPlanner host(Device::kCpu), device(Device::kCuda);
  auto params = [&](ViewPlanner& at, EvoformerForwardParams* f, EvoformerBackwardParams* b) {
    f->q = at.view(c.dtype, qkv);
    f->k = at.view(c.dtype, qkv);
    f->v = at.view(c.dtype, qkv);
    f->bias1 = at.view(bias1_dtype, bias1, c.bias1);
    f->bias2 = at.view(c.dtype, bias2, c.bias2);
    f->out = at.view(c.dtype, qkv);
    f->lse = at.view(DType::kF32, lse);
    f->options.scale = c.scale;
    f->options.num_threads = c.threads;
    if (!c.backward) return;
    b->q = f->q;
    b->k = f->k;
    b->v = f->v;
    b->bias1 = f->bias1;
    b->bias2 = f->bias2;
    b->out = f->out;
    b->lse = f->lse;
    b->dout = at.view(c.dtype, qkv);
    b->dq = at.view(c.dtype, qkv);
    b->dk = at.view(c.dtype, qkv);
    b->dv = at.view(c.dtype, qkv);
    b->dbias1 = at.view(c.dtype, bias1, want_dbias1);
    b->dbias2 = at.view(c.dtype, bias2, c.bias2);
    b->options = f->options;
  };
  EvoformerForwardParams fwd, host_fwd;
  EvoformerBackwardParams bwd, host_bwd;
  params(host, &host_fwd, &host_bwd);
  if (on_gpu) {
    params(device, &fwd, &bwd);
  } else {
    fwd = host_fwd;
    bwd = host_bwd;
  }
  // The reference reads the host inputs and writes outputs of its own, compared with the run's.
  EvoformerForwardParams ref_fwd = host_fwd;
  EvoformerBackwardParams ref_bwd = host_bwd;
  if (c.check) {
    ref_fwd.out = host.view(c.dtype, qkv);
    ref_fwd.lse = host.view(DType::kF32, lse);
    ref_fwd.options.cpu_algorithm = EvoformerCpuAlgorithm::kReference;
    if (c.backward) {
      ref_bwd.dq = host.view(c.dtype, qkv);
      ref_bwd.dk = host.view(c.dtype, qkv);
      ref_bwd.dv = host.view(c.dtype, qkv);
      ref_bwd.dbias1 = host.view(c.dtype, bias1, want_dbias1);
      ref_bwd.dbias2 = host.view(c.dtype, bias2, c.bias2);
      ref_bwd.options.cpu_algorithm = EvoformerCpuAlgorithm::kReference;
    }
  }
  m->host = host.bytes();
  m->device = device.bytes();
  // Past the planner's range the views' addresses could wrap: the tensors alone already say that
  // the run cannot fit, and the library is not asked about them.
  if (!host.fits_in_address_space() || !device.fits_in_address_space()) return Status::ok_status();

  // The library's workspaces: the run's (host bytes on the CPU, device bytes on the GPU) and the
  // reference's (host bytes), each the larger of forward and backward since one buffer is reused.
  // A reference whose score matrices are out of all proportion is counted by them, not asked.
  const bool ask_reference = c.check && !(reference_bytes(c) > (uint64_t{1} << 50));
  RunWorkspaces w;
  const Status status = run_workspaces(fwd, bwd, ref_fwd, ref_bwd, c.backward, ask_reference, &w);
  if (!status.ok()) return status;
  if (c.check && !ask_reference) w.reference = reference_bytes(c);
  (on_gpu ? m->device : m->host) += w.run;
  m->host += w.reference;
  return Status::ok_status();
}

Status check_evoformer_memory(const EvoformerRunConfig& c) {
  EvoformerRunMemory m;
  Status status = estimate_evoformer_memory(c, &m);
  const char* advice = c.check
                           ? "use a smaller shape, or --no-check to leave out the naive reference"
                           : "use a smaller shape";
  if (status.ok()) {
    status = check_fits("this run (shape " + shape_of(c) + ")", m.host, host_memory_available(),
                        "host", advice);
  }
  if (status.ok() && c.device == Device::kCuda) {
    status = check_fits("this run (shape " + shape_of(c) + ")", m.device, gpu_memory_available(),
                        "GPU", "use a smaller shape");
  }
  return status;
}

std::string shape_of(const EvoformerRunConfig& c) {
  return "[" + std::to_string(c.batch) + ", " + std::to_string(c.n) + ", " + std::to_string(c.len) +
         ", " + std::to_string(c.heads) + ", " + std::to_string(c.dim) + "]";
}

Status run_evoformer_config(const EvoformerRunConfig& c, EvoformerRunResult* result) {
  const bool on_gpu = c.device == Device::kCuda;
  Status status = check_device_usable(c.device);
  if (status.ok()) status = check_evoformer_memory(c);
  if (!status.ok()) return status;
  // On the GPU every tensor gets a device copy; the library runs on those and the results come
  // back into the host buffers, which the reference (always on the CPU) is compared with.
  auto place = [&c](const HostBuffer& host, DeviceMirror& mirror, TensorView* view) {
    return place_tensor(c.device, host, mirror, view);
  };
  // A timed call on the GPU includes waiting for its kernels.
  auto finish = [on_gpu](Status s) { return s.ok() && on_gpu ? cuda_synchronize() : s; };
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

  EvoformerForwardParams host_fwd;
  host_fwd.q = q.view;
  host_fwd.k = k.view;
  host_fwd.v = v.view;
  host_fwd.bias1 = bias1.view;
  host_fwd.bias2 = bias2.view;
  host_fwd.out = out.view;
  host_fwd.lse = lse.view;
  host_fwd.options.scale = c.scale;
  host_fwd.options.num_threads = c.threads;

  EvoformerForwardParams fwd = host_fwd;
  DeviceMirror d_q, d_k, d_v, d_bias1, d_bias2, d_out, d_lse;
  status = place(q, d_q, &fwd.q);
  if (status.ok()) status = place(k, d_k, &fwd.k);
  if (status.ok()) status = place(v, d_v, &fwd.v);
  if (status.ok()) status = place(bias1, d_bias1, &fwd.bias1);
  if (status.ok()) status = place(bias2, d_bias2, &fwd.bias2);
  if (status.ok()) status = place(out, d_out, &fwd.out);
  if (status.ok()) status = place(lse, d_lse, &fwd.lse);
  if (!status.ok()) return status;
  std::string why;
  status = can_implement(fwd, &why);
  if (!status.ok()) return status;

  std::vector<std::byte> ws;  // the reference's, on the CPU
  RunWorkspace run_ws(c.device);
  auto workspace = [&](size_t bytes, void** ptr) { return run_ws.get(bytes, ptr); };
  void* ws_ptr = nullptr;
  result->forward_flops = evoformer_forward_flops(fwd);
  result->forward_bytes = workspace_size(fwd);
  status = workspace(result->forward_bytes, &ws_ptr);
  if (!status.ok()) return status;
  status = time_calls(
      c.repeat, [&] { return finish(run(fwd, ws_ptr, result->forward_bytes)); },
      &result->forward_ms);
  if (status.ok()) status = d_out.download(out);
  if (status.ok()) status = d_lse.download(lse);
  if (!status.ok()) return status;

  EvoformerForwardParams ref_fwd = host_fwd;
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
    EvoformerBackwardParams host_bwd;
    host_bwd.q = q.view;
    host_bwd.k = k.view;
    host_bwd.v = v.view;
    host_bwd.bias1 = bias1.view;
    host_bwd.bias2 = bias2.view;
    host_bwd.out = out.view;
    host_bwd.lse = lse.view;
    host_bwd.dout = dout.view;
    host_bwd.dq = dq.view;
    host_bwd.dk = dk.view;
    host_bwd.dv = dv.view;
    host_bwd.dbias1 = dbias1.view;
    host_bwd.dbias2 = dbias2.view;
    host_bwd.options = fwd.options;

    EvoformerBackwardParams bwd = host_bwd;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.bias1 = fwd.bias1;
    bwd.bias2 = fwd.bias2;
    bwd.out = fwd.out;
    bwd.lse = fwd.lse;
    DeviceMirror d_dout, d_dq, d_dk, d_dv, d_dbias1, d_dbias2;
    status = place(dout, d_dout, &bwd.dout);
    if (status.ok()) status = place(dq, d_dq, &bwd.dq);
    if (status.ok()) status = place(dk, d_dk, &bwd.dk);
    if (status.ok()) status = place(dv, d_dv, &bwd.dv);
    if (status.ok()) status = place(dbias1, d_dbias1, &bwd.dbias1);
    if (status.ok()) status = place(dbias2, d_dbias2, &bwd.dbias2);
    if (!status.ok()) return status;
    result->backward_flops = evoformer_backward_flops(bwd);
    result->backward_bytes = workspace_size(bwd);
    status = workspace(result->backward_bytes, &ws_ptr);
    if (!status.ok()) return status;
    status = time_calls(
        c.repeat, [&] { return finish(run(bwd, ws_ptr, result->backward_bytes)); },
        &result->backward_ms);
    if (status.ok()) status = d_dq.download(dq);
    if (status.ok()) status = d_dk.download(dk);
    if (status.ok()) status = d_dv.download(dv);
    if (status.ok()) status = d_dbias1.download(dbias1);
    if (status.ok()) status = d_dbias2.download(dbias2);
    if (!status.ok()) return status;
    if (c.check) {
      EvoformerBackwardParams ref_bwd = host_bwd;
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
