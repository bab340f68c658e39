// `sciattn sparse` (one sparse self-attention run: time, memory, error against the dense masked
// reference) and the block-sparse section of `sciattn demo`. Tools layer: public API only.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "device_mirror.h"
#include "layout_flags.h"
#include "run_memory.h"
#include "run_support.h"
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#include "table.h"

namespace sciattn::tools {
namespace {

// The dense reference is plain single-threaded loops over every (query, key) pair; past this many
// pairs times D it takes minutes, so the check is skipped with a note.
constexpr double kMaxReferenceWork = 1e10;

// ---- one run ------------------------------------------------------------------------------------

struct SparseRunConfig {
  std::string name = "sparse";
  SparsityConfig sparsity = FixedSparsityConfig{};
  int64_t max_seq_length = 0;  // SparseSelfAttention's; 0 = the (padded) length itself
  int64_t batch = 1, len = 512, dim = 64;
  DType dtype = DType::kF32;
  bool backward = false;
  bool causal = false;
  std::optional<float> scale;
  int64_t masked_keys = 0;  // the last keys of every sequence removed by a key padding mask
  SparseAttentionAlgorithm path = SparseAttentionAlgorithm::kFused;
  Device device = Device::kCpu;  // where the library runs; the reference always runs on the CPU
  int repeat = 3;
  int threads = 0;
  uint64_t seed = 0;
  bool check = true;
};

struct SparseRunResult : RunMeasurements {
  int64_t padded_len = 0, nnz = 0;
  double density = 0;
};

double reference_work(const SparseRunConfig& c, int64_t padded_len) {
  return static_cast<double>(c.batch) * static_cast<double>(sparsity_common(c.sparsity).num_heads) *
         static_cast<double>(padded_len) * static_cast<double>(padded_len) *
         static_cast<double>(c.dim) * (c.backward ? 4.0 : 1.0);
}

// The memory a run takes, added up before it allocates (run_memory.h), as run_sparse_config
// makes its buffers: the random inputs and their padded copies, the outputs, the reference's
// outputs and the copies compared (when it checks), on the GPU the device copies, and with the
// index built, the library's workspaces. Without the index (before it is built) the workspaces
// are left out. Checks the total against the memory available.
Status check_sparse_memory(const SparseRunConfig& c, const BlockSparseIndex* index) {
  const SparsityCommon& common = sparsity_common(c.sparsity);
  const int64_t H = common.num_heads, B = c.batch, D = c.dim;
  const int64_t L = c.len, Lp = L + block_pad_length(L, common.block);
  const bool on_gpu = c.device == Device::kCuda, masked = Lp != L || c.masked_keys > 0;
  const std::vector<int64_t> tokens = {B, H, L, D}, padded = {B, H, Lp, D}, rows = {B, H, Lp};
  ViewPlanner host(Device::kCpu), device(Device::kCuda);
  for (int i = 0; i < 4; ++i) host.view(c.dtype, tokens);  // q, k, v, dout
  auto run_params = [&](ViewPlanner& at, SparseAttentionForwardParams* f,
                        SparseAttentionBackwardParams* b) {
    f->index = index;
    f->q = at.view(c.dtype, padded);
    f->k = at.view(c.dtype, padded);
    f->v = at.view(c.dtype, padded);
    f->key_padding_mask = at.view(DType::kF32, {B, Lp}, masked);
    f->out = at.view(c.dtype, padded);
    f->lse = at.view(DType::kF32, rows);
    f->options.scale = c.scale;
    f->options.causal = c.causal;
    f->options.num_threads = c.threads;
    f->options.algorithm = c.path;
    b->index = index;
    b->q = f->q;
    b->k = f->k;
    b->v = f->v;
    b->key_padding_mask = f->key_padding_mask;
    b->out = f->out;
    b->lse = f->lse;
    b->dout = at.view(c.dtype, padded);
    b->options = f->options;
    if (!c.backward) return;
    b->dq = at.view(c.dtype, padded);
    b->dk = at.view(c.dtype, padded);
    b->dv = at.view(c.dtype, padded);
  };
  SparseAttentionForwardParams fwd, host_fwd;
  SparseAttentionBackwardParams bwd, host_bwd;
  run_params(host, &host_fwd, &host_bwd);
  if (on_gpu) {
    run_params(device, &fwd, &bwd);
  } else {
    fwd = host_fwd;
    bwd = host_bwd;
  }
  const bool check = c.check && reference_work(c, Lp) <= kMaxReferenceWork;
  SparseAttentionForwardParams ref_fwd = host_fwd;
  SparseAttentionBackwardParams ref_bwd = host_bwd;
  if (check) {
    // The reference's outputs, and the unpadded copies of both sides that are compared.
    ref_fwd.out = host.view(c.dtype, padded);
    ref_fwd.lse = TensorView();
    ref_fwd.options.algorithm = SparseAttentionAlgorithm::kReference;
    for (int i = 0; i < 2; ++i) host.view(c.dtype, tokens);
    if (c.backward) {
      ref_bwd.dq = host.view(c.dtype, padded);
      ref_bwd.dk = host.view(c.dtype, padded);
      ref_bwd.dv = host.view(c.dtype, padded);
      ref_bwd.options.algorithm = SparseAttentionAlgorithm::kReference;
      for (int i = 0; i < 6; ++i) host.view(c.dtype, tokens);
    }
  }
  ByteCount host_bytes = host.bytes(), device_bytes = device.bytes();
  if (index != nullptr && host.fits_in_address_space() && device.fits_in_address_space()) {
    RunWorkspaces w;
    const Status status = run_workspaces(fwd, bwd, ref_fwd, ref_bwd, c.backward, check, &w);
    if (!status.ok()) return status;
    (on_gpu ? device_bytes : host_bytes) += w.run;
    host_bytes += w.reference;
  }
  const std::string what = "this run (shape [B, H, L, D] = [" + std::to_string(B) + ", " +
                           std::to_string(H) + ", " + std::to_string(L) + ", " + std::to_string(D) +
                           "])";
  Status status = check_fits(what, host_bytes, host_memory_available(), "host",
                             "use a smaller shape, or --no-check to leave out the reference");
  if (status.ok() && on_gpu) {
    status = check_fits(what, device_bytes, gpu_memory_available(), "GPU", "use a smaller shape");
  }
  return status;
}

Status run_sparse_config(const SparseRunConfig& c, SparseRunResult* r) {
  Status status = check_device_usable(c.device);
  // The tensors first, then (below) with the index built, the workspaces too.
  if (status.ok()) status = check_sparse_memory(c, nullptr);
  if (!status.ok()) return status;
  const bool on_gpu = c.device == Device::kCuda;
  // A timed call on the GPU includes waiting for its kernels.
  auto finish = [on_gpu](Status s) { return s.ok() && on_gpu ? cuda_synchronize() : s; };
  // On the GPU every tensor gets a device copy (DeviceMirror); the library runs on those and the
  // results come back into the host buffers, which the reference (on the CPU) is compared with.
  auto place = [&c](const HostBuffer& host, DeviceMirror& mirror, TensorView* view) {
    return place_tensor(c.device, host, mirror, view);
  };
  const SparsityCommon& common = sparsity_common(c.sparsity);
  const int64_t H = common.num_heads, b = common.block, B = c.batch, D = c.dim;
  // A length that is not a multiple of the block is padded (pad_to_block_size) and the padded
  // keys are removed with a key padding mask, as SparseAttentionUtils does.
  const int64_t L = c.len, Lp = L + block_pad_length(L, b);
  r->padded_len = Lp;
  BlockSparseIndex index;
  // SparseSelfAttention's crop rule: the layout for Lp is the top-left crop of the one built for
  // max_seq_length, which must therefore be at least Lp.
  status = build_sparse_attention_index(c.sparsity, c.max_seq_length > 0 ? c.max_seq_length : Lp,
                                        Lp, &index);
  if (!status.ok()) return status;
  // The GPU ops read the index's device copy. The command's buffers live on the current device,
  // which is device 0 (the program never selects another).
  if (on_gpu) status = upload_block_sparse_index(&index, 0);
  if (status.ok()) status = check_sparse_memory(c, &index);
  if (!status.ok()) return status;
  r->nnz = index.nnz;
  r->density = static_cast<double>(index.nnz) /
               static_cast<double>(H * index.num_row_blocks * index.num_col_blocks);

  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](std::vector<int64_t> sizes) {
    HostBuffer t = make_host_buffer(c.dtype, std::move(sizes));
    for (int64_t i = 0; i < element_count(t); ++i)
      store_from_float(t.bytes.data(), c.dtype, i, normal(rng));
    return t;
  };
  HostBuffer q = random({B, H, L, D}), k = random({B, H, L, D}), v = random({B, H, L, D});
  HostBuffer dout = random({B, H, L, D});
  auto padded = [&](const HostBuffer& x) {
    if (Lp == L) return x;
    HostBuffer p = make_host_buffer(c.dtype, {B, H, Lp, D});
    pad_to_block_size(x.view, 2, b, 0.0, p.view);
    return p;
  };
  const HostBuffer qp = padded(q), kp = padded(k), vp = padded(v), doutp = padded(dout);
  HostBuffer kpm;
  if (Lp != L || c.masked_keys > 0) {
    kpm = make_host_buffer(DType::kF32, {B, Lp});
    status = padding_key_mask(std::max<int64_t>(0, L - c.masked_keys), MaskMode::kAdd, kpm.view);
    if (!status.ok()) return status;
  }

