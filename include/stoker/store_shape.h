#pragma once

#include <cstdint>

namespace stoker {

/// How a store's service time departs from a flat one (issue 27): real
/// stores slow down when overloaded, drift over minutes, and serve a few
/// reads far slower than the rest. All zero (drift 1): every read takes the
/// service time it is booked with.
struct StoreShape {
  /// Past its slots, each read's service time grows by this fraction of it
  /// per read waiting when it arrives (a FUSE server or NFS server that
  /// thrashes): the store's rate falls as the queue grows, not just stays.
  double overload = 0;
  /// Service time swings smoothly between 1x and this factor (a cache
  /// warming, other tenants) ...
  double drift = 1;
  /// ... over this period: 1x at 0, `drift` x at half of it, 1x again.
  double drift_period_s = 120;
  /// This fraction of reads are 10-50x slower (log-uniform): a heavy tail.
  double jitter = 0;
  /// Keys which reads are slow (the n-th booking's draw).
  uint64_t seed = 0;

  /// Whether every field is in range: overload >= 0, drift >= 1,
  /// drift_period_s > 0, 0 <= jitter <= 1.
  bool Valid() const;
};

}  // namespace stoker
