#include "stoker/advisor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/number_text.h"
#include "stoker/defaults.h"
#include "stoker/sweep.h"

namespace stoker {
namespace {

constexpr int64_t kAssumedBatchSize = 64;
constexpr size_t kAssumedSampleBytes = 3 * 224 * 224;  // an ImageNet crop, uint8 CHW
constexpr size_t kThreadFootprint = size_t{16} << 20;
constexpr size_t kProcessFootprint = size_t{256} << 20;
constexpr uint64_t kAssumedMemory = uint64_t{4} << 30;
constexpr double kAssumedCores = 1.0;
constexpr double kTrainerCores = 1.0;
// Concurrent readers beyond two make an HDD's head seek between files.
constexpr int kHddReaders = 2;
// Latency-bound reads: a worker mostly waits, so several per core help.
constexpr int kLatencyWorkersPerCore = 4;
constexpr int kLatencyMinWorkers = 8;
constexpr int kLatencyMaxWorkers = 64;
// When memory is short, a worker keeps at most this many batches in flight.
constexpr int kPrefetchPerWorker = 2;
constexpr double kShmFraction = 0.8;
// Open files a worker may hold: the one it reads, a process worker's socket
// and shared-memory segments; the rest of RLIMIT_NOFILE is the process's.
constexpr int kFilesPerWorker = 4;

std::string Num(double value) { return FormatNumber(value, 3); }

std::string Cores(double n) { return Num(n) + (n == 1 ? " core" : " cores"); }

std::string Workers(int n) { return std::to_string(n) + (n == 1 ? " worker" : " workers"); }

std::string DescribeCpu(const MachineFacts::Cpu& cpu) {
  auto part = [](const char* label, const std::optional<double>& v, const char* unit) {
    return std::string(label) + " " + (v ? Num(*v) + unit : std::string("unknown"));
  };
  auto as_double = [](const std::optional<int>& v) {
    return v ? std::optional<double>(*v) : std::nullopt;
  };
  return part("affinity", as_double(cpu.affinity), " CPUs") + ", " +
         (cpu.quota_cores ? "cgroup quota " + Num(*cpu.quota_cores) + " cores"
                          : std::string("no cgroup quota")) +
         ", " + part("logical", as_double(cpu.logical), " CPUs");
}

// The advice as the rules build it: each rule reads the facts and what the
// rules before it decided, appends its AdviceRule and may change the figures.
struct Draft {
  Advice advice;
  double budget = 0;    // cores the process may use
  double per_rank = 0;  // of them, this rank's
  int workers = 1;
  int prefetch = 2;

