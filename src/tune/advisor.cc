#include "stoker/advisor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace stoker {
namespace {

constexpr int64_t kAssumedBatchSize = 64;
constexpr size_t kAssumedSampleBytes = 3 * 224 * 224;  // an ImageNet crop, uint8 CHW
constexpr size_t kThreadFootprint = size_t{16} << 20;
constexpr size_t kProcessFootprint = size_t{256} << 20;
constexpr uint64_t kAssumedMemory = uint64_t{4} << 30;
constexpr double kAssumedCores = 1.0;
constexpr double kTrainerCores = 1.0;
// Concurrent readers beyond two make a disk head seek between files.
constexpr int kRotationalReaders = 2;
// Latency-bound reads: a worker mostly waits, so several per core help.
constexpr int kLatencyWorkersPerCore = 4;
constexpr int kLatencyMinWorkers = 8;
constexpr int kLatencyMaxWorkers = 64;
constexpr int kPrefetchPerWorker = 2;
constexpr double kShmFraction = 0.8;

std::string Num(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", value);
  return text;
}

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

}  // namespace

const char* WorkersKindName(WorkersKind kind) {
  return kind == WorkersKind::kProcesses ? "processes" : "threads";
}

Advice Advise(const MachineFacts& facts, const AdviseInputs& inputs) {
  Advice advice;
  struct {
    Advice& advice;
    void Rule(std::string name, std::string input, std::string outcome, std::optional<double> value,
              bool limited = false) {
      advice.rules.push_back(
          {std::move(name), std::move(input), std::move(outcome), value, limited});
    }
  } rules{advice};

  // CPU: the budget is what the scheduler will really give this process.
  double budget = facts.cpu.budget_cores.value_or(kAssumedCores);
  rules.Rule("cpu budget", DescribeCpu(facts.cpu),
             facts.cpu.budget_cores ? "min(affinity, quota) = " + Cores(budget)
                                    : "unknown; assuming " + Cores(budget),
             budget);

  int local_ranks = facts.ranks.local_world_size.value_or(1);
  double per_rank = budget / local_ranks;
  rules.Rule("local ranks",
             facts.ranks.local_world_size
                 ? std::to_string(local_ranks) + (local_ranks == 1 ? " rank" : " ranks") +
                       " on this node (launcher: " + facts.ranks.launcher + ")"
                 : std::string("local world size unknown; assuming 1 rank"),
             Cores(budget) + " / " + std::to_string(local_ranks) + " = " + Cores(per_rank) +
                 " for this rank",
             per_rank, local_ranks > 1);

  double for_workers = per_rank - kTrainerCores;
  int workers = std::max(1, static_cast<int>(std::floor(for_workers + 1e-9)));
  rules.Rule("trainer share", Cores(per_rank) + " for this rank",
             Num(per_rank) + " - " + Num(kTrainerCores) + " core for the trainer = " +
                 Cores(std::max(0.0, for_workers)) + " -> " + Workers(workers) +
                 (for_workers < 1 ? " (at least one, so loading overlaps the training step)" : ""),
             workers, true);

  // Storage: what bounds a reader is seek time on a disk and round trips on a
  // network or FUSE file system, not CPU.
  if (!facts.storage) {
    rules.Rule("storage", "no data path given", "not considered", std::nullopt);
  } else {
    const MachineFacts::Storage& s = *facts.storage;
    std::string input =
        s.path + " on " + s.fs_type.value_or("unknown file system") +
        (s.mount_point ? " at " + *s.mount_point : std::string()) + ", " + StorageKindName(s.kind) +
        (s.rotational ? (*s.rotational ? ", rotational" : ", not rotational") : std::string());
    using Kind = MachineFacts::StorageKind;
    if (s.kind == Kind::kNetwork || s.kind == Kind::kFuse) {
      int latency_workers =
          std::clamp(static_cast<int>(std::ceil(kLatencyWorkersPerCore * per_rank)),
                     kLatencyMinWorkers, kLatencyMaxWorkers);
      workers = std::max(workers, latency_workers);
      rules.Rule("storage", input,
                 std::string("latency-bound: workers mostly wait on I/O, so ") +
                     std::to_string(kLatencyWorkersPerCore) + " per core (" +
                     std::to_string(kLatencyMinWorkers) + " to " +
                     std::to_string(kLatencyMaxWorkers) + ") -> " + Workers(workers),
                 workers);
    } else if (s.rotational.value_or(false)) {
      bool limited = workers > kRotationalReaders;
      workers = std::min(workers, kRotationalReaders);
      rules.Rule("storage", input,
                 "rotational disk: more than " + std::to_string(kRotationalReaders) +
                     " concurrent readers make it seek -> " + Workers(workers),
                 workers, limited);
    } else {
      rules.Rule("storage", input,
                 s.kind == Kind::kUnknown ? "mount not found; CPU rule stands"
                                          : "reads keep up with the CPU; CPU rule stands",
                 workers);
    }
  }

  // Every thread or process counts against RLIMIT_NPROC, and so does
  // everything else the user runs; keep half of it for them.
  if (facts.limits.nproc) {
    int cap = static_cast<int>(std::clamp<uint64_t>(*facts.limits.nproc / 2, 1, 1 << 20));
    bool limited = workers > cap;
    workers = std::min(workers, cap);
    rules.Rule("process limit", "RLIMIT_NPROC " + std::to_string(*facts.limits.nproc),
               "at most half of it -> " + Workers(workers), workers, limited);
  } else {
    rules.Rule("process limit", "RLIMIT_NPROC unlimited or unknown", "not capped", std::nullopt);
  }

  int prefetch = kPrefetchPerWorker * workers;
  rules.Rule("prefetch depth", Workers(workers),
             std::to_string(kPrefetchPerWorker) + " batches per worker -> " +
                 std::to_string(prefetch) + " batches",
             prefetch);

  // Memory: workers' own footprint plus every batch in flight stays within a
  // fraction of what this process may still take.
  int64_t batch_size = inputs.batch_size.value_or(kAssumedBatchSize);
  size_t sample_bytes = inputs.sample_bytes.value_or(kAssumedSampleBytes);
  size_t batch_bytes = static_cast<size_t>(std::max<int64_t>(batch_size, 1)) * sample_bytes;
  advice.batch_bytes = batch_bytes;
  size_t footprint = inputs.worker_footprint_bytes.value_or(
      inputs.workers_kind == WorkersKind::kProcesses ? kProcessFootprint : kThreadFootprint);
  std::optional<uint64_t> room = facts.memory.available_bytes;
  std::string room_input = facts.memory.available_bytes
                               ? "available " + FormatBytes(*facts.memory.available_bytes)
                               : std::string("available unknown");
  if (facts.memory.cgroup_limit_bytes) {
    uint64_t limit = *facts.memory.cgroup_limit_bytes;
    uint64_t used = std::min(limit, facts.memory.cgroup_current_bytes.value_or(0));
    uint64_t cgroup_room = limit - used;
    room_input += ", cgroup limit " + FormatBytes(limit) +
                  (facts.memory.cgroup_current_bytes ? " with " + FormatBytes(used) + " used"
                                                     : std::string(" (use unknown)"));
    room = room ? std::min(*room, cgroup_room) : cgroup_room;
  }
  if (!room) {
    room = kAssumedMemory;
    room_input += "; assuming " + FormatBytes(kAssumedMemory);
  }
  size_t memory_budget = static_cast<size_t>(inputs.memory_fraction * static_cast<double>(*room));
  advice.memory_budget_bytes = memory_budget;
  auto fits = [&](int w, int p) {
    return static_cast<double>(w) * footprint + static_cast<double>(p) * batch_bytes <=
           static_cast<double>(memory_budget);
  };
  std::string memory_input =
      room_input + "; batch " + FormatBytes(batch_bytes) + " (" + std::to_string(batch_size) +
      (inputs.batch_size ? "" : " assumed") + " x " + FormatBytes(sample_bytes) +
      (inputs.sample_bytes ? "" : " assumed") + "), " + FormatBytes(footprint) +
      (inputs.worker_footprint_bytes ? "" : " assumed") + " per " +
      (inputs.workers_kind == WorkersKind::kProcesses ? "process" : "thread") + " worker";
  std::string budget_text =
      "budget " + Num(inputs.memory_fraction * 100) + " % = " + FormatBytes(memory_budget);
  if (fits(workers, prefetch)) {
    rules.Rule(
        "memory", memory_input,
        budget_text + "; " + Workers(workers) + " and " + std::to_string(prefetch) + " batches fit",
        workers);
  } else {
    // Give up spare batches first (one per worker keeps every worker busy),
    // then workers.
    int w = workers;
    while (w > 1 && !fits(w, w)) --w;
    int p = kPrefetchPerWorker * w;
    while (p > w && !fits(w, p)) --p;
    std::string outcome = budget_text + " -> " + Workers(w) + ", " + std::to_string(p) + " batches";
    if (!fits(w, p)) {
      p = 1;
      outcome = budget_text + ": even 1 worker and 1 batch do not fit; reduce the batch size";
    }
    workers = w;
    prefetch = p;
    rules.Rule("memory", memory_input, outcome, workers, true);
  }

  // Process workers hand batches over through /dev/shm; a container's default
  // is 64 MiB, which holds very few batches.
  if (inputs.workers_kind == WorkersKind::kProcesses) {
    std::optional<uint64_t> shm =
        facts.shm.free_bytes ? facts.shm.free_bytes : facts.shm.size_bytes;
    if (!shm) {
      rules.Rule("shared memory", "/dev/shm size unknown", "not capped", std::nullopt);
    } else {
      uint64_t usable = static_cast<uint64_t>(kShmFraction * static_cast<double>(*shm));
      int64_t batches = static_cast<int64_t>(usable / std::max<size_t>(batch_bytes, 1));
      std::string input =
          "/dev/shm " + FormatBytes(*shm) + " free; batch " + FormatBytes(batch_bytes);
      if (batches >= prefetch) {
        rules.Rule("shared memory", input,
                   Num(kShmFraction * 100) + " % holds " + std::to_string(batches) + " batches; " +
                       std::to_string(prefetch) + " fit",
                   prefetch);
      } else if (batches >= 1) {
        prefetch = static_cast<int>(batches);
        workers = std::min(workers, prefetch);
        rules.Rule("shared memory", input,
                   Num(kShmFraction * 100) + " % holds " + std::to_string(batches) +
                       " batches -> " + std::to_string(prefetch) + " batches, " + Workers(workers) +
                       " (raise it with docker --shm-size, or use thread workers)",
                   prefetch, true);
      } else {
        prefetch = 1;
        workers = 1;
        rules.Rule("shared memory", input,
                   "not even one batch fits in " + Num(kShmFraction * 100) +
                       " % -> 1 worker, 1 batch; raise it with docker --shm-size, or use thread "
                       "workers",
                   prefetch, true);
      }
    }
  } else {
    rules.Rule("shared memory", "thread workers", "not used: batches stay in this process",
               std::nullopt);
  }

  advice.workers = workers;
  advice.prefetch_batches = prefetch;
  advice.prefetch_bytes = static_cast<size_t>(prefetch) * batch_bytes;
  advice.note =
      "A starting point: while training runs, the tuner refines the worker count and prefetch "
      "depth from measured stall time, throughput and memory, and re-reads these budgets.";
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
          {"prefetch_batches", advice.prefetch_batches},
          {"prefetch_bytes", advice.prefetch_bytes},
          {"memory_budget_bytes", advice.memory_budget_bytes},
          {"batch_bytes", advice.batch_bytes},
          {"workers_kind", WorkersKindName(inputs.workers_kind)},
          {"rules", rules},
          {"note", advice.note}};
}

}  // namespace stoker
