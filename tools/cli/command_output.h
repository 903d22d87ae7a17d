#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "stoker/status.h"

namespace stoker::cli {

// How every subcommand ends: its --json output, and its errors in one form.
// Exit codes: 0 done, 1 failed, 2 a usage error (a bad option or value),
// 128 + the signal's number for a run ended by SIGINT (130) or SIGTERM (143).

inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

/// Routes std::cout through a buffer that remembers the first write to stdout
/// that failed and its errno, and ignores SIGPIPE so that a write to a pipe
/// whose reader is gone fails with EPIPE instead of ending the process
/// silently. Call once, first in main, before any output. The CLI writes
/// stdout from its main thread only.
void CheckStdoutWrites();

/// The errno of the first write to stdout that failed (ENOSPC, EPIPE, EBADF
/// for a closed stdout, ...), or 0 while everything got there. Cheap; does
/// not flush.
int StdoutWriteError();

/// How main ends: flushes stdout; when some output did not reach it, says so
/// in one line on stderr ("stoker <command>: cannot write the output to
/// stdout: Broken pipe") and returns kExitFailed, or `exit_code` when that
/// already says the command failed. Else returns `exit_code`.
/// Output that a pipe took counts as written: a reader that closes early
/// (`| head -c 1`) fails the command only when stoker writes after it left;
/// whether it read what it was given cannot be known.
int FinishOutput(const std::string& command, int exit_code);

/// Prints `value` on stdout, indented, through DumpJson (any bytes in its
/// strings are fine), then a newline.
void PrintJson(const nlohmann::json& value);

/// Reports that `command` ("run", or "stoker" before a subcommand is known)
/// failed: "stoker <command>: <message>" on stderr, and with `json` also one
/// object {"error": message, "command": command, "exit_code": exit_code} on
/// stdout, so that a caller reading stdout always gets JSON. Returns
/// `exit_code`.
int ReportError(const std::string& command, const std::string& message, bool json,
                int exit_code = kExitFailed);

/// The same for a Status: its text as the message, "status" its code's name;
/// an InvalidArgument (a flag's value at fault) exits kExitUsage, an
/// Interrupted one (stop_signals.h) ExitCodeFor its signal, others
/// kExitFailed.
int ReportError(const std::string& command, const Status& status, bool json);

}  // namespace stoker::cli
