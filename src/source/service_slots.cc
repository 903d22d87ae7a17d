#include "source/service_slots.h"

#include <algorithm>
#include <cassert>

#include "core/clock.h"

namespace stoker {

ServiceSlots::ServiceSlots(int slots) { Resize(slots); }

int64_t ServiceSlots::Reserve(int64_t now, int64_t service_ns) {
  MutexLock lock(mu_);
  return Book(now, service_ns);
}

int64_t ServiceSlots::ReserveNow(int64_t service_ns) {
  MutexLock lock(mu_);
  return Book(SteadyNanos(), service_ns);
}

int64_t ServiceSlots::Book(int64_t now, int64_t service_ns) {
  if (free_at_.empty()) return now + service_ns;
  // A handful of slots: a linear scan beats a heap's upkeep.
  auto first = std::min_element(free_at_.begin(), free_at_.end());
  *first = std::max(*first, now) + service_ns;
  return *first;
}

void ServiceSlots::Resize(int slots) {
  assert(slots >= 0);
  MutexLock lock(mu_);
  std::sort(free_at_.begin(), free_at_.end());
  free_at_.resize(static_cast<size_t>(slots), INT64_MIN);
}

int ServiceSlots::slots() const {
  MutexLock lock(mu_);
  return static_cast<int>(free_at_.size());
}

}  // namespace stoker
