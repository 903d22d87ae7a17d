#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/tuning.h"
#include "tune/node_registry.h"

namespace stoker {

/// The least share of the node's CPU budget a loader keeps (or budget / n,
/// when that is less): enough for one worker under the tuner's CPU-bound cap
/// (budget + 1), however little it needs now.
inline constexpr double kMinShareCores = 0.25;

/// Splits `budget_cores` among the loaders sharing a node by need.
/// wants[i] is the cores loader i would use; +inf marks a data-bound loader
/// (its consumer waits: it takes what the others leave). Needs are met from
/// the smallest up while they are below an equal part of what is left; the
/// rest goes in equal parts to the loaders whose need is larger (the
/// data-bound ones); when every need is met, what is left over is added in
/// equal parts to all. Each share is at least min(kMinShareCores, budget /
/// n); the shares sum to the budget; a loader alone gets all of it.
/// Returns the shares in the order of `wants`. Pure.
std::vector<double> SplitNodeBudget(double budget_cores, const std::vector<double>& wants);

/// A loader's need from its consumer's recent stall and its workers' CPU
/// use (cores): +inf (data-bound) when the consumer waited more than the
/// tuner's stall_high share of the time, or, `data_bound_before`, more than
/// its stall_low (the same hysteresis as the tuner's, so that a need near
/// the bar does not make every other loader's share flap); else the cores
/// its workers use with the tuner's headroom.
double CoresWanted(double stall, double cpu_cores, bool data_bound_before);

/// A hash of the CPUs this process may run on: loaders share a budget only
/// with those whose CPUs are the same. 0 when the affinity is unknown.
uint64_t CpuDomain();

/// The tuner's side of the node registry: each tick it publishes this
/// loader's workers, CPU use and need, reads the others', and returns this
/// loader's share of the node's CPU budget (SplitNodeBudget among the live
/// loaders of its CPU domain). Without a registry (none could be opened, or
/// $STOKER_NODE_REGISTRY=off) the share is the budget / LOCAL_WORLD_SIZE, as
/// before the registry, and view().note says why. Not thread-safe: the
/// tuner's tick only.
class NodeShare {
 public:
  /// Opens the registry again (NodeRegistry::OpenDefault), `*busy` set when
  /// its lock was busy.
  using Opener = std::function<Result<std::unique_ptr<NodeRegistry>>(bool* busy)>;

  /// `registry` may be null, with `why_none` saying why. With `reopen`, a
  /// registry that could not be opened (a lock busy a moment) is tried again
  /// every kReopenS, and one whose file was removed or replaced under it
  /// (Detached) is left for the file at its path.
  /// A loader with a fixed worker count (`tuned` false) is listed for the
  /// monitor but takes no part in the split: the others' shares ignore it.
  NodeShare(std::unique_ptr<NodeRegistry> registry, std::string why_none,
            std::optional<int> local_rank, std::optional<int> local_world_size, Opener reopen = {},
            bool tuned = true);
  static constexpr double kReopenS = 1.0;

  /// Feeds one tick's window (its length, the consumer's wait, the workers'
  /// CPU seconds, the worker count) and returns this loader's share of
  /// `node_budget_cores`. When the registry cannot be reached this tick
  /// (its lock busy), the last share is kept. `samples` (the user's samples
  /// delivered in the window) and `prefetch` are published for the monitor.
  double Update(double window_s, double wait_s, double cpu_s, int workers, double node_budget_cores,
                int64_t samples = 0, int prefetch = 0);

  /// The last tick's picture.
  const NodeView& view() const { return view_; }

 private:
  // Joins the registry again where it can (see the constructor).
  void Rejoin();

  std::unique_ptr<NodeRegistry> registry_;
  const Opener reopen_;
  std::chrono::steady_clock::time_point next_open_;
  const std::optional<int> local_rank_;
  const int local_world_size_;
  const uint64_t domain_;
  const bool tuned_;
  // The last second or so of ticks: window, wait and CPU seconds.
  struct Tick {
    double window_s, wait_s, cpu_s;
    int64_t samples;
  };
  std::deque<Tick> recent_;
  bool data_bound_ = false;
  std::optional<double> share_fraction_;  // the last share / budget from the registry
  NodeView view_;
};

}  // namespace stoker
