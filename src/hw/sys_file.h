#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// Small readers for the text files of /proc, /sys and cgroup trees. Each
// returns nullopt when the file is missing or its text is not what the kernel
// writes there, so callers turn that into an unknown fact.

namespace stoker::hw {

/// The whole file (these files are small; at most `max_bytes` are read), or
/// nullopt when it cannot be opened.
std::optional<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 1 << 20);

/// `text` without leading and trailing white space.
std::string_view Trim(std::string_view text);

/// A non-negative decimal integer filling all of `text` (after trimming).
std::optional<uint64_t> ParseUint(std::string_view text);

/// One item of a kernel CPU list: CPUs first..last.
struct CpuRange {
  uint64_t first = 0;
  uint64_t last = 0;
};

/// The items of a kernel CPU list such as "0-3,8,10-11"; nullopt for
/// malformed text.
std::optional<std::vector<CpuRange>> ParseCpuList(std::string_view text);

/// The number of CPUs in a kernel CPU list such as "0-3,8,10-11"; nullopt for
/// malformed text. An empty list has 0 CPUs.
std::optional<int> CountCpuList(std::string_view text);

/// The value after "<key>:" on the first line starting with it (trimmed), as
/// in /proc/meminfo ("MemTotal:  16 kB") or /proc/self/status.
std::optional<std::string> FindKeyedLine(std::string_view text, std::string_view key);

/// `parts` joined with "/", never doubling a separator: JoinPath("/a/", "/b").
std::string JoinPath(std::string_view a, std::string_view b);

/// The lines of `text`, without their newlines.
std::vector<std::string_view> SplitLines(std::string_view text);

}  // namespace stoker::hw