  // host_fwd: every tensor on the host (the reference's call); fwd: the library's call, on the
  // run's device.
  SparseAttentionForwardParams host_fwd;
  host_fwd.index = &index;
  host_fwd.q = qp.view;
  host_fwd.k = kp.view;
  host_fwd.v = vp.view;
  host_fwd.key_padding_mask = kpm.view;
  host_fwd.options.scale = c.scale;
  host_fwd.options.causal = c.causal;
  host_fwd.options.num_threads = c.threads;
  host_fwd.options.algorithm = c.path;
  HostBuffer out = make_host_buffer(c.dtype, {B, H, Lp, D}),
             lse = make_host_buffer(DType::kF32, {B, H, Lp});
  host_fwd.out = out.view;
  host_fwd.lse = lse.view;
  SparseAttentionForwardParams fwd = host_fwd;
  DeviceMirror d_q, d_k, d_v, d_kpm, d_out, d_lse;
  status = place(qp, d_q, &fwd.q);
  if (status.ok()) status = place(kp, d_k, &fwd.k);
  if (status.ok()) status = place(vp, d_v, &fwd.v);
  if (status.ok()) status = place(kpm, d_kpm, &fwd.key_padding_mask);
  if (status.ok()) status = place(out, d_out, &fwd.out);
  if (status.ok()) status = place(lse, d_lse, &fwd.lse);
  if (!status.ok()) return status;
  status = can_implement(fwd);
  if (!status.ok()) return status;
  RunWorkspace ws(c.device);
  void* ws_ptr = nullptr;
  r->forward_bytes = workspace_size(fwd);
  r->forward_flops = sparse_attention_forward_flops(fwd);
  status = ws.get(r->forward_bytes, &ws_ptr);
  if (status.ok()) {
    status = time_calls(
        c.repeat, [&] { return finish(run(fwd, ws_ptr, r->forward_bytes)); }, &r->forward_ms);
  }
  if (status.ok()) status = d_out.download(out);
  if (status.ok()) status = d_lse.download(lse);
  if (!status.ok()) return status;

