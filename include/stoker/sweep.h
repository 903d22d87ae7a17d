#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stoker/defaults.h"
#include "stoker/loader.h"
#include "stoker/status.h"
#include "stoker/tuning.h"

namespace stoker {

/// One moment of a run, for live views, summaries and plots.
struct TimelinePoint {
  double t_s = 0;
  double samples_per_s = 0;   // delivered, over the interval that ends at t_s
  double produced_per_s = 0;  // produced by the workers (or the consumer), same interval
  double stall_fraction = 0;
  int workers = 0;
  int prefetch_batches = 0;
};

/// Time-weighted means over the timeline points that end in (from_s, to_s]:
/// throughput (samples/s) and stall fraction.
double MeanRate(const std::vector<TimelinePoint>& timeline, double from_s, double to_s);
double MeanStall(const std::vector<TimelinePoint>& timeline, double from_s, double to_s);
/// The throughput a stretch of the timeline shows: the lesser of what was
/// delivered and what was produced. Delivery alone reads high while the
/// consumer catches up on batches started before the stretch (a pool that
/// just shrank, a warm-up that ended with many batches part-filled);
/// production alone reads high while the prefetch window fills.
double SettledRate(const std::vector<TimelinePoint>& timeline, double from_s, double to_s);
/// For a short window (when a rate was first reached): what was delivered,
/// unless the consumer caught up on batches filled before it (delivered over
/// 1.2 x produced): then what was produced. The lesser of the two would read
/// a steady one-second window low by its noise.
double WindowRate(const std::vector<TimelinePoint>& timeline, double from_s, double to_s);

/// How the stand-in training loop consumes batches.
struct ConsumeOptions {
  double seconds = 0;  // stop after this long (0: no time limit)
  /// With `seconds`: true ends the loop at the limit itself, cutting short
  /// the wait for a batch, a batch being made on the consumer's thread and
  /// the step (a run told to last that long: `stoker run`); false lets the
  /// batch awaited at the limit and its step end first, so that a rate
  /// counts whole batches with their steps (the sweep's points).
  bool cut_at_limit = false;
  int64_t epochs = 0;  // stop after this many epochs (0: no epoch limit)
  double step_ms = 0;  // simulated accelerator step per batch (0: as fast as possible)
  /// Optional: the step as a function of time (overrides step_ms), for runs
  /// whose consumer changes speed midway.
  std::function<double(double t_s)> step_ms_at;
  double timeline_interval_s = 0.25;
  /// Called on the consumer's thread after each timeline point.
  std::function<void(const TimelinePoint&)> on_point;
  /// Optional: called after each batch (e.g. to change the workload mid-run).
  std::function<void(double t_s)> on_batch;
  /// Optional: polled on the consumer's thread between batches, and every
  /// 50 ms while a batch is awaited or a step sleeps; once it returns true
  /// the loop ends with the stats so far (ConsumeStats::stopped), e.g. on
  /// SIGINT. With 0 workers it is also asked after each sample of a batch
  /// being made on the consumer's thread (Loader::SetInterrupt).
  std::function<bool()> stop;
};

/// What a consume loop saw.
struct ConsumeStats {
  int64_t samples = 0;   // delivered
  int64_t produced = 0;  // produced by the workers (or the consumer) meanwhile
  int64_t batches = 0;
  int64_t epochs_completed = 0;
  double seconds = 0;
  double stall_fraction = 0;  // time inside Next() / total
  int workers_max = 0;
  bool stopped = false;  // ended by ConsumeOptions::stop
  std::vector<TimelinePoint> timeline;
};

/// Runs the stand-in training loop on `loader`: Next(), then sleeps step_ms,
/// until the time or epoch limit (at least one must be set) or `stop`. Blocks. A batch
/// error (ErrorPolicy::kRaise) ends the loop and is returned, naming the
/// sample and its file.
Result<ConsumeStats> Consume(Loader& loader, const ConsumeOptions& options);

/// The seeds' table: throughput per worker count, then the tuner on the same
/// data and pipeline.
struct SweepOptions {
  std::vector<int> workers;       // empty: 0, 1, 2, ... until past the knee; else CheckSweepCounts
  int max_workers = kMaxWorkers;  // where the automatic sequence stops at the latest
  double point_seconds = 4.0;     // measured per setting, after the warm-up
  double warmup_seconds = 0.5;
  /// The best few settings are measured a second time and each keeps the
  /// mean of its two measurements: the best of many short, noisy points
  /// otherwise sets the bar by luck. 0 = measure each point once.
  int confirm_top = 3;
  double tuned_seconds = 12.0;  // the tuned run
  bool run_tuned = true;        // false: the static sweep only
  /// After the tuned run, the best static setting is measured once more and
  /// the reference becomes the mean of before and after: a machine whose
  /// speed drifts over minutes then moves both sides of the ratio alike. A
  /// mean that falls below another count's row has that count measured again
  /// too: the reference is always the best row.
  bool bracket = true;
  double step_ms = 0;
  /// Progress lines for people (may be empty).
  std::function<void(const std::string&)> log;
  /// Optional: polled as ConsumeOptions::stop is; once it returns true the
  /// sweep ends with what it measured so far (SweepReport::interrupted), e.g.
  /// on SIGINT. The point being measured then is left out.
  std::function<bool()> stop;
};

struct SweepPoint {
  int workers = 0;
  double samples_per_s = 0;
  double stall_fraction = 0;
};

struct SweepReport {
  std::vector<SweepPoint> sweep;
  SweepPoint best_static;  // bracketed around the tuned run when asked
  SweepPoint recommended;  // RecommendedSweepPoint(sweep): the count advice names, marked "best"
  double tuned_samples_per_s = 0;  // after the first 5 s (or third of the run)
  int tuned_workers_final = 0;
  int tuned_workers_max = 0;
  double tuned_stall_fraction = 0;
  double seconds_to_95pct = -1;  // -1: never reached
  double ratio = 0;              // tuned / best static
  std::vector<TimelinePoint> tuned_timeline;
  std::vector<TunerDecision> trace;
  /// SweepOptions::stop ended the sweep early: `sweep` holds the points
  /// measured before (best_static the best of them), the tuned figures and
  /// the ratio are set only when tuned_measured.
  bool interrupted = false;
  bool tuned_measured = false;
  /// The samples skipped (ErrorPolicy::kSkip) in any of its runs, each once
  /// (by index), first seen first: the rates count only the others.
  std::vector<SkipRecord> skipped;
};

/// A measured setting that beats the fewer-worker settings by less than this
/// share of throughput (3 %) is noise, not a gain: the sweep's knee.
inline constexpr double kSweepSignificantGain = 0.03;

/// The count a sweep recommends, the one rule that `stoker bench`
/// (SweepReport::recommended) and stoker.bench answer with: the fewest
/// workers whose samples/s is within kSweepSignificantGain of the highest
/// measured (more workers past that only take CPU and memory), the first
/// listed of equal counts. Points may come in any order.
/// REQUIRES: !points.empty().
SweepPoint RecommendedSweepPoint(const std::vector<SweepPoint>& points);

/// The rule for a listed sweep's counts, `stoker bench --sweep` and
/// stoker.bench's alike: at least one, each from 0 to kMaxWorkers, none
/// twice. kInvalidArgument naming the count at fault.
Status CheckSweepCounts(const std::vector<int>& counts);

/// Sweeps static worker counts over fresh loaders made from `base` (its
/// `workers` is ignored), then runs one with workers = auto and base.tuner
/// (whose max_workers, when 0, becomes max_workers, at most kMaxWorkers).
/// Blocks for about (points x (warm-up + point)) + tuned seconds, or until
/// options.stop.
Result<SweepReport> RunSweep(const LoaderOptions& base, const SweepOptions& options);

}  // namespace stoker
