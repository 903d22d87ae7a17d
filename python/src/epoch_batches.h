#pragma once

// The user's batches of each epoch (lists of dataset indices), as
// stoker.DataLoader hands them over, for the worker kinds of Python datasets
// (process_workers.h, thread_workers.h): the engine schedules batch numbers;
// a worker looks up which indices its batch holds.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_annotations.h"
#include "stoker/status.h"

namespace stoker::python {

/// Thread-safe. Keeps the epochs set or asked for (Has) most recently.
class EpochBatches {
 public:
  explicit EpochBatches(int64_t batches_per_epoch) : batches_per_epoch_(batches_per_epoch) {}
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

  /// Sets the batches of `epoch` (flat indices and their offsets, one more
  /// than batches); wakes workers waiting for them. kInvalidArgument when
  /// the count differs from batches_per_epoch().
  Status Set(int64_t epoch, std::vector<int64_t> flat, std::vector<int64_t> offsets) EXCLUDES(mu_);
  /// The indices of batch `batch` of `epoch`; waits until the epoch's batches
  /// are set. kCancelled after Shutdown.
  Result<std::vector<int64_t>> Indices(int64_t epoch, int64_t batch) EXCLUDES(mu_);
  /// Whether `epoch`'s batches are here; if so, they are kept as if just set.
  bool Has(int64_t epoch) EXCLUDES(mu_);
  /// Wakes and refuses every waiting and later Indices call.
  void Shutdown() EXCLUDES(mu_);

 private:
  const int64_t batches_per_epoch_;
  Mutex mu_;
  CondVar cv_;  // an epoch set, or shut down
  bool shutdown_ GUARDED_BY(mu_) = false;
  struct Epoch {
    std::vector<int64_t> flat, offsets;
    uint64_t used = 0;  // when last set or asked for: the least recent goes first
  };
  std::map<int64_t, Epoch> epochs_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
};

}  // namespace stoker::python
