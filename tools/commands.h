// The subcommands of the `sciattn` program. Tools layer: thin users of the public API only.
// Each add_*_command registers a subcommand with its flags and a callback on `app`. A callback
// that fails throws CLI::RuntimeError(exit_code) after printing its message to stderr.
#pragma once

#include <CLI/CLI.hpp>

namespace sciattn::tools {

void add_demo_command(CLI::App& app);
void add_evoformer_command(CLI::App& app);
void add_layout_command(CLI::App& app);

}  // namespace sciattn::tools
