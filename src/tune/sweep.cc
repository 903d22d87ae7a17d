#include "stoker/sweep.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Time-weighted mean of `field` over the points ending in (from_s, to_s].
template <typename F>
double TimelineMean(const std::vector<TimelinePoint>& tl, double from_s, double to_s, F field) {
  double sum = 0, seconds = 0, prev = 0;
  for (const auto& p : tl) {
    const double dt = p.t_s - prev;
    if (p.t_s > from_s && p.t_s <= to_s + 1e-9) {
      sum += field(p) * dt;
      seconds += dt;
    }
    prev = p.t_s;
  }
  return seconds > 0 ? sum / seconds : 0;
}

constexpr std::chrono::milliseconds kStopPoll{50};  // ConsumeOptions::stop's polling

bool Stopping(const ConsumeOptions& o) { return o.stop && o.stop(); }

// The simulated accelerator step after a batch taken at `t_s`; it ends at
// `deadline` (the time limit) too.
void Step(const ConsumeOptions& o, double t_s, Clock::time_point deadline) {
  const double ms = o.step_ms_at ? o.step_ms_at(t_s) : o.step_ms;
  if (ms <= 0) return;
  const auto until =
      std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double, std::milli>(ms)));
  while (Clock::now() < until && !Stopping(o)) {
    std::this_thread::sleep_until(
        o.stop ? std::min<Clock::time_point>(until, Clock::now() + kStopPoll) : until);
  }
}

// How long to wait for a batch before looking at the stop and the time
// limit again. REQUIRES: o.stop or a finite `deadline`.
std::chrono::nanoseconds WaitSlice(const ConsumeOptions& o, Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return kStopPoll;
  const auto left = std::max(Clock::duration::zero(), deadline - Clock::now());
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      o.stop ? std::min<Clock::duration>(left, kStopPoll) : left);
}

// The timeline point at `t_s` for the `dt_s` since the metrics `last`.
TimelinePoint PointBetween(const LoaderMetrics& last, const LoaderMetrics& m, double t_s,
                           double dt_s) {
  TimelinePoint p;
  p.t_s = t_s;
  p.samples_per_s = dt_s > 0 ? (m.samples_delivered - last.samples_delivered) / dt_s : 0;
  p.produced_per_s = dt_s > 0 ? (m.samples_produced - last.samples_produced) / dt_s : 0;
  p.stall_fraction =
      StallFraction(static_cast<double>(m.consumer_wait_ns - last.consumer_wait_ns) * 1e-9, dt_s);
  p.workers = m.workers_target;
  p.prefetch_batches = m.prefetch_batches;
  return p;
}

}  // namespace

double MeanRate(const std::vector<TimelinePoint>& tl, double from_s, double to_s) {
  return TimelineMean(tl, from_s, to_s, [](const TimelinePoint& p) { return p.samples_per_s; });
}

double MeanStall(const std::vector<TimelinePoint>& tl, double from_s, double to_s) {
  return TimelineMean(tl, from_s, to_s, [](const TimelinePoint& p) { return p.stall_fraction; });
}

namespace {

double MeanProduced(const std::vector<TimelinePoint>& tl, double from_s, double to_s) {
  return TimelineMean(tl, from_s, to_s, [](const TimelinePoint& p) { return p.produced_per_s; });
}

}  // namespace

double SettledRate(const std::vector<TimelinePoint>& tl, double from_s, double to_s) {
  return std::min(MeanRate(tl, from_s, to_s), MeanProduced(tl, from_s, to_s));
}

double WindowRate(const std::vector<TimelinePoint>& tl, double from_s, double to_s) {
  const double delivered = MeanRate(tl, from_s, to_s), produced = MeanProduced(tl, from_s, to_s);
  return delivered > 1.2 * produced ? produced : delivered;
}

