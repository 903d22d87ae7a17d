#include "tune/tuner_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace stoker {
namespace {

std::string Fmt(const char* fmt, double a, double b = 0, double c = 0, double d = 0, double e = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d, e);
  return buf;
}

double RelChange(double now, double before) {
  if (before <= 0) return now > 0 ? 1 : 0;
  return std::abs(now - before) / before;
}

std::string Plural(const std::string& noun) {
  return noun + (noun.ends_with("ch") || noun.ends_with("s") ? "es" : "s");
}

void ReplaceAll(std::string& text, std::string_view token, const std::string& with) {
  for (size_t at = text.find(token); at != std::string::npos;
       at = text.find(token, at + with.size())) {
    text.replace(at, token.size(), with);
  }
}

}  // namespace

TunerCore::TunerCore(int initial_workers, int initial_prefetch, TunerParams params,
                     std::string item)
    : params_(params),
      item_(std::move(item)),
      items_(Plural(item_)),
      workers_(std::max(1, initial_workers)),
      prefetch_(std::max(1, initial_prefetch)),
      store_(params.store_queued, params.store_headroom, 5 * params.gain) {}

std::string TunerCore::Words(const char* fmt) const {
  std::string text = fmt;
  ReplaceAll(text, "{items}", items_);
  ReplaceAll(text, "{item}", item_);
  return text;
}

std::string TunerCore::Say(const char* fmt, double a, double b, double c, double d,
                           double e) const {
  return Fmt(Words(fmt).c_str(), a, b, c, d, e);
}

