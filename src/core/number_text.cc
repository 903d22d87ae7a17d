#include "core/number_text.h"

#include <cstdio>

namespace stoker {

std::string FormatNumber(double value, int significant_digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*g", significant_digits, value);
  return text;
}

// Declared in stoker/probe.h (public) and core/number_text.h: messages of
// every module print sizes this way.
std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  return text;
}

}  // namespace stoker
