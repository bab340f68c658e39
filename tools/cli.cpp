// The `sciattn` program's command tree and its parse (see cli.h). Tools layer.
#include "cli.h"

#include "device_mirror.h"

#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

namespace sciattn::tools {
namespace {

constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;

std::string command_list(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return names;
}

// The subcommand the parse reached (the deepest one given), or the app itself.
CLI::App* reached(CLI::App& app) {
  CLI::App* at = &app;
  for (CLI::App* sub : app.get_subcommands()) at = sub;
  return at;
}

// "unknown flag --bogus", "unexpected argument extra": what a command did not take.
std::string leftovers(const std::vector<std::string>& args) {
  std::string text;
  for (const std::string& a : args) {
    text +=
        (text.empty() ? "" : "; ") +
        (a.size() > 1 && a[0] == '-' ? "unknown flag " + a : "unexpected argument \"" + a + "\"");
  }
  return text;
}

int usage_error(CLI::App& failing, const std::string& message) {
  std::cerr << "error: " << message << "\n\n" << failing.help();
  return kExitBadInput;
}

// `sciattn help [command]`: the help of the program or of one command.
int help_command(CLI::App& app, int argc, const char* const* argv) {
  if (argc <= 2) {
    std::cout << app.help();
    return 0;
  }
  const std::string name = argv[2];
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(name)) {
      std::cout << sub->help();
      return 0;
    }
  }
  return usage_error(
      app, "help: unknown command \"" + name + "\"; the commands are " + command_list(app));
}

int parse_and_run(CLI::App& app, int argc, const char* const* argv) {
  if (argc >= 2 && std::string(argv[1]) == "help") return help_command(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    // A command ran and failed; it has already said why on stderr.
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    CLI::App& failing = *reached(app);
    // CLI11 checks required options before it reports what it could not place, so a mistyped
    // flag would otherwise come out as "--len is required", and a mistyped command as "A
    // subcommand is required". Name what the user wrote instead.
    if (&failing == &app && !app.remaining().empty()) {
      const std::string word = app.remaining().front();
      if (word.empty() || word[0] != '-') {
        return usage_error(app, "unknown command \"" + word + "\"; the commands are " +
                                    command_list(app) + " (sciattn help <command> describes one)");
      }
      return usage_error(app, leftovers(app.remaining()));
    }
    if (&failing != &app && !failing.remaining().empty()) {
      return usage_error(failing, failing.get_name() + ": " + leftovers(failing.remaining()));
    }
    if (&failing == &app && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      return usage_error(app, "a command is required: one of " + command_list(app));
    }
    return usage_error(failing, (&failing == &app ? "" : failing.get_name() + ": ") + e.what());
  }
  return 0;
}

}  // namespace

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (digits && (text.size() < 20 || (text.size() == 20 && text <= "18446744073709551615"))) {
          return "";
        }
        return "must be an integer from 0 to 18446744073709551615; got \"" + text + "\"";
      },
      "UINT");
}

void require_usable_device(Device device) {
  const Status status = check_device_usable(device);
  if (status.ok()) return;
  std::cerr << "error: " << status.message() << "\n";
  throw CLI::RuntimeError(kExitBadInput);
}

void build_cli(CLI::App& app, const CommandOptions& options) {
  app.name("sciattn");
  app.description(
      "sciattn: memory-efficient Evoformer attention and block-sparse attention.\n"
      "Run `sciattn demo` for a tour, `sciattn train --demo` to train a small GPT, or\n"
      "`sciattn <command> --help` (`sciattn help <command>`).");
  app.require_subcommand(1);
  app.set_version_flag("--version", "sciattn 0.1.0");
  add_demo_command(app, options);
  add_evoformer_command(app, options);
  add_layout_command(app, options);
  add_sparse_command(app, options);
  if (!options.check_only) {
    add_train_command(app);
    add_data_command(app);
  }
}

int run_cli(CLI::App& app, int argc, const char* const* argv) {
  try {
    return parse_and_run(app, argc, argv);
  } catch (const std::bad_alloc&) {
    // Runs are sized before they allocate (run_memory.h); what is left is an allocation the
    // estimate did not foresee, or memory taken by something else in the meantime.
    std::cerr << "error: out of memory: an allocation failed while running `"
              << reached(app)->get_name()
              << "`; run a smaller configuration or free memory and try again\n";
    return kExitFailed;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitFailed;
  }
}

}  // namespace sciattn::tools
