// Shared pieces of the Evoformer commands: flags, device defaults and the report (table or JSON).
// Tools layer.
#pragma once

#include <optional>
#include <ostream>
#include <vector>

#include "device_mirror.h"
#include "evoformer_runner.h"
#include "table.h"

namespace sciattn::tools {

// Flags that map onto EvoformerRunConfig only after parsing.
struct EvoformerFlags {
  bool no_bias1 = false;
  bool no_bias2 = false;
  bool no_check = false;
  bool json = false;
  std::optional<float> scale;
};

// Runs each configuration and prints one table (or a JSON array). Returns 0, or 1 when a run
// failed or an error exceeded its tolerance.
int report_runs(const std::vector<EvoformerRunConfig>& configs, bool json, std::ostream& out,
                std::ostream& err);

}  // namespace sciattn::tools
