#include "core/number_text.h"

#include <cstdio>

namespace stoker {

std::string FormatNumber(double value, int significant_digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*g", significant_digits, value);
  return text;
}

}  // namespace stoker
