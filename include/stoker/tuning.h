#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stoker/gpu_sampler.h"

namespace stoker {

/// How the tuner may act (LoaderOptions::tuner, read when workers ==
/// kAutoWorkers; memory_budget_bytes applies to every loader). Loader::Make
/// checks every field whatever the worker count.
struct TunerOptions {
  /// Memory budget for buffers in flight and workers' footprint, for every
  /// loader (fixed worker counts too); 0 = the default, 80 % of what is
  /// available (or of the cgroup limit). Must hold two batch buffers
  /// (batch_size x the sample's bytes: one delivered, one being written).
  /// Loader::Make splits it into batch buffers and each worker's per-sample
  /// cap (docs/engine.md, "Memory budget").
  size_t memory_budget_bytes = 0;
  /// Most workers it may use, at most kMaxWorkers; 0 = from the machine (CPU
  /// budget, or many times more for I/O-bound work), up to kMaxWorkers.
  int max_workers = 0;
  /// The count it starts from, at most kMaxWorkers; 0 = the advisor's (the
  /// CPU budget less a core for the trainer). stoker.DataLoader passes the
  /// CPU budget: its workers are processes, slower to add than threads, and
  /// a Python batch takes long enough that the first model jump comes late.
  int initial_workers = 0;
  /// How often it looks at the metrics, in seconds (finite, > 0).
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
  /// Each GPU's utilisation and memory when the decision was made (NVML;
  /// empty without it). Recorded for people, never an input of a decision.
  std::vector<GpuUsage> gpus;
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

}  // namespace stoker
