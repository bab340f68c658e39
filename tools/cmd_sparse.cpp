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
#include "run_support.h"
#include "sciattn/block_sparse.h"
#include "sciattn/block_sparse_ops.h"
#include "table.h"

namespace sciattn::tools {
namespace {

constexpr int kExitBadInput = 2;
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

Status run_sparse_config(const SparseRunConfig& c, SparseRunResult* r) {
  const SparsityCommon& common = sparsity_common(c.sparsity);
  const int64_t H = common.num_heads, b = common.block, B = c.batch, D = c.dim;
  // A length that is not a multiple of the block is padded (pad_to_block_size) and the padded
  // keys are removed with a key padding mask, as SparseAttentionUtils does.
  const int64_t L = c.len, Lp = L + block_pad_length(L, b);
  r->padded_len = Lp;
  BlockSparseIndex index;
  // SparseSelfAttention's crop rule: the layout for Lp is the top-left crop of the one built for
  // max_seq_length, which must therefore be at least Lp.
  Status status = build_sparse_attention_index(
      c.sparsity, c.max_seq_length > 0 ? c.max_seq_length : Lp, Lp, &index);
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

  SparseAttentionForwardParams fwd;
  fwd.index = &index;
  fwd.q = qp.view;
  fwd.k = kp.view;
  fwd.v = vp.view;
  fwd.key_padding_mask = kpm.view;
  fwd.options.scale = c.scale;
  fwd.options.causal = c.causal;
  fwd.options.num_threads = c.threads;
  fwd.options.algorithm = c.path;
  HostBuffer out = make_host_buffer(c.dtype, {B, H, Lp, D}),
             lse = make_host_buffer(DType::kF32, {B, H, Lp});
  fwd.out = out.view;
  fwd.lse = lse.view;
  status = can_implement(fwd);
  if (!status.ok()) return status;
  std::vector<std::byte> ws(workspace_size(fwd));
  r->forward_bytes = ws.size();
  r->forward_flops = sparse_attention_forward_flops(fwd);
  status = time_calls(
      c.repeat, [&] { return run(fwd, ws.data(), ws.size()); }, &r->forward_ms);
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
    SparseAttentionForwardParams ref = fwd;
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
    SparseAttentionBackwardParams bwd;
    bwd.index = &index;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.key_padding_mask = fwd.key_padding_mask;
    bwd.out = out.view;
    bwd.lse = lse.view;
    bwd.dout = doutp.view;
    bwd.options = fwd.options;
    HostBuffer dq = make_host_buffer(c.dtype, {B, H, Lp, D}),
               dk = make_host_buffer(c.dtype, {B, H, Lp, D}),
               dv = make_host_buffer(c.dtype, {B, H, Lp, D});
    bwd.dq = dq.view;
    bwd.dk = dk.view;
    bwd.dv = dv.view;
    std::vector<std::byte> bws(workspace_size(bwd));
    r->backward_bytes = bws.size();
    r->backward_flops = sparse_attention_backward_flops(bwd);
    status = time_calls(
        c.repeat, [&] { return run(bwd, bws.data(), bws.size()); }, &r->backward_ms);
    if (!status.ok()) return status;
    if (check) {
      SparseAttentionBackwardParams ref = bwd;
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
  j["causal"] = c.causal;
  j["threads"] = c.threads;
  add_measurements(r, c.backward, &j);
  return j;
}

// Runs each configuration and prints one table (or a JSON array). Returns 0, or 1 when a run
// failed or an error exceeded its tolerance.
int report_sparse_runs(const std::vector<SparseRunConfig>& configs, bool json, std::ostream& out,
                       std::ostream& err) {
  TextTable table({"layout", "shape [B,H,L,D]", "block", "nnz (density)", "dtype", "path", "fwd ms",
                   "bwd ms", "GFLOP/s", "extra mem", "dense ref fwd ms", "dense ref bwd ms",
                   "max err", "tol", "check"});
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
           sparse_attention_algorithm_name(c.path), fixed(r.forward_ms, 2),
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

// ---- flags --------------------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  throw CLI::RuntimeError(kExitBadInput);
}

// The layout flags, named after DeepSpeed's parameters as in `sciattn layout`. They have no CLI
// default: the config's own default applies unless the flag is given.
struct LayoutFlags {
  std::string mode = "fixed";
  int64_t heads = 4;
  int64_t block = kDefaultBlock;
  std::string config_path;
  bool different_layout_per_head = false;
  int64_t num_local_blocks = 0, num_global_blocks = 0, num_different_global_patterns = 0;
  int64_t num_random_blocks = 0, num_sliding_window_blocks = 0;
  std::string attention;
  bool horizontal_global_attention = false;
  std::vector<int64_t> local_window_blocks, global_block_indices, global_block_end_indices;
  CLI::Option *mode_opt = nullptr, *block_opt = nullptr, *config_opt = nullptr;
  std::vector<std::pair<CLI::Option*, std::function<void(SparsityConfig&, const CLI::Option*)>>>
      params;
};

// Applies `setter` to the config when the config has the field it sets (the setter's return type
// makes it invocable only then); a flag given for a mode without that parameter is an error.
template <typename Setter>
void set_field(SparsityConfig& config, const CLI::Option* opt, Setter setter) {
  if (opt->count() == 0) return;
  bool applied = false;
  std::visit(
      [&](auto& alternative) {
        if constexpr (std::is_invocable_v<Setter&, decltype(alternative)>) {
          setter(alternative);
          applied = true;
        }
      },
      config);
  if (!applied) {
    fail(opt->get_name() + " does not apply to --mode " +
         sparsity_mode_name(sparsity_mode(config)));
  }
}

// Registers a parameter flag whose value `field` is copied into every config that has it.
// Registers a parameter flag whose value is copied into the config's field `member` when the
// config has one (f lives in a shared_ptr the command's callback holds).
#define SCIATTN_LAYOUT_PARAM(flag, member, help)                                             \
  do {                                                                                       \
    CLI::Option* opt = cmd->add_option(flag, f.member, help);                                \
    LayoutFlags* fp = &f;                                                                    \
    f.params.push_back({opt, [fp](SparsityConfig& config, const CLI::Option* o) {            \
                          set_field(config, o,                                               \
                                    [fp](auto& c) -> decltype(void(c.member = fp->member)) { \
                                      c.member = fp->member;                                 \
                                    });                                                      \
                        }});                                                                 \
  } while (0)

void add_layout_flags(CLI::App* cmd, LayoutFlags& f) {
  f.mode_opt = cmd->add_option("--mode", f.mode,
                               "layout: dense, fixed (default), variable, bigbird, bslongformer "
                               "or local_sliding_window");
  cmd->add_option("--heads,--num-heads", f.heads, "H: attention heads (default 4)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  f.block_opt = cmd->add_option("--block", f.block, "block size: 16 (default), 32, 64 or 128");
  f.config_opt = cmd->add_option("--config", f.config_path,
                                 "a DeepSpeed JSON config (its sparse_attention section); flags "
                                 "given as well override its values");
  SCIATTN_LAYOUT_PARAM("--num-local-blocks", num_local_blocks, "fixed: local window in blocks");
  SCIATTN_LAYOUT_PARAM("--num-global-blocks", num_global_blocks, "fixed, bigbird: global blocks");
  SCIATTN_LAYOUT_PARAM("--num-different-global-patterns", num_different_global_patterns,
                       "fixed: global patterns cycled over the heads");
  SCIATTN_LAYOUT_PARAM("--num-random-blocks", num_random_blocks,
                       "variable, bigbird: random blocks per block row");
  SCIATTN_LAYOUT_PARAM("--num-sliding-window-blocks", num_sliding_window_blocks,
                       "bigbird, bslongformer, local_sliding_window: window in blocks");
  SCIATTN_LAYOUT_PARAM("--local-window-blocks", local_window_blocks,
                       "variable: local window sizes, e.g. 1,2,3");
  SCIATTN_LAYOUT_PARAM("--global-block-indices", global_block_indices,
                       "variable, bslongformer: global blocks, e.g. 0,4");
  SCIATTN_LAYOUT_PARAM("--global-block-end-indices", global_block_end_indices,
                       "variable, bslongformer: ends of global ranges");
  for (const char* list :
       {"--local-window-blocks", "--global-block-indices", "--global-block-end-indices"}) {
    cmd->get_option(list)->delimiter(',');
  }
  // Flags and the direction need their own setters (bool flags, a parsed enum).
  CLI::Option* per_head = cmd->add_flag("--different-layout-per-head", f.different_layout_per_head,
                                        "a layout per head");
  LayoutFlags* fp = &f;
  f.params.push_back(
      {per_head, [fp](SparsityConfig& config, const CLI::Option* o) {
         set_field(config, o, [fp](auto& c) -> decltype(void(c.different_layout_per_head = true)) {
           c.different_layout_per_head = fp->different_layout_per_head;
         });
       }});
  CLI::Option* horizontal =
      cmd->add_flag("--horizontal-global-attention", f.horizontal_global_attention,
                    "fixed, variable: global rows see every block");
  f.params.push_back({horizontal, [fp](SparsityConfig& config, const CLI::Option* o) {
                        set_field(
                            config, o,
                            [fp](auto& c) -> decltype(void(c.horizontal_global_attention = true)) {
                              c.horizontal_global_attention = fp->horizontal_global_attention;
                            });
                      }});
  CLI::Option* attention =
      cmd->add_option("--attention", f.attention, "bidirectional or unidirectional");
  f.params.push_back({attention, [fp](SparsityConfig& config, const CLI::Option* o) {
                        if (o->count() == 0) return;
                        const auto d = parse_attention_direction(fp->attention);
                        if (!d) {
                          fail("--attention must be bidirectional or unidirectional; got \"" +
                               fp->attention + "\"");
                        }
                        set_field(config, o, [&](auto& c) -> decltype(void(c.attention = *d)) {
                          c.attention = *d;
                        });
                      }});
}

#undef SCIATTN_LAYOUT_PARAM

SparsityConfig config_from_flags(const LayoutFlags& f, uint64_t seed) {
  SparsityConfig config;
  const auto mode = parse_sparsity_mode(f.mode);
  if (!mode || *mode == SparsityMode::kUser) {
    fail(
        "--mode must be one of dense, fixed, variable, bigbird, bslongformer, "
        "local_sliding_window; got \"" +
        f.mode + "\"");
  }
  if (f.config_opt->count() > 0) {
    const Status s = load_deepspeed_sparsity_config(f.config_path, f.heads, &config, seed);
    if (!s.ok()) fail(s.message());
    if (f.mode_opt->count() > 0 && *mode != sparsity_mode(config)) {
      fail(std::string("--mode ") + f.mode + " contradicts the mode of " + f.config_path);
    }
  } else {
    config = default_sparsity_config(*mode, f.heads);
  }
  SparsityCommon& common = sparsity_common(config);
  common.num_heads = f.heads;
  common.seed = seed;
  if (f.block_opt->count() > 0) common.block = f.block;
  for (const auto& [opt, apply] : f.params) apply(config, opt);
  const Status s = validate_sparsity_config(config);
  if (!s.ok()) fail(s.message());
  return config;
}

}  // namespace

void add_sparse_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "sparse",
      "Run block-sparse self-attention (DeepSpeed's SparseSelfAttention semantics) once on random\n"
      "inputs: Q, K, V [B, H, L, D] on a layout from DeepSpeed's sparsity configs, through the\n"
      "fused or the composite (sdd -> softmax -> dsd) path, and compare with dense attention\n"
      "that applies the layout as a mask. A length that is not a multiple of the block is padded\n"
      "and the padding masked.");
  auto flags = std::make_shared<LayoutFlags>();
  auto config = std::make_shared<SparseRunConfig>();
  auto dtype = std::make_shared<std::string>("f32");
  auto path = std::make_shared<std::string>("fused");
  auto json = std::make_shared<bool>(false);
  auto no_check = std::make_shared<bool>(false);
  add_layout_flags(cmd, *flags);
  cmd->add_option("--len,--seq-len", config->len, "L: sequence length in tokens (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--max-seq-length", config->max_seq_length,
                  "SparseSelfAttention's max_seq_length: the layout is the crop of the one built "
                  "for it (default: the length itself)");
  cmd->add_option("--batch,-b", config->batch, "B: batch size (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--dim,-d", config->dim, "D: head dim (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--dtype", *dtype, "storage dtype (default f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_option("--path", *path, "fused (default) or composite")
      ->check(CLI::IsMember({"fused", "composite"}));
  cmd->add_flag("--backward", config->backward, "also run and time the backward");
  cmd->add_flag("--causal", config->causal, "token-level causal masking inside diagonal blocks");
  cmd->add_option("--scale", config->scale, "softmax scale (default 1/sqrt(D))");
  cmd->add_option("--masked-keys", config->masked_keys,
                  "remove the last N keys of every sequence with a key padding mask")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--repeat", config->repeat, "timed calls, median reported (default 3)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--threads", config->threads, "CPU threads (0 = all)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--seed", config->seed, "seed of the inputs and of the random blocks");
  cmd->add_flag("--no-check", *no_check, "skip the dense reference and the error check");
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->callback([=] {
    config->sparsity = config_from_flags(*flags, config->seed);
    config->dtype = *parse_dtype(*dtype);
    config->path = *path == "composite" ? SparseAttentionAlgorithm::kComposite
                                        : SparseAttentionAlgorithm::kFused;
    config->check = !*no_check;
    config->name = layout_name(*config);
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

int run_sparse_demo(bool json, std::ostream& out, std::ostream& err) {
  // DeepSpeed's layouts at BERT-like sizes: BigBird and BSLongformer (global rows), Fixed
  // unidirectional with token-level causal masking, and a length that needs padding. L = 512
  // keeps the dense reference, plain single-threaded loops, to a few seconds for the section.
  auto make = [](SparsityConfig sparsity, int64_t len, DType dtype, SparseAttentionAlgorithm path,
                 bool causal) {
    SparseRunConfig c;
    c.sparsity = std::move(sparsity);
    c.name = sparsity_mode_name(sparsity_mode(c.sparsity));
    c.batch = 1;
    c.len = len;
    c.dim = 64;
    c.dtype = dtype;
    c.backward = true;
    c.causal = causal;
    c.path = path;
    c.repeat = 3;
    c.seed = 2026;
    return c;
  };
  BigBirdSparsityConfig bigbird;
  bigbird.num_heads = 4;
  FixedSparsityConfig fixed_uni;
  fixed_uni.num_heads = 4;
  fixed_uni.attention = AttentionDirection::kUnidirectional;
  BSLongformerSparsityConfig longformer;
  longformer.num_heads = 4;
  longformer.block = 32;
  const std::vector<SparseRunConfig> configs = {
      make(bigbird, 512, DType::kF32, SparseAttentionAlgorithm::kFused, false),
      make(bigbird, 512, DType::kF32, SparseAttentionAlgorithm::kComposite, false),
      make(fixed_uni, 512, DType::kBF16, SparseAttentionAlgorithm::kFused, true),
      make(longformer, 500, DType::kF16, SparseAttentionAlgorithm::kFused, false),
  };
  if (!json) {
    out << "\nBlock-sparse self-attention (DeepSpeed's SparseSelfAttention) on the CPU, forward "
           "and backward.\n'fused' streams over each query block's nonzero key blocks with an "
           "online softmax; 'composite' is DeepSpeed's sdd -> softmax -> dsd. 'max err' compares "
           "with dense attention that applies the layout as a mask.\n\n";
  }
  return report_sparse_runs(configs, json, out, err);
}

}  // namespace sciattn::tools
