#include "tune/remote_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "stoker/defaults.h"

namespace stoker {
namespace {

std::string Percent(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f %%", share * 100);
  return text;
}

std::string MemoryHolds(int slots) {
  return "the memory budget holds the batches of " + std::to_string(slots) + " remote slots";
}

// Remote slots the loader may have: what the cluster offers, within the memory budget.
int Room(const RemoteContext& c) {
  return c.memory_cap >= 0 ? std::min(c.capacity, c.memory_cap) : c.capacity;
}

std::string Rate(double per_s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f batches/s", per_s);
  return text;
}

}  // namespace

std::optional<RemoteDecision> RemotePolicy::Observe(const RemoteWindow& w, const RemoteContext& c) {
  since_change_s_ += w.window_s;
  if (c.capacity != capacity_) {
    // Workers joined or left: another cluster, whose knee and floor are unknown.
    capacity_ = c.capacity;
    knee_rate_ = floor_rate_ = -1;
  }
  // The cluster shrank under us: its slots are gone whatever we judge.
  if (c.remote > c.capacity) {
    return Change(c.remote, c.capacity, Trial::kNone, 0,
                  "the cluster offers " + std::to_string(c.capacity) + " remote slots now");
  }
  if (c.memory_cap >= 0 && c.remote > c.memory_cap) {
    return Change(c.remote, c.memory_cap, Trial::kNone, 0, MemoryHolds(c.memory_cap));
  }
  // Until the first batch came, the consumer waits for the pipeline to fill,
  // not for want of workers: that window is no evidence.
  if (!started_) {
    started_ = w.batches > 0;
    return std::nullopt;
  }
  // The pool is still refilling, or new slots have not delivered yet.
  awaited_ = std::max<int64_t>(0, awaited_ - w.remote_batches);
  if (since_change_s_ < p_.settle_s || (awaited_ > 0 && since_change_s_ < p_.max_settle_s)) {
    return std::nullopt;
  }
  pooled_.window_s += w.window_s;
  pooled_.batches += w.batches;
  pooled_.wait_s += w.wait_s;
  pooled_.step_s += w.step_s;
  if (pooled_.window_s < p_.min_window_s ||
      (pooled_.batches < p_.min_batches && pooled_.window_s < p_.max_window_s)) {
    return std::nullopt;
  }
  const RemoteWindow p = pooled_;
  pooled_ = {};
  const double rate = static_cast<double>(p.batches) / p.window_s;
  const double stall = StallFraction(p.wait_s, p.window_s);
  // Batches/s the consumer would take if it never waited (infinite: it is
  // never out of Next() long enough to tell).
  const double demand = p.step_s > 0.01 * p.window_s && p.batches > 0
                            ? static_cast<double>(p.batches) / p.step_s
                            : INFINITY;
  return Judge(rate, stall, demand, c);
}

std::optional<RemoteDecision> RemotePolicy::Judge(double rate, double stall, double demand,
                                                  const RemoteContext& c) {
  const auto changed = [&](double mark) {
    return mark >= 0 && std::abs(rate - mark) > p_.change * std::max(mark, 1e-9);
  };
  if (changed(knee_rate_)) knee_rate_ = -1;
  if (changed(floor_rate_)) floor_rate_ = -1;
  const std::string waits = "the consumer waits " + Percent(stall) + " of its time";

  if (trial_ == Trial::kUp) {
    trial_ = Trial::kNone;
    const double expected =
        static_cast<double>(c.remote - before_) / std::max(1, c.local_workers + before_);
    const bool paid =
        stall <= p_.stall_high || rate >= base_rate_ * (1 + std::max(p_.gain, expected / 2));
    if (!paid) {
      // It paid some: as much as `useful` slots would have at the rate of the
      // workers before it (the network or the scheduler binds beyond them).
      // A step of one slot that paid some keeps it: a remote slot yields
      // less than a local worker (its round trip, the receiving), and giving
      // back one that adds `gain` throws that throughput away.
      const double gained = rate / std::max(base_rate_, 1e-9) - 1;
      const double per_slot = 1.0 / std::max(1, c.local_workers + before_);
      if (gained >= p_.gain) {
        const int useful = before_ + std::clamp(static_cast<int>(std::ceil(gained / per_slot)), 1,
                                                c.remote - before_);
        knee_rate_ = rate;
        return Change(c.remote, useful, Trial::kNone, rate,
                      std::to_string(c.remote) + " remote slots gave " + Rate(rate) + " against " +
                          Rate(base_rate_) + " with " + std::to_string(before_) + ", as much as " +
                          std::to_string(useful) + " would: " + std::to_string(useful));
      }
      knee_rate_ = base_rate_;
      return Change(c.remote, before_, Trial::kNone, rate,
                    std::to_string(c.remote) + " remote slots gave " + Rate(rate) + ", " +
                        std::to_string(before_) + " gave " + Rate(base_rate_) +
                        ": more do not pay");
    }
  } else if (trial_ == Trial::kDown) {
    trial_ = Trial::kNone;
    if (stall > p_.stall_high) {
      floor_rate_ = rate;
      return Change(c.remote, before_, Trial::kNone, rate,
                    "with " + std::to_string(c.remote) + " remote slots " + waits + ": back to " +
                        std::to_string(before_));
    }
  }

  const int room = Room(c);
  if (stall > p_.stall_high && room > c.remote && knee_rate_ < 0) {
    if (c.remote == 0) {
      if (!c.local_spent || c.local_workers <= 0) return std::nullopt;  // local first
      // Little's law: the local pool makes `rate`; the consumer wants `demand`.
      const double per_worker = rate / c.local_workers;
      const double want = std::isfinite(demand) ? demand : rate / std::max(1 - stall, 0.05);
      const int slots = std::clamp(
          static_cast<int>(std::ceil((want - rate) / std::max(per_worker, 1e-9))), 1, room);
      return Change(0, slots, Trial::kUp, rate,
                    "the local CPU budget is spent (" + std::to_string(c.local_workers) +
                        " workers make " + Rate(rate) + ") and " + waits + ": " +
                        std::to_string(slots) + " remote slots for a demand of " +
                        (std::isfinite(demand) ? Rate(demand) : "more than it gets"));
    }
    const int to = std::min(room, c.remote + std::max(1, c.remote / 2));
    return Change(c.remote, to, Trial::kUp, rate,
                  waits + " with " + std::to_string(c.remote) + " remote slots (" + Rate(rate) +
                      "): trying " + std::to_string(to));
  }
  if (stall < p_.stall_low && c.remote > 0 && floor_rate_ < 0) {
    return Change(c.remote, c.remote - 1, Trial::kDown, rate,
                  "the consumer waits " + Percent(stall) + " of its time with " +
                      std::to_string(c.remote) + " remote slots: trying one fewer");
  }
  return std::nullopt;
}

std::optional<RemoteDecision> RemotePolicy::Change(int from, int to, Trial trial, double rate,
                                                   std::string reason) {
  trial_ = trial;
  before_ = from;
  awaited_ = std::max(0, to - from);
  base_rate_ = rate;
  since_change_s_ = 0;
  pooled_ = {};
  return RemoteDecision{to, std::move(reason)};
}

}  // namespace stoker
