#include "hw/cgroup.h"

#include <sys/stat.h>

#include <sstream>

#include "hw/sys_file.h"

namespace stoker::hw {
namespace {

// Kernels report "no limit" in v1 memory files as a huge page-aligned number
// (PAGE_COUNTER_MAX pages, about 2^63); no real limit comes near 2^62.
constexpr uint64_t kNoMemoryLimitAbove = uint64_t{1} << 62;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

// `hierarchy` + `path`, then each parent of `path`, ending at `hierarchy`.
std::vector<std::string> WalkUp(const std::string& hierarchy, std::string path) {
  std::vector<std::string> dirs;
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    dirs.push_back(JoinPath(hierarchy, path));
    if (path.empty() || path == "/") break;
    size_t slash = path.rfind('/');
    path = slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
  }
  return dirs;
}

std::string Quoted(const std::string& text) {
  std::string t(Trim(text.substr(0, 64)));
  return "'" + t + "'";
}

// The file cache charged to a memory cgroup: its pages on the file LRU
// lists (v1 counts the hierarchy under "total_"), which the kernel reclaims
// before it fails an allocation. Shared memory is not among them. nullopt
// where memory.stat or its keys are missing.
std::optional<uint64_t> FileCacheBytes(const std::string& path, bool is_v1,
                                       std::vector<std::string>& notes) {
  std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return std::nullopt;
  const std::string_view keys[] = {is_v1 ? "total_active_file" : "active_file",
                                   is_v1 ? "total_inactive_file" : "inactive_file"};
  uint64_t sum = 0;
  int found = 0;
  for (std::string_view line : SplitLines(*text)) {
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, space);
    if (key != keys[0] && key != keys[1]) continue;
    std::optional<uint64_t> n = ParseUint(Trim(line.substr(space + 1)));
    if (!n) {
      notes.push_back(path + ": " + Quoted(std::string(line)) + " is not a byte count");
      return std::nullopt;
    }
    sum += *n;
    ++found;
  }
  return found == 2 ? std::optional<uint64_t>(sum) : std::nullopt;
}

}  // namespace

CgroupMembership ParseCgroupMembership(const std::string& text) {
  CgroupMembership m;
  for (std::string_view line_view : SplitLines(text)) {
    std::string line(line_view);
    // "hierarchy-id:controller-list:path"; the path itself may hold ':'.
    size_t first = line.find(':');
    if (first == std::string::npos) continue;
    size_t second = line.find(':', first + 1);
    if (second == std::string::npos) continue;
    std::string id = line.substr(0, first);
    std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    if (path.empty() || path[0] != '/' || !ParseUint(id)) continue;
    if (id == "0" && controllers.empty()) {
      m.unified_path = path;
      continue;
    }
    for (const std::string& c : Split(controllers, ',')) {
      if (!c.empty() && c.find('=') == std::string::npos) m.v1[c] = {controllers, path};
    }
  }
  return m;
}

std::vector<std::string> CgroupDirs(const CgroupMembership& membership,
                                    const std::string& cgroup_root, const std::string& controller,
                                    bool* is_v1) {
  auto it = membership.v1.find(controller);
  if (it != membership.v1.end()) {
    // The hierarchy is mounted under its controller list ("cpu,cpuacct"),
    // usually with a symlink per controller ("cpu").
    for (const std::string& name : {it->second.first, controller}) {
      std::string hierarchy = JoinPath(cgroup_root, name);
      if (IsDirectory(hierarchy)) {
        *is_v1 = true;
        return WalkUp(hierarchy, it->second.second);
      }
    }
  }
  if (membership.unified_path) {
    *is_v1 = false;
    return WalkUp(cgroup_root, *membership.unified_path);
  }
  *is_v1 = false;
  return {};
}

std::optional<double> CgroupCpuQuota(const std::vector<std::string>& dirs, bool is_v1,
                                     std::vector<std::string>& notes) {
  std::optional<double> tightest;
  auto consider = [&](double cores) {
    if (!tightest || cores < *tightest) tightest = cores;
  };
  for (const std::string& dir : dirs) {
    if (is_v1) {
      std::string quota_path = JoinPath(dir, "cpu.cfs_quota_us");
      std::optional<std::string> quota = ReadSmallFile(quota_path);
      if (!quota) continue;
      if (Trim(*quota) == "-1") continue;  // no quota at this level
      std::string period_path = JoinPath(dir, "cpu.cfs_period_us");
      std::optional<std::string> period = ReadSmallFile(period_path);
      std::optional<uint64_t> q = ParseUint(*quota);
      std::optional<uint64_t> p = period ? ParseUint(*period) : std::nullopt;
      if (!q || !p || *p == 0) {
        notes.push_back(quota_path + ": " + Quoted(*quota) + " with period " +
                        (period ? Quoted(*period) : std::string("missing")) +
                        " is not a CPU quota");
        continue;
      }
      consider(static_cast<double>(*q) / static_cast<double>(*p));
    } else {
      std::string path = JoinPath(dir, "cpu.max");
      std::optional<std::string> text = ReadSmallFile(path);
      if (!text) continue;
      // "<quota> <period>", quota "max" for none.
      std::string_view t = Trim(*text);
      size_t space = t.find(' ');
      std::string_view quota = t.substr(0, space);
      uint64_t period = 0;
      if (space != std::string_view::npos) period = ParseUint(t.substr(space + 1)).value_or(0);
      if (quota == "max" && period > 0) continue;
      std::optional<uint64_t> q = ParseUint(quota);
      if (!q || period == 0) {
        notes.push_back(path + ": " + Quoted(*text) +
                        " is not '<quota> <period>' or 'max <period>'");
        continue;
      }
      consider(static_cast<double>(*q) / static_cast<double>(period));
    }
  }
  return tightest;
}

CgroupMemory CgroupMemoryLimit(const std::vector<std::string>& dirs, bool is_v1,
                               std::vector<std::string>& notes) {
  const char* limit_file = is_v1 ? "memory.limit_in_bytes" : "memory.max";
  const char* current_file = is_v1 ? "memory.usage_in_bytes" : "memory.current";
  CgroupMemory result;
  std::optional<std::string> tightest_dir;
  for (const std::string& dir : dirs) {
    std::string path = JoinPath(dir, limit_file);
    std::optional<std::string> text = ReadSmallFile(path);
    if (!text || Trim(*text) == "max") continue;
    std::optional<uint64_t> limit = ParseUint(*text);
    if (!limit) {
      notes.push_back(path + ": " + Quoted(*text) + " is not a byte count");
      continue;
    }
    if (*limit >= kNoMemoryLimitAbove) continue;
    if (!result.limit_bytes || *limit < *result.limit_bytes) {
      result.limit_bytes = limit;
      tightest_dir = dir;
    }
  }
  std::vector<std::string> current_dirs = tightest_dir ? std::vector{*tightest_dir} : dirs;
  for (const std::string& dir : current_dirs) {
    std::string path = JoinPath(dir, current_file);
    std::optional<std::string> text = ReadSmallFile(path);
    if (!text) continue;
    result.current_bytes = ParseUint(*text);
    if (!result.current_bytes)
      notes.push_back(path + ": " + Quoted(*text) + " is not a byte count");
    result.cache_bytes = FileCacheBytes(JoinPath(dir, "memory.stat"), is_v1, notes);
    break;
  }
  return result;
}

}  // namespace stoker::hw
