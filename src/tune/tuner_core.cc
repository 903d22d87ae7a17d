#include "tune/tuner_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace stoker {
namespace {

constexpr double kMinWindowS = 0.5;   // pool windows until they cover this much time
constexpr int64_t kMinBatches = 3;    // ... and this many batches,
constexpr double kMaxWindowS = 1.5;   // ... unless this much time has passed.
constexpr double kHeadroom = 1.2;     // the model provisions 20 % above the demand
// ... and three times the CPU-saturation point of I/O-bound work: there,
// with many workers waking at random, the cores approach full use only
// slowly as workers are added (measured: 20 ms reads on 2 cores saturate in
// theory at ~35 workers; static sweeps gained 3-5 % from 72 to 108-128,
// less than a one-second trial can tell from noise). Idle threads cost
// little.
constexpr double kIoHeadroom = 3.0;
constexpr double kTrialWindowS = 1.0;  // a trial is judged on at least this much time
constexpr int64_t kStartSamples = 16;  // the first model jump needs this many samples
constexpr double kDownBusy = 0.85;    // step down only if the rest would be at most this busy
// When other processes keep our CPUs busy, each runnable thread gets its
// share: provision workers for this share of the CPU time that is taken.
constexpr double kOutbidShare = 0.96;
// Other processes take at least this share of our CPU budget (less is not
// worth more threads: a monitoring daemon is no reason to outbid) ...
constexpr double kContended = 0.25;
constexpr double kNoIdle = 0.1;       // ... and the CPUs are idle at most this fraction
// ... or, with a CPU-bound pool large enough to leave them little, they
// run at least this many threads' worth (Pooled::rivals). (Not for I/O-bound
// pools: their size comes from the I/O, and there a few hundredths of a
// core, times a hundred threads, would read as rivals.)
constexpr double kRivals = 1.0;
// Once contended, the estimate may fall to this before the rivals count as
// gone: a pool that has outbid them leaves them a share near /proc/stat's
// tick noise (two hogs beside 128 workers take 1.5 % of the CPUs, 0.7
// threads' worth after the noise allowance), where the estimate wanders
// below kRivals while they still run. Gone, they read as ~0.
constexpr double kRivalsHeld = 0.25;
constexpr double kBigChange = 1.0;    // a change this large is believed on one window
constexpr double kBigGain = 0.1;      // a step up that paid this much: double next time

std::string Fmt(const char* fmt, double a, double b = 0, double c = 0, double d = 0, double e = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d, e);
  return buf;
}

double RelChange(double now, double before) {
  if (before <= 0) return now > 0 ? 1 : 0;
  return std::abs(now - before) / before;
}

}  // namespace

TunerCore::TunerCore(int initial_workers, int initial_prefetch)
    : workers_(std::max(1, initial_workers)), prefetch_(std::max(1, initial_prefetch)) {}

const char* TunerCore::phase() const {
  switch (phase_) {
    case Phase::kStart: return "measuring";
    case Phase::kRefine: return knee_ || floor_ ? "steady" : "refining";
    case Phase::kTrialUp: return "trying more workers";
    case Phase::kTrialDown: return "trying fewer workers";
  }
  return "?";
}

int TunerCore::Cap(const Budgets& b) const {
  int cap = std::max(1, b.max_workers);
  if (b.memory_bytes > 0) {
    // Keep room for two batches in flight; the rest may go to workers.
    size_t batches = 2 * b.batch_bytes;
    size_t per_worker = std::max<size_t>(b.worker_bytes, 1);
    size_t room = b.memory_bytes > batches ? b.memory_bytes - batches : 0;
    cap = std::min<int64_t>(cap, std::max<int64_t>(1, static_cast<int64_t>(room / per_worker)));
  }
  return cap;
}

int TunerCore::PrefetchFor(int workers, const Budgets& b) const {
  int p = DefaultPrefetch(workers);
  if (b.memory_bytes > 0 && b.batch_bytes > 0) {
    size_t used = static_cast<size_t>(workers) * b.worker_bytes;
    size_t room = b.memory_bytes > used ? b.memory_bytes - used : 0;
    p = std::min<int64_t>(p, static_cast<int64_t>(room / b.batch_bytes));
  }
  return std::max(1, p);
}

