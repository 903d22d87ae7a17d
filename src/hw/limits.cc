#include <sys/resource.h>
#include <sys/stat.h>

#include "hw/fact_readers.h"
#include "hw/sys_file.h"

namespace stoker::hw {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool NamesContainerRuntime(const std::string& cgroup_path) {
  for (const char* marker : {"docker", "kubepods", "containerd", "libpod", "lxc", "crio"}) {
    if (cgroup_path.find(marker) != std::string::npos) return true;
  }
  return false;
}

// Only positive evidence counts: runtimes leave marker files (Docker's
// /.dockerenv, Podman's /run/.containerenv), systemd-style ones set
// $container, and cgroup paths name the runtime when there is no cgroup
// namespace. A container that shows none of them is reported as not one.
std::optional<bool> DetectContainer(const ProbeOptions& o, const CgroupMembership& cgroups) {
  if (Exists(JoinPath(o.fs_root, ".dockerenv")) || Exists(JoinPath(o.fs_root, "run/.containerenv")))
    return true;
  if (o.getenv("container")) return true;
  if (cgroups.unified_path && NamesContainerRuntime(*cgroups.unified_path)) return true;
  for (const auto& [controller, hierarchy_path] : cgroups.v1) {
    if (NamesContainerRuntime(hierarchy_path.second)) return true;
  }
  return false;
}

}  // namespace

MachineFacts::Limits ReadLimitFacts(const ProbeOptions& options, const CgroupMembership& cgroups) {
  MachineFacts::Limits limits;
  limits.nproc = options.rlimit(RLIMIT_NPROC);
  limits.nofile = options.rlimit(RLIMIT_NOFILE);
  limits.in_container = DetectContainer(options, cgroups);
  return limits;
}

}  // namespace stoker::hw
