// The `sciattn` command-line program: demo, evoformer, layout, sparse, train, data. Tools layer.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "sciattn: memory-efficient Evoformer attention and block-sparse attention.\n"
      "Run `sciattn demo` for a tour, `sciattn train --demo` to train a small GPT, or\n"
      "`sciattn <command> --help`."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sciattn 0.1.0");
  sciattn::tools::add_demo_command(app);
  sciattn::tools::add_evoformer_command(app);
  sciattn::tools::add_layout_command(app);
  sciattn::tools::add_sparse_command(app);
  sciattn::tools::add_train_command(app);
  sciattn::tools::add_data_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    // A command ran and failed; it has already said why on stderr.
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // A wrong flag or missing subcommand: print the message and the usage, exit non-zero.
    if (e.get_exit_code() != 0) {
      std::cerr << "error: " << e.what() << "\n\n";
      CLI::App* failing = &app;
      for (CLI::App* sub : app.get_subcommands()) failing = sub;
      std::cerr << failing->help();
      return e.get_exit_code();
    }
    return app.exit(e);
  }
  return 0;
}
