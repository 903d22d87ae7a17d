#pragma once

#include <CLI/CLI.hpp>

namespace stoker::cli {

// Each subcommand lives in its own file and registers itself here. A command
// prints a human view by default and JSON on stdout with --json; it sets the
// process exit code through the int it is handed, and reports its errors
// through ReportError (command_output.h), which also writes them as JSON.
void AddDemoCommand(CLI::App& app, int& exit_code);
void AddRunCommand(CLI::App& app, int& exit_code);
void AddBenchCommand(CLI::App& app, int& exit_code);
void AddProbeCommand(CLI::App& app, int& exit_code);
void AddAdviseCommand(CLI::App& app, int& exit_code);
void AddMakeDatasetCommand(CLI::App& app, int& exit_code);
void AddMonitorCommand(CLI::App& app, int& exit_code);

}  // namespace stoker::cli
