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
  // The CPUs this process may run on, over the window (core-seconds; < 0:
  // unknown): time other processes ran there, and time they were idle.
  double others_s = -1;
  double idle_s = -1;
};

/// Limits the tuner must keep, re-read as the machine changes.
struct Budgets {
  double cpu_cores = 1;          // cores this loader's workers may use
  int max_workers = 64;          // hard cap (configuration, rlimits)
  size_t memory_bytes = 0;       // 0 = unbounded
  size_t batch_bytes = 0;        // one batch buffer
  size_t worker_bytes = 0;       // one worker's footprint, measured or assumed
  // Cores of the CPUs we may run on that are not ours to use (other ranks',
  // or beyond a quota): other processes running there take nothing from us.
  double others_room = 0;
};

/// The decision logic of the tuner, free of clocks and threads: fed one
/// Observation per tick, it returns a decision when the knobs should change.
/// Deterministic, so tests drive it with a simulated workload and clock.
///
/// Method: windows are pooled until they hold enough evidence (time, and
/// batches or samples); the first pooled window sizes the pool by Little's
/// law (workers = demand rate x wall time per sample, capped where the
/// CPU-bound share saturates the CPU budget, or, when other processes keep
/// our CPUs busy, where the workers' share of them reaches 96 %); then, while
/// the consumer waits, it tries steps of half the pool (whole while steps
/// pay > 10 %), chaining them while they pay >= kGain, and marks the knee
/// when one does not; it steps down while the consumer never waits and the
/// workers are idle enough that fewer would still keep up, marking the floor
/// when that stalls. A workload change (demand, CPU or wall time per sample
/// at the same worker count, other processes' CPU use) clears the marks and
/// re-sizes by the model; a change of more than 2x is believed at once.
class TunerCore {
 public:
  static constexpr double kStallHigh = 0.01;  // the consumer waits too much above this
  static constexpr double kStallLow = 0.003;  // it is fed with margin below this
  static constexpr double kGain = 0.03;       // a step up must add this much throughput
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
    double others_s = 0, idle_s = 0;
    bool machine_known = true;  // others_s and idle_s were known in every window
    int64_t batches = 0, samples = 0, produced = 0;
    double rate() const { return window_s > 0 ? samples / window_s : 0; }
    // Samples/s the workers finished: finer-grained than whole batches.
    double produced_rate() const { return window_s > 0 ? produced / window_s : 0; }
    // Cores: the workers', other processes' (on our CPUs), and idle.
    double worker_cores() const { return window_s > 0 ? cpu_s / window_s : 0; }
    double other_cores() const { return window_s > 0 ? others_s / window_s : 0; }
    // Other processes' use beyond `room`: what they take of our budget.
    double intruding_cores(double room) const { return std::max(0.0, other_cores() - room); }
    double idle_cores() const { return window_s > 0 ? idle_s / window_s : 0; }
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
  double Changed(const Pooled& p, const Budgets& b) const;
  std::optional<TunerDecision> TryMore(const Budgets& b, const Pooled& p, const std::string& why,
                                       double t_s);
  std::optional<TunerDecision> Set(int workers, const Budgets& b, const Pooled& p,
                                   std::string reason, double t_s);

  Phase phase_ = Phase::kStart;
  int workers_;
  int prefetch_;
  Pooled pool_;
  int skip_windows_ = 1;  // windows to ignore after a change (pipeline refill) ...
  double skip_until_s_ = 0;  // ... and until this time, for slow samples
  // The settled reference at the current worker count.
  std::optional<Pooled> reference_;
  int reference_workers_ = -1;
  // Trial bookkeeping.
  int trial_from_ = 0;
  double trial_rate_before_ = 0;
  int calm_windows_ = 0;
  int changed_windows_ = 0;
  bool careful_ = false;   // a multi-step descent stalled: step down by one
  double last_gain_ = 0;   // of the last step up
  std::optional<int> knee_;   // more than this did not pay
  std::optional<int> floor_;  // fewer than this stalled
  double last_rate_ = 0, last_stall_ = 0;
  int last_cpu_cap_ = 0;
};

}  // namespace stoker
