#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stoker/gpu_sampler.h"
#include "stoker/status.h"

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
  /// How errors about the budget name memory_budget_bytes: as the caller's
  /// API spells the option (stoker.Loader's "option 'memory_budget'").
  std::string memory_budget_name = "tuner option 'memory_budget_bytes'";
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
  /// Remote slots kept in use whatever the tuner judges, while the kind's
  /// cluster offers them (>= 0; for tests and benchmarks; 0: the tuner's).
  int remote_min = 0;
  /// Where to append the decision trace as JSON lines; empty = keep in memory only.
  /// Opened when the loader is made (an unwritable path is an error then) and
  /// written by a background thread, never the consumer's.
  std::string trace_path;
};

/// One decision, with the reason and the figures behind it.
///
/// The figures count the engine's items, which `unit` names: "sample" for a
/// loader over a Source (stoker.Loader, the CLI), "batch" for
/// stoker.DataLoader (its items are whole user batches), "item" for a worker
/// kind that does not say. The fields keep their names for every unit:
/// samples_per_s is `unit`s per second, cpu_per_sample_ms CPU ms per `unit`;
/// the reason says the unit in words ("ms CPU per batch").
struct TunerDecision {
  double t_s = 0;  // seconds since the tuner started
  int workers_before = 0;
  int workers_after = 0;
  int prefetch_before = 0;
  int prefetch_after = 0;
  std::string reason;
  std::string unit = "sample";  // what the figures count (see above)
  double samples_per_s = 0;
  double stall_fraction = 0;
  double cpu_per_sample_ms = 0;
  double wall_per_sample_ms = 0;
  double demand_per_s = 0;  // the consumer's rate (units/s) when it is not waiting
  /// The CPU budget the decision aimed at: this loader's share of the node's
  /// budget (NodeView::share_cores), less a busy trainer's CPU.
  double cpu_budget_cores = 0;
  /// Loaders sharing the node's budget then (this one included); 0 without
  /// a node registry.
  int node_loaders = 0;
  /// Remote slots (a kind with a cluster) before and after: local workers
  /// first, slots only while the local CPU budget is spent and the consumer
  /// waits (docs/remote.md).
  int remote_before = 0;
  int remote_after = 0;
  /// Each GPU's utilisation and memory when the decision was made (NVML;
  /// empty without it). Recorded for people, never an input of a decision.
  std::vector<GpuUsage> gpus;
};

/// This loader among the stoker loaders on its machine, which split the
/// node's CPU budget by need through a shared registry (docs/tuner.md,
/// "Loaders sharing a node").
struct NodeView {
  /// The registry's file; empty when there is none (`note` says why: the
  /// share is then the budget / LOCAL_WORLD_SIZE).
  std::string registry;
  /// Why there is no registry, or why the last tick could not reach it.
  std::string note;
  double share_cores = 0;   // this loader's share of the node's CPU budget
  double budget_cores = 0;  // the node's CPU budget (affinity and quota)
  // The loaders sharing that budget (this one included), their workers and
  // their workers' CPU use (cores); 0 without a registry.
  int loaders = 0;
  int workers = 0;
  double cpu_cores = 0;
};

/// The tuner's current picture, for people and for `stats()`.
struct TunerView {
  int workers = 0;
  int prefetch_batches = 0;
  int cpu_budget_workers = 0;
  int max_workers = 0;
  int remote_slots = 0;  // remote slots in use (a kind with a cluster)
  size_t memory_budget_bytes = 0;
  std::string unit = "sample";  // what samples_per_s counts (TunerDecision::unit)
  double samples_per_s = 0;     // over the last pooled window
  double stall_fraction = 0;
  /// "measuring" (before the first model jump), "refining", "steady" (a knee
  /// or floor found), "trying more workers" or "trying fewer workers".
  std::string phase;
  std::optional<TunerDecision> last_decision;
  int64_t decisions = 0;
  NodeView node;
};

/// A loader on this machine as the node registry lists it: what `stoker
/// monitor` shows. Figures are its own, over its last second or so.
struct NodeLoaderInfo {
  int pid = 0;
  uint64_t loader_id = 0;  // unique within its process
  int local_rank = -1;     // LOCAL_RANK, or -1
  bool tuned = true;       // false: a fixed worker count
  int workers = 0;
  int prefetch_batches = 0;
  double samples_per_s = 0;  // the user's samples delivered
  double stall = 0;          // the share of time its consumer waited for data
  double cpu_cores = 0;      // its workers' CPU use
  double want_cores = 0;     // its need (+inf: data-bound); tuned loaders only
  double share_cores = 0;    // its share of the node's budget; tuned loaders only
  double budget_cores = 0;   // the node's CPU budget as it reads it; tuned loaders only
  double heartbeat_age_s = 0;
  std::string command;  // its process's command line ("" when /proc does not show it)
};

/// Every loader in the node registry (this user's loaders on this machine).
struct NodeLoaders {
  std::vector<std::string> registries;  // the tables read (those that exist)
  std::vector<std::string> notes;       // a table that could not be read, and why
  std::vector<NodeLoaderInfo> loaders;  // by pid, then loader
};

/// Reads the node registry's tables (NodeRegistry::DefaultPaths, so
/// $STOKER_NODE_REGISTRY too) without joining them. No table is no loaders;
/// the error is only that the registry is turned off. Safe from any thread.
Result<NodeLoaders> ReadNodeLoaders();

}  // namespace stoker
