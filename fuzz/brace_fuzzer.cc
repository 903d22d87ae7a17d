// Fuzzes the brace-pattern expander (shard-{000..015}.tar): ExpandBraces
// must never crash, hang or allocate past its limits. MeasureBraces, its
// arithmetic, must agree with what it makes: a pattern measured past the
// limits is refused, and one within them expands to exactly as many names,
// none longer than measured nor than the pattern itself.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "source/brace_pattern.h"
#include "stoker/image_sources.h"

namespace {

// Expanding up to the public limits (a million names) takes too long per
// input to fuzz well; smaller expansions are checked name by name.
constexpr uint64_t kCheckedNames = 20'000;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string pattern(reinterpret_cast<const char*>(data), size);
  const stoker::BraceExpansionSize measured = stoker::MeasureBraces(pattern);
  if (measured.names == 0 || measured.longest > pattern.size()) std::abort();
  const bool within = measured.names <= stoker::kMaxBraceNames &&
                      measured.names * measured.longest <= stoker::kMaxBraceBytes;
  if (!within) {
    if (stoker::ExpandBraces(pattern).ok()) std::abort();
    return 0;
  }
  if (measured.names > kCheckedNames) return 0;
  auto names = stoker::ExpandBraces(pattern);
  if (!names.ok() || names->size() != measured.names) std::abort();
  uint64_t longest = 0;
  for (const std::string& name : *names) longest = std::max<uint64_t>(longest, name.size());
  if (longest != measured.longest) std::abort();
  return 0;
}
