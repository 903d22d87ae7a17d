#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "stoker/tuner.h"

namespace stoker {

/// What the loader did over one measurement window (between two ticks).
struct Observation {
  double t_s = 0;                 // end of the window, seconds since start
  double window_s = 0;            // its length
  int workers = 0;                // worker target during the window
  int prefetch = 0;               // prefetch depth during the window
  int64_t batches = 0;            // batches delivered
  int64_t samples = 0;            // samples delivered
  double wait_s = 0;              // consumer time inside Next()
  double step_s = 0;              // consumer time between Next() calls
  int64_t produced = 0;           // samples produced by workers
  double busy_s = 0;              // workers' task wall time
  double cpu_s = 0;               // workers' task CPU time
};

/// Limits the tuner must keep, re-read as the machine changes.
struct Budgets {
  double cpu_cores = 1;          // cores this loader's workers may use
  int max_workers = 64;          // hard cap (configuration, rlimits)
  size_t memory_bytes = 0;       // 0 = unbounded
  size_t batch_bytes = 0;        // one batch buffer
  size_t worker_bytes = 0;       // one worker's footprint, measured or assumed
};

/// The decision logic of the tuner, free of clocks and threads: fed one
/// Observation per tick, it returns a decision when the knobs should change.
/// Deterministic, so tests drive it with a simulated workload and clock.
///
/// Method: windows are pooled until they hold enough evidence (time and
/// batches); the first pooled window sizes the pool by Little's law (workers
/// = demand rate x wall time per sample, capped where the CPU-bound share
/// saturates the CPU budget); then it climbs while the consumer waits and a
/// step up pays (>= kGain more throughput), marking the knee when it does not;
/// and it steps down while the consumer never waits and the workers are idle
/// enough that one fewer would still keep up, marking the floor when that
/// stalls. A workload change (demand, CPU or wall time per sample at the same
/// worker count) clears the marks and re-sizes by the model.
class TunerCore {
 public:
  static constexpr double kStallHigh = 0.01;  // the consumer waits too much above this
  static constexpr double kStallLow = 0.003;  // it is fed with margin below this
  static constexpr double kGain = 0.04;       // a step up must add this much throughput
  static constexpr double kChange = 0.3;      // relative change that means a new workload

  explicit TunerCore(int initial_workers, int initial_prefetch);

  /// Feeds one window; returns a decision when workers or prefetch change.
  std::optional<TunerDecision> Observe(const Observation& o, const Budgets& b);

  int workers() const { return workers_; }
  int prefetch() const { return prefetch_; }
  const char* phase() const;
  /// Latest pooled figures (for the view).
  double samples_per_s() const { return last_rate_; }
  double stall_fraction() const { return last_stall_; }
  int cpu_cap() const { return last_cpu_cap_; }

 private:
  enum class Phase { kStart, kRefine, kTrialUp, kTrialDown };

  struct Pooled {
    double window_s = 0, wait_s = 0, step_s = 0, busy_s = 0, cpu_s = 0;
    int64_t batches = 0, samples = 0, produced = 0;
    double rate() const { return window_s > 0 ? samples / window_s : 0; }
    // A Next() that spans windows is counted where it ends: clamp.
    double stall() const { return window_s > 0 ? std::min(1.0, wait_s / window_s) : 0; }
    double wall_per_sample() const { return produced > 0 ? busy_s / produced : 0; }
    double cpu_per_sample() const { return produced > 0 ? cpu_s / produced : 0; }
    // Samples/s the consumer would take if it never waited; infinite when it
    // spends (almost) no time outside Next().
    double demand() const {
      if (window_s <= 0 || step_s < 0.01 * window_s || batches == 0) {
        return std::numeric_limits<double>::infinity();
      }
      return samples / step_s;
    }
  };

  int Model(const Pooled& p, const Budgets& b) const;
  int Cap(const Budgets& b) const;
  int PrefetchFor(int workers, const Budgets& b) const;
  bool Changed(const Pooled& p) const;
  std::optional<TunerDecision> Set(int workers, const Budgets& b, const Pooled& p,
                                   std::string reason, double t_s);

  Phase phase_ = Phase::kStart;
  int workers_;
  int prefetch_;
  Pooled pool_;
  int skip_windows_ = 1;  // windows to ignore after a change (pipeline refill)
  // The settled reference at the current worker count.
  std::optional<Pooled> reference_;
  int reference_workers_ = -1;
  // Trial bookkeeping.
  int trial_from_ = 0;
  double trial_rate_before_ = 0;
  int calm_windows_ = 0;
  int changed_windows_ = 0;
  bool careful_ = false;
  double last_gain_ = 0;  // of the last step up  // a multi-step descent stalled: step by one
  std::optional<int> knee_;   // more than this did not pay
  std::optional<int> floor_;  // fewer than this stalled
  double last_rate_ = 0, last_stall_ = 0;
  int last_cpu_cap_ = 0;
};

}  // namespace stoker