  struct Compared {
    const char* name;
    HostBuffer ours, reference;
  };
  std::vector<Compared> compared;
  // The real rows of a [B, H, Lp, D] result (unpad_sequence_output).
  auto unpadded = [&](const HostBuffer& x) {
    if (Lp == L) return x;
    HostBuffer u = make_host_buffer(c.dtype, {B, H, L, D});
    unpad_sequence_output(x.view, 2, u.view);
    return u;
  };
  const bool check = c.check && reference_work(c, Lp) <= kMaxReferenceWork;
  if (check) {
    SparseAttentionForwardParams ref = host_fwd;
    HostBuffer ref_out = make_host_buffer(c.dtype, {B, H, Lp, D});
    ref.out = ref_out.view;
    ref.lse = TensorView();
    ref.options.algorithm = SparseAttentionAlgorithm::kReference;
    std::vector<std::byte> ref_ws(workspace_size(ref));
    r->reference_forward_bytes = ref_ws.size();
    status = time_calls(
        1, [&] { return run(ref, ref_ws.data(), ref_ws.size()); }, &r->reference_forward_ms);
    if (!status.ok()) return status;
    compared.push_back({"out", unpadded(out), unpadded(ref_out)});
  }

  if (c.backward) {
    SparseAttentionBackwardParams host_bwd;
    host_bwd.index = &index;
    host_bwd.q = host_fwd.q;
    host_bwd.k = host_fwd.k;
    host_bwd.v = host_fwd.v;
    host_bwd.key_padding_mask = host_fwd.key_padding_mask;
    host_bwd.out = out.view;
    host_bwd.lse = lse.view;
    host_bwd.dout = doutp.view;
    host_bwd.options = host_fwd.options;
    HostBuffer dq = make_host_buffer(c.dtype, {B, H, Lp, D}),
               dk = make_host_buffer(c.dtype, {B, H, Lp, D}),
               dv = make_host_buffer(c.dtype, {B, H, Lp, D});
    host_bwd.dq = dq.view;
    host_bwd.dk = dk.view;
    host_bwd.dv = dv.view;
    SparseAttentionBackwardParams bwd = host_bwd;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.key_padding_mask = fwd.key_padding_mask;
    bwd.out = fwd.out;
    bwd.lse = fwd.lse;
    DeviceMirror d_dout, d_dq, d_dk, d_dv;
    status = place(doutp, d_dout, &bwd.dout);
    if (status.ok()) status = place(dq, d_dq, &bwd.dq);
    if (status.ok()) status = place(dk, d_dk, &bwd.dk);
    if (status.ok()) status = place(dv, d_dv, &bwd.dv);
    if (!status.ok()) return status;
    r->backward_bytes = workspace_size(bwd);
    r->backward_flops = sparse_attention_backward_flops(bwd);
    status = ws.get(r->backward_bytes, &ws_ptr);
    if (status.ok()) {
      status = time_calls(
          c.repeat, [&] { return finish(run(bwd, ws_ptr, r->backward_bytes)); }, &r->backward_ms);
    }
    if (status.ok()) status = d_dq.download(dq);
    if (status.ok()) status = d_dk.download(dk);
    if (status.ok()) status = d_dv.download(dv);
    if (!status.ok()) return status;
    if (check) {
      // The reference backward reads the library's forward output and lse (downloaded above),
      // as a training step would.
      SparseAttentionBackwardParams ref = host_bwd;
      HostBuffer rdq = make_host_buffer(c.dtype, {B, H, Lp, D}),
                 rdk = make_host_buffer(c.dtype, {B, H, Lp, D}),
                 rdv = make_host_buffer(c.dtype, {B, H, Lp, D});
      ref.dq = rdq.view;
      ref.dk = rdk.view;
      ref.dv = rdv.view;
      ref.options.algorithm = SparseAttentionAlgorithm::kReference;
      std::vector<std::byte> ref_ws(workspace_size(ref));
      r->reference_backward_bytes = ref_ws.size();
      status = time_calls(
          1, [&] { return run(ref, ref_ws.data(), ref_ws.size()); }, &r->reference_backward_ms);
      if (!status.ok()) return status;
      compared.push_back({"dq", unpadded(dq), unpadded(rdq)});
      compared.push_back({"dk", unpadded(dk), unpadded(rdk)});
      compared.push_back({"dv", unpadded(dv), unpadded(rdv)});
    }
  }

