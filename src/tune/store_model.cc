#include "tune/store_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>

namespace stoker {

StoreModel::StoreModel(double queued, double headroom, double stale)
    : queued_(queued), headroom_(headroom), stale_(stale) {
  assert(queued > 1 && headroom >= 1);
}

void StoreModel::Add(const Point& p) {
  assert(p.workers >= 1 && p.rate > 0 && p.wait_s > 0);
  // A larger pool that produced clearly less than this one measured another
  // store (it got faster, or gained slots): its saturation no longer holds.
  auto outran = [&](const Point& q) {
    return q.workers > p.workers && q.rate * (1 + stale_) < p.rate;
  };
  outrun_ += static_cast<int>(std::count_if(points_.begin(), points_.end(), outran));
  std::erase_if(points_, [&](const Point& q) { return q.workers == p.workers || outran(q); });
  points_.push_back(p);
}

void StoreModel::ForgetBefore(double t_s) {
  std::erase_if(points_, [&](const Point& q) { return q.t_s < t_s; });
}

const StoreModel::Point& StoreModel::Least() const {
  assert(!points_.empty());
  return *std::min_element(points_.begin(), points_.end(),
                           [](const Point& a, const Point& b) { return a.wait_s < b.wait_s; });
}

double StoreModel::service_s() const { return points_.empty() ? 0 : Least().wait_s; }

double StoreModel::UnqueuedRate() const {
  if (points_.empty()) return 0;
  const Point& least = Least();
  return 1 / (least.wait_s + least.rest_s);
}

bool StoreModel::Saturated() const {
  if (points_.empty()) return false;
  const Point& least = Least();
  return std::any_of(points_.begin(), points_.end(), [&](const Point& q) {
    return !q.reference && q.workers > least.workers && q.wait_s >= queued_ * least.wait_s;
  });
}

const StoreModel::Point& StoreModel::Queued() const {
  assert(Saturated());
  const Point& least = Least();
  const Point* most = nullptr;
  for (const Point& q : points_) {
    if (!q.reference && q.workers > least.workers && q.wait_s >= queued_ * least.wait_s &&
        (!most || q.workers > most->workers)) {
      most = &q;
    }
  }
  return *most;
}

double StoreModel::slots() const {
  // Little's law on the store's service: reads in service = rate x service
  // time. The mean over the queued points smooths one window's noise.
  const double service = service_s();
  double sum = 0;
  int n = 0;
  for (const Point& q : points_) {
    if (!q.reference && q.wait_s >= queued_ * service) {
      sum += q.rate * service;
      ++n;
    }
  }
  assert(n > 0);
  return sum / n;
}

int StoreModel::SureKnee() const {
  const Point& least = Least();
  const double k = slots();
  if (least.workers >= k) return 0;
  return static_cast<int>(std::ceil(k * (least.wait_s + least.rest_s) / least.wait_s - 0.05));
}

int StoreModel::Knee() const {
  // Each worker reads for service_s of every service_s + rest_s; keeping
  // slots() reads in service takes that many times more workers, and some
  // headroom for the moments when several are busy elsewhere at once.
  const Point& least = Least();
  const double per_slot = (least.wait_s + least.rest_s) / least.wait_s;
  return std::max(1, static_cast<int>(std::ceil(slots() * per_slot * headroom_ - 0.05)));
}

std::string StoreModel::Describe(const std::string& item) const {
  const Point& least = Least();
  const Point& queued = Queued();
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "the store serves ~%.1f reads at once (reads wait %.1f ms per %s at %d "
                "workers, %.1f ms at %d)",
                slots(), queued.wait_s * 1e3, item.c_str(), queued.workers, least.wait_s * 1e3,
                least.workers);
  return buf;
}

}  // namespace stoker
