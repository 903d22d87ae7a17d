#pragma once

#include <cstdint>
#include <vector>

#include "stoker/status.h"

namespace stoker {

/// What decides an epoch's order: everything but the epoch number.
struct PlanOptions {
  int64_t num_samples = 0;  // samples in the source
  int64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;  // drop this rank's last, partial batch
  int rank = 0;
  int world_size = 1;
  /// Distributed only: true pads the epoch by repeating samples from its start
  /// so that every rank gets the same count (as torch's DistributedSampler);
  /// false drops the tail that does not divide evenly.
  bool pad_shards = true;
};

/// Checks `options`; the error names the offending option and value.
Status ValidatePlanOptions(const PlanOptions& options);

/// The sizes of every epoch's plan, from the options alone (they do not
/// depend on the epoch): O(1), no order is built.
struct PlanShape {
  int64_t num_samples = 0;  // this rank's samples per epoch
  int64_t num_batches = 0;
  int64_t batch_size = 1;

  /// REQUIRES: ValidatePlanOptions(options).ok().
  static PlanShape Of(const PlanOptions& options);
  /// Samples in batch `b` (the last one may be short).
  int64_t batch_length(int64_t b) const;
};

/// One rank's order of one epoch, cut into batches: a pure function of
/// (options, epoch). Immutable; safe to read from many threads.
class EpochPlan {
 public:
  /// REQUIRES: ValidatePlanOptions(options).ok().
  EpochPlan(const PlanOptions& options, int64_t epoch);

  int64_t epoch() const { return epoch_; }
  /// Samples this rank delivers this epoch (after padding and drop_last).
  int64_t num_samples() const { return shape_.num_samples; }
  int64_t num_batches() const { return shape_.num_batches; }
  int64_t batch_size() const { return shape_.batch_size; }
  const PlanShape& shape() const { return shape_; }
  /// Position in this rank's order of batch `b`'s first sample.
  int64_t batch_begin(int64_t b) const { return b * shape_.batch_size; }
  /// Samples in batch `b` (the last one may be short).
  int64_t batch_length(int64_t b) const { return shape_.batch_length(b); }
  /// The source index at `position` of this rank's order.
  int64_t sample(int64_t position) const { return order_[static_cast<size_t>(position)]; }

 private:
  int64_t epoch_;
  PlanShape shape_;
  std::vector<int64_t> order_;
};

}  // namespace stoker