  if (check) {
    r->checked = true;
    r->tolerance = tolerance_for(c.dtype);
    for (const Compared& cmp : compared) {
      const double err = relative_error(cmp.ours, cmp.reference);
      if (err >= r->max_error) {
        r->max_error = err;
        r->worst_output = cmp.name;
      }
    }
    r->passed = r->max_error <= r->tolerance;
  }
  return Status::ok_status();
}

// ---- reports ------------------------------------------------------------------------------------

std::string layout_name(const SparseRunConfig& c) {
  return sparsity_mode_name(sparsity_mode(c.sparsity));
}

std::string shape_of(const SparseRunConfig& c) {
  return "[" + std::to_string(c.batch) + ", " +
         std::to_string(sparsity_common(c.sparsity).num_heads) + ", " + std::to_string(c.len) +
         ", " + std::to_string(c.dim) + "]";
}

nlohmann::json to_json(const SparseRunConfig& c, const SparseRunResult& r) {
  nlohmann::json j;
  j["name"] = c.name;
  j["layout"] = to_string(c.sparsity);
  j["mode"] = layout_name(c);
  j["shape"] = {c.batch, sparsity_common(c.sparsity).num_heads, c.len, c.dim};
  j["padded_len"] = r.padded_len;
  j["block"] = sparsity_common(c.sparsity).block;
  j["nnz"] = r.nnz;
  j["density"] = r.density;
  j["dtype"] = dtype_name(c.dtype);
  j["path"] = sparse_attention_algorithm_name(c.path);
  j["device"] = device_name(c.device);
  j["causal"] = c.causal;
  j["threads"] = c.threads;
  add_measurements(r, c.backward, &j);
  return j;
}

// Runs each configuration and prints one table (or a JSON array). Returns 0, or 1 when a run
// failed or an error exceeded its tolerance.
int report_sparse_runs(const std::vector<SparseRunConfig>& configs, bool json, std::ostream& out,
                       std::ostream& err) {
  TextTable table({"layout", "shape [B,H,L,D]", "block", "nnz (density)", "dtype", "path", "device",
                   "fwd ms", "bwd ms", "GFLOP/s", "extra mem", "dense ref fwd ms",
                   "dense ref bwd ms", "max err", "tol", "check"});
  nlohmann::json all = nlohmann::json::array();
  int code = 0;
  size_t rows = 0;
  for (const SparseRunConfig& c : configs) {
    SparseRunResult r;
    const Status status = run_sparse_config(c, &r);
    if (!status.ok()) {
      err << "error: " << c.name << ": " << status.message() << "\n";
      code = 1;
      continue;
    }
    ++rows;
    if (json) {
      all.push_back(to_json(c, r));
    } else {
      const double ms = r.forward_ms + r.backward_ms;
      const double flops = r.forward_flops + r.backward_flops;
      std::string label = c.name + (c.causal ? " causal" : "");
      if (r.padded_len != c.len) label += " (pad " + std::to_string(r.padded_len) + ")";
      table.add_row(
          {label, shape_of(c), std::to_string(sparsity_common(c.sparsity).block),
           std::to_string(r.nnz) + " (" + fixed(100.0 * r.density, 1) + "%)", dtype_name(c.dtype),
           sparse_attention_algorithm_name(c.path), device_name(c.device), fixed(r.forward_ms, 2),
           c.backward ? fixed(r.backward_ms, 2) : "-", ms > 0 ? fixed(flops / (ms * 1e6), 1) : "-",
           human_bytes(std::max(r.forward_bytes, r.backward_bytes)),
           r.checked ? fixed(r.reference_forward_ms, 1) : "-",
           r.checked && c.backward ? fixed(r.reference_backward_ms, 1) : "-",
           r.checked ? scientific(r.max_error) : "-", r.checked ? scientific(r.tolerance) : "-",
           r.checked ? (r.passed ? "ok" : "FAIL (" + r.worst_output + ")") : "skipped"});
    }
    if (r.checked && !r.passed) code = 1;
  }
  if (json) {
    out << all.dump(2) << "\n";
  } else if (rows > 0) {
    table.print(out);
  }
  return code;
}

}  // namespace

