// Shared pieces of the Evoformer commands (see report.h). Tools layer.
#include "report.h"

#include <nlohmann/json.hpp>

namespace sciattn::tools {
namespace {

std::string gflops(double flops, double ms) {
  return ms > 0 ? fixed(flops / (ms * 1e6), 1) : "-";
}

}  // namespace

int report_runs(const std::vector<EvoformerRunConfig>& configs, bool json, std::ostream& out,
                std::ostream& err) {
  TextTable table({"form", "shape [B,N,L,H,D]", "dtype", "fwd ms", "bwd ms", "GFLOP/s", "extra mem",
                   "naive fwd ms", "naive bwd ms", "naive mem", "max err", "tol", "check"});
  nlohmann::json all = nlohmann::json::array();
  int code = 0;
  for (const EvoformerRunConfig& c : configs) {
    EvoformerRunResult r;
    const Status status = run_evoformer_config(c, &r);
    if (!status.ok()) {
      err << "error: " << c.name << ": " << status.message() << "\n";
      code = 1;
      continue;
    }
    if (json) {
      all.push_back(to_json(c, r));
    } else {
      const double ms = r.forward_ms + r.backward_ms;
      const double flops = r.forward_flops + r.backward_flops;
      const size_t mem = std::max(r.forward_bytes, r.backward_bytes);
      const size_t ref_mem = std::max(r.reference_forward_bytes, r.reference_backward_bytes);
      table.add_row({c.name, shape_of(c), dtype_name(c.dtype), fixed(r.forward_ms, 2),
                     c.backward ? fixed(r.backward_ms, 2) : "-", gflops(flops, ms),
                     human_bytes(mem), r.checked ? fixed(r.reference_forward_ms, 2) : "-",
                     r.checked && c.backward ? fixed(r.reference_backward_ms, 2) : "-",
                     r.checked ? human_bytes(ref_mem) : "-",
                     r.checked ? scientific(r.max_error) : "-",
                     r.checked ? scientific(r.tolerance) : "-",
                     r.checked ? (r.passed ? "ok" : "FAIL (" + r.worst_output + ")") : "skipped"});
    }
    if (r.checked && !r.passed) code = 1;
  }
  if (json) {
    out << all.dump(2) << "\n";
  } else {
    table.print(out);
  }
  return code;
}

}  // namespace sciattn::tools
