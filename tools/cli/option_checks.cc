#include "option_checks.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>

#include "stoker/image_sources.h"

namespace stoker::cli {
namespace {

template <typename T>
bool ParseAll(const std::string& text, T& value) {
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, value);
  return !text.empty() && ec == std::errc() && stop == end;
}

template <typename T>
std::string Text(T value) {
  std::ostringstream out;
  out.precision(15);
  out << value;
  return out.str();
}

}  // namespace

CLI::Validator CountIn(uint64_t lo, uint64_t hi) {
  const std::string range = Text(lo) + " to " + Text(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) {
        uint64_t value = 0;
        if (!ParseAll(text, value) || value < lo || value > hi) {
          return "expected an integer from " + range + ", got '" + text + "'";
        }
        return std::string();
      },
      "INT in [" + range + "]");
}

CLI::Validator NumberIn(double lo, double hi) {
  const std::string range = Text(lo) + " to " + Text(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) {
        double value = 0;
        if (!ParseAll(text, value) || !std::isfinite(value) || value < lo || value > hi) {
          return "expected a number from " + range + ", got '" + text + "'";
        }
        return std::string();
      },
      "NUMBER in [" + range + "]");
}

CLI::Validator PathGiven() {
  return CLI::Validator(
      [](std::string& text) {
        return text.empty() ? std::string("expected a path, got an empty one (an unset variable?)")
                            : std::string();
      },
      "PATH");
}

CLI::Validator ExistingPlace() {
  return CLI::Validator(
      [](std::string& text) {
        if (std::string error = PathGiven()(text); !error.empty()) return error;
        const std::string missing = MissingDataPlace(text);
        if (missing.empty()) return std::string();
        return missing.find('{') == std::string::npos
                   ? "no such file or folder: '" + missing + "'"
                   : "no file that the pattern '" + missing + "' names exists";
      },
      "PATH");
}

}  // namespace stoker::cli
