// The `sciattn` program's command tree and its parse, callable in-process: main() runs it, and the
// fuzz target of the argument handling (tests/fuzz) calls it on generated argument lists. Tools
// layer.
#pragma once

#include <CLI/CLI.hpp>

#include "commands.h"

namespace sciattn::tools {

// Builds the program's subcommands on `app`. With options.check_only, every command stops once
// its flags and the memory its run needs are checked, and the trainer's commands (which read and
// write files) are left out.
void build_cli(CLI::App& app, const CommandOptions& options);

// Parses argv on an app made by build_cli and runs the chosen command. Returns the exit code:
// 0, 1 (a run failed or ran out of memory) or 2 (bad input: an unknown command or flag, a bad
// value, a run that cannot fit). Never throws and never exits the process: every message goes to
// stderr (help and version to stdout).
int run_cli(CLI::App& app, int argc, const char* const* argv);

}  // namespace sciattn::tools
