#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/thread_annotations.h"
#include "stoker/loader.h"

namespace stoker {

/// The consumer's counters as they were over its last few seconds, so that
/// LoaderMetrics::recent can give rates of now rather than since the start.
/// It keeps a point (the cumulative ConsumerCounters) at most every
/// `spacing_ns` of the consumer's time, enough of them to reach `window_ns`
/// back. Its clock is the consumer's time (wait + step), which advances at
/// each Next() boundary.
///
/// Thread contract: Record belongs to the consumer's thread; Recent is safe
/// from any thread, concurrently with it.
class ConsumerWindow {
 public:
  /// REQUIRES: 0 < spacing_ns <= window_ns, and window_ns / spacing_ns + 2
  /// <= kPoints.
  explicit ConsumerWindow(int64_t window_ns, int64_t spacing_ns);

  /// Notes `now`, the cumulative counters at a Next() boundary; keeps it
  /// when `spacing_ns` has passed since the last point kept. Cheap (no lock)
  /// otherwise.
  void Record(const ConsumerCounters& now) EXCLUDES(mu_);

  /// `now` less the counters of the newest point at least `window_ns` of the
  /// consumer's time before it: the counters over about the last window
  /// (all of `now` before one is that old). Never negative.
  ConsumerCounters Recent(const ConsumerCounters& now) const EXCLUDES(mu_);

  static constexpr size_t kPoints = 32;

 private:
  static int64_t Clock(const ConsumerCounters& c) {
    return c.consumer_wait_ns + c.consumer_step_ns;
  }

  const int64_t window_ns_;
  const int64_t spacing_ns_;
  int64_t last_kept_ns_ = -1;  // consumer thread only
  mutable Mutex mu_;
  std::array<ConsumerCounters, kPoints> points_ GUARDED_BY(mu_);
  size_t kept_ GUARDED_BY(mu_) = 0;  // points ever kept; the newest is at (kept_ - 1) % kPoints
};

}  // namespace stoker
