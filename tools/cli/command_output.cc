#include "command_output.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "stoker/json_text.h"

namespace stoker::cli {
namespace {

int Report(const std::string& command, const std::string& message, bool json, int exit_code,
           const char* status) {
  // stdout first: a reader of both streams sees the JSON whatever it waits on.
  if (json) {
    nlohmann::json error = {{"error", message}, {"command", command}, {"exit_code", exit_code}};
    if (status != nullptr) error["status"] = status;
    PrintJson(error);
  }
  std::cerr << (command == "stoker" ? "stoker" : "stoker " + command) << ": " << message << "\n";
  return exit_code;
}

}  // namespace

void PrintJson(const nlohmann::json& value) {
  std::cout << DumpJson(value, 2) << "\n" << std::flush;
}

int ReportError(const std::string& command, const std::string& message, bool json, int exit_code) {
  return Report(command, message, json, exit_code, nullptr);
}

int ReportError(const std::string& command, const Status& status, bool json) {
  return Report(command, status.ToString(), json,
                status.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailed,
                StatusCodeName(status.code()));
}

}  // namespace stoker::cli
