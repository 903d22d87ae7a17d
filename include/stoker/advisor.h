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
  /// The most workers the machine's limits allow (RLIMIT_NOFILE): the tuner
  /// never goes past it.
  int max_workers = kMaxWorkers;
  int prefetch_batches = 2;
  size_t prefetch_bytes = 0;       // prefetch_batches * bytes of one batch
  size_t memory_budget_bytes = 0;  // what workers and batches in flight may use
  size_t batch_bytes = 0;          // bytes of one batch, as assumed
  std::vector<AdviceRule> rules;   // in the order applied
  /// False when not even 1 worker and the 2 batches a loader holds fit the
  /// memory budget: no setting runs, the batch must shrink (the memory rule
  /// says so).
  bool fits = true;
  /// Says that this is a starting point that the tuner refines while training runs.
  std::string note;
};

/// The initial worker count and prefetch depth for `facts` and `inputs`, with
/// every rule that shaped it. A pure function: the same arguments give the
/// same advice. Unknown facts fall back to conservative assumptions that the
/// rule states. Always advises at least one worker and one batch.
Advice Advise(const MachineFacts& facts, const AdviseInputs& inputs = {});

/// {"workers", "fits", "prefetch_batches", "prefetch_bytes", "memory_budget_bytes",
/// "batch_bytes", "max_workers", "workers_kind", "rules": [{"name", "input", "outcome",
/// "value", "limited"}], "note"}.
nlohmann::json AdviceToJson(const Advice& advice, const AdviseInputs& inputs);

/// The loaders a worker count may be for. Each runs its workers its own way,
/// so a count measured on one is not a count for another: stoker's native
/// pipeline decodes in C++ threads; the two DataLoaders run the user's
/// Python Dataset in worker processes (stoker.DataLoader's forked from a
/// zygote and fed by stoker's engine, torch's its own).
enum class LoaderKind {
  kNative,            // stoker.Loader, `stoker run`, `stoker bench`: worker threads
  kStokerDataLoader,  // stoker.DataLoader over the user's Dataset
  kTorchDataLoader,   // torch.utils.data.DataLoader over the user's Dataset
};

/// The loader as users write it: "stoker.Loader", "stoker.DataLoader" or
/// "torch.utils.data.DataLoader".
const char* LoaderKindName(LoaderKind kind);

/// The answer to "which num_workers?" for one loader: the arguments to
/// paste, what the count rests on, and the rule behind each argument. The
/// one form in which `stoker advise`, `stoker bench` and stoker.bench answer
/// (their text is Text(), their JSON LoaderArgsToJson), so that each names
/// the loader it is for and what it measured, and none answers for a loader
/// it did not measure.
struct LoaderArgs {
  LoaderKind loader = LoaderKind::kTorchDataLoader;  // what the line is for
  /// True: the count is a sweep's best, measured on `loader` itself. False:
  /// the advisor's rules on the machine's facts, nothing measured.
  bool measured = false;
  /// What it rests on, for people: "measured on Squares (48 samples), batch
  /// 4, by this sweep" or "not measured, a static guess from the advisor's
  /// rules on this machine's facts".
  std::string basis;
  int num_workers = 0;
  int prefetch_factor = 2;  // torch: batches per worker (torch counts it so); unused at 0 workers
  bool pin_memory = false;
  bool persistent_workers = true;  // torch only
  std::vector<std::string> rules;  // one line per argument, why it has its value
  /// What the count is not, and how to measure what it is not for (may be empty).
  std::string note;

  /// In the loader's own terms: "DataLoader(num_workers=2, prefetch_factor=2,
  /// pin_memory=False, persistent_workers=True)", "stoker.DataLoader(
  /// num_workers=3, pin_memory=False)" or "stoker.Loader(workers=3,
  /// pin_memory=False)".
  std::string Line() const;
  /// For people: "For <loader> (<basis>), paste:", the line, the rules, the
  /// note; lines end with '\n'.
  std::string Text() const;
};

/// The advisor's count for `loader` (nothing measured): `workers` workers
/// and a prefetch depth of `prefetch_batches` batches in all, as Advise gave
/// them for that loader's kind of worker (threads for kNative, processes
/// for the DataLoaders); `gpus`: devices were found (pin_memory pays then).
LoaderArgs LoaderArgsFromAdvice(LoaderKind loader, int workers, int prefetch_batches, int gpus);

/// What a sweep measured: the loader, and the data it ran over.
struct SweepSubject {
  LoaderKind loader = LoaderKind::kNative;
  /// The data, as people know it: "images in /data (2000), train 224",
  /// "Squares (48 samples)".
  std::string data;
  int64_t batch_size = 0;  // 0: not said
};

/// A sweep's answer, for the loader it measured (subject.loader) and no
/// other: num_workers = the best count, at the prefetch depth that count ran
/// with (`prefetch_batches` in all), so that the same number of batches
/// stays in flight.
LoaderArgs LoaderArgsFromSweep(const SweepSubject& subject, int best_workers, double samples_per_s,
                               double stall_fraction, int prefetch_batches, int gpus);

/// {"loader" (LoaderKindName), "measured", "basis", "num_workers",
/// "prefetch_factor" (null but for torch's DataLoader with workers),
/// "pin_memory", "persistent_workers" (null but for torch's), "line",
/// "rules": [...], "note"}.
nlohmann::json LoaderArgsToJson(const LoaderArgs& args);

}  // namespace stoker
