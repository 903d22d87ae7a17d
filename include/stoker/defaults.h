#pragma once

#include <algorithm>
#include <cstdint>

namespace stoker {

/// The one home of the defaults that the loader, the tuner, the advisor, the
/// sweep, the CLI and Python share. Change one here and every part follows.

/// Worker count meaning "let the tuner decide" (LoaderOptions::workers).
inline constexpr int kAutoWorkers = -1;

/// The most workers the tuner may use (TunerOptions::max_workers is at most
/// this), and where the sweep stops unless told otherwise
/// (SweepOptions::max_workers, --max-workers).
inline constexpr int kMaxWorkers = 128;

/// The largest epoch a loader starts at (start_epoch, SetEpoch, a
/// checkpoint's): far from int64's end, so the passes after it never wrap.
inline constexpr int64_t kMaxEpoch = int64_t{1} << 62;

/// The default memory budget: this share of the memory available to the
/// process (or of its cgroup limit).
inline constexpr double kMemoryBudgetShare = 0.8;

/// The prefetch depth, in batches of `batch_items` items, for `workers`
/// workers when nobody chose one: 2 for up to 3 workers, then one more per 4
/// workers, up to 16, and never fewer than hold two items a worker. Workers
/// share batches (a task is a run of one batch's items), so a few batches
/// absorb jitter; many workers need a wider window to all find work; where
/// an item is a whole user batch (stoker.DataLoader's kinds, batch_items 1)
/// each worker needs its own, two as torch's prefetch_factor gives it. Each
/// batch in flight is memory (a float32 224x224 batch of 64 is 38.5 MiB).
constexpr int DefaultPrefetch(int workers, int64_t batch_items) {
  const int64_t items = std::max<int64_t>(batch_items, 1);
  const int64_t fill = (2 * static_cast<int64_t>(std::max(workers, 0)) + items - 1) / items;
  return static_cast<int>(std::max<int64_t>(std::clamp(2 + workers / 4, 2, 16), fill));
}

/// How far back the recent figures reach (LoaderMetrics::recent, stats()'s
/// samples_per_s and stall_fraction): about this many seconds of the
/// consumer's time, ending at its latest Next().
inline constexpr double kRecentWindowS = 5.0;
/// Skip records a loader keeps (Loader::Skipped): past them, skips are
/// counted only (LoaderMetrics::samples_skipped), so a long run over bad
/// files, epoch after epoch, does not grow without bound.
inline constexpr size_t kSkipRecordsKept = 100'000;

/// The share of a stretch of time the consumer spent waiting for data, in
/// [0, 1]; 0 for an empty stretch. A wait that spans stretches is counted
/// where it ends, hence the clamp.
constexpr double StallFraction(double wait_s, double elapsed_s) {
  return elapsed_s > 0 ? std::clamp(wait_s / elapsed_s, 0.0, 1.0) : 0.0;
}

}  // namespace stoker