void TunerCore::UpdateContention(Pooled& p, const Budgets& b) {
  const bool strict = Contended(p, b);
  const bool held = contended_ && p.machine_known && p.on_cpu() &&
                    p.idle_cores() <= kNoIdle * b.cpu_cores && p.rivals(b) >= kRivalsHeld;
  if (strict) {
    rivals_ = p.on_cpu() ? std::max(p.rivals(b), contended_ ? rivals_ : 0.0) : 0;
  } else if (!held) {
    rivals_ = 0;
  }
  contended_ = strict || held;
  p.contended = contended_;
}

bool TunerCore::Contended(const Pooled& p, const Budgets& b) {
  if (!p.machine_known || p.worker_cores() <= 0 || p.idle_cores() > kNoIdle * b.cpu_cores) {
    return false;
  }
  return p.intruding_cores(b.others_room) >= kContended * b.cpu_cores ||
         (p.on_cpu() && p.rivals(b) >= kRivals);
}

int TunerCore::Model(const Pooled& p, const Budgets& b) const {
  // The time a sample needs, not the time it queued: with more threads than
  // cores the wall time grows with the pool, and sizing the pool by it
  // would keep it large once it is large.
  const double wall = p.unqueued_per_sample();
  const double cpu = p.cpu_per_sample();
  if (wall <= 0) return workers_;  // nothing produced yet: no evidence
  // Workers whose CPU-bound share fills the CPU budget: beyond them, more
  // workers only queue for cores. I/O-bound work (cpu << wall) gets many.
  // With many mostly-waiting workers, samples near saturation queue for
  // cores: provision the same headroom there (not for CPU-bound work, where
  // a worker per core is the knee).
  double cpu_fill = cpu > 0 ? b.cpu_cores * wall / cpu : 1e9;
  if (cpu_fill >= 2 * b.cpu_cores) cpu_fill *= kIoHeadroom;
  // Other processes compete for our CPUs and leave none idle: the scheduler
  // shares CPU time per runnable thread, so the workers' share grows with
  // their count. Size the pool for kOutbidShare of the busy CPU time.
  const bool contended = contended_;
  if (contended) {
    const double share = kOutbidShare / (1 - kOutbidShare);
    cpu_fill = std::max(cpu_fill, std::ceil(share * rivals_));
  }
  // A bounded demand, by Little's law; queueing behind other processes will
  // last, behind our own surplus threads it will not.
  const double demand = p.demand();
  const double need =
      std::isinf(demand) ? 1e9 : demand * (contended ? p.wall_per_sample() : wall) * kHeadroom;
  // A little over an integer counts as that integer: 2.07 means 2 (wall
  // time a few per cent over CPU time is the consumer's thread, not waiting).
  const double m = std::ceil(std::min(need, cpu_fill) - 0.1);
  return static_cast<int>(std::clamp<double>(m, 1, Cap(b)));
}

double TunerCore::Changed(const Pooled& p, const Budgets& b) const {
  if (!reference_) return 0;
  const Pooled& r = *reference_;
  // A consumer that would take more than twice what it gets is not the
  // limit, whatever its exact demand (a moment outside Next() makes it finite).
  // Without a whole batch delivered, a window says nothing of the demand.
  auto unbounded = [](const Pooled& x) { return x.demand() > 2 * x.rate(); };
  const bool demand_known = p.batches > 0 && r.batches > 0;
  if (demand_known && unbounded(p) != unbounded(r)) return 2 * kBigChange;
  double change = !demand_known || unbounded(p) ? 0 : RelChange(p.demand(), r.demand());
  change = std::max(change, RelChange(p.cpu_per_sample(), r.cpu_per_sample()));
  // The wall time less its queueing for a CPU: CPU-bound work's wall time
  // is its CPU time plus a queue that grows and wanders with the threads
  // sharing the cores (ours and others', whose coming and going is tested
  // below), and that would read as a new workload.
  if (!p.on_cpu() || !r.on_cpu()) {
    change = std::max(change, RelChange(p.unqueued_per_sample(), r.unqueued_per_sample()));
  }
  // Other processes starting or stopping on our CPUs: a core's worth, the
  // contention coming or going, or, while it lasts, twice or half as many
  // of their threads (both estimates clear of the noise).
  if (p.machine_known && r.machine_known) {
    const double rp = p.rivals(b), rr = r.rivals(b);
    if (std::abs(p.intruding_cores(b.others_room) - r.intruding_cores(b.others_room)) >
            2 * kContended * b.cpu_cores ||
        p.contended != r.contended ||
        (p.contended && p.on_cpu() && r.on_cpu() && std::min(rp, rr) >= kRivals &&
         std::min(rp, rr) < 0.5 * std::max(rp, rr))) {
      change = std::max(change, 2 * kChange);
    }
  }
  return change > kChange ? change : 0;
}

