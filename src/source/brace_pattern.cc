#include "source/brace_pattern.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/number_text.h"
#include "stoker/image_sources.h"

namespace stoker {
namespace {

constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();

uint64_t SaturatingProduct(uint64_t a, uint64_t b) {
  if (a != 0 && b > kSaturated / a) return kSaturated;
  return a * b;
}

// One valid brace group of a pattern: "{lo..hi}" or "{x,y,z}".
struct BraceGroup {
  size_t open = 0, close = 0;  // offsets of its '{' and '}' in the pattern
  bool range = false;
  int64_t lo = 0, hi = 0;                 // a range
  size_t width = 0;                       // a range's zero-padded width (0: none)
  std::vector<std::string_view> choices;  // a list

  // Magnitudes in uint64_t: hi - lo and -lo overflow int64_t at its ends.
  uint64_t span() const {
    return hi >= lo ? static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo)
                    : static_cast<uint64_t>(lo) - static_cast<uint64_t>(hi);
  }
  uint64_t count() const {
    if (!range) return choices.size();
    return span() == kSaturated ? kSaturated : span() + 1;
  }

  // The `k`th choice, appended to `out`. REQUIRES: k < count().
  void Append(uint64_t k, std::string& out) const {
    if (!range) {
      out.append(choices[k]);
      return;
    }
    const uint64_t start = static_cast<uint64_t>(lo);
    const int64_t v = static_cast<int64_t>(hi >= lo ? start + k : start - k);
    const uint64_t magnitude = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    const std::string digits = std::to_string(magnitude);
    const size_t sign = v < 0 ? 1 : 0;
    if (sign) out += '-';
    if (digits.size() + sign < width) out.append(width - digits.size() - sign, '0');
    out += digits;
  }

  size_t longest() const {
    if (!range) {
      size_t n = 0;
      for (std::string_view c : choices) n = std::max(n, c.size());
      return n;
    }
    // The bound of larger magnitude is the longest number; padding is
    // never wider than a bound's own text.
    auto length = [&](int64_t v) {
      const uint64_t m = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
      return std::to_string(m).size() + (v < 0 ? 1 : 0);
    };
    return std::max({width, length(lo), length(hi)});
  }
};

// `body` (the text between the braces) as a group, or false when it is
// literal text ("{}", "{word}", "{1..x}").
bool ParseGroup(std::string_view body, BraceGroup& g) {
  const size_t dots = body.find("..");
  if (dots != std::string_view::npos) {
    const std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
    std::optional<int64_t> lo = ParseInteger<int64_t>(a), hi = ParseInteger<int64_t>(b);
    if (lo && hi) {
      auto padded = [](std::string_view t) {
        if (!t.empty() && t[0] == '-') t.remove_prefix(1);
        return t.size() > 1 && t[0] == '0';
      };
      g.range = true;
      g.lo = *lo;
      g.hi = *hi;
      g.width = (padded(a) || padded(b)) ? std::max(a.size(), b.size()) : 0;
      return true;
    }
  }
  if (body.find(',') == std::string_view::npos) return false;
  for (size_t start = 0;;) {
    const size_t comma = body.find(',', start);
    g.choices.push_back(body.substr(start, comma - start));
    if (comma == std::string_view::npos) return true;
    start = comma + 1;
  }
}

// The pattern's groups, left to right. A '{' whose matching '}' encloses
// another '{' is literal, and so are the groups that ParseGroup refuses;
// expanded text is never scanned again, so groups do not nest.
std::vector<BraceGroup> FindGroups(std::string_view pattern) {
  std::vector<BraceGroup> groups;
  for (size_t open = pattern.find('{'); open != std::string_view::npos;
       open = pattern.find('{', open + 1)) {
    const size_t close = pattern.find('}', open);
    if (close == std::string_view::npos) break;
    const std::string_view body = pattern.substr(open + 1, close - open - 1);
    if (body.find('{') != std::string_view::npos) continue;
    BraceGroup g;
    if (!ParseGroup(body, g)) continue;
    g.open = open;
    g.close = close;
    groups.push_back(std::move(g));
    open = close;  // the next search starts after this group
  }
  return groups;
}

BraceExpansionSize Measure(std::string_view pattern, const std::vector<BraceGroup>& groups) {
  BraceExpansionSize size;
  size.longest = pattern.size();
  for (const BraceGroup& g : groups) {
    size.names = SaturatingProduct(size.names, g.count());
    size.longest = size.longest - (g.close - g.open + 1) + g.longest();
  }
  return size;
}

}  // namespace

BraceExpansionSize MeasureBraces(std::string_view pattern) {
  return Measure(pattern, FindGroups(pattern));
}

Result<std::vector<std::string>> ExpandBraces(const std::string& pattern) {
  const std::vector<BraceGroup> groups = FindGroups(pattern);
  const BraceExpansionSize size = Measure(pattern, groups);
  if (size.names > kMaxBraceNames) {
    return InvalidArgument("the pattern " + pattern + " expands to " +
                           (size.names == kSaturated ? "more than " + std::to_string(kSaturated)
                                                     : std::to_string(size.names)) +
                           " names; at most " + std::to_string(kMaxBraceNames) + " are allowed");
  }
  if (SaturatingProduct(size.names, size.longest) > kMaxBraceBytes) {
    return InvalidArgument("the pattern " + pattern + " expands to " + std::to_string(size.names) +
                           " names of up to " + std::to_string(size.longest) + " bytes; at most " +
                           std::to_string(kMaxBraceBytes) + " bytes of names are allowed");
  }
  std::vector<std::string> out;
  out.reserve(size.names);
  // An odometer over the groups' choices, the leftmost group slowest.
  std::vector<uint64_t> choice(groups.size(), 0);
  while (true) {
    std::string name;
    name.reserve(size.longest);
    size_t from = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      name.append(pattern, from, groups[i].open - from);
      groups[i].Append(choice[i], name);
      from = groups[i].close + 1;
    }
    name.append(pattern, from);
    out.push_back(std::move(name));
    size_t i = groups.size();
    while (i > 0 && ++choice[i - 1] == groups[i - 1].count()) choice[--i] = 0;
    if (i == 0) return out;
  }
}

}  // namespace stoker