Result<ConsumeStats> Consume(Loader& loader, const ConsumeOptions& o) {
  if (o.seconds <= 0 && o.epochs <= 0) {
    return InvalidArgument("give a time limit (seconds) or an epoch count");
  }
  if (o.step_ms < 0) return InvalidArgument("step_ms must be >= 0");
  ConsumeStats s;
  const auto t0 = Clock::now();
  auto next_point = t0 + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(o.timeline_interval_s));
  LoaderMetrics m0 = loader.Metrics();
  LoaderMetrics last = m0;
  double last_t = 0;
  // The time limit, where cut_at_limit ends the loop mid-wait, mid-batch
  // and mid-step too; the loop's own check between batches is below.
  const bool limited = o.seconds > 0 && o.cut_at_limit;
  const auto deadline = limited ? t0 + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(o.seconds))
                                : Clock::time_point::max();
  const auto past_deadline = [limited, deadline] { return limited && Clock::now() >= deadline; };
  // A stop, or the time limit, ends a batch being made on the consumer's
  // thread (0 workers) too.
  if (o.stop || limited) {
    loader.SetInterrupt([&o, past_deadline] { return Stopping(o) || past_deadline(); });
  }
  struct Unset {
    Loader& loader;
    ~Unset() { loader.SetInterrupt({}); }
  } unset{loader};
  while (true) {
    if (o.seconds > 0 && Since(t0) >= o.seconds) break;
    // With a stop or a time limit to watch, wait for the batch in slices
    // (the wait still counts as the consumer's), so that either ends a long
    // wait too.
    if (o.stop || limited) {
      while (!loader.WaitReady(WaitSlice(o, deadline)) && !Stopping(o) && !past_deadline()) {
      }
    }
    if (Stopping(o)) {
      s.stopped = true;
      break;
    }
    if (past_deadline()) break;
    auto r = loader.Next();
    if (!r.ok() && r.status().code() == StatusCode::kCancelled) {
      if (Stopping(o)) {
        s.stopped = true;
        break;
      }
      if (past_deadline()) break;
    }
    if (!r.ok()) return r.status();
    if (!r->has_value()) {
      ++s.epochs_completed;
      if (o.epochs > 0 && s.epochs_completed >= o.epochs) break;
      continue;
    }
    s.samples += (**r).size();
    ++s.batches;
    r->reset();  // hand the buffer back before the "step", as a trainer would after its copy
    Step(o, Since(t0), deadline);
    if (o.on_batch) o.on_batch(Since(t0));
    if (Clock::now() >= next_point) {
      LoaderMetrics m = loader.Metrics();
      double t = Since(t0);
      double dt = t - last_t;
      const TimelinePoint p = PointBetween(last, m, t, dt);
      s.workers_max = std::max(s.workers_max, m.workers_target);
      s.timeline.push_back(p);
      if (o.on_point) o.on_point(p);
      last = m;
      last_t = t;
      // One point per interval; after a long wait (a slow first batch),
      // start afresh rather than emit a burst of zero-length points.
      const auto interval = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(o.timeline_interval_s));
      next_point += interval;
      if (next_point <= Clock::now()) next_point = Clock::now() + interval;
    }
  }
  s.seconds = Since(t0);
  LoaderMetrics end = loader.Metrics();
  // A run shorter than one interval is one point, not none (a rate of 0).
  if (s.timeline.empty() && s.seconds > 0) {
    s.timeline.push_back(PointBetween(m0, end, s.seconds, s.seconds));
    if (o.on_point) o.on_point(s.timeline.back());
  }
  s.workers_max = std::max(s.workers_max, end.workers_target);
  s.produced = end.samples_produced - m0.samples_produced;
  s.stall_fraction = StallFraction(
      static_cast<double>(end.consumer_wait_ns - m0.consumer_wait_ns) * 1e-9, s.seconds);
  return s;
}

