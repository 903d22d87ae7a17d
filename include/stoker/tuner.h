#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stoker/defaults.h"
#include "stoker/loader.h"
#include "stoker/status.h"

namespace stoker {

/// How the tuner may act.
struct TunerOptions {
  /// Memory budget for buffers in flight and workers' footprint; 0 = the
  /// default, 80 % of what is available (or of the cgroup limit).
  size_t memory_budget_bytes = 0;
  /// Most workers it may use; 0 = from the machine (CPU budget, or many times
  /// more for I/O-bound work).
  int max_workers = 0;
  /// How often it looks at the metrics, in seconds.
  double interval_s = 0.2;
  /// Where to append the decision trace as JSON lines; empty = keep in memory only.
  /// Opened when the loader is made (an unwritable path is an error then) and
  /// written by a background thread, never the consumer's.
  std::string trace_path;
};

/// One decision, with the reason and the figures behind it.
struct TunerDecision {
  double t_s = 0;  // seconds since the tuner started
  int workers_before = 0;
  int workers_after = 0;
  int prefetch_before = 0;
  int prefetch_after = 0;
  std::string reason;
  double samples_per_s = 0;
  double stall_fraction = 0;
  double cpu_per_sample_ms = 0;
  double wall_per_sample_ms = 0;
  double demand_per_s = 0;  // the consumer's rate when it is not waiting
};

/// The tuner's current picture, for people and for `stats()`.
struct TunerView {
  int workers = 0;
  int prefetch_batches = 0;
  int cpu_budget_workers = 0;
  int max_workers = 0;
  size_t memory_budget_bytes = 0;
  double samples_per_s = 0;
  double stall_fraction = 0;
  /// "measuring" (before the first model jump), "refining", "steady" (a knee
  /// or floor found), "trying more workers" or "trying fewer workers".
  std::string phase;
  std::optional<TunerDecision> last_decision;
  int64_t decisions = 0;
};

/// Makes a loader. With options.workers == kAutoWorkers the worker count and
/// prefetch depth start from the advisor and are then tuned on-line by a
/// tuner that runs on the consumer's thread inside Next() (no extra thread,
/// but one that writes the trace file when tuner.trace_path is set; an
/// unwritable trace_path is an error naming it). Otherwise it is Loader::Make.
Result<std::unique_ptr<Loader>> OpenLoader(LoaderOptions options, TunerOptions tuner = {});

/// The tuner's view of `loader`, or nullopt when it has no tuner.
std::optional<TunerView> GetTunerView(const Loader& loader);
/// Every decision so far (empty when the loader has no tuner).
std::vector<TunerDecision> GetTunerTrace(const Loader& loader);

/// One decision as a JSON object (the trace file's line format): t_s,
/// workers_before/after, prefetch_before/after, reason, samples_per_s,
/// stall_fraction, cpu_per_sample_ms, wall_per_sample_ms, demand_per_s.
nlohmann::json TunerDecisionToJson(const TunerDecision& decision);

}  // namespace stoker
