#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

// Numbers in text: how messages print them, and strict parsing of the
// integers in list files, tar members and kernel files.

namespace stoker {

/// `value` as printf's "%.<significant_digits>g" writes it: "0.5", "1e+06".
/// The default of 6 digits is plain "%g".
std::string FormatNumber(double value, int significant_digits = 6);

/// `bytes` in binary units for people: "512 B", "64.0 MiB", "1.5 GiB" (also
/// declared in stoker/probe.h, its public home).
std::string FormatBytes(uint64_t bytes);

/// The decimal integer that fills all of `text` ("-12" for a signed `Int`);
/// nullopt for empty text, any other character (spaces, '+', a trailing
/// unit) or a value out of `Int`'s range.
template <typename Int>
std::optional<Int> ParseInteger(std::string_view text) {
  Int value{};
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || stop != end) return std::nullopt;
  return value;
}

}  // namespace stoker
