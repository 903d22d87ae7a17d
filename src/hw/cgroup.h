#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

// This process's control groups (v1 and v2) and the CPU and memory limits
// they impose. Used by the CPU and memory probes.

namespace stoker::hw {

/// Where this process sits, from <proc_root>/self/cgroup.
struct CgroupMembership {
  /// The v2 path from the "0::/path" line, if there is one.
  std::optional<std::string> unified_path;
  /// v1: controller name ("cpu", "memory") -> (hierarchy's controller list as
  /// written in the file, e.g. "cpu,cpuacct"; path within it).
  std::map<std::string, std::pair<std::string, std::string>> v1;
};

/// Parses the text of /proc/<pid>/cgroup; malformed lines are skipped.
CgroupMembership ParseCgroupMembership(const std::string& text);

/// The directories to read for `controller`, leaf first and ending at the
/// hierarchy's root under `cgroup_root`, and whether they are v1 (`is_v1`).
/// Empty when the controller's hierarchy is not found. A v1 hierarchy wins
/// when the controller is bound to one (hybrid set-ups keep cpu and memory
/// there).
std::vector<std::string> CgroupDirs(const CgroupMembership& membership,
                                    const std::string& cgroup_root, const std::string& controller,
                                    bool* is_v1);

/// The tightest CPU quota, in cores, on the way from `dirs` to the root;
/// nullopt when no level sets one or none can be read. Garbage is noted.
std::optional<double> CgroupCpuQuota(const std::vector<std::string>& dirs, bool is_v1,
                                     std::vector<std::string>& notes);

struct CgroupMemory {
  std::optional<uint64_t> limit_bytes;
  std::optional<uint64_t> current_bytes;
  // Of current_bytes, the file cache (memory.stat's active and inactive
  // file pages): reclaimed by the kernel before an allocation fails.
  std::optional<uint64_t> cache_bytes;
};

/// The tightest memory limit on the way from `dirs` to the root, and the use
/// charged at that level (at the leaf when no level sets a limit), with its file
/// cache.
CgroupMemory CgroupMemoryLimit(const std::vector<std::string>& dirs, bool is_v1,
                               std::vector<std::string>& notes);

}  // namespace stoker::hw