std::optional<TunerDecision> TunerCore::Set(int workers, const Budgets& b, const Pooled& p,
                                            std::string reason, double t_s) {
  workers = std::clamp(workers, 1, Cap(b));
  const int prefetch = PrefetchFor(workers, b);
  TunerDecision d;
  d.t_s = t_s;
  d.workers_before = workers_;
  d.prefetch_before = prefetch_;
  d.workers_after = workers;
  d.prefetch_after = prefetch;
  d.reason = std::move(reason);
  d.samples_per_s = p.rate();
  d.stall_fraction = p.stall();
  d.cpu_per_sample_ms = p.cpu_per_sample() * 1e3;
  d.wall_per_sample_ms = p.wall_per_sample() * 1e3;
  d.demand_per_s = std::isinf(p.demand()) ? 0 : p.demand();
  if (workers != workers_) windows_at_count_ = 0;
  if (workers != workers_ || prefetch != prefetch_) {
    // Let the pipeline refill before judging: a window, and longer when
    // samples are slow (the new workers' first tasks end late).
    skip_windows_ = 1;
    skip_until_s_ = t_s + std::clamp(20 * p.wall_per_sample(), 0.0, 1.0);
    pool_ = {};
  }
  workers_ = workers;
  prefetch_ = prefetch;
  return d;
}

std::optional<TunerDecision> TunerCore::KneeHere(const Budgets& b, const Pooled& p,
                                                 std::string reason, double t_s) {
  knee_ = workers_;
  reference_ = p;
  reference_workers_ = workers_;
  return Set(workers_, b, p, std::move(reason), t_s);
}

std::optional<TunerDecision> TunerCore::TryMore(const Budgets& b, const Pooled& p,
                                                const std::string& why, double t_s) {
  const int cap = Cap(b);
  if (workers_ >= cap || (knee_ && *knee_ <= workers_)) return std::nullopt;
  // CPU-bound workers that fill the budget are the knee already: a trial
  // would only cost the time its thread needs to start and compete. (Not
  // while other processes compete: there, more threads win a larger share.)
  if (!contended_ && p.on_cpu() && workers_ >= static_cast<int>(std::ceil(b.cpu_cores - 0.05))) {
    return KneeHere(
        b, p,
        why + Fmt("knee at %.0f workers: CPU-bound (%.2f ms wall, %.2f ms CPU per "
                  "sample) and filling the %.1f-core budget",
                  workers_, p.wall_per_sample() * 1e3, p.cpu_per_sample() * 1e3, b.cpu_cores),
        t_s);
  }
  // Steps of half the pool, whole while they keep paying handsomely: big
  // enough that their gain stands out of the noise of a one-second window.
  const int step = std::max(1, last_gain_ > kBigGain ? workers_ : workers_ / 2);
  int target = std::max(Model(p, b), workers_ + step);
  if (knee_) target = std::min(target, *knee_);
  target = std::min(target, cap);
  if (target <= workers_) return std::nullopt;
  // CPU-bound under contention, the step can only win a larger share of
  // the cores from the rivals: when that is less than a trial can tell,
  // this is the knee (a trial would pay by the noise's luck alone).
  if (contended_ && p.on_cpu() && rivals_ > 0) {
    auto share = [&](int n) { return n / (n + rivals_); };
    const double most = share(target) / share(workers_) - 1;
    if (most < kGain) {
      return KneeHere(b, p,
                      why + Fmt("knee at %.0f workers: outbidding %.1f threads of other "
                                "processes, %.0f workers would win at most %+.1f %% more of the "
                                "CPUs",
                                workers_, rivals_, target, most * 100),
                      t_s);
    }
  }
  trial_from_ = workers_;
  trial_rate_before_ = p.produced_rate();
  phase_ = Phase::kTrialUp;
  return Set(target, b, p,
             why + Fmt("consumer waited %.1f %% of the time at %.0f samples/s: trying %.0f "
                       "workers",
                       p.stall() * 100, p.rate(), target),
             t_s);
}