namespace {

void Log(const SweepOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// The row of the highest samples/s (the first of equals). REQUIRES: !sweep.empty().
SweepPoint& BestRow(std::vector<SweepPoint>& sweep) {
  assert(!sweep.empty());
  return *std::max_element(
      sweep.begin(), sweep.end(),
      [](const SweepPoint& x, const SweepPoint& y) { return x.samples_per_s < y.samples_per_s; });
}

// Adds the samples `loader` skipped that the report does not hold yet.
void NoteSkipped(const Loader& loader, SweepReport& report) {
  std::set<int64_t> known;
  for (const SkipRecord& r : report.skipped) known.insert(r.index);
  for (SkipRecord& r : loader.Skipped()) {
    if (known.insert(r.index).second) report.skipped.push_back(std::move(r));
  }
}

// One static setting: a fresh loader with `workers`, warmed up, then
// measured; nullopt when options.stop ended it (report.interrupted is set).
Result<std::optional<SweepPoint>> MeasureStatic(const LoaderOptions& base, const SweepOptions& o,
                                                int workers, SweepReport& report) {
  LoaderOptions lo = base;
  lo.workers = workers;
  lo.prefetch_batches = DefaultPrefetch(workers, base.batch_size);
  STOKER_ASSIGN_OR_RETURN(auto loader, Loader::Make(lo));
  ConsumeOptions warm;
  warm.seconds = o.warmup_seconds;
  warm.step_ms = o.step_ms;
  warm.stop = o.stop;
  STOKER_ASSIGN_OR_RETURN(ConsumeStats warmed, Consume(*loader, warm));
  ConsumeStats st;
  if (!warmed.stopped) {
    ConsumeOptions run = warm;
    run.seconds = o.point_seconds;
    STOKER_ASSIGN_OR_RETURN(st, Consume(*loader, run));
  }
  NoteSkipped(*loader, report);
  if (warmed.stopped || st.stopped) {
    report.interrupted = true;
    return std::optional<SweepPoint>();
  }
  // The lesser of delivered and produced, as SettledRate (which says why).
  SweepPoint p{workers, static_cast<double>(std::min(st.samples, st.produced)) / st.seconds,
               st.stall_fraction};
  char line[160];
  std::snprintf(line, sizeof line, "  workers %3d  %10.1f samples/s  stall %5.1f %%", workers,
                p.samples_per_s, p.stall_fraction * 100);
  Log(o, line);
  return std::optional<SweepPoint>(p);
}

// The worker counts the user listed.
Status SweepListed(const LoaderOptions& base, const SweepOptions& o, SweepReport& report) {
  for (int w : o.workers) {
    if (w < 0) return InvalidArgument("sweep worker counts must be >= 0, got " + std::to_string(w));
    STOKER_ASSIGN_OR_RETURN(std::optional<SweepPoint> p, MeasureStatic(base, o, w, report));
    if (!p) break;
    report.sweep.push_back(*p);
  }
  return Status::Ok();
}

// 0, 1, 2, 3, 4, then x1.5, until two points in a row fail to beat the best
// by kSweepSignificantGain (past the knee), or max_workers.
Status SweepUntilKnee(const LoaderOptions& base, const SweepOptions& o, SweepReport& report) {
  int misses = 0;
  double best = 0;
  for (int w = 0; w <= o.max_workers;) {
    STOKER_ASSIGN_OR_RETURN(std::optional<SweepPoint> measured, MeasureStatic(base, o, w, report));
    if (!measured) break;
    const SweepPoint& p = *measured;
    report.sweep.push_back(p);
    if (w >= 2) misses = p.samples_per_s > best * (1 + kSweepSignificantGain) ? 0 : misses + 1;
    best = std::max(best, p.samples_per_s);
    if (misses >= 2) break;
    int next = w < 4 ? w + 1 : static_cast<int>(std::lround(w * 1.5));
    if (w < o.max_workers && next > o.max_workers) next = o.max_workers;
    w = next;
    if (w == report.sweep.back().workers) break;
  }
  return Status::Ok();
}

// Second measurements of the best few (time-weighted: both are equally
// long), then the best static setting.
Status ConfirmBest(const LoaderOptions& base, const SweepOptions& o, SweepReport& report) {
  std::vector<size_t> order(report.sweep.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return report.sweep[a].samples_per_s > report.sweep[b].samples_per_s;
  });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(std::max(o.confirm_top, 0))));
  if (report.interrupted) order.clear();
  if (!order.empty()) Log(o, "  measuring the best settings again ...");
  for (size_t i : order) {
    SweepPoint& p = report.sweep[i];
    STOKER_ASSIGN_OR_RETURN(std::optional<SweepPoint> again,
                            MeasureStatic(base, o, p.workers, report));
    if (!again) break;
    p.samples_per_s = (p.samples_per_s + again->samples_per_s) / 2;
    p.stall_fraction = (p.stall_fraction + again->stall_fraction) / 2;
  }
  if (report.sweep.empty()) return Status::Ok();  // interrupted before the first point
  report.best_static = BestRow(report.sweep);
  report.recommended = RecommendedSweepPoint(report.sweep);
  return Status::Ok();
}

// The run with workers = auto; its trace and timeline go into the report.
Status RunTuned(const LoaderOptions& base, const SweepOptions& o, SweepReport& report) {
  Log(o, "  tuner (workers = auto) ...");
  LoaderOptions lo = base;
  lo.workers = kAutoWorkers;
  if (lo.tuner.max_workers == 0) lo.tuner.max_workers = std::min(o.max_workers, kMaxWorkers);
  STOKER_ASSIGN_OR_RETURN(auto loader, Loader::Make(std::move(lo)));
  ConsumeOptions run;
  run.seconds = o.tuned_seconds;
  run.step_ms = o.step_ms;
  run.stop = o.stop;
  STOKER_ASSIGN_OR_RETURN(ConsumeStats st, Consume(*loader, run));
  NoteSkipped(*loader, report);
  if (st.stopped) {
    report.interrupted = true;
    return Status::Ok();
  }
  report.tuned_measured = true;
  report.tuned_timeline = st.timeline;
  report.trace = loader->tuner_trace();
  report.tuned_workers_final = loader->workers();
  report.tuned_workers_max = st.workers_max;
  report.tuned_stall_fraction = st.stall_fraction;
  const double settle = std::min(5.0, o.tuned_seconds / 3);
  report.tuned_samples_per_s = SettledRate(st.timeline, settle, st.seconds);
  return Status::Ok();
}

