#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_annotations.h"
#include "stoker/store_shape.h"

namespace stoker {

/// A store's service slots (SlowSource, bench/slowfs): at most `slots`
/// reads served at once, first come, first served. Kept in virtual time:
/// each slot holds the time it frees, and a read arriving at `now` takes the
/// slot that frees first, from then (or now) for its service time, shaped
/// by a StoreShape. The caller then sleeps until the time it was given,
/// without any lock: its wait is bounded by the reads ahead of it. The one
/// home of the store shapes, for the in-process store and FUSE alike. Safe
/// for concurrent use from many threads.
class ServiceSlots {
 public:
  /// REQUIRES: slots >= 0 (0: any number of reads at once), shape.Valid().
  explicit ServiceSlots(int slots, StoreShape shape = {});

  /// When a read arriving at `now` (ns, any monotonic clock) with
  /// `service_ns` of service is done: at least now + service_ns shaped,
  /// later when every slot is taken then. Books the slot.
  int64_t Reserve(int64_t now, int64_t service_ns) EXCLUDES(mu_);

  /// Reserve at SteadyNanos() read under the lock: a time read before it
  /// would be stale after a wait for the lock or a core, and the read would
  /// be booked in the past, beyond the store's rate.
  int64_t ReserveNow(int64_t service_ns) EXCLUDES(mu_);

  /// Now `slots` (>= 0) slots. Kept slots keep their bookings (those that
  /// free first are kept); new ones are free. Reads booked on a dropped slot
  /// still end when they were told.
  void Resize(int slots) EXCLUDES(mu_);

  /// Now `shape` (REQUIRES: Valid()); the drift's clock starts again at the
  /// next read.
  void SetShape(const StoreShape& shape) EXCLUDES(mu_);

  int slots() const EXCLUDES(mu_);

  /// The service time of a read arriving `since_ns` after the first one,
  /// with `waiting` reads queued ahead of it, its jitter draw `draw` in
  /// [0, 1) (below shape.jitter: slow, by `tail` in [0, 1) between 10x
  /// and 50x). Pure; Reserve uses it.
  static int64_t Shaped(const StoreShape& shape, int64_t service_ns, int64_t since_ns, int waiting,
                        double draw, double tail);

 private:
  int64_t Book(int64_t now, int64_t service_ns) REQUIRES(mu_);

  mutable Mutex mu_;
  std::vector<int64_t> free_at_ GUARDED_BY(mu_);  // when each slot frees
  StoreShape shape_ GUARDED_BY(mu_);
  // Reads booked to start after they arrived, by start time: those not yet
  // started are the queue an overloaded store slows down with.
  std::vector<int64_t> queued_starts_ GUARDED_BY(mu_);
  int64_t origin_ GUARDED_BY(mu_) = INT64_MIN;  // the first read's arrival (drift's clock)
  uint64_t booked_ GUARDED_BY(mu_) = 0;         // reads booked (jitter's counter)
};

}  // namespace stoker