  void Rule(std::string name, std::string input, std::string outcome, std::optional<double> value,
            bool limited = false) {
    advice.rules.push_back({std::move(name), std::move(input), std::move(outcome), value, limited});
  }
};

// CPU: the budget is what the scheduler will really give this process.
void CpuBudgetRule(const MachineFacts& facts, const AdviseInputs&, Draft& d) {
  d.budget = facts.cpu.budget_cores.value_or(kAssumedCores);
  d.Rule("cpu budget", DescribeCpu(facts.cpu),
         facts.cpu.budget_cores ? "min(affinity, quota) = " + Cores(d.budget)
                                : "unknown; assuming " + Cores(d.budget),
         d.budget);
}

void LocalRanksRule(const MachineFacts& facts, const AdviseInputs&, Draft& d) {
  const int local_ranks = facts.ranks.local_world_size.value_or(1);
  d.per_rank = d.budget / local_ranks;
  d.Rule("local ranks",
         facts.ranks.local_world_size
             ? std::to_string(local_ranks) + (local_ranks == 1 ? " rank" : " ranks") +
                   " on this node (launcher: " + facts.ranks.launcher + ")"
             : std::string("local world size unknown; assuming 1 rank"),
         Cores(d.budget) + " / " + std::to_string(local_ranks) + " = " + Cores(d.per_rank) +
             " for this rank",
         d.per_rank, local_ranks > 1);
}

void TrainerShareRule(const MachineFacts&, const AdviseInputs&, Draft& d) {
  const double for_workers = d.per_rank - kTrainerCores;
  d.workers = std::max(1, static_cast<int>(std::floor(for_workers + 1e-9)));
  d.Rule("trainer share", Cores(d.per_rank) + " for this rank",
         Num(d.per_rank) + " - " + Num(kTrainerCores) + " core for the trainer = " +
             Cores(std::max(0.0, for_workers)) + " -> " + Workers(d.workers) +
             (for_workers < 1 ? " (at least one, so loading overlaps the training step)" : ""),
         d.workers, true);
}

std::string DescribeStorage(const MachineFacts::Storage& s) {
  std::string text = s.path + " on " + s.fs_type.value_or("unknown file system") +
                     (s.mount_point ? " at " + *s.mount_point : std::string()) + ", " +
                     StorageKindName(s.kind);
  if (!s.disk_evidence.empty()) {
    text += std::string(", disk ") + DiskKindLabel(s.disk) + " (" + s.disk_evidence + ")";
  }
  return text;
}

// Storage: what bounds a reader is seek time on a disk and round trips on a
// network or FUSE file system, not CPU.
void StorageRule(const MachineFacts& facts, const AdviseInputs&, Draft& d) {
  if (!facts.storage) {
    d.Rule("storage", "no data path given", "not considered", std::nullopt);
    return;
  }
  const MachineFacts::Storage& s = *facts.storage;
  using Kind = MachineFacts::StorageKind;
  if (s.kind == Kind::kNetwork || s.kind == Kind::kFuse) {
    const int latency_workers =
        std::clamp(static_cast<int>(std::ceil(kLatencyWorkersPerCore * d.per_rank)),
                   kLatencyMinWorkers, kLatencyMaxWorkers);
    d.workers = std::max(d.workers, latency_workers);
    d.Rule("storage", DescribeStorage(s),
           std::string("latency-bound: workers mostly wait on I/O, so ") +
               std::to_string(kLatencyWorkersPerCore) + " per core (" +
               std::to_string(kLatencyMinWorkers) + " to " + std::to_string(kLatencyMaxWorkers) +
               ") -> " + Workers(d.workers),
           d.workers);
  } else if (s.disk == MachineFacts::DiskKind::kHdd) {
    // Only on evidence (MachineFacts::DiskKind): a virtual disk's rotational
    // flag says nothing of what is behind it.
    const bool limited = d.workers > kHddReaders;
    d.workers = std::min(d.workers, kHddReaders);
    d.Rule("storage", DescribeStorage(s),
           "HDD: more than " + std::to_string(kHddReaders) +
               " concurrent readers make it seek -> " + Workers(d.workers),
           d.workers, limited);
  } else {
    const char* why = s.kind == Kind::kUnknown ? "mount not found; CPU rule stands"
                      : s.disk == MachineFacts::DiskKind::kVirtual
                          ? "virtual disk: its rotational flag says nothing of the storage "
                            "behind it, so no HDD rule; CPU rule stands"
                          : "reads keep up with the CPU; CPU rule stands";
    d.Rule("storage", DescribeStorage(s), why, d.workers);
  }
}

// Every thread or process counts against RLIMIT_NPROC, and so does
// everything else the user runs; keep half of it for them.
void ProcessLimitRule(const MachineFacts& facts, const AdviseInputs&, Draft& d) {
  if (!facts.limits.nproc) {
    d.Rule("process limit", "RLIMIT_NPROC unlimited or unknown", "not capped", std::nullopt);
    return;
  }
  const int cap = static_cast<int>(std::clamp<uint64_t>(*facts.limits.nproc / 2, 1, 1 << 20));
  const bool limited = d.workers > cap;
  d.workers = std::min(d.workers, cap);
  d.Rule("process limit", "RLIMIT_NPROC " + std::to_string(*facts.limits.nproc),
         "at most half of it -> " + Workers(d.workers), d.workers, limited);
}

// Past RLIMIT_NOFILE a worker's open() fails (EMFILE) and the run ends: a
// hard cap, which the tuner never goes past either (Advice::max_workers).
void OpenFilesRule(const MachineFacts& facts, const AdviseInputs&, Draft& d) {
  if (!facts.limits.nofile) {
    d.Rule("open files", "RLIMIT_NOFILE unlimited or unknown", "not capped", std::nullopt);
    return;
  }
  const uint64_t nofile = *facts.limits.nofile;
  const int cap = static_cast<int>(std::clamp<uint64_t>(nofile / kFilesPerWorker, 1, kMaxWorkers));
  d.advice.max_workers = cap;
  const bool limited = d.workers > cap;
  d.workers = std::min(d.workers, cap);
  d.Rule("open files", "RLIMIT_NOFILE " + std::to_string(nofile),
         std::to_string(kFilesPerWorker) + " a worker -> at most " + Workers(cap) +
             (cap < kMaxWorkers ? ", the tuner's cap too" : "") + " -> " + Workers(d.workers),
         d.workers, limited);
}

void PrefetchRule(const MachineFacts&, const AdviseInputs& inputs, Draft& d) {
  const int64_t batch_size = inputs.batch_size.value_or(kAssumedBatchSize);
  d.prefetch = DefaultPrefetch(d.workers, batch_size);
  d.Rule("prefetch depth", Workers(d.workers) + ", batch " + std::to_string(batch_size),
         "2 batches, one more per 4 workers, at most 16, at least 2 samples a worker -> " +
             std::to_string(d.prefetch) + " batches",
         d.prefetch);
}

// What this process may still take: available memory, or the cgroup's room
// when smaller; described for the rule's input. The cgroup's file cache is
// room, as MemAvailable counts the host's: the kernel reclaims it before an
// allocation fails (a job that has read its data holds a cache the size of
// its limit).
uint64_t MemoryRoom(const MachineFacts::Memory& memory, std::string& input) {
  std::optional<uint64_t> room = memory.available_bytes;
  input = memory.available_bytes ? "available " + FormatBytes(*memory.available_bytes)
                                 : std::string("available unknown");
  if (memory.cgroup_limit_bytes) {
    const uint64_t limit = *memory.cgroup_limit_bytes;
    const uint64_t current = memory.cgroup_current_bytes.value_or(0);
    const uint64_t cache = std::min(current, memory.cgroup_cache_bytes.value_or(0));
    const uint64_t used = std::min(limit, current - cache);
    input += ", cgroup limit " + FormatBytes(limit) +
             (!memory.cgroup_current_bytes ? std::string(" (use unknown)")
              : cache > 0 ? " with " + FormatBytes(used) + " used (and " + FormatBytes(cache) +
                                " of file cache, reclaimable)"
                          : " with " + FormatBytes(used) + " used");
    room = room ? std::min(*room, limit - used) : limit - used;
  }
  if (!room) {
    room = kAssumedMemory;
    input += "; assuming " + FormatBytes(kAssumedMemory);
  }
  return *room;
}

// Memory: workers' own footprint plus every batch in flight stays within a
// fraction of what this process may still take.
void MemoryRule(const MachineFacts& facts, const AdviseInputs& inputs, Draft& d) {
  const int64_t batch_size = inputs.batch_size.value_or(kAssumedBatchSize);
  const size_t sample_bytes = inputs.sample_bytes.value_or(kAssumedSampleBytes);
  const size_t batch_bytes = static_cast<size_t>(std::max<int64_t>(batch_size, 1)) * sample_bytes;
  d.advice.batch_bytes = batch_bytes;
  const bool processes = inputs.workers_kind == WorkersKind::kProcesses;
  const size_t footprint =
      inputs.worker_footprint_bytes.value_or(processes ? kProcessFootprint : kThreadFootprint);
  std::string input;
  const uint64_t room = MemoryRoom(facts.memory, input);
  const size_t budget = static_cast<size_t>(inputs.memory_fraction * static_cast<double>(room));
  d.advice.memory_budget_bytes = budget;
  // `p` batches in flight and the one the consumer holds (the engine's
  // smallest loader holds two: CheckBatchFits).
  auto fits = [&](int w, int p) {
    return static_cast<double>(w) * footprint + static_cast<double>(p + 1) * batch_bytes <=
           static_cast<double>(budget);
  };
  input += "; batch " + FormatBytes(batch_bytes) + " (" + std::to_string(batch_size) +
           (inputs.batch_size ? "" : " assumed") + " x " + FormatBytes(sample_bytes) +
           (inputs.sample_bytes ? "" : " assumed") + "), " + FormatBytes(footprint) +
           (inputs.worker_footprint_bytes ? "" : " assumed") + " per " +
           (processes ? "process" : "thread") + " worker";
  const std::string budget_text =
      "budget " + Num(inputs.memory_fraction * 100) + " % = " + FormatBytes(budget);
  if (fits(d.workers, d.prefetch)) {
    d.Rule("memory", input,
           budget_text + "; " + Workers(d.workers) + " and " + std::to_string(d.prefetch) +
               " batches fit",
           d.workers);
    return;
  }
  // Give up spare batches first (one per worker keeps every worker busy),
  // then workers.
  int w = d.workers;
  while (w > 1 && !fits(w, w)) --w;
  int p = kPrefetchPerWorker * w;
  while (p > w && !fits(w, p)) --p;
  std::string outcome = budget_text + " -> " + Workers(w) + ", " + std::to_string(p) + " batches";
  if (!fits(w, p)) {
    p = 1;
    d.advice.fits = false;
    outcome = budget_text +
              ": even 1 worker and 2 batches (1 in flight, 1 held) do not fit; reduce the batch "
              "size";
  }
  d.workers = w;
  d.prefetch = p;
  d.Rule("memory", input, outcome, d.workers, true);
}

// Process workers hand batches over through /dev/shm; a container's default
// is 64 MiB, which holds very few batches.
void SharedMemoryRule(const MachineFacts& facts, const AdviseInputs& inputs, Draft& d) {
  if (inputs.workers_kind != WorkersKind::kProcesses) {
    d.Rule("shared memory", "thread workers", "not used: batches stay in this process",
           std::nullopt);
    return;
  }
  const std::optional<uint64_t> shm =
      facts.shm.free_bytes ? facts.shm.free_bytes : facts.shm.size_bytes;
  if (!shm) {
    d.Rule("shared memory", "/dev/shm size unknown", "not capped", std::nullopt);
    return;
  }
  const size_t batch_bytes = d.advice.batch_bytes;
  const uint64_t usable = static_cast<uint64_t>(kShmFraction * static_cast<double>(*shm));
  const int64_t batches = static_cast<int64_t>(usable / std::max<size_t>(batch_bytes, 1));
  const std::string input =
      "/dev/shm " + FormatBytes(*shm) + " free; batch " + FormatBytes(batch_bytes);
  const std::string share = Num(kShmFraction * 100) + " %";
  if (batches >= d.prefetch) {
    d.Rule("shared memory", input,
           share + " holds " + std::to_string(batches) + " batches; " + std::to_string(d.prefetch) +
               " fit",
           d.prefetch);
  } else if (batches >= 1) {
    d.prefetch = static_cast<int>(batches);
    d.workers = std::min(d.workers, d.prefetch);
    d.Rule("shared memory", input,
           share + " holds " + std::to_string(batches) + " batches -> " +
               std::to_string(d.prefetch) + " batches, " + Workers(d.workers) +
               " (raise it with docker --shm-size, or use thread workers)",
           d.prefetch, true);
  } else {
    d.prefetch = 1;
    d.workers = 1;
    d.Rule("shared memory", input,
           "not even one batch fits in " + share +
               " -> 1 worker, 1 batch; raise it with docker --shm-size, or use thread workers",
           d.prefetch, true);
  }
}

// The rules, in the order they apply: each sees what the ones before decided.
using AdviceRuleFn = void (*)(const MachineFacts&, const AdviseInputs&, Draft&);
constexpr AdviceRuleFn kRules[] = {CpuBudgetRule, LocalRanksRule,   TrainerShareRule,
                                   StorageRule,   ProcessLimitRule, OpenFilesRule,
                                   PrefetchRule,  MemoryRule,       SharedMemoryRule};

}  // namespace

const char* WorkersKindName(WorkersKind kind) {
  return kind == WorkersKind::kProcesses ? "processes" : "threads";
}

Advice Advise(const MachineFacts& facts, const AdviseInputs& inputs) {
  Draft d;
  for (AdviceRuleFn rule : kRules) rule(facts, inputs, d);
  Advice advice = std::move(d.advice);
  advice.workers = d.workers;
  advice.prefetch_batches = d.prefetch;
  advice.prefetch_bytes = static_cast<size_t>(d.prefetch) * advice.batch_bytes;
  advice.note =
      "A static guess from the machine's facts, nothing measured: while training runs, the tuner "
      "refines the worker count and prefetch depth from measured stall time, throughput and "
      "memory, and re-reads these budgets; a sweep (stoker bench, stoker.bench) measures them.";
  return advice;
}

nlohmann::json AdviceToJson(const Advice& advice, const AdviseInputs& inputs) {
  nlohmann::json rules = nlohmann::json::array();
  for (const AdviceRule& r : advice.rules) {
    rules.push_back({{"name", r.name},
                     {"input", r.input},
                     {"outcome", r.outcome},
                     {"value", r.value ? nlohmann::json(*r.value) : nlohmann::json(nullptr)},
                     {"limited", r.limited}});
  }
  return {{"workers", advice.workers},
          {"fits", advice.fits},
          {"prefetch_batches", advice.prefetch_batches},
          {"prefetch_bytes", advice.prefetch_bytes},
          {"memory_budget_bytes", advice.memory_budget_bytes},
          {"batch_bytes", advice.batch_bytes},
          {"max_workers", advice.max_workers},
          {"workers_kind", WorkersKindName(inputs.workers_kind)},
          {"rules", rules},
          {"note", advice.note}};
}

const char* LoaderKindName(LoaderKind kind) {
  switch (kind) {
    case LoaderKind::kNative:
      return "stoker.Loader";
    case LoaderKind::kStokerDataLoader:
      return "stoker.DataLoader";
    case LoaderKind::kTorchDataLoader:
      break;
  }
  return "torch.utils.data.DataLoader";
}

namespace {

// The arguments for `loader`, `workers_rule` saying where the count comes from.
LoaderArgs ArgsFor(LoaderKind loader, int workers, int prefetch_batches, int gpus,
                   const std::string& workers_rule) {
  LoaderArgs a;
  a.loader = loader;
  a.num_workers = std::max(0, workers);
  a.pin_memory = gpus > 0;
  const bool torch = loader == LoaderKind::kTorchDataLoader;
  const std::string count =
      (loader == LoaderKind::kNative ? "workers=" : "num_workers=") + std::to_string(a.num_workers);
  a.rules.push_back(count + ": " + workers_rule);
  if (torch && a.num_workers > 0) {
    a.prefetch_factor = std::max(1, (prefetch_batches + a.num_workers - 1) / a.num_workers);
    a.rules.push_back("prefetch_factor=" + std::to_string(a.prefetch_factor) + ": " +
                      std::to_string(prefetch_batches) + " batches in flight split among " +
                      Workers(a.num_workers) + ", rounded up (torch counts it per worker)");
  } else if (!torch && a.num_workers > 0) {
    a.rules.push_back("prefetch: the default for " + Workers(a.num_workers) + ", " +
                      std::to_string(prefetch_batches) + " batches in flight");
  }
  a.rules.push_back(std::string("pin_memory=") + (a.pin_memory ? "True" : "False") + ": " +
                    (a.pin_memory
                         ? std::to_string(gpus) + " GPU(s) found: page-locked batches copy to them "
                                                  "asynchronously and faster"
                         : "no GPU found (NVML): pinning would cost memory for nothing"));
  a.persistent_workers = torch && a.num_workers > 0;
  if (torch) {
    a.rules.push_back(a.persistent_workers
                          ? "persistent_workers=True: workers stay between epochs, so no epoch "
                            "pays their start (fork, dataset copy, imports) again"
                          : "persistent_workers=False: no workers to keep (torch refuses True)");
  }
  return a;
}

}  // namespace

LoaderArgs LoaderArgsFromAdvice(LoaderKind loader, int workers, int prefetch_batches, int gpus) {
  const bool threads = loader == LoaderKind::kNative;
  LoaderArgs a = ArgsFor(loader, workers, prefetch_batches, gpus,
                         std::string("the worker ") + (threads ? "threads" : "processes") +
                             " the CPU and memory budgets allow (stoker advise --workers-kind " +
                             (threads ? "threads" : "processes") + ": its rules)");
  a.measured = false;
  a.basis = "not measured, a static guess from the advisor's rules on this machine's facts";
  a.note = loader == LoaderKind::kNative
               ? "stoker bench --data PATH measures stoker's native pipeline on your data."
               : std::string("stoker.bench(dataset") +
                     (loader == LoaderKind::kStokerDataLoader ? ", kind=\"stoker\"" : "") +
                     ") measures " + LoaderKindName(loader) + " over your own Dataset.";
  return a;
}

LoaderArgs LoaderArgsFromSweep(const SweepSubject& subject, int best_workers, double samples_per_s,
                               double stall_fraction, int prefetch_batches, int gpus) {
  char measured[96];
  std::snprintf(measured, sizeof measured, "%.1f samples/s, stall %.1f %%", samples_per_s,
                stall_fraction * 100);
  // Without workers the training loop loads each batch itself: nothing in flight.
  const std::string in_flight =
      best_workers > 0 ? ", " + std::to_string(prefetch_batches) + " batches in flight" : "";
  const std::string on = subject.loader == LoaderKind::kNative
                             ? "stoker's native pipeline (C++ worker threads) over "
                             : "";
  const std::string batch =
      subject.batch_size > 0 ? ", batch " + std::to_string(subject.batch_size) : "";
  const std::string rule = "the fewest workers within " + Num(kSweepSignificantGain * 100) +
                           " % of the highest samples/s (RecommendedSweepPoint)";
  LoaderArgs a = ArgsFor(subject.loader, best_workers, prefetch_batches, gpus,
                         "the sweep's best count (" + std::string(measured) + in_flight +
                             "), measured with " + LoaderKindName(subject.loader) + "; " + rule);
  a.measured = true;
  a.basis = "measured on " + on + subject.data + batch + ", by this sweep";
  switch (subject.loader) {
    case LoaderKind::kNative:
      a.rules.push_back("in the CLI: stoker run --workers " + std::to_string(a.num_workers));
      a.note =
          "Not a count for a DataLoader over your own Dataset (Python in worker processes): "
          "stoker.bench(dataset) measures torch.utils.data.DataLoader there, "
          "stoker.bench(dataset, kind=\"stoker\") stoker.DataLoader.";
      break;
    case LoaderKind::kStokerDataLoader:
      a.note =
          "For stoker.DataLoader only: num_workers=\"auto\" (its default) tunes the count while "
          "training runs; stoker.bench(dataset) measures torch.utils.data.DataLoader.";
      break;
    case LoaderKind::kTorchDataLoader:
      a.note =
          "For torch.utils.data.DataLoader only: stoker.bench(dataset, kind=\"stoker\") measures "
          "stoker.DataLoader, whose count may differ.";
      break;
  }
  return a;
}

std::string LoaderArgs::Line() const {
  switch (loader) {
    case LoaderKind::kNative:
      return "stoker.Loader(workers=" + std::to_string(num_workers) +
             ", pin_memory=" + (pin_memory ? "True" : "False") + ")";
    case LoaderKind::kStokerDataLoader:
      return "stoker.DataLoader(num_workers=" + std::to_string(num_workers) +
             ", pin_memory=" + (pin_memory ? "True" : "False") + ")";
    case LoaderKind::kTorchDataLoader:
      break;
  }
  std::string line = "DataLoader(num_workers=" + std::to_string(num_workers);
  if (num_workers > 0) line += ", prefetch_factor=" + std::to_string(prefetch_factor);
  line += std::string(", pin_memory=") + (pin_memory ? "True" : "False");
  line += std::string(", persistent_workers=") + (persistent_workers ? "True" : "False");
  return line + ")";
}

std::string LoaderArgs::Text() const {
  std::string text =
      std::string("For ") + LoaderKindName(loader) + " (" + basis + "), paste:\n  " + Line() + "\n";
  for (const std::string& rule : rules) text += "    " + rule + "\n";
  if (!note.empty()) text += "  " + note + "\n";
  return text;
}

nlohmann::json LoaderArgsToJson(const LoaderArgs& a) {
  const bool torch = a.loader == LoaderKind::kTorchDataLoader;
  return {{"loader", LoaderKindName(a.loader)},
          {"measured", a.measured},
          {"basis", a.basis},
          {"num_workers", a.num_workers},
          {"prefetch_factor", torch && a.num_workers > 0 ? nlohmann::json(a.prefetch_factor)
                                                         : nlohmann::json(nullptr)},
          {"pin_memory", a.pin_memory},
          {"persistent_workers",
           torch ? nlohmann::json(a.persistent_workers) : nlohmann::json(nullptr)},
          {"line", a.Line()},
          {"rules", a.rules},
          {"note", a.note}};
}

}  // namespace stoker
