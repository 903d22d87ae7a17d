#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "hw/fact_readers.h"
#include "hw/sys_file.h"

namespace stoker::hw {
namespace {

std::optional<int> ReadLogicalCpus(const ProbeOptions& o) {
  if (auto online = ReadSmallFile(JoinPath(o.sys_root, "devices/system/cpu/online"))) {
    if (auto n = CountCpuList(*online); n && *n > 0) return n;
  }
  std::optional<std::string> cpuinfo = ReadSmallFile(JoinPath(o.proc_root, "cpuinfo"));
  if (!cpuinfo) return std::nullopt;
  int processors = 0;
  for (std::string_view line : SplitLines(*cpuinfo)) {
    if (line.starts_with("processor") && line.find(':') != std::string_view::npos) ++processors;
  }
  return processors > 0 ? std::optional<int>(processors) : std::nullopt;
}

// A core is identified by the set of hardware threads it runs, so counting
// distinct sibling lists counts cores across packages and dies alike.
std::optional<int> ReadPhysicalCores(const ProbeOptions& o) {
  std::string cpu_dir = JoinPath(o.sys_root, "devices/system/cpu");
  DIR* dir = ::opendir(cpu_dir.c_str());
  if (dir == nullptr) return std::nullopt;
  std::set<std::string> cores;
  while (dirent* entry = ::readdir(dir)) {
    std::string_view name = entry->d_name;
    if (!name.starts_with("cpu") || !ParseUint(name.substr(3))) continue;
    std::string topology = JoinPath(JoinPath(cpu_dir, name), "topology");
    std::optional<std::string> siblings = ReadSmallFile(JoinPath(topology, "core_cpus_list"));
    if (!siblings) siblings = ReadSmallFile(JoinPath(topology, "thread_siblings_list"));
    if (siblings && CountCpuList(*siblings).value_or(0) > 0)
      cores.insert(std::string(Trim(*siblings)));
  }
  ::closedir(dir);
  return cores.empty() ? std::nullopt : std::optional<int>(static_cast<int>(cores.size()));
}

// Cpus_allowed_list is the kernel's view of sched_getaffinity for the
// process's main thread, including any cpuset restriction; reading it from
// <proc_root> lets tests supply it.
std::optional<int> ReadAffinity(const ProbeOptions& o, Notes& notes) {
  std::string path = JoinPath(o.proc_root, "self/status");
  std::optional<std::string> status = ReadSmallFile(path);
  if (!status) return std::nullopt;
  std::optional<std::string> list = FindKeyedLine(*status, "Cpus_allowed_list");
  if (!list) return std::nullopt;
  std::optional<int> n = CountCpuList(*list);
  if (!n || *n == 0) {
    notes.push_back(path + ": Cpus_allowed_list '" + list->substr(0, 64) + "' is not a CPU list");
    return std::nullopt;
  }
  return n;
}

std::optional<std::string> ReadCpuModel(const ProbeOptions& o) {
  std::optional<std::string> cpuinfo = ReadSmallFile(JoinPath(o.proc_root, "cpuinfo"));
  if (!cpuinfo) return std::nullopt;
  for (const char* key : {"model name", "Model", "cpu model"}) {
    std::optional<std::string> model = FindKeyedLine(*cpuinfo, key);
    if (model && !model->empty()) return model;
  }
  return std::nullopt;
}

}  // namespace

MachineFacts::Cpu ReadCpuFacts(const ProbeOptions& options, const CgroupMembership& cgroups,
                               Notes& notes) {
  MachineFacts::Cpu cpu;
  cpu.logical = ReadLogicalCpus(options);
  cpu.physical_cores = ReadPhysicalCores(options);
  cpu.affinity = ReadAffinity(options, notes);
  bool is_v1 = false;
  std::vector<std::string> dirs = CgroupDirs(cgroups, options.cgroup_root, "cpu", &is_v1);
  cpu.quota_cores = CgroupCpuQuota(dirs, is_v1, notes);
  cpu.model = ReadCpuModel(options);

  std::optional<int> cpus = cpu.affinity ? cpu.affinity : cpu.logical;
  if (cpus && cpu.quota_cores) {
    cpu.budget_cores = std::min(static_cast<double>(*cpus), *cpu.quota_cores);
  } else if (cpus) {
    cpu.budget_cores = *cpus;
  } else {
    cpu.budget_cores = cpu.quota_cores;
  }
  return cpu;
}

}  // namespace stoker::hw

