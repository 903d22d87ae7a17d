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
#include "stoker/worker_kind.h"

namespace stoker::python {

/// The seed of batch `batch` of `epoch` (-1: the epoch's shuffle) under the
/// epoch's seed, the same whichever worker runs it: a non-negative int64.
int64_t BatchSeed(uint64_t seed, int64_t epoch, int64_t batch);

/// Thread-safe. Keeps the epochs set or asked for (Has) most recently. An
/// epoch may have any number of batches (a data set that grows or shrinks
/// between epochs); the engine is told each epoch's count apart.
class EpochBatches {
 public:
  /// `first_batches`: the first epoch's count (the kinds' items()).
  /// `item_name`: what one of its items is, for people (the tuner's unit):
  /// "batch", or kShard for a sharded stream's; `shards`: how errors show
  /// its shards (Python's repr of each name), by position.
  explicit EpochBatches(int64_t first_batches, std::string item_name = "batch",
                        std::vector<std::string> shards = {})
      : first_batches_(first_batches),
        item_name_(std::move(item_name)),
        shards_(std::move(shards)) {}
  static constexpr const char* kShard = "shard";
  int64_t first_batches() const { return first_batches_; }
  const std::string& item_name() const { return item_name_; }
  /// Whether its items are a sharded stream's shards, made in parts: a
  /// worker that leaves mid-shard may hand one over (ItemOutcome::may_leave).
  bool sharded() const { return item_name_ == kShard; }
  /// Names a sharded stream's failures, whose index is their shard's
  /// position, "shard <shown>" (their key, a name as Python holds it, is
  /// the loader's). Others are left as they are.
  void NameShardFailures(std::vector<SampleFailure>* failures) const;

  /// Sets the batches of `epoch` (flat indices and their offsets, one more
  /// than batches, from 0 to flat's size) and its seed (torch's base seed:
  /// drawn at iter()); wakes workers waiting for them. kInvalidArgument for
  /// offsets that are not that. `keys`: empty when the indices are the
  /// sampler's keys (ints); else one pickled list of keys per batch (the
  /// sampler's own objects: tuples, strings, floats), and each batch's
  /// indices are positions in its list.
  Status Set(int64_t epoch, std::vector<int64_t> flat, std::vector<int64_t> offsets, int64_t seed,
             std::vector<std::string> keys = {}) EXCLUDES(mu_);
  /// One batch: its dataset indices (or positions in `keys`), the seed its
  /// samples run under, and its epoch's (torch's base seed).
  struct Batch {
    std::vector<int64_t> indices;
    int64_t seed = 0;
    int64_t base_seed = 0;
    std::string keys;  // the pickled keys, or empty: the indices are the keys
  };
  /// Batch `batch` of `epoch`; waits until the epoch's batches are set.
  /// kCancelled after Shutdown, or when the epoch as set has no such batch
  /// (a look-ahead planned from another count, which the engine drops).
  Result<Batch> Get(int64_t epoch, int64_t batch) EXCLUDES(mu_);
  /// Whether `epoch`'s batches are here; if so, they are kept as if just set.
  bool Has(int64_t epoch) EXCLUDES(mu_);
  /// The first epoch ever set, and the one set last; -1 while none has been.
  int64_t first_set() const EXCLUDES(mu_);
  int64_t last_set() const EXCLUDES(mu_);
  /// Drops every epoch's list (a resume starts over); calls waiting for one
  /// return kCancelled (their epochs were abandoned).
  void Restart() EXCLUDES(mu_);
  /// Wakes and refuses every waiting and later Get call.
  void Shutdown() EXCLUDES(mu_);

 private:
  const int64_t first_batches_;
  const std::string item_name_;
  const std::vector<std::string> shards_;
  mutable Mutex mu_;
  CondVar cv_;  // an epoch set, or shut down
  bool shutdown_ GUARDED_BY(mu_) = false;
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // Restart() calls so far
  int64_t first_set_ GUARDED_BY(mu_) = -1;
  int64_t last_set_ GUARDED_BY(mu_) = -1;
  struct Epoch {
    // The indices, 4 bytes each when every one fits (narrow; flat then
    // empty): an epoch of millions is kept for its whole length, up to
    // three epochs at once.
    std::vector<int32_t> narrow;
    std::vector<int64_t> flat, offsets;
    int64_t seed = 0;
    std::vector<std::string> keys;  // per batch, or empty
    uint64_t used = 0;              // when last set or asked for: the least recent goes first
  };
  std::map<int64_t, Epoch> epochs_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
};

}  // namespace stoker::python
