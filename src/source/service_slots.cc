#include "source/service_slots.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numbers>

#include "core/clock.h"
#include "stoker/rng.h"

namespace stoker {

bool StoreShape::Valid() const {
  return overload >= 0 && drift >= 1 && drift_period_s > 0 && jitter >= 0 && jitter <= 1;
}

ServiceSlots::ServiceSlots(int slots, StoreShape shape) {
  SetShape(shape);
  Resize(slots);
}

int64_t ServiceSlots::Reserve(int64_t now, int64_t service_ns) {
  MutexLock lock(mu_);
  return Book(now, service_ns);
}

int64_t ServiceSlots::ReserveNow(int64_t service_ns) {
  MutexLock lock(mu_);
  return Book(SteadyNanos(), service_ns);
}

int64_t ServiceSlots::Shaped(const StoreShape& shape, int64_t service_ns, int64_t since_ns,
                             int waiting, double draw, double tail) {
  double factor = 1 + shape.overload * waiting;
  if (shape.drift > 1) {
    const double phase = 2 * std::numbers::pi * (since_ns * 1e-9) / shape.drift_period_s;
    factor *= 1 + (shape.drift - 1) * (1 - std::cos(phase)) / 2;
  }
  // Log-uniform between 10x and 50x: most slow reads near 10-20x, a few at 50x.
  if (draw < shape.jitter) factor *= 10 * std::pow(5.0, tail);
  return static_cast<int64_t>(std::llround(static_cast<double>(service_ns) * factor));
}

int64_t ServiceSlots::Book(int64_t now, int64_t service_ns) {
  if (origin_ == INT64_MIN) origin_ = now;
  const uint64_t n = booked_++;
  double draw = 1, tail = 0;
  if (shape_.jitter > 0) {
    SampleRng rng(shape_.seed, 0, n);
    draw = rng.Uniform();
    tail = rng.Uniform();
  }
  if (free_at_.empty()) return now + Shaped(shape_, service_ns, now - origin_, 0, draw, tail);
  // Reads still queued when this one arrives (booked to start later).
  std::erase_if(queued_starts_, [&](int64_t start) { return start <= now; });
  const int waiting = static_cast<int>(queued_starts_.size());
  const int64_t shaped = Shaped(shape_, service_ns, now - origin_, waiting, draw, tail);
  // A handful of slots: a linear scan beats a heap's upkeep.
  auto first = std::min_element(free_at_.begin(), free_at_.end());
  const int64_t start = std::max(*first, now);
  if (start > now && shape_.overload > 0) queued_starts_.push_back(start);
  *first = start + shaped;
  return *first;
}

void ServiceSlots::Resize(int slots) {
  assert(slots >= 0);
  MutexLock lock(mu_);
  std::sort(free_at_.begin(), free_at_.end());
  free_at_.resize(static_cast<size_t>(slots), INT64_MIN);
}

void ServiceSlots::SetShape(const StoreShape& shape) {
  assert(shape.Valid());
  MutexLock lock(mu_);
  shape_ = shape;
  origin_ = INT64_MIN;
  booked_ = 0;
  queued_starts_.clear();
}

int ServiceSlots::slots() const {
  MutexLock lock(mu_);
  return static_cast<int>(free_at_.size());
}

}  // namespace stoker
