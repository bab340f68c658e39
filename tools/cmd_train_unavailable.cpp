// `sciattn train` and `sciattn data` in a build without the trainer (no OpenBLAS found at
// configure time): both say how to get it. Tools layer.
#include <iostream>

#include "commands.h"

namespace sciattn::tools {
namespace {

constexpr int kExitNotBuilt = 2;

void add_unavailable(CLI::App& app, const char* name) {
  CLI::App* cmd = app.add_subcommand(name, "(not in this build: it needs OpenBLAS; see --help)");
  cmd->allow_extras();
  cmd->callback([name] {
    std::cerr << "sciattn " << name
              << ": this build has no trainer. It needs OpenBLAS: install Debian's "
                 "libopenblas-openmp-dev (scripts/setup.sh --deps does) and configure again, or "
                 "point -DBLAS_LIBRARIES=<libopenblas.so> and -DCBLAS_INCLUDE_DIR=<folder of "
                 "cblas.h> at a copy.\n";
    throw CLI::RuntimeError(kExitNotBuilt);
  });
}

}  // namespace

void add_train_command(CLI::App& app) {
  add_unavailable(app, "train");
}
void add_data_command(CLI::App& app) {
  add_unavailable(app, "data");
}

}  // namespace sciattn::tools
