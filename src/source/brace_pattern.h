#pragma once

#include <cstdint>
#include <string_view>

// ExpandBraces (stoker/image_sources.h) lives in brace_pattern.cc; this is
// its arithmetic, for the tests and the fuzzer.

namespace stoker {

/// How much a brace pattern expands to, computed without expanding it.
struct BraceExpansionSize {
  uint64_t names = 1;    // saturates at UINT64_MAX
  uint64_t longest = 0;  // bytes of the longest name; never more than the pattern's
};

/// The size ExpandBraces(pattern) would have, in time linear in the
/// pattern's length and memory bounded by it.
BraceExpansionSize MeasureBraces(std::string_view pattern);

}  // namespace stoker
