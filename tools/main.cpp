// The `sciattn` command-line program: demo, evoformer, layout, sparse, train, data. Tools layer.
#include <CLI/CLI.hpp>

#include "cli.h"

int main(int argc, char** argv) {
  CLI::App app;
  sciattn::tools::build_cli(app, {});
  return sciattn::tools::run_cli(app, argc, argv);
}
