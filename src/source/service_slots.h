#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_annotations.h"

namespace stoker {

/// A store's service slots (SlowSource): at most `slots` reads served at
/// once, first come, first served. Kept in virtual time: each slot holds the
/// time it frees, and a read arriving at `now` takes the slot that frees
/// first, from then (or now) for its service time. The caller then sleeps
/// until the time it was given, without any lock: its wait is bounded by the
/// reads ahead of it. Safe for concurrent use from many threads.
class ServiceSlots {
 public:
  /// REQUIRES: slots >= 0 (0: any number of reads at once).
  explicit ServiceSlots(int slots);

  /// When a read arriving at `now` (ns, any monotonic clock) with
  /// `service_ns` of service is done: at least now + service_ns, later when
  /// every slot is taken then. Books the slot.
  int64_t Reserve(int64_t now, int64_t service_ns) EXCLUDES(mu_);

  /// Reserve at SteadyNanos() read under the lock: a time read before it
  /// would be stale after a wait for the lock or a core, and the read would
  /// be booked in the past, beyond the store's rate.
  int64_t ReserveNow(int64_t service_ns) EXCLUDES(mu_);

  /// Now `slots` (>= 0) slots. Kept slots keep their bookings (those that
  /// free first are kept); new ones are free. Reads booked on a dropped slot
  /// still end when they were told.
  void Resize(int slots) EXCLUDES(mu_);

  int slots() const EXCLUDES(mu_);

 private:
  int64_t Book(int64_t now, int64_t service_ns) REQUIRES(mu_);

  mutable Mutex mu_;
  std::vector<int64_t> free_at_ GUARDED_BY(mu_);  // when each slot frees
};

}  // namespace stoker
