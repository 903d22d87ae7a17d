#pragma once

#include <nlohmann/json_fwd.hpp>

#include "stoker/tuning.h"

namespace stoker {

// The tuner is attached by Loader::Make when LoaderOptions::workers ==
// kAutoWorkers; Loader::tuner_view() and Loader::tuner_trace() read it.

/// One decision as a JSON object (the trace file's line format): t_s,
/// workers_before/after, prefetch_before/after, reason, samples_per_s,
/// stall_fraction, cpu_per_sample_ms, wall_per_sample_ms, demand_per_s,
/// cpu_budget_cores, node_loaders.
nlohmann::json TunerDecisionToJson(const TunerDecision& decision);

}  // namespace stoker