namespace stoker {

double DescendantsCpuSeconds(const ProbeOptions& o) {
  static const double kTick = 1.0 / static_cast<double>(std::max<long>(1, ::sysconf(_SC_CLK_TCK)));
  auto children_of = [&](const std::string& pid) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& task :
         std::filesystem::directory_iterator(hw::JoinPath(o.proc_root, pid + "/task"), ec)) {
      const auto list = hw::ReadSmallFile((task.path() / "children").string());
      if (!list) continue;
      for (std::string_view rest = *list; !(rest = hw::Trim(rest)).empty();) {
        const size_t end = std::min(rest.find(' '), rest.size());
        out.emplace_back(rest.substr(0, end));
        rest = rest.substr(end);
      }
    }
    return out;
  };
  double total = 0;
  std::vector<std::string> pending = children_of("self");
  for (size_t i = 0; i < pending.size() && i < 100'000; ++i) {
    // "pid (comm) state ppid ... utime stime": fields 14 and 15, counted
    // after the comm's closing parenthesis (a comm may hold spaces).
    const auto stat = hw::ReadSmallFile(hw::JoinPath(o.proc_root, pending[i] + "/stat"));
    const size_t close = stat ? stat->rfind(')') : std::string::npos;
    if (close != std::string::npos) {
      std::string_view rest = std::string_view(*stat).substr(close + 1);
      uint64_t ticks = 0;
      for (int field = 3; field <= 15; ++field) {
        rest = hw::Trim(rest);
        const size_t end = std::min(rest.find(' '), rest.size());
        if (field >= 14) ticks += hw::ParseUint(rest.substr(0, end)).value_or(0);
        rest = rest.substr(end);
      }
      total += static_cast<double>(ticks) * kTick;
    }
    for (std::string& child : children_of(pending[i])) pending.push_back(std::move(child));
  }
  return total;
}

std::optional<CpuTimes> ReadCpuTimes(const ProbeOptions& o) {
  std::optional<std::string> status = hw::ReadSmallFile(hw::JoinPath(o.proc_root, "self/status"));
  std::optional<std::string> list =
      status ? hw::FindKeyedLine(*status, "Cpus_allowed_list") : std::nullopt;
  std::optional<std::vector<hw::CpuRange>> allowed = list ? hw::ParseCpuList(*list) : std::nullopt;
  std::optional<std::string> stat = hw::ReadSmallFile(hw::JoinPath(o.proc_root, "stat"));
  if (!allowed || !stat) return std::nullopt;
  static const double kTick = 1.0 / static_cast<double>(std::max<long>(1, ::sysconf(_SC_CLK_TCK)));
  CpuTimes t;
  for (std::string_view line : hw::SplitLines(*stat)) {
    // "cpuN user nice system idle iowait irq softirq steal ...": the per-CPU lines.
    if (!line.starts_with("cpu") || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    const size_t space = line.find(' ');
    std::optional<uint64_t> cpu = hw::ParseUint(line.substr(3, space - 3));
    if (!cpu || space == std::string_view::npos) return std::nullopt;
    const bool ours = std::any_of(allowed->begin(), allowed->end(), [&](const hw::CpuRange& r) {
      return *cpu >= r.first && *cpu <= r.last;
    });
    if (!ours) continue;
    uint64_t fields[8] = {};
    std::string_view rest = line.substr(space);
    for (uint64_t& f : fields) {
      rest = hw::Trim(rest);
      const size_t end = rest.find(' ');
      std::optional<uint64_t> v = hw::ParseUint(rest.substr(0, end));
      if (!v) return std::nullopt;
      f = *v;
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
    }
    const uint64_t idle = fields[3] + fields[4];
    const uint64_t busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6];
    t.idle_s += static_cast<double>(idle) * kTick;
    t.busy_s += static_cast<double>(busy) * kTick;
    t.steal_s += static_cast<double>(fields[7]) * kTick;
    ++t.cpus;
  }
  if (t.cpus == 0) return std::nullopt;
  return t;
}

}  // namespace stoker