void add_sparse_command(CLI::App& app, const CommandOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "sparse",
      "Run block-sparse self-attention (DeepSpeed's SparseSelfAttention semantics) once on random\n"
      "inputs: Q, K, V [B, H, L, D] on a layout from DeepSpeed's sparsity configs, through the\n"
      "fused or the composite (sdd -> softmax -> dsd) path, on the GPU (--device cuda, the\n"
      "default when a GPU and the CUDA build are present) or the CPU, and compare with dense\n"
      "attention on the CPU that applies the layout as a mask. A length that is not a multiple\n"
      "of the block is padded and the padding masked.");
  auto flags = std::make_shared<LayoutFlags>();
  auto config = std::make_shared<SparseRunConfig>();
  auto dtype = std::make_shared<std::string>("auto");
  auto path = std::make_shared<std::string>("fused");
  auto device = std::make_shared<std::string>(default_device_name());
  auto json = std::make_shared<bool>(false);
  auto no_check = std::make_shared<bool>(false);
  add_layout_flags(cmd, flags.get(), /*default_heads=*/4);
  cmd->add_option("--len,--seq-len", config->len, "L: sequence length in tokens (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--max-seq-length", config->max_seq_length,
                  "SparseSelfAttention's max_seq_length: the layout is the crop of the one built "
                  "for it (default: the length itself)");
  cmd->add_option("--batch,-b", config->batch, "B: batch size (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--dim,-d", config->dim, "D: head dim (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--dtype", *dtype,
                  "storage dtype (auto, the default: f32 on the CPU, bf16 on the GPU, whose "
                  "tensor cores take f16 and bf16)")
      ->check(CLI::IsMember({"auto", "f32", "f16", "bf16"}));
  cmd->add_option("--algorithm,--path", *path, "fused (default) or composite")
      ->check(CLI::IsMember({"fused", "composite"}));
  cmd->add_option("--device", *device,
                  "where the library runs (default: cuda when a GPU and the CUDA build are "
                  "present); the dense reference always runs on the CPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--backward", config->backward, "also run and time the backward");
  cmd->add_flag("--causal", config->causal, "token-level causal masking inside diagonal blocks");
  cmd->add_option("--scale", config->scale, "softmax scale (default 1/sqrt(D))");
  cmd->add_option("--masked-keys", config->masked_keys,
                  "remove the last N keys of every sequence with a key padding mask, at most "
                  "--len (default 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--repeat", config->repeat, "timed calls, median reported (default 3)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--threads", config->threads,
                  "most CPU threads (default 0 = all; calls with little work use fewer)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--seed", config->seed, "seed of the inputs and of the random blocks (default 0)")
      ->check(unsigned_integer());
  cmd->add_flag("--no-check", *no_check, "skip the dense reference and the error check");
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->callback([=] {
    flags->read_config_file = options.read_config_files;
    config->sparsity = config_from_flags(*flags, config->seed);
    config->device = *device == "cuda" ? Device::kCuda : Device::kCpu;
    config->dtype = *parse_dtype(*dtype != "auto"                  ? *dtype
                                 : config->device == Device::kCuda ? "bf16"
                                                                   : "f32");
    config->path = *path == "composite" ? SparseAttentionAlgorithm::kComposite
                                        : SparseAttentionAlgorithm::kFused;
    config->check = !*no_check;
    config->name = layout_name(*config);
    if (config->masked_keys > config->len) {
      fail_bad_input("--masked-keys " + std::to_string(config->masked_keys) +
                     " is more than --len " + std::to_string(config->len) + ": a sequence of " +
                     std::to_string(config->len) + " tokens has at most that many keys to mask");
    }
    require_usable_device(config->device);
    const Status fits = check_sparse_memory(*config, nullptr);
    if (!fits.ok()) fail_bad_input(fits.message());
    if (options.check_only) return;
    const int64_t padded =
        config->len + block_pad_length(config->len, sparsity_common(config->sparsity).block);
    if (config->check && reference_work(*config, padded) > kMaxReferenceWork) {
      std::cerr << "note: the dense reference would take minutes at this size; skipping the "
                   "error check (use a smaller shape to compare)\n";
    }
    const int code = report_sparse_runs({*config}, *json, std::cout, std::cerr);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

int run_sparse_demo(bool json, Device device, int threads, std::ostream& out, std::ostream& err) {
  // DeepSpeed's layouts at BERT-like sizes: BigBird and BSLongformer (global rows), Fixed
  // unidirectional with token-level causal masking, and a length that needs padding. L = 512
  // keeps the dense reference, plain single-threaded loops, to a few seconds for the section.
  // On the GPU every run is in f16 or bf16 (what its tensor cores take); on the CPU the BigBird
  // runs stay in f32.
  const bool on_gpu = device == Device::kCuda;
  const DType wide = on_gpu ? DType::kBF16 : DType::kF32;
  auto make = [device, threads](const SparsityConfig& sparsity, int64_t len, DType dtype,
                                SparseAttentionAlgorithm path, bool causal) {
    SparseRunConfig c;
    c.sparsity = sparsity;
    c.name = sparsity_mode_name(sparsity_mode(c.sparsity));
    c.batch = 1;
    c.len = len;
    c.dim = 64;
    c.dtype = dtype;
    c.backward = true;
    c.causal = causal;
    c.path = path;
    c.device = device;
    c.threads = threads;
    c.repeat = 3;
    c.seed = 2026;
    return c;
  };
  const SparsityConfig bigbird = default_sparsity_config(SparsityMode::kBigBird, 4);
  SparsityConfig fixed_uni = default_sparsity_config(SparsityMode::kFixed, 4);
  std::get<FixedSparsityConfig>(fixed_uni).attention = AttentionDirection::kUnidirectional;
  SparsityConfig longformer = default_sparsity_config(SparsityMode::kBSLongformer, 4);
  sparsity_common(longformer).block = 32;
  const std::vector<SparseRunConfig> configs = {
      make(bigbird, 512, wide, SparseAttentionAlgorithm::kFused, false),
      make(bigbird, 512, wide, SparseAttentionAlgorithm::kComposite, false),
      make(fixed_uni, 512, DType::kBF16, SparseAttentionAlgorithm::kFused, true),
      make(longformer, 500, DType::kF16, SparseAttentionAlgorithm::kFused, false),
  };
  if (!json) {
    const std::string engine =
        on_gpu ? "on the GPU (" + cuda_device_description() + ")" : std::string("on the CPU");
    out << "\nBlock-sparse self-attention (DeepSpeed's SparseSelfAttention) " << engine
        << ", forward and backward.\n'fused' streams over each query block's nonzero key blocks "
           "with an online softmax; 'composite' is DeepSpeed's sdd -> softmax -> dsd. 'max err' "
           "compares with dense attention on the CPU that applies the layout as a mask.\n\n";
  }
  return report_sparse_runs(configs, json, out, err);
}

}  // namespace sciattn::tools
