#pragma once

#include <string>
#include <vector>

#include "hw/cgroup.h"
#include "stoker/probe.h"

// One reader per fact area, each filling its part of MachineFacts. They take
// options whose getenv, space_of and rlimit are set (ProbeMachine fills the
// defaults) and append to `notes` what they found but could not parse.

namespace stoker::hw {

using Notes = std::vector<std::string>;

MachineFacts::Cpu ReadCpuFacts(const ProbeOptions& options, const CgroupMembership& cgroups,
                               Notes& notes);
MachineFacts::Memory ReadMemoryFacts(const ProbeOptions& options, const CgroupMembership& cgroups,
                                     Notes& notes);
MachineFacts::Shm ReadShmFacts(const ProbeOptions& options);
MachineFacts::Limits ReadLimitFacts(const ProbeOptions& options, const CgroupMembership& cgroups);
MachineFacts::Storage ReadStorageFacts(const ProbeOptions& options, const std::string& path,
                                       Notes& notes);
std::vector<MachineFacts::Gpu> ReadGpuFacts(Notes& notes);
MachineFacts::Ranks ReadRankFacts(const ProbeOptions& options, Notes& notes);

}  // namespace stoker::hw
