#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "stoker/version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "stoker: a data loader that tunes its own workers so the accelerator never waits for data."};
  app.set_version_flag("--version", std::string("stoker ") + stoker::kVersion);
  app.require_subcommand(1);
  int exit_code = 0;
  stoker::cli::AddDemoCommand(app, exit_code);
  stoker::cli::AddRunCommand(app, exit_code);
  stoker::cli::AddBenchCommand(app, exit_code);
  stoker::cli::AddProbeCommand(app, exit_code);
  stoker::cli::AddAdviseCommand(app, exit_code);
  stoker::cli::AddMakeDatasetCommand(app, exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
