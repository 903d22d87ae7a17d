#include <limits>

#include "hw/fact_readers.h"
#include "hw/sys_file.h"

namespace stoker::hw {
namespace {

struct RankVariables {
  const char* launcher;
  const char* rank;
  const char* local_rank;
  const char* world_size;
  const char* local_world_size;
};

constexpr RankVariables kLaunchers[] = {
    {"torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
};

// `problem`, if given, is told why a variable that is needed is unknown.
std::optional<int> ReadIntVariable(const ProbeOptions& o, const char* name, uint64_t min,
                                   Notes& notes, std::string* problem = nullptr) {
  std::optional<std::string> text = o.getenv(name);
  if (!text) {
    if (problem != nullptr && problem->empty()) *problem = std::string("$") + name + " is not set";
    return std::nullopt;
  }
  std::optional<uint64_t> v = ParseUint(*text);
  if (!v || *v < min || *v > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    notes.push_back(std::string("$") + name + ": '" + text->substr(0, 64) +
                    "' is not an integer >= " + std::to_string(min));
    if (problem != nullptr && problem->empty()) *problem = notes.back();
    return std::nullopt;
  }
  return static_cast<int>(*v);
}

}  // namespace

MachineFacts::Ranks ReadRankFacts(const ProbeOptions& options, Notes& notes) {
  MachineFacts::Ranks ranks;
  for (const RankVariables& vars : kLaunchers) {
    // A launcher is recognised by its world size or rank variable; the
    // others are then read as they are, unknown when absent or malformed.
    if (!options.getenv(vars.world_size) && !options.getenv(vars.rank)) continue;
    ranks.launcher = vars.launcher;
    ranks.rank = ReadIntVariable(options, vars.rank, 0, notes, &ranks.problem);
    ranks.local_rank = ReadIntVariable(options, vars.local_rank, 0, notes);
    ranks.world_size = ReadIntVariable(options, vars.world_size, 1, notes, &ranks.problem);
    ranks.local_world_size = ReadIntVariable(options, vars.local_world_size, 1, notes);
    if (ranks.problem.empty() && *ranks.rank >= *ranks.world_size) {
      ranks.problem = std::string("$") + vars.rank + " " + std::to_string(*ranks.rank) +
                      " is not below $" + vars.world_size + " " + std::to_string(*ranks.world_size);
    }
    return ranks;
  }
  ranks.rank = 0;
  ranks.local_rank = 0;
  ranks.world_size = 1;
  ranks.local_world_size = 1;
  return ranks;
}

}  // namespace stoker::hw
