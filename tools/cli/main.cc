#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>

#include "command_output.h"
#include "commands.h"
#include "stoker/version.h"

namespace {

// Whether the command line asks for JSON. Read from argv itself, since a
// line that fails to parse never sets the --json flag. `--json=VALUE` is
// read as CLI11 reads it (1, true, yes, on: JSON; 0, false, no, off: not),
// the last one deciding; a VALUE it cannot read still asks for JSON, whose
// error then names it.
bool AsksForJson(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--json") {
      json = true;
    } else if (arg.starts_with("--json=")) {
      bool value = true;
      json = CLI::detail::lexical_cast(std::string(arg.substr(7)), value) ? value : true;
    }
  }
  return json;
}

// The subcommand the line named, as far as it was parsed.
std::string CommandName(const CLI::App& app) {
  auto subcommands = app.get_subcommands();
  return subcommands.empty() ? "stoker" : subcommands.front()->get_name();
}

// Parses the line and runs the chosen command, which sets `exit_code`;
// returns the exit code.
int ParseAndRun(CLI::App& app, int argc, char** argv, const int& exit_code) {
  namespace cli = stoker::cli;
  const bool json = AsksForJson(argc, argv);
  // A misspelt command: CLI11 says only that a subcommand is required.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->check_name(argv[1]);
    }
    if (!found) {
      return cli::ReportError(
          "stoker", "unknown command '" + std::string(argv[1]) + "' (one of " + known + ")", json,
          cli::kExitUsage);
    }
  }
  try {
    app.parse(argc, argv);  // runs the chosen command's callback
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    if (json) return cli::ReportError(CommandName(app), e.what(), true, cli::kExitUsage);
    app.exit(e);  // the message and CLI11's hint on stderr
    return cli::kExitUsage;
  } catch (const std::exception& e) {
    // A command's errors are Status values; an exception here is a bug or
    // an exhausted resource (bad_alloc, a thread that could not start).
    return cli::ReportError(CommandName(app), std::string("unexpected error: ") + e.what(), json);
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = stoker::cli;
  cli::CheckStdoutWrites();
  CLI::App app{
      "stoker: a data loader that tunes its own workers so the accelerator never waits for data."};
  app.set_version_flag("--version", std::string("stoker ") + stoker::kVersion);
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 done, 1 failed (also when the output cannot be written to stdout: a full "
      "disk, a closed stdout, a pipe whose reader left), 2 a bad option or value, 130/143 a run "
      "ended by SIGINT/SIGTERM (its summary printed). With --json every error is also one JSON "
      "object {\"error\": ...} on stdout.");
  int exit_code = 0;
  cli::AddDemoCommand(app, exit_code);
  cli::AddRunCommand(app, exit_code);
  cli::AddBenchCommand(app, exit_code);
  cli::AddProbeCommand(app, exit_code);
  cli::AddAdviseCommand(app, exit_code);
  cli::AddMakeDatasetCommand(app, exit_code);
  cli::AddMonitorCommand(app, exit_code);
  const int code = ParseAndRun(app, argc, argv, exit_code);
  // A command succeeds only when its output, --help's too, reached stdout.
  return cli::FinishOutput(CommandName(app), code);
}
