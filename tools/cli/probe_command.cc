#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command_output.h"
#include "commands.h"
#include "option_checks.h"
#include "stoker/probe.h"
#include "stoker/report.h"

namespace stoker::cli {
namespace {

struct ProbeCommandOptions {
  std::string data_path;
  bool no_gpus = false;
  bool json = false;
};

struct Row {
  std::string section;
  std::string label;
  std::string value;
};

template <typename T>
std::string Or(const std::optional<T>& value, const std::string& absent) {
  if (!value) return absent;
  if constexpr (std::is_same_v<T, std::string>) {
    return *value;
  } else {
    std::ostringstream text;
    text << *value;
    return text.str();
  }
}

std::string Bytes(const std::optional<uint64_t>& bytes, const std::string& absent = "unknown") {
  return bytes ? FormatBytes(*bytes) : absent;
}

std::string YesNo(const std::optional<bool>& value) {
  return value ? (*value ? "yes" : "no") : "unknown";
}

std::vector<Row> FactRows(const MachineFacts& f) {
  std::vector<Row> rows = {
      {"cpu", "logical CPUs", Or(f.cpu.logical, "unknown")},
      {"", "physical cores", Or(f.cpu.physical_cores, "unknown")},
      {"", "affinity", Or(f.cpu.affinity, "unknown")},
      {"", "cgroup quota", f.cpu.quota_cores ? Or(f.cpu.quota_cores, "") + " cores" : "none"},
      {"", "budget", f.cpu.budget_cores ? Or(f.cpu.budget_cores, "") + " cores" : "unknown"},
      {"", "model", Or(f.cpu.model, "unknown")},
      {"memory", "total", Bytes(f.memory.total_bytes)},
      {"", "available", Bytes(f.memory.available_bytes)},
      {"", "cgroup limit", Bytes(f.memory.cgroup_limit_bytes, "none")},
      {"", "cgroup use", Bytes(f.memory.cgroup_current_bytes)},
      {"", "of it file cache", Bytes(f.memory.cgroup_cache_bytes)},
      {"shm", "size", Bytes(f.shm.size_bytes)},
      {"", "free", Bytes(f.shm.free_bytes)},
      {"limits", "processes (nproc)", Or(f.limits.nproc, "unlimited")},
      {"", "open files (nofile)", Or(f.limits.nofile, "unlimited")},
      {"", "in a container", YesNo(f.limits.in_container)},
  };
  if (f.storage) {
    const MachineFacts::Storage& s = *f.storage;
    rows.push_back({"storage", "path", s.path});
    rows.push_back(
        {"", "mount",
         Or(s.mount_point, "unknown") + " (" + Or(s.source, "?") + ", " + Or(s.device, "?") + ")"});
    rows.push_back({"", "file system", Or(s.fs_type, "unknown")});
    rows.push_back({"", "kind", StorageKindName(s.kind)});
    rows.push_back({"", "disk",
                    std::string(DiskKindLabel(s.disk)) +
                        (s.disk_evidence.empty() ? "" : ": " + s.disk_evidence)});
    rows.push_back({"", "rotational flag", YesNo(s.rotational)});
  }
  if (f.gpus.empty()) rows.push_back({"gpus", "", "none found"});
  for (const MachineFacts::Gpu& g : f.gpus) {
    std::string value = Or(g.name, "unknown") + ", " + Bytes(g.memory_used_bytes) + " of " +
                        Bytes(g.memory_total_bytes) + " used, " +
                        (g.utilization_percent ? Or(g.utilization_percent, "") + " % busy"
                                               : std::string("utilisation unknown"));
    rows.push_back({f.gpus.front().index == g.index ? "gpus" : "", std::to_string(g.index), value});
  }
  rows.push_back({"ranks", "launcher", f.ranks.launcher});
  rows.push_back(
      {"", "rank / world size", Or(f.ranks.rank, "?") + " / " + Or(f.ranks.world_size, "?")});
  rows.push_back({"", "local rank / size",
                  Or(f.ranks.local_rank, "?") + " / " + Or(f.ranks.local_world_size, "?")});
  if (!f.ranks.problem.empty()) rows.push_back({"", "problem", PrintableLine(f.ranks.problem)});
  return rows;
}

void PrintTable(const std::vector<Row>& rows) {
  size_t section_width = 0;
  size_t label_width = 0;
  for (const Row& r : rows) {
    section_width = std::max(section_width, r.section.size());
    label_width = std::max(label_width, r.label.size());
  }
  for (const Row& r : rows) {
    std::cout << "  " << r.section << std::string(section_width - r.section.size() + 2, ' ')
              << r.label << std::string(label_width - r.label.size() + 2, ' ') << r.value << "\n";
  }
}

int RunProbe(const ProbeCommandOptions& o) {
  ProbeOptions options;
  if (!o.data_path.empty()) options.data_path = o.data_path;
  options.skip_gpus = o.no_gpus;
  MachineFacts facts = ProbeMachine(options);
  if (o.json) {
    PrintJson(FactsToJson(facts));
    return 0;
  }
  std::cout << "stoker probe: what this process may use\n\n";
  PrintTable(FactRows(facts));
  if (!facts.notes.empty()) {
    std::cout << "\nunreadable (reported as unknown):\n";
    for (const std::string& note : facts.notes) std::cout << "  " << note << "\n";
  }
  return 0;
}

}  // namespace

void AddProbeCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ProbeCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "probe", "Show the machine facts that bound the loader: CPUs, memory, shm, storage, GPUs.");
  cmd->add_option("--data", opts->data_path, "describe the storage holding this path")
      ->check(ExistingPlace());
  cmd->add_flag("--no-gpus", opts->no_gpus, "skip the NVML query");
  cmd->add_flag("--json", opts->json, "print JSON on stdout");
  cmd->callback([opts, &exit_code] { exit_code = RunProbe(*opts); });
}

}  // namespace stoker::cli