std::optional<TunerDecision> TunerCore::Observe(const Observation& o, const Budgets& b) {
  if (o.workers != workers_) {
    // Someone else resized the loader: adopt it and measure afresh.
    workers_ = std::max(1, o.workers);
    windows_at_count_ = 0;
    pool_ = {};
    reference_.reset();
    return std::nullopt;
  }
  if (skip_windows_ > 0 || o.t_s < skip_until_s_) {
    skip_windows_ = std::max(0, skip_windows_ - 1);
    return std::nullopt;
  }
  pool_.window_s += o.window_s;
  pool_.others_s += std::max(0.0, o.others_s);
  pool_.idle_s += std::max(0.0, o.idle_s);
  pool_.machine_known = pool_.machine_known && o.others_s >= 0 && o.idle_s >= 0;
  pool_.wait_s += o.wait_s;
  pool_.step_s += o.step_s;
  pool_.busy_s += o.busy_s;
  pool_.cpu_s += o.cpu_s;
  pool_.queue_s += o.queue_s;
  pool_.workers = o.workers;
  pool_.batches += o.batches;
  pool_.samples += o.samples;
  pool_.produced += o.produced;
  if (phase_ == Phase::kStart) {
    // The model needs per-sample times, not delivered batches: jump early,
    // and earlier still when samples are many.
    const bool plenty = pool_.produced >= 4 * kStartSamples && pool_.window_s >= kMinWindowS / 2;
    if (!plenty && (pool_.window_s < kMinWindowS || pool_.produced < kStartSamples)) {
      return std::nullopt;
    }
  } else {
    const bool trial = phase_ == Phase::kTrialUp || phase_ == Phase::kTrialDown;
    if (pool_.window_s < (trial ? kTrialWindowS : kMinWindowS)) return std::nullopt;
    // Few batches, but enough samples for per-sample figures, will do.
    if (pool_.batches < kMinBatches && pool_.produced < 3 * kStartSamples &&
        pool_.window_s < kMaxWindowS) {
      return std::nullopt;
    }
  }
  Pooled p = pool_;
  pool_ = {};
  UpdateContention(p, b);
  ++windows_at_count_;
  last_rate_ = p.rate();
  last_stall_ = p.stall();
  last_cpu_cap_ =
      p.cpu_per_sample() > 0
          ? static_cast<int>(std::ceil(b.cpu_cores * p.unqueued_per_sample() / p.cpu_per_sample()))
          : 0;
  const double t = o.t_s;
  const int cap = Cap(b);

  if (workers_ > cap) {
    return Set(cap, b, p, Fmt("over budget: cap is %.0f workers", cap), t);
  }

  switch (phase_) {
    case Phase::kStart: {
      phase_ = Phase::kRefine;
      reference_ = p;
      reference_workers_ = workers_;
      // Logged even when it keeps the count: the trace then says why.
      const int m = Model(p, b);
      return Set(m, b, p,
                 Fmt("model: %.2f ms wall (%.2f ms of it queued for a CPU) and %.2f ms CPU per "
                     "sample, demand %.0f/s -> %.0f workers",
                     p.wall_per_sample() * 1e3, p.queue_per_sample() * 1e3,
                     p.cpu_per_sample() * 1e3, std::isinf(p.demand()) ? -1 : p.demand(), m),
                 t);
    }
    case Phase::kTrialUp: {
      phase_ = Phase::kRefine;
      const double gain = p.produced_rate() / std::max(trial_rate_before_, 1e-9) - 1;
      last_gain_ = gain;
      if (gain >= kGain) {
        // Still short, the next step comes after one more window, the new
        // reference: this one holds the new threads' start-up.
        reference_.reset();
        return Set(workers_, b, p,
                   Fmt("step up from %.0f paid: throughput %+.1f %%", trial_from_, gain * 100), t);
      }
      knee_ = trial_from_;
      reference_.reset();  // measure the settled count afresh, not the trial's window
      return Set(trial_from_, b, p,
                 Fmt("knee at %.0f workers: %.0f gained only %+.1f %%", trial_from_, workers_,
                     gain * 100),
                 t);
    }
    case Phase::kTrialDown: {
      phase_ = Phase::kRefine;
      if (p.stall() > kStallHigh) {
        const bool single_step = trial_from_ - workers_ == 1;
        if (single_step) floor_ = trial_from_;
        careful_ = true;  // from now on, step down one at a time
        reference_.reset();
        return Set(trial_from_, b, p,
                   Fmt(single_step ? "floor at %.0f workers: %.0f left the consumer waiting %.1f %%"
                                   : "back to %.0f workers: %.0f left the consumer waiting %.1f %%",
                       trial_from_, workers_, p.stall() * 100),
                   t);
      }
      reference_ = p;
      reference_workers_ = workers_;
      return Set(workers_, b, p,
                 Fmt("%.0f workers keep the consumer fed (stall %.2f %%)", workers_,
                     p.stall() * 100),
                 t);
    }
    case Phase::kRefine:
      break;
  }

  if (reference_workers_ != workers_ || !reference_) {
    // The reference for workload changes: a settled window (see above).
    if (windows_at_count_ < 2) return std::nullopt;
    reference_ = p;
    reference_workers_ = workers_;
  } else if (const double change = Changed(p, b); change > 0) {
    if (++changed_windows_ >= 2 || change > kBigChange) {
      changed_windows_ = 0;
      knee_.reset();
      floor_.reset();
      careful_ = false;
      last_gain_ = 0;
      reference_ = p;
      const int m = Model(p, b);
      return Set(m, b, p,
                 Fmt("workload changed (%.2f ms wall, %.2f ms of it queued for a CPU, %.2f ms "
                     "CPU per sample, demand %.0f/s): model says %.0f workers",
                     p.wall_per_sample() * 1e3, p.queue_per_sample() * 1e3,
                     p.cpu_per_sample() * 1e3, std::isinf(p.demand()) ? -1 : p.demand(), m),
                 t);
    }
    return std::nullopt;  // wait for a second window before believing it
  } else {
    changed_windows_ = 0;
  }

  if (p.stall() > kStallHigh) {
    calm_windows_ = 0;
    // A trial is judged against this window: not the first after the pool
    // grew, which holds the new threads' start-up (and their first touch of
    // new batch buffers) and would make any step look like it paid.
    if (windows_at_count_ < 2) return std::nullopt;
    return TryMore(b, p, "", t);
  }
  if (p.stall() < kStallLow) {
    const double busy = p.busy_s / (workers_ * p.window_s);
    if (++calm_windows_ >= 2 && workers_ > 1 && !(floor_ && *floor_ >= workers_) &&
        busy * workers_ / (workers_ - 1) < kDownBusy) {
      calm_windows_ = 0;
      // Far too many workers: go most of the way at once (at most halving),
      // unless a big step already stalled once.
      int target = workers_ - 1;
      if (!careful_) target = std::min(target, std::max({Model(p, b), workers_ / 2, 1}));
      if (floor_) target = std::max(target, *floor_);
      trial_from_ = workers_;
      phase_ = Phase::kTrialDown;
      return Set(target, b, p,
                 Fmt("consumer fed (stall %.2f %%), workers %.0f %% busy: trying %.0f",
                     p.stall() * 100, busy * 100, target),
                 t);
    }
    return std::nullopt;
  }
  calm_windows_ = 0;
  return std::nullopt;
}

}  // namespace stoker
