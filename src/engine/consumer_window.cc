#include "engine/consumer_window.h"

#include <algorithm>
#include <cassert>

namespace stoker {

ConsumerWindow::ConsumerWindow(int64_t window_ns, int64_t spacing_ns)
    : window_ns_(window_ns), spacing_ns_(spacing_ns) {
  assert(spacing_ns > 0 && spacing_ns <= window_ns);
  assert(static_cast<size_t>(window_ns / spacing_ns) + 2 <= kPoints);
}

void ConsumerWindow::Record(const ConsumerCounters& now) {
  const int64_t clock = Clock(now);
  if (last_kept_ns_ >= 0 && clock - last_kept_ns_ < spacing_ns_) return;
  last_kept_ns_ = clock;
  MutexLock lock(mu_);
  points_[kept_ % kPoints] = now;
  ++kept_;
}

ConsumerCounters ConsumerWindow::Recent(const ConsumerCounters& now) const {
  // Points are spacing_ns apart at least, and kPoints of them reach further
  // back than window_ns + spacing_ns: once they wrap, one is old enough.
  ConsumerCounters base;  // the start: nothing taken yet
  const int64_t since = Clock(now) - window_ns_;
  {
    MutexLock lock(mu_);
    const size_t held = std::min(kept_, kPoints);
    for (size_t k = 0; k < held; ++k) {
      const ConsumerCounters& p = points_[(kept_ - 1 - k) % kPoints];
      if (Clock(p) <= since) {
        base = p;
        break;
      }
    }
  }
  auto less = [](int64_t a, int64_t b) { return std::max<int64_t>(0, a - b); };
  return {less(now.batches_delivered, base.batches_delivered),
          less(now.samples_delivered, base.samples_delivered),
          less(now.user_samples_delivered, base.user_samples_delivered),
          less(now.consumer_wait_ns, base.consumer_wait_ns),
          less(now.consumer_step_ns, base.consumer_step_ns)};
}

}  // namespace stoker