const char* TunerCore::phase() const {
  switch (phase_) {
    case Phase::kStart:
      return "measuring";
    case Phase::kRefine:
      return knee_ || floor_ ? "steady" : "refining";
    case Phase::kTrialUp:
      return "trying more workers";
    case Phase::kTrialDown:
      return "trying fewer workers";
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

int TunerCore::CpuBoundCap(const Budgets& b) const {
  // A budget a few per cent short of a whole core still fills it (as the
  // knee in StepUp reads it).
  return std::max(1, static_cast<int>(std::floor(b.cpu_cores + params_.over_budget + 0.05)));
}

void TunerCore::UpdateContention(Pooled& p, const Budgets& b) {
  const bool held = contended_ && p.machine_known && p.worker_cores() > 0 &&
                    p.idle_cores() <= params_.no_idle_share * b.cpu_cores &&
                    p.intruding_cores(b.others_room) >= params_.contended_held * b.cpu_cores;
  contended_ = Contended(p, b) || held;
  p.contended = contended_;
}

bool TunerCore::Contended(const Pooled& p, const Budgets& b) const {
  if (!p.machine_known || p.worker_cores() <= 0 ||
      p.idle_cores() > params_.no_idle_share * b.cpu_cores) {
    return false;
  }
  return p.intruding_cores(b.others_room) >= params_.contended_share * b.cpu_cores;
}

double TunerCore::AvailableCores(const Pooled& p, const Budgets& b) const {
  // With idle CPUs, what other processes use is what they need: the rest is
  // ours. With none (contended), it is what the scheduler gave them beside
  // our pool; aiming below it would shrink the pool, leave them more, and
  // spiral down to one worker (seen: 3 -> 1 beside two hogs on 2 cores).
  // Then the aim is the budget itself, never more.
  if (!p.machine_known || p.contended) return b.cpu_cores;
  return std::max(0.0, b.cpu_cores - p.intruding_cores(b.others_room));
}

bool TunerCore::CpuBound(const Pooled& p) const {
  // Wall time off the CPU is a wait for I/O only where it is shown to be:
  // by the run-queue figure, or by idle CPUs (a runnable thread would have
  // had one). Contended and without the figure, it may be queueing behind
  // other processes.
  return p.on_cpu(params_) || (p.contended && p.queue_s <= 0 && p.cpu_s > 0);
}

double TunerCore::CpuFill(const Pooled& p, const Budgets& b) const {
  // The time a sample needs, not the time it queued: the queue grows with
  // the pool (and with other processes' threads), and sizing by it would
  // keep a large pool large.
  const double wall = p.unqueued_per_sample();
  const double cpu = p.cpu_per_sample();
  if (wall <= 0) return 0;
  // No CPU time measured: no saturation point to size by; double the pool
  // and let the trials judge, rather than jump to the cap.
  if (cpu <= 0) return 2.0 * workers_;
  // Workers whose CPU share fills the cores left to us (more only queue);
  // work that waits off the CPU for most of its wall time (I/O) saturates
  // the cores slowly, so it gets io_headroom.
  const double fill = AvailableCores(p, b) * wall / cpu;
  return wall >= 2 * cpu && !CpuBound(p) ? fill * params_.io_headroom : fill;
}

int TunerCore::Model(const Pooled& p, const Budgets& b) const {
  if (p.unqueued_per_sample() <= 0) return workers_;  // nothing produced yet: no evidence
  const double cpu_fill = CpuFill(p, b);
  // A bounded demand, by Little's law; queueing behind other processes will
  // last, behind our own surplus threads it will not. A consumer with no
  // measurable demand takes what the budget allows: the CPU fill alone.
  const double demand = p.demand();
  const double need = std::isinf(demand)
                          ? cpu_fill
                          : demand * (contended_ ? p.wall_per_sample() : p.unqueued_per_sample()) *
                                params_.headroom;
  // 2.07 means 2: wall time a few per cent over CPU time is the consumer's
  // thread competing, not waiting.
  double m = std::ceil(std::min(need, cpu_fill) - 0.1);
  if (CpuBound(p)) m = std::min<double>(m, CpuBoundCap(b));
  return static_cast<int>(std::clamp<double>(m, 1, Cap(b)));
}

double TunerCore::Changed(const Pooled& p, const Budgets& b) const {
  if (!reference_) return 0;
  const Pooled& r = *reference_;
  // A consumer that would take over twice what it gets is not the limit,
  // whatever its exact demand; without a whole batch, the demand is unknown.
  auto unbounded = [](const Pooled& x) { return x.demand() > 2 * x.rate(); };
  const bool demand_known = p.batches > 0 && r.batches > 0;
  if (demand_known && unbounded(p) != unbounded(r)) return 2 * params_.big_change;
  double change = !demand_known || unbounded(p) ? 0 : RelChange(p.demand(), r.demand());
  change = std::max(change, RelChange(p.cpu_per_sample(), r.cpu_per_sample()));
  // Not for CPU-bound work: its wall time beyond the CPU time is a queue
  // that wanders with the threads sharing the cores (tested below).
  if (!p.on_cpu(params_) || !r.on_cpu(params_)) {
    change = std::max(change, RelChange(p.unqueued_per_sample(), r.unqueued_per_sample()));
  }
  // Other processes on our CPUs: a core's worth more or less, or
  // contention starting or ending.
  if (p.machine_known && r.machine_known &&
      (std::abs(p.intruding_cores(b.others_room) - r.intruding_cores(b.others_room)) >
           2 * params_.contended_share * b.cpu_cores ||
       p.contended != r.contended)) {
    change = std::max(change, 2 * params_.change);
  }
  // Our CPU budget moved by half a core or more (the node's loaders
  // re-split it, a quota changed): the model's aim moved with it. Believed
  // at once, like a large change: the budget is a fact, not a measurement.
  if (r.cpu_cores > 0 && std::abs(p.cpu_cores - r.cpu_cores) >= 0.5 &&
      RelChange(p.cpu_cores, r.cpu_cores) > params_.change) {
    change = std::max(change, 2 * params_.big_change);
  }
  return change > params_.change ? change : 0;
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
  d.unit = item_;
  d.samples_per_s = p.rate();
  d.stall_fraction = p.stall();
  d.cpu_per_sample_ms = p.cpu_per_sample() * 1e3;
  d.wall_per_sample_ms = p.wall_per_sample() * 1e3;
  d.demand_per_s = std::isinf(p.demand()) ? 0 : p.demand();
  const bool changes = workers != workers_ || prefetch != prefetch_;
  if (workers != workers_) windows_at_count_ = 0;
  if (changes) {
    // Let the pipeline refill before judging: a window, and longer when
    // samples are slow (the new workers' first tasks end late).
    skip_windows_ = 1;
    skip_until_s_ =
        t_s + std::clamp(params_.refill_samples * p.wall_per_sample(), 0.0, params_.max_refill_s);
    pool_ = {};
  }
  workers_ = workers;
  prefetch_ = prefetch;
  // A verdict that changes nothing is worth one record after a change (a
  // trial paid, a knee, a floor) and then one per repeat_s: re-deciding the
  // same count every window would bury the decisions that matter.
  if (!changes && last_record_s_ && !last_record_changed_ &&
      t_s - *last_record_s_ < params_.repeat_s) {
    return std::nullopt;
  }
  last_record_s_ = t_s;
  last_record_changed_ = changes;
  return d;
}

std::optional<TunerDecision> TunerCore::KneeHere(const Budgets& b, const Pooled& p,
                                                 std::string reason, double t_s) {
  knee_ = workers_;
  reference_ = p;
  reference_workers_ = workers_;
  return Set(workers_, b, p, std::move(reason), t_s);
}

void TunerCore::Pooled::Add(const Observation& o) {
  window_s += o.window_s;
  others_s += std::max(0.0, o.others_s);
  idle_s += std::max(0.0, o.idle_s);
  machine_known = machine_known && o.others_s >= 0 && o.idle_s >= 0;
  wait_s += o.wait_s;
  step_s += o.step_s;
  busy_s += o.busy_s;
  cpu_s += o.cpu_s;
  queue_s += o.queue_s;
  workers = o.workers;
  batches += o.batches;
  samples += o.samples;
  produced += o.produced;
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
  std::optional<Pooled> pooled = Accumulate(o);
  if (!pooled) return std::nullopt;
  Pooled& p = *pooled;
  Note(p, b);
  Learn(p, b);
  const double t = o.t_s;
  const int cap = Cap(b);
  if (workers_ > cap) {
    return Set(cap, b, p, Fmt("over budget: cap is %.0f workers", cap), t);
  }
  if (phase_ != Phase::kStart && workers_ > CpuBoundCap(b) && CpuBound(p)) {
    // CPU-bound, and more workers than the budget allows (someone resized
    // the loader, or the work changed): back within it at once.
    phase_ = Phase::kRefine;
    reference_.reset();
    return SetByModel(p, b,
                      "CPU-bound over the budget (%.2f ms wall, %.2f ms of it queued for a CPU, "
                      "%.2f ms CPU per {item}, %s): model says %d workers",
                      t);
  }
  switch (phase_) {
    case Phase::kStart:
      return Start(p, b, t);
    case Phase::kTrialUp:
      return JudgeTrialUp(p, b, t);
    case Phase::kTrialDown:
      return JudgeTrialDown(p, b, t);
    case Phase::kRefine:
      break;
  }
  return Refine(p, b, t);
}

std::optional<TunerCore::Pooled> TunerCore::Accumulate(const Observation& o) {
  if (skip_windows_ > 0 || o.t_s < skip_until_s_) {
    skip_windows_ = std::max(0, skip_windows_ - 1);
    return std::nullopt;
  }
  pool_.Add(o);
  const TunerParams& k = params_;
  if (phase_ == Phase::kStart) {
    // The model needs per-sample times, not delivered batches: jump early,
    // and earlier still when samples are many.
    const bool plenty =
        pool_.produced >= 4 * k.start_samples && pool_.window_s >= k.min_window_s / 2;
    if (!plenty && (pool_.window_s < k.min_window_s || pool_.produced < k.start_samples)) {
      return std::nullopt;
    }
  } else {
    const bool trial = phase_ == Phase::kTrialUp || phase_ == Phase::kTrialDown;
    if (pool_.window_s < (trial ? k.trial_window_s : k.min_window_s)) return std::nullopt;
    // Few batches, but enough samples for per-sample figures, will do.
    if (pool_.batches < k.min_batches && pool_.produced < 3 * k.start_samples &&
        pool_.window_s < k.max_window_s) {
      return std::nullopt;
    }
  }
  Pooled p = pool_;
  pool_ = {};
  return p;
}

void TunerCore::Note(Pooled& p, const Budgets& b) {
  UpdateContention(p, b);
  p.cpu_cores = b.cpu_cores;
  ++windows_at_count_;
  last_rate_ = p.rate();
  last_stall_ = p.stall();
  // The view's CPU budget in workers: as many as the cores left to us keep
  // busy (CPU-bound: at most the budget + over_budget).
  if (p.cpu_per_sample() <= 0) {
    last_cpu_cap_ = 0;
  } else {
    last_cpu_cap_ = static_cast<int>(
        std::ceil(AvailableCores(p, b) * p.unqueued_per_sample() / p.cpu_per_sample()));
    if (CpuBound(p)) last_cpu_cap_ = std::min(last_cpu_cap_, CpuBoundCap(b));
  }
}

std::optional<TunerDecision> TunerCore::Start(const Pooled& p, const Budgets& b, double t_s) {
  phase_ = Phase::kRefine;
  reference_ = p;
  reference_workers_ = workers_;
  // The first window holds the pool's start-up (new threads, first-touch
  // page faults, decoder set-up). With other processes keeping the CPUs
  // busy, it and their run queue read as time off the CPU: a CPU-bound
  // pipeline's first window beside two hogs showed 11.5 ms wall for 2.9 ms
  // CPU per sample (settled: ~0.5 ms for 0.5 ms), and the model said 23.
  // Then more threads than the CPU-bound cap wait for a settled window to
  // show the wait (StepUp); with idle CPUs, time off the CPU is a wait.
  return SetByModel(p, b,
                    "model: %.2f ms wall (%.2f ms of it queued for a CPU) and %.2f ms CPU per "
                    "{item}, %s -> %d workers",
                    t_s, p.contended ? CpuBoundCap(b) : kMaxWorkers);
}

std::optional<TunerDecision> TunerCore::JudgeTrialUp(const Pooled& p, const Budgets& b,
                                                     double t_s) {
  phase_ = Phase::kRefine;
  const double gain = p.produced_rate() / std::max(trial_rate_before_, 1e-9) - 1;
  last_gain_ = gain;
  // Either way the next reference is a later window: this one holds the new
  // threads' start-up, or the trial's count.
  reference_.reset();
  if (gain >= params_.gain) {
    return Set(workers_, b, p,
               Fmt("step up from %.0f paid: throughput %+.1f %%", trial_from_, gain * 100), t_s);
  }
  if (gain < -params_.change) {
    // More workers do not lose this much of the throughput: the workload
    // changed under the trial (other processes started, say). Back, with no
    // knee marked, to judge afresh on settled windows.
    return Set(trial_from_, b, p,
               Fmt("back to %.0f workers: throughput %+.1f %% at %.0f, the workload changed "
                   "under the trial",
                   trial_from_, gain * 100, workers_),
               t_s);
  }
  knee_ = trial_from_;
  return Set(
      trial_from_, b, p,
      Fmt("knee at %.0f workers: %.0f gained only %+.1f %%", trial_from_, workers_, gain * 100),
      t_s);
}

std::optional<TunerDecision> TunerCore::JudgeTrialDown(const Pooled& p, const Budgets& b,
                                                       double t_s) {
  phase_ = Phase::kRefine;
  if (store_trial_) return JudgeStoreTrial(p, b, t_s);
  if (p.stall() > params_.stall_high) {
    const bool single_step = trial_from_ - workers_ == 1;
    if (single_step) floor_ = trial_from_;
    careful_ = true;  // from now on, step down one at a time
    reference_.reset();
    return Set(trial_from_, b, p,
               Fmt(single_step ? "floor at %.0f workers: %.0f left the consumer waiting %.1f %%"
                               : "back to %.0f workers: %.0f left the consumer waiting %.1f %%",
                   trial_from_, workers_, p.stall() * 100),
               t_s);
  }
  reference_ = p;
  reference_workers_ = workers_;
  return Set(workers_, b, p,
             Fmt("%.0f workers keep the consumer fed (stall %.2f %%)", workers_, p.stall() * 100),
             t_s);
}

std::optional<TunerDecision> TunerCore::Refine(const Pooled& p, const Budgets& b, double t_s) {
  if (reference_workers_ != workers_ || !reference_) {
    // The reference for workload changes: a settled window (see StepUp).
    if (windows_at_count_ < 2) return std::nullopt;
    reference_ = p;
    reference_workers_ = workers_;
  } else if (const double change = Changed(p, b); change > 0) {
    return Remodel(p, b, change, t_s);
  } else {
    changed_windows_ = 0;
  }
  if (p.stall() > params_.stall_high) return StepUp(p, b, t_s);
  if (p.stall() < params_.stall_low) return StepDown(p, b, t_s);
  calm_windows_ = 0;
  return std::nullopt;
}

std::optional<TunerDecision> TunerCore::Remodel(const Pooled& p, const Budgets& b, double change,
                                                double t_s) {
  // One window of a moderate change may be noise: wait for a second.
  if (++changed_windows_ < 2 && change <= params_.big_change) return std::nullopt;
  changed_windows_ = 0;
  knee_.reset();
  floor_.reset();
  careful_ = false;
  last_gain_ = 0;
  // The store's points hold until the store changes: reads served faster
  // than its service time, or a wait and a rate that both changed at this
  // count. Contention, the CPU time per sample, or the wait alone changing
  // do not change it: a saturated store's wait per sample wanders widely
  // from window to window, and forgetting the small pool's point would hold
  // the large pool (docs/tuner.md, "Storage that saturates").
  const bool faster = p.wait_per_sample() < (1 - params_.change) * store_.service_s();
  if (!reference_ || faster ||
      (RelChange(p.wait_per_sample(), reference_->wait_per_sample()) > params_.change &&
       RelChange(p.produced_rate(), reference_->produced_rate()) > params_.change)) {
    store_.Clear();
    store_floor_.reset();
    // This window too (Observe fed it): it may straddle the change, and a
    // wait averaged across it would teach the model a false service time.
  }
  reference_ = p;
  return SetByModel(p, b,
                    "workload changed (%.2f ms wall, %.2f ms of it queued for a CPU, %.2f ms "
                    "CPU per {item}, %s): model says %d workers",
                    t_s);
}

std::optional<TunerDecision> TunerCore::SetByModel(const Pooled& p, const Budgets& b,
                                                   const char* reason_fmt, double t_s, int most) {
  const int m = std::min(Model(p, b), most);
  const std::string demand = std::isinf(p.demand())
                                 ? std::string("no measurable demand: as fast as the budget allows")
                                 : Say("demand %.0f {items}/s", p.demand());
  char reason[512];
  std::snprintf(reason, sizeof reason, Words(reason_fmt).c_str(), p.wall_per_sample() * 1e3,
                p.queue_per_sample() * 1e3, p.cpu_per_sample() * 1e3, demand.c_str(), m);
  std::string why = reason;
  if (Model(p, b) > m)
    why += Fmt(" (model %.0f: more once a settled window shows it)", Model(p, b));
  return Set(m, b, p, std::move(why), t_s);
}

std::optional<TunerDecision> TunerCore::StepUp(const Pooled& p, const Budgets& b, double t_s) {
  calm_windows_ = 0;
  // A trial is judged against a settled window: the first after the pool
  // grew holds the new threads' start-up and would make any step look good.
  if (windows_at_count_ < 2) return std::nullopt;
  const bool cpu_bound = CpuBound(p);
  // CPU-bound work never holds more than the budget + over_budget workers,
  // whatever else runs: more threads would only win CPU time from other
  // processes (and cost a worker's memory each).
  int cap = cpu_bound ? std::min(Cap(b), CpuBoundCap(b)) : Cap(b);
  // A store that saturated: more workers than its knee only queue there.
  if (!cpu_bound && store_.Saturated()) {
    const int store_knee = std::min(store_.Knee(), cap);
    if (workers_ >= store_knee) return StoreKnee(p, b, store_knee, t_s);
    cap = store_knee;
  } else if (store_knee_ && knee_ == store_knee_) {
    // The store's knee, but no point shows it saturated any more (it got
    // faster, or gained slots): look again.
    knee_.reset();
    store_knee_.reset();
  }
  if (knee_ && *knee_ <= workers_) return std::nullopt;
  // CPU-bound workers that fill the budget are the knee already. With other
  // processes on our CPUs they cannot fill it: steps may go on, each judged
  // by what it paid, up to the budget + over_budget.
  if (cpu_bound &&
      workers_ >= (contended_ ? cap : static_cast<int>(std::ceil(b.cpu_cores - 0.05)))) {
    return KneeHere(
        b, p,
        Say(contended_ ? "knee at %.0f workers: CPU-bound (%.2f ms wall, %.2f ms CPU per "
                         "{item}), the %.1f-core budget + %.0f, other processes on our CPUs"
                       : "knee at %.0f workers: CPU-bound (%.2f ms wall, %.2f ms CPU per "
                         "{item}) and filling the %.1f-core budget",
            workers_, p.wall_per_sample() * 1e3, p.cpu_per_sample() * 1e3, b.cpu_cores,
            params_.over_budget),
        t_s);
  }
  if (workers_ >= cap) return std::nullopt;
  // Steps of half the pool, whole while they keep paying handsomely: big
  // enough that their gain stands out of the noise of a one-second window.
  const int step = std::max(1, last_gain_ > params_.big_gain ? workers_ : workers_ / 2);
  int target = std::max(Model(p, b), workers_ + step);
  if (knee_) target = std::min(target, *knee_);
  target = std::min(target, cap);
  if (target <= workers_) return std::nullopt;
  trial_from_ = workers_;
  trial_rate_before_ = p.produced_rate();
  phase_ = Phase::kTrialUp;
  return Set(target, b, p,
             Say("consumer waited %.1f %% of the time at %.0f {items}/s: trying %.0f workers",
                 p.stall() * 100, p.rate(), target),
             t_s);
}

std::optional<TunerDecision> TunerCore::StepDown(const Pooled& p, const Budgets& b, double t_s) {
  const double busy = p.busy_s / (workers_ * p.window_s);
  if (++calm_windows_ < 2 || workers_ <= 1 || (floor_ && *floor_ >= workers_) ||
      !(busy * workers_ / (workers_ - 1) < params_.down_busy)) {
    return std::nullopt;
  }
  calm_windows_ = 0;
  // Far too many workers: go most of the way at once (at most halving),
  // unless a big step already stalled once.
  int target = workers_ - 1;
  if (!careful_) target = std::min(target, std::max({Model(p, b), workers_ / 2, 1}));
  if (floor_) target = std::max(target, *floor_);
  trial_from_ = workers_;
  phase_ = Phase::kTrialDown;
  return Set(target, b, p,
             Fmt("consumer fed (stall %.2f %%), workers %.0f %% busy: trying %.0f", p.stall() * 100,
                 busy * 100, target),
             t_s);
}

void TunerCore::Learn(const Pooled& p, const Budgets& b) {
  // Reads must be most of a sample's time (twice the rest: a CPU-bound
  // pipeline on a loaded machine spends time off the CPU too), and time
  // off the CPU a wait, not a run queue unseen: the kernel's
  // figure is there, the CPUs had idle time, or our workers use under half
  // the budget (their own queue is short; a busy machine's first windows
  // show no run queue for a few sleeping workers).
  const double wait = p.wait_per_sample();
  const bool waits_seen =
      p.queue_s > 0 || (p.machine_known && p.idle_cores() > params_.no_idle_share * b.cpu_cores) ||
      p.worker_cores() < 0.5 * b.cpu_cores;
  if (p.produced <= 0 || p.window_s <= 0 || CpuBound(p) ||
      wait < 2 * (p.cpu_per_sample() + p.queue_per_sample()) || wait <= 0 || !waits_seen) {
    return;
  }
  store_.Add({workers_, p.produced_rate(), wait, p.wall_per_sample() - wait});
}

std::optional<TunerDecision> TunerCore::StoreKnee(const Pooled& p, const Budgets& b, int knee,
                                                  double t_s) {
  // Steps within an eighth of the knee are within its estimate's noise.
  const int slack = std::max(1, knee / 8);
  int target = knee;
  // The knee lost before: halfway between that count and this one.
  if (store_floor_ && target <= *store_floor_) target = (*store_floor_ + workers_ + 1) / 2;
  if (workers_ - target > slack) {
    trial_from_ = workers_;
    trial_rate_before_ = p.produced_rate();
    phase_ = Phase::kTrialDown;
    store_trial_ = true;
    return Set(target, b, p,
               store_.Describe(item_) + Say(": trying %.0f workers (%.0f {items}/s at %.0f)",
                                            target, p.produced_rate(), workers_),
               t_s);
  }
  if (knee_ && *knee_ == workers_) return std::nullopt;  // held here already
  store_knee_ = workers_;
  return KneeHere(b, p, Fmt("knee at %.0f workers: ", workers_) + store_.Describe(item_), t_s);
}

std::optional<TunerDecision> TunerCore::JudgeStoreTrial(const Pooled& p, const Budgets& b,
                                                        double t_s) {
  store_trial_ = false;
  reference_.reset();
  const double change = p.produced_rate() / std::max(trial_rate_before_, 1e-9) - 1;
  if (change >= -params_.gain) {
    knee_ = store_knee_ = workers_;
    return Set(workers_, b, p,
               Fmt("%.0f workers keep the store's rate (%+.1f %% of that at %.0f)", workers_,
                   change * 100, trial_from_),
               t_s);
  }
  store_floor_ = workers_;
  return Set(trial_from_, b, p,
             Fmt("back to %.0f workers: %.0f lost %.1f %% of the store's rate", trial_from_,
                 workers_, -change * 100),
             t_s);
}

}  // namespace stoker
