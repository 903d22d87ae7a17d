#include "hw/sys_file.h"

#include <algorithm>
#include <fstream>

#include "core/number_text.h"

namespace stoker::hw {

std::optional<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  // sysfs and procfs files report size 0, so read until end of file.
  std::string text;
  char chunk[4096];
  while (text.size() < max_bytes && in) {
    in.read(chunk, static_cast<std::streamsize>(std::min(sizeof chunk, max_bytes - text.size())));
    text.append(chunk, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return std::nullopt;
  return text;
}

std::string_view Trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  size_t end = text.find_last_not_of(kSpace);
  return text.substr(begin, end - begin + 1);
}

std::optional<uint64_t> ParseUint(std::string_view text) {
  return ParseInteger<uint64_t>(Trim(text));
}

std::optional<std::vector<CpuRange>> ParseCpuList(std::string_view text) {
  text = Trim(text);
  std::vector<CpuRange> ranges;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    size_t dash = item.find('-');
    std::optional<uint64_t> first = ParseUint(item.substr(0, dash));
    std::optional<uint64_t> last =
        dash == std::string_view::npos ? first : ParseUint(item.substr(dash + 1));
    if (!first || !last || *last < *first || *last - *first > (1u << 20)) return std::nullopt;
    ranges.push_back({*first, *last});
    if (comma != std::string_view::npos && text.empty()) return std::nullopt;  // "0-3,"
  }
  return ranges;
}

std::optional<int> CountCpuList(std::string_view text) {
  std::optional<std::vector<CpuRange>> ranges = ParseCpuList(text);
  if (!ranges) return std::nullopt;
  int count = 0;
  for (const CpuRange& r : *ranges) count += static_cast<int>(r.last - r.first + 1);
  return count;
}

std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text = text.substr(nl + 1);
  }
  return lines;
}

std::optional<std::string> FindKeyedLine(std::string_view text, std::string_view key) {
  for (std::string_view line : SplitLines(text)) {
    if (line.size() > key.size() && line.starts_with(key)) {
      std::string_view rest = line.substr(key.size());
      // "model name\t: x" in /proc/cpuinfo pads the key before the colon.
      size_t colon = rest.find(':');
      if (colon == std::string_view::npos || !Trim(rest.substr(0, colon)).empty()) continue;
      return std::string(Trim(rest.substr(colon + 1)));
    }
  }
  return std::nullopt;
}

std::string JoinPath(std::string_view a, std::string_view b) {
  while (a.size() > 1 && a.back() == '/') a.remove_suffix(1);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  std::string joined(a);
  if (!b.empty()) {
    if (!joined.empty() && joined.back() != '/') joined.push_back('/');
    joined.append(b);
  }
  return joined;
}

}  // namespace stoker::hw