// The best static setting measured again after the tuned run: its row
// becomes the mean of before and after, and the reference is the best row
// so bracketed. A mean that falls below another row makes that row the best,
// and it is bracketed in turn (each count once, so this ends): the reference
// is never a lesser row, nor one measured only before the tuned run.
Status Bracket(const LoaderOptions& base, const SweepOptions& o, SweepReport& report) {
  std::vector<int> bracketed;
  for (SweepPoint* best = &BestRow(report.sweep);
       std::find(bracketed.begin(), bracketed.end(), best->workers) == bracketed.end();
       best = &BestRow(report.sweep)) {
    Log(o, bracketed.empty() ? "  the best static setting again, after the tuned run ..."
                             : "  workers " + std::to_string(best->workers) +
                                   ", now the best static setting, again ...");
    STOKER_ASSIGN_OR_RETURN(std::optional<SweepPoint> after,
                            MeasureStatic(base, o, best->workers, report));
    if (!after) break;
    best->samples_per_s = (best->samples_per_s + after->samples_per_s) / 2;
    best->stall_fraction = (best->stall_fraction + after->stall_fraction) / 2;
    bracketed.push_back(best->workers);
  }
  // One figure per count: the reference, its row in the table and plot, and
  // the count recommended from the rows.
  report.best_static = BestRow(report.sweep);
  report.recommended = RecommendedSweepPoint(report.sweep);
  return Status::Ok();
}

// The first moment a 1-second window reaches 95 % of `best`; -1 if never.
double SecondsTo95Percent(const std::vector<TimelinePoint>& timeline, double best) {
  for (const auto& p : timeline) {
    if (p.t_s < 1.0) continue;
    if (WindowRate(timeline, p.t_s - 1.0, p.t_s) >= 0.95 * best) return p.t_s;
  }
  return -1;
}

}  // namespace

SweepPoint RecommendedSweepPoint(const std::vector<SweepPoint>& points) {
  assert(!points.empty());
  double top = 0;
  for (const SweepPoint& p : points) top = std::max(top, p.samples_per_s);
  const SweepPoint* chosen = nullptr;
  for (const SweepPoint& p : points) {
    const bool at_knee = p.samples_per_s * (1 + kSweepSignificantGain) >= top;
    if (at_knee && (chosen == nullptr || p.workers < chosen->workers)) chosen = &p;
  }
  return *chosen;
}

Status CheckSweepCounts(const std::vector<int>& counts) {
  if (counts.empty()) return InvalidArgument("list at least one worker count");
  std::vector<bool> seen(kMaxWorkers + 1, false);
  for (const int count : counts) {
    if (count < 0 || count > kMaxWorkers) {
      return InvalidArgument("worker counts go from 0 to " + std::to_string(kMaxWorkers) +
                             ", got " + std::to_string(count));
    }
    if (seen[static_cast<size_t>(count)]) {
      return InvalidArgument("worker count " + std::to_string(count) +
                             " is listed twice (a count is measured once)");
    }
    seen[static_cast<size_t>(count)] = true;
  }
  return Status::Ok();
}

Result<SweepReport> RunSweep(const LoaderOptions& base, const SweepOptions& o) {
  if (o.point_seconds <= 0 || o.tuned_seconds <= 0) {
    return InvalidArgument("sweep point and tuned seconds must be > 0");
  }
  if (!o.workers.empty()) STOKER_RETURN_IF_ERROR(CheckSweepCounts(o.workers));
  SweepReport report;
  STOKER_RETURN_IF_ERROR(o.workers.empty() ? SweepUntilKnee(base, o, report)
                                           : SweepListed(base, o, report));
  STOKER_RETURN_IF_ERROR(ConfirmBest(base, o, report));
  if (!o.run_tuned || report.interrupted) return report;
  STOKER_RETURN_IF_ERROR(RunTuned(base, o, report));
  if (report.interrupted) return report;
  if (o.bracket) STOKER_RETURN_IF_ERROR(Bracket(base, o, report));
  const double best = report.best_static.samples_per_s;
  report.seconds_to_95pct = SecondsTo95Percent(report.tuned_timeline, best);
  report.ratio = best > 0 ? report.tuned_samples_per_s / best : 0;
  return report;
}

}  // namespace stoker
