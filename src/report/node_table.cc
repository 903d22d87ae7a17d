#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "stoker/report.h"

namespace stoker {
namespace {

// A figure that may be missing (a fixed count's share) or infinite (a
// data-bound loader's need) as JSON: null then.
nlohmann::json FiniteOrNull(double value, bool present = true) {
  return present && std::isfinite(value) ? nlohmann::json(value) : nlohmann::json();
}

}  // namespace

nlohmann::json NodeLoadersToJson(const NodeLoaders& node) {
  nlohmann::json loaders = nlohmann::json::array();
  for (const NodeLoaderInfo& l : node.loaders) {
    loaders.push_back({{"pid", l.pid},
                       {"loader_id", l.loader_id},
                       {"local_rank", l.local_rank >= 0 ? nlohmann::json(l.local_rank) : nullptr},
                       {"tuned", l.tuned},
                       {"workers", l.workers},
                       {"prefetch_batches", l.prefetch_batches},
                       {"samples_per_s", l.samples_per_s},
                       {"stall_fraction", l.stall},
                       {"cpu_cores", l.cpu_cores},
                       {"want_cores", FiniteOrNull(l.want_cores, l.tuned)},
                       {"share_cores", FiniteOrNull(l.share_cores, l.tuned)},
                       {"budget_cores", FiniteOrNull(l.budget_cores, l.tuned)},
                       {"heartbeat_age_s", l.heartbeat_age_s},
                       {"command", l.command}});
  }
  return {{"registries", node.registries}, {"notes", node.notes}, {"loaders", loaders}};
}

std::string FormatNodeLoaders(const NodeLoaders& node, size_t columns) {
  std::string out;
  char line[256];
  if (node.loaders.empty()) {
    out += "no stoker loader is running on this machine as this user";
  } else {
    std::snprintf(line, sizeof line, "%8s %4s %7s %8s %10s %6s %6s %10s  %s\n", "PID", "RANK",
                  "WORKERS", "PREFETCH", "SAMPLES/S", "STALL", "CPU", "SHARE", "COMMAND");
    out += line;
    int workers = 0;
    double rate = 0, cpu = 0;
    for (const NodeLoaderInfo& l : node.loaders) {
      const std::string rank = l.local_rank >= 0 ? std::to_string(l.local_rank) : "-";
      char share[32];
      if (!l.tuned) {
        std::snprintf(share, sizeof share, "fixed");
      } else {
        std::snprintf(share, sizeof share, "%.1f/%.1f", l.share_cores, l.budget_cores);
      }
      const int n = std::snprintf(line, sizeof line, "%8d %4s %7d %8d %10.0f %5.0f%% %6.1f %10s  ",
                                  l.pid, rank.c_str(), l.workers, l.prefetch_batches,
                                  l.samples_per_s, 100 * l.stall, l.cpu_cores, share);
      // The program's name without its folder: the arguments are what tell runs apart.
      std::string command = l.command.empty() ? "?" : l.command;
      const size_t space = command.find(' ');
      const size_t slash = command.rfind('/', space);
      if (slash != std::string::npos) command.erase(0, slash + 1);
      std::replace(command.begin(), command.end(), '\n', ' ');  // one row per loader
      std::replace(command.begin(), command.end(), '\t', ' ');
      command = Printable(command);
      const size_t room = columns > static_cast<size_t>(n) + 4 ? columns - n : 4;
      if (columns > 0 && command.size() > room) command = command.substr(0, room - 3) + "...";
      out += line + command + "\n";
      workers += l.workers;
      rate += l.samples_per_s;
      cpu += l.cpu_cores;
    }
    std::snprintf(line, sizeof line, "%8s %4s %7d %8s %10.0f %6s %6.1f\n", "total", "", workers, "",
                  rate, "", cpu);
    out += line;
    std::snprintf(line, sizeof line, "%zu loader%s", node.loaders.size(),
                  node.loaders.size() == 1 ? "" : "s");
    out += line;
  }
  if (!node.registries.empty()) {
    out += " (node registry ";
    for (size_t i = 0; i < node.registries.size(); ++i) {
      out += (i > 0 ? ", " : "") + Printable(node.registries[i]);
    }
    out += ")";
  }
  out += "\n";
  for (const std::string& note : node.notes) out += "note: " + Printable(note) + "\n";
  return out;
}

}  // namespace stoker
