#include "stoker/probe.h"

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hw/cgroup.h"
#include "hw/fact_readers.h"
#include "hw/sys_file.h"

namespace stoker {
namespace {

std::optional<std::string> ProcessEnv(const std::string& name) {
  // getenv is safe alongside other readers; the probe never sets variables.
  const char* value = std::getenv(name.c_str());
  return value ? std::optional<std::string>(value) : std::nullopt;
}

std::optional<FsSpace> StatvfsSpace(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) return std::nullopt;
  uint64_t unit = st.f_frsize != 0 ? st.f_frsize : st.f_bsize;
  return FsSpace{static_cast<uint64_t>(st.f_blocks) * unit,
                 static_cast<uint64_t>(st.f_bavail) * unit};
}

std::optional<uint64_t> ProcessRlimit(int resource) {
  struct rlimit limit;
  if (::getrlimit(resource, &limit) != 0) return std::nullopt;
  if (limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<uint64_t>(limit.rlim_cur);
}

template <typename T>
nlohmann::json OrNull(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

const char* StorageKindName(MachineFacts::StorageKind kind) {
  switch (kind) {
    case MachineFacts::StorageKind::kLocal:
      return "local";
    case MachineFacts::StorageKind::kMemory:
      return "memory";
    case MachineFacts::StorageKind::kNetwork:
      return "network";
    case MachineFacts::StorageKind::kFuse:
      return "fuse";
    case MachineFacts::StorageKind::kUnknown:
      break;
  }
  return "unknown";
}

const char* DiskKindName(MachineFacts::DiskKind kind) {
  switch (kind) {
    case MachineFacts::DiskKind::kHdd:
      return "hdd";
    case MachineFacts::DiskKind::kSsd:
      return "ssd";
    case MachineFacts::DiskKind::kVirtual:
      return "virtual";
    case MachineFacts::DiskKind::kUnknown:
      break;
  }
  return "unknown";
}

const char* DiskKindLabel(MachineFacts::DiskKind kind) {
  switch (kind) {
    case MachineFacts::DiskKind::kHdd:
      return "HDD (rotational)";
    case MachineFacts::DiskKind::kSsd:
      return "SSD (not rotational)";
    case MachineFacts::DiskKind::kVirtual:
      return "virtual (rotational flag unreliable)";
    case MachineFacts::DiskKind::kUnknown:
      break;
  }
  return "unknown";
}

MachineFacts ProbeMachine(const ProbeOptions& options) {
  ProbeOptions o = options;
  if (!o.getenv) o.getenv = ProcessEnv;
  if (!o.space_of) o.space_of = StatvfsSpace;
  if (!o.rlimit) o.rlimit = ProcessRlimit;

  MachineFacts facts;
  hw::CgroupMembership cgroups;
  if (std::optional<std::string> text = hw::ReadSmallFile(hw::JoinPath(o.proc_root, "self/cgroup")))
    cgroups = hw::ParseCgroupMembership(*text);
  facts.cpu = hw::ReadCpuFacts(o, cgroups, facts.notes);
  facts.memory = hw::ReadMemoryFacts(o, cgroups, facts.notes);
  facts.shm = hw::ReadShmFacts(o);
  facts.limits = hw::ReadLimitFacts(o, cgroups);
  if (o.data_path) facts.storage = hw::ReadStorageFacts(o, *o.data_path, facts.notes);
  if (!o.skip_gpus) facts.gpus = hw::ReadGpuFacts(facts.notes);
  facts.ranks = hw::ReadRankFacts(o, facts.notes);
  return facts;
}

nlohmann::json FactsToJson(const MachineFacts& f) {
  nlohmann::json j;
  j["cpu"] = {{"logical", OrNull(f.cpu.logical)},
              {"physical_cores", OrNull(f.cpu.physical_cores)},
              {"affinity", OrNull(f.cpu.affinity)},
              {"quota_cores", OrNull(f.cpu.quota_cores)},
              {"budget_cores", OrNull(f.cpu.budget_cores)},
              {"model", OrNull(f.cpu.model)}};
  j["memory"] = {{"total_bytes", OrNull(f.memory.total_bytes)},
                 {"available_bytes", OrNull(f.memory.available_bytes)},
                 {"cgroup_limit_bytes", OrNull(f.memory.cgroup_limit_bytes)},
                 {"cgroup_current_bytes", OrNull(f.memory.cgroup_current_bytes)},
                 {"cgroup_cache_bytes", OrNull(f.memory.cgroup_cache_bytes)}};
  j["shm"] = {{"size_bytes", OrNull(f.shm.size_bytes)}, {"free_bytes", OrNull(f.shm.free_bytes)}};
  j["limits"] = {{"nproc", OrNull(f.limits.nproc)},
                 {"nofile", OrNull(f.limits.nofile)},
                 {"in_container", OrNull(f.limits.in_container)}};
  if (f.storage) {
    const MachineFacts::Storage& s = *f.storage;
    j["storage"] = {{"path", s.path},
                    {"device", OrNull(s.device)},
                    {"source", OrNull(s.source)},
                    {"mount_point", OrNull(s.mount_point)},
                    {"fs_type", OrNull(s.fs_type)},
                    {"rotational", OrNull(s.rotational)},
                    {"kind", StorageKindName(s.kind)},
                    {"disk", DiskKindName(s.disk)},
                    {"disk_evidence", s.disk_evidence}};
  } else {
    j["storage"] = nullptr;
  }
  j["gpus"] = nlohmann::json::array();
  for (const MachineFacts::Gpu& g : f.gpus) {
    j["gpus"].push_back({{"index", g.index},
                         {"name", OrNull(g.name)},
                         {"memory_total_bytes", OrNull(g.memory_total_bytes)},
                         {"memory_used_bytes", OrNull(g.memory_used_bytes)},
                         {"utilization_percent", OrNull(g.utilization_percent)}});
  }
  j["ranks"] = {{"rank", OrNull(f.ranks.rank)},
                {"local_rank", OrNull(f.ranks.local_rank)},
                {"world_size", OrNull(f.ranks.world_size)},
                {"local_world_size", OrNull(f.ranks.local_world_size)},
                {"launcher", f.ranks.launcher},
                {"problem", f.ranks.problem}};
  j["notes"] = f.notes;
  return j;
}

}  // namespace stoker
