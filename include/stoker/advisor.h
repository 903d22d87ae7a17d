#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stoker/defaults.h"
#include "stoker/probe.h"

namespace stoker {

/// How the loader's workers run: threads share one address space; processes
/// (PyTorch-style) each carry an interpreter and pass batches through /dev/shm.
enum class WorkersKind { kThreads, kProcesses };

/// "threads" or "processes".
const char* WorkersKindName(WorkersKind kind);

/// What the user knows about the job. Unset values are assumed (and the
/// rule that uses one says so).
struct AdviseInputs {
  std::optional<int64_t> batch_size;   // samples per batch; assumed 64
  std::optional<size_t> sample_bytes;  // one transformed sample; assumed 3x224x224 uint8
  WorkersKind workers_kind = WorkersKind::kThreads;
  /// Resident memory of one worker besides its batches; assumed 16 MiB for a
  /// thread (decode buffers) and 256 MiB for a process (interpreter, dataset).
  std::optional<size_t> worker_footprint_bytes;
  /// Share of the available memory that workers and batches may take.
  double memory_fraction = kMemoryBudgetShare;
};

/// One step of the advice: what it looked at and what it decided.
struct AdviceRule {
  std::string name;             // "cpu budget", "memory", ...
  std::string input;            // the facts it used, e.g. "quota 1.5 cores, affinity 16 CPUs"
  std::string outcome;          // what it decided and why, e.g. "0.5 cores for workers -> 1 worker"
  std::optional<double> value;  // the number it set or capped to
  bool limited = false;         // true when this rule lowered the advice
};

/// The starting point for a loader on this machine.
struct Advice {
  int workers = 1;
  int prefetch_batches = 2;
  size_t prefetch_bytes = 0;       // prefetch_batches * bytes of one batch
  size_t memory_budget_bytes = 0;  // what workers and batches in flight may use
  size_t batch_bytes = 0;          // bytes of one batch, as assumed
  std::vector<AdviceRule> rules;   // in the order applied
  /// Says that this is a starting point that the tuner refines while training runs.
  std::string note;
};

/// The initial worker count and prefetch depth for `facts` and `inputs`, with
/// every rule that shaped it. A pure function: the same arguments give the
/// same advice. Unknown facts fall back to conservative assumptions that the
/// rule states. Always advises at least one worker and one batch.
Advice Advise(const MachineFacts& facts, const AdviseInputs& inputs = {});

/// {"workers", "prefetch_batches", "prefetch_bytes", "memory_budget_bytes",
/// "batch_bytes", "workers_kind", "rules": [{"name", "input", "outcome",
/// "value", "limited"}], "note"}.
nlohmann::json AdviceToJson(const Advice& advice, const AdviseInputs& inputs);

/// The same advice as arguments of torch.utils.data.DataLoader, for the user
/// to paste, with the rule behind each.
struct DataLoaderArgs {
  int num_workers = 0;
  int prefetch_factor = 2;  // batches per worker (torch counts it so); unused at 0 workers
  bool pin_memory = false;
  bool persistent_workers = true;
  std::vector<std::string> rules;  // one line per argument, why it has its value
  /// "DataLoader(num_workers=2, prefetch_factor=2, pin_memory=False, persistent_workers=True)".
  std::string Line() const;
};

/// `workers` worker processes and a prefetch depth of `prefetch_batches`
/// batches in all; `gpus`: devices were found (pin_memory pays then).
/// `workers_rule`: where the count comes from, for its rule line (empty: the
/// advisor's CPU and memory budgets, as `stoker advise` derives it).
DataLoaderArgs DataLoaderArgsFor(int workers, int prefetch_batches, int gpus,
                                 const std::string& workers_rule = {});

/// The arguments a sweep supports: num_workers = the best count it measured,
/// at the prefetch depth that count ran with (DefaultPrefetch), so that
/// torch keeps the same number of batches in flight. `measured_with` names
/// what ran the sweep (e.g. "stoker's worker threads").
DataLoaderArgs DataLoaderArgsFromSweep(int best_workers, double samples_per_s,
                                       double stall_fraction, int prefetch_batches, int gpus,
                                       const std::string& measured_with);

/// {"num_workers", "prefetch_factor" (null at 0 workers), "pin_memory",
/// "persistent_workers", "line", "rules": [...]}.
nlohmann::json DataLoaderArgsToJson(const DataLoaderArgs& args);

}  // namespace stoker
