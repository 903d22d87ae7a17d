#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "stoker/status.h"

namespace stoker::cli {

// How every subcommand ends: its --json output, and its errors in one form.
// Exit codes: 0 done, 1 failed, 2 a usage error (a bad option or value),
// 128 + the signal's number for a run ended by SIGINT (130) or SIGTERM (143).

inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

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
/// an InvalidArgument (a flag's value at fault) exits kExitUsage, others
/// kExitFailed.
int ReportError(const std::string& command, const Status& status, bool json);

}  // namespace stoker::cli
