#include "hw/fact_readers.h"
#include "hw/sys_file.h"

namespace stoker::hw {
namespace {

// "MemTotal:       16314528 kB" -> bytes.
std::optional<uint64_t> ReadMeminfoBytes(const std::string& meminfo, const std::string& path,
                                         const char* key, Notes& notes) {
  std::optional<std::string> value = FindKeyedLine(meminfo, key);
  if (!value) return std::nullopt;
  std::string_view v = *value;
  uint64_t unit = 1;
  if (v.ends_with(" kB")) {
    v.remove_suffix(3);
    unit = 1024;
  }
  std::optional<uint64_t> n = ParseUint(v);
  if (!n) {
    notes.push_back(path + ": " + key + " '" + value->substr(0, 64) + "' is not a size");
    return std::nullopt;
  }
  return *n * unit;
}

}  // namespace

MachineFacts::Memory ReadMemoryFacts(const ProbeOptions& options, const CgroupMembership& cgroups,
                                     Notes& notes) {
  MachineFacts::Memory memory;
  std::string path = JoinPath(options.proc_root, "meminfo");
  if (std::optional<std::string> meminfo = ReadSmallFile(path)) {
    memory.total_bytes = ReadMeminfoBytes(*meminfo, path, "MemTotal", notes);
    memory.available_bytes = ReadMeminfoBytes(*meminfo, path, "MemAvailable", notes);
  }
  bool is_v1 = false;
  std::vector<std::string> dirs = CgroupDirs(cgroups, options.cgroup_root, "memory", &is_v1);
  CgroupMemory cg = CgroupMemoryLimit(dirs, is_v1, notes);
  memory.cgroup_limit_bytes = cg.limit_bytes;
  memory.cgroup_current_bytes = cg.current_bytes;
  memory.cgroup_cache_bytes = cg.cache_bytes;
  return memory;
}

MachineFacts::Shm ReadShmFacts(const ProbeOptions& options) {
  MachineFacts::Shm shm;
  if (std::optional<FsSpace> space = options.space_of(options.shm_path)) {
    shm.size_bytes = space->size_bytes;
    shm.free_bytes = space->free_bytes;
  }
  return shm;
}

}  // namespace stoker::hw

namespace stoker {
namespace {

// A "<key>:  123 kB" line of <proc_root>/self/status, bytes; 0 if unknown.
size_t SelfStatusBytes(const ProbeOptions& o, const char* key) {
  const std::string path = hw::JoinPath(o.proc_root, "self/status");
  const std::optional<std::string> status = hw::ReadSmallFile(path);
  hw::Notes ignored;  // an unknown size is 0 here, with no note to carry
  const std::optional<uint64_t> bytes =
      status ? hw::ReadMeminfoBytes(*status, path, key, ignored) : std::nullopt;
  return bytes.value_or(0);
}

}  // namespace

size_t RssBytes(const ProbeOptions& options) { return SelfStatusBytes(options, "VmRSS"); }
size_t PeakRssBytes(const ProbeOptions& options) { return SelfStatusBytes(options, "VmHWM"); }

}  // namespace stoker
