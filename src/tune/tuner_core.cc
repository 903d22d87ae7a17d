#include "tune/tuner_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

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
  int p = DefaultPrefetch(workers, b.batch_items);
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
  return IoHeadroom(p) ? fill * params_.io_headroom : fill;
}

std::string TunerCore::TrimAbove(int knee, double fill) {
  const int fills = static_cast<int>(std::ceil(fill));
  if (fill <= 0 || knee <= fills) return "";
  trim_fill_ = fills;
  trim_kept_ = 1;
  trim_paid_ = false;
  return Fmt("; the CPUs fill at %.0f workers: steps down verify the threads above it", fills);
}

double TunerCore::CpuRoom(const Pooled& p, const Budgets& b) const {
  const double busy = p.worker_cores();
  if (busy <= 0 || !p.machine_known || p.contended) return std::numeric_limits<double>::infinity();
  return AvailableCores(p, b) / busy - 1;
}

bool TunerCore::IoHeadroom(const Pooled& p) const {
  const double cpu = p.cpu_per_sample();
  return cpu > 0 && p.unqueued_per_sample() >= 2 * cpu && !CpuBound(p);
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
  // Not on a store that saturated while reads are most of the wall time
  // on both sides (twice the CPU time): the CPU time per item wanders there
  // (a loaded machine, a pool's set-up), it changes nothing the store's
  // steps judge by, and a store that changed shows in its rate.
  if (!(store_seen_ || store_.Saturated()) || !p.reads_wait() || !r.reads_wait()) {
    change = std::max(change, RelChange(p.cpu_per_sample(), r.cpu_per_sample()));
  }
  // Not for CPU-bound work: its wall time beyond the CPU time is a queue
  // that wanders with the threads sharing the cores (tested below). Nor on
  // a store that saturated: its queue wanders too (by a third at 128
  // workers), and a store that changed shows in its rate (store_moved).
  if (!store_seen_ && (!p.on_cpu(params_) || !r.on_cpu(params_))) {
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
  const bool short_refill = std::exchange(short_refill_, false);
  if (workers != workers_) {
    windows_at_count_ = 0;
    settled_s_ = 0;
    settled_produced_ = 0;
    // A pool grown more than twofold delivers the work in flight when it
    // grew in a lump over its first seconds: its store reading starts after
    // 2 x max_refill_s, or a step judged against it reads the lump as the
    // step's loss.
    settle_after_s_ = workers > 2 * workers_ ? t_s + 2 * params_.max_refill_s : 0;
  }
  if (changes) {
    // Let the pipeline refill before judging: a window, and longer when
    // samples are slow (the new workers' first tasks end late).
    skip_windows_ = 1;
    auto refill = [&](double samples) {
      return t_s + std::clamp(samples * p.wall_per_sample(), 0.0, params_.max_refill_s);
    };
    skip_until_s_ = refill(params_.refill_samples);
    early_until_s_ = short_refill ? refill(params_.linear_refill_samples) : skip_until_s_;
    skip_for_s_ = skip_until_s_ - t_s;
    early_for_s_ = early_until_s_ - t_s;
    settle_for_s_ = settle_after_s_ > 0 ? settle_after_s_ - t_s : 0;
    starting_until_s_ = t_s + params_.max_start_s;
    pool_ = {};
    early_ = {};
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
  t_s = o.t_s;
  if (o.window_s > 0) {
    const double r = o.produced / o.window_s;
    ++ticks;
    tick_rate_sum += r;
    tick_rate_sq += r * r;
  }
  batches += o.batches;
  samples += o.samples;
  produced += o.produced;
}

std::optional<TunerDecision> TunerCore::Observe(const Observation& o, const Budgets& b) {
  if (o.workers != workers_) {
    // Someone else resized the loader: adopt it and measure afresh.
    workers_ = std::max(1, o.workers);
    starting_until_s_ = o.t_s + params_.max_start_s;
    windows_at_count_ = 0;
    settled_s_ = 0;
    settled_produced_ = 0;
    pool_ = {};
    early_ = {};
    reference_.reset();
    return std::nullopt;
  }
  std::optional<Pooled> pooled = Accumulate(o);
  if (!pooled) return std::nullopt;
  Pooled& p = *pooled;
  const double t = o.t_s;
  const int cap = Cap(b);
  // Nothing finished over several windows: no rate or figure to learn from
  // or to start a step by (a step judged against a rate of 0 "paid" any
  // gain); a trial's count that made nothing has lost, and is judged.
  const bool blank = p.produced == 0 && phase_ != Phase::kTrialUp && phase_ != Phase::kTrialDown;
  if (!blank) {
    Note(p, b);
    Learn(p, b);
  }
  if (workers_ > cap) {
    return Set(cap, b, p, Fmt("over budget: cap is %.0f workers", cap), t);
  }
  if (blank) return std::nullopt;
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
  const TunerParams& k = params_;
  if (o.starting > 0 && o.t_s < starting_until_s_) {
    // Workers still start: the skips after the change begin once they all
    // have (a pool half up reads low, and a step judged against it pays).
    skip_windows_ = std::max(skip_windows_, 1);
    skip_until_s_ = std::max(skip_until_s_, o.t_s + skip_for_s_);
    early_until_s_ = std::max(early_until_s_, o.t_s + early_for_s_);
    if (settle_after_s_ > 0) settle_after_s_ = std::max(settle_after_s_, o.t_s + settle_for_s_);
    pool_ = {};
    early_ = {};
    return std::nullopt;
  }
  if (skip_windows_ > 0 || o.t_s < early_until_s_) {
    skip_windows_ = std::max(0, skip_windows_ - 1);
    return std::nullopt;
  }
  if (early_until_s_ < skip_until_s_) {
    // A change whose refill skip is short (linear_refill_samples): the
    // windows after it are read only for a verdict that pays (start-up
    // reads low, so it can delay such a verdict, never make one); every
    // other verdict waits for the usual skip.
    early_.Add(o);
    if (early_.window_s >= k.min_window_s && (PaysClearly(early_) || JumpPaysEarly(early_)) &&
        (early_.batches >= k.min_batches || early_.produced >= 3 * k.start_samples)) {
      Pooled p = early_;
      early_ = {};
      pool_ = {};
      return p;
    }
    if (o.t_s < skip_until_s_) return std::nullopt;
  }
  pool_.Add(o);
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
    const double need = trial ? std::max(k.trial_window_s, store_trial_s_) : k.min_window_s;
    if (pool_.window_s < need &&
        !(trial && pool_.window_s >= k.trial_window_s && TrialIsClear(pool_)) &&
        !(pool_.window_s >= k.min_window_s && PaysClearly(pool_))) {
      return std::nullopt;
    }
    // Few batches, but enough samples for per-sample figures, will do.
    if (pool_.batches < k.min_batches && pool_.produced < 3 * k.start_samples &&
        pool_.window_s < k.max_window_s) {
      return std::nullopt;
    }
    // Workers that finished nothing yet (batches of seconds on a busy CPU)
    // give no rate and no per-sample figure: pooled on, up to 4 windows.
    if (pool_.produced == 0 && pool_.window_s < 4 * k.max_window_s) return std::nullopt;
  }
  Pooled p = pool_;
  pool_ = {};
  early_ = {};
  return p;
}

bool TunerCore::TrialIsClear(const Pooled& w) const {
  // A store trial judged on a longer window (its rate spreads) whose
  // reading so far is farther from the bar than three of its spreads and
  // half a gain: a trial that loses half the rate tells so within a second.
  if (store_trial_s_ <= params_.trial_window_s || trial_rate_before_ <= 0 || w.window_s <= 0) {
    return false;
  }
  const double change = w.produced_rate() / trial_rate_before_ - 1;
  const double bar = phase_ == Phase::kTrialUp ? StoreUpBar(trial_from_, workers_) : -params_.gain;
  const double spread = ReadingNoise(w.window_s, store_trial_s_);
  return std::abs(change - bar) > 3 * spread + params_.gain / 2;
}

bool TunerCore::PaysClearly(const Pooled& w) const {
  // A plain step up where reads are the wait whose reading so far paid
  // more than big_gain, three spreads of noise aside, with the consumer
  // still waiting: the full window would go on too. Only a verdict that
  // pays is taken early: a new pool's start-up reads low.
  if (phase_ != Phase::kTrialUp || store_seen_ || trial_rate_before_ <= 0 || w.window_s <= 0 ||
      !w.reads_wait() || w.stall() <= params_.stall_high) {
    return false;
  }
  const double gain = w.produced_rate() / trial_rate_before_ - 1;
  return gain - 3 * ReadingNoise(w.window_s, params_.trial_window_s) > params_.big_gain;
}

void TunerCore::Note(Pooled& p, const Budgets& b) {
  UpdateContention(p, b);
  p.cpu_cores = b.cpu_cores;
  if (++windows_at_count_ >= 2 && p.t_s - p.window_s >= settle_after_s_ - 1e-9) {
    if (settled_s_ == 0) settled_from_s_ = p.t_s - p.window_s;
    settled_to_s_ = p.t_s;
    settled_s_ += p.window_s;
    settled_produced_ += p.produced;
  }
  // How much the ticks' rates spread, scaled to a second's worth of them.
  if (p.ticks >= 2 && p.tick_rate_sum > 0) {
    const double mean = p.tick_rate_sum / p.ticks;
    const double sd =
        std::sqrt(std::max(0.0, p.tick_rate_sq / p.ticks - mean * mean) * p.ticks / (p.ticks - 1));
    const double spread = sd / mean * std::sqrt(p.window_s / p.ticks);
    store_spread_ = store_spread_ > 0 ? 0.7 * store_spread_ + 0.3 * spread : spread;
  }
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
  // A first jump where reads are the wait may show it grew the rate in
  // proportion sooner (Refine), as a step up from such a count may pay.
  short_refill_ = !p.contended && p.reads_wait();
  auto d = SetByModel(p, b,
                      "model: %.2f ms wall (%.2f ms of it queued for a CPU) and %.2f ms CPU per "
                      "{item}, %s -> %d workers",
                      t_s, p.contended ? CpuBoundCap(b) : FirstJumpCap(p));
  if (workers_ > reference_workers_)
    jump_ = Jump{reference_workers_, workers_, p.produced_rate(), p.wait_per_sample()};
  return d;
}

int TunerCore::FirstJumpCap(const Pooled& p) const {
  // Work that waits off the CPU for reads may be on a store that slows when
  // overloaded: a jump to the cap serves a fraction of its rate there, and
  // the model, reading its slots in that state, errs low. Steps that pay
  // double the pool from here.
  if (p.reads_wait()) return std::max(params_.first_jump, params_.first_jump * workers_);
  return kMaxWorkers;
}

bool TunerCore::InProportion(int from, int to, double change) const {
  const double step = std::abs(to - from) / static_cast<double>(std::max(from, 1));
  return change >= params_.store_linear * step;
}

bool TunerCore::JumpInProportion(const Pooled& p) const {
  return jump_ && jump_->to == workers_ && jump_->rate > 0 && p.reads_wait() &&
         InProportion(jump_->from, jump_->to, p.produced_rate() / jump_->rate - 1);
}

bool TunerCore::JumpPaysEarly(const Pooled& p) const {
  return phase_ == Phase::kRefine && p.stall() > params_.stall_high && JumpInProportion(p);
}

bool TunerCore::JumpLostEarly(const Pooled& p) const {
  return phase_ == Phase::kRefine && p.stall() > params_.stall_high && jump_ &&
         jump_->to == workers_ && !CpuBound(p) && p.reads_wait() &&
         p.produced_rate() < (1 - params_.change) * jump_->rate &&
         p.wait_per_sample() >= params_.store_queued * jump_->wait_s;
}

std::optional<TunerDecision> TunerCore::JudgeTrialUp(const Pooled& p, const Budgets& b,
                                                     double t_s) {
  phase_ = Phase::kRefine;
  store_trial_s_ = 0;
  if (store_seen_ && !CpuBound(p)) return JudgeStoreTrial(p, b, t_s, /*up=*/true);
  const double gain = p.produced_rate() / std::max(trial_rate_before_, 1e-9) - 1;
  last_gain_ = gain;
  // Either way the next reference is a later window: this one holds the new
  // threads' start-up, or the trial's count.
  reference_.reset();
  if (gain >= params_.gain) {
    lost_step_ = {0, 0};
    doubted_from_ = 0;
    // Reads the wait, and the rate grew in proportion to the step: a store
    // had room for every read up to this count (its steps, if it saturates
    // further up, try nothing below it).
    if (p.reads_wait() && InProportion(trial_from_, workers_, gain)) store_linear_ = workers_;
    const std::string paid =
        Fmt("step up from %.0f paid: throughput %+.1f %%", trial_from_, gain * 100);
    if (gain > params_.big_gain && p.stall() > params_.stall_high) {
      if (auto next = StepUp(p, b, t_s, /*settled=*/true)) {
        next->reason = paid + "; " + next->reason;
        return next;
      }
    }
    return Set(workers_, b, p, paid, t_s);
  }
  if (!CpuBound(p) && trial_reads_before_ && WaitsOnReads(p, b) &&
      p.wait_per_sample() >= params_.store_queued * trial_wait_before_) {
    // Reads were the wait before and queued under the larger pool, which
    // paid nothing (or lost: a store that slows when overloaded, not a
    // workload change): the store's steps find its knee from here, below
    // this count.
    store_seen_ = true;
    knee_.reset();
    NoteFall(workers_, p.produced_rate());
    store_peaked_ = store_peaked_ || gain <= -params_.gain;
    NoteLostStepUp(trial_from_, gain);
    return Set(
        trial_from_, b, p,
        Say("back to %.0f workers: %.0f gained %+.1f %% with reads waiting %.1f ms per "
            "{item} (%.1f ms before): the store saturates, steps find its knee",
            trial_from_, workers_, gain * 100, p.wait_per_sample() * 1e3, trial_wait_before_ * 1e3),
        t_s);
  }
  if (gain < -params_.change) {
    const std::pair<int, int> before = std::exchange(lost_step_, {trial_from_, workers_});
    if (before.first == trial_from_ && before.second > trial_from_) {
      // A step up from this count lost as much the last time (the same, or
      // another size: the model moves between them): it is the steps that
      // lose (a store overloaded past it, processes past the cores), not
      // the workload.
      knee_ = trial_from_;
      return Set(trial_from_, b, p,
                 Fmt("knee at %.0f workers: %.0f lost %.1f %%, as a step up from it did before: "
                     "the step and not the workload",
                     trial_from_, workers_, -gain * 100),
                 t_s);
    }
    // More workers do not lose this much of the throughput: the workload
    // changed under the trial (other processes started, say). Back, with no
    // knee marked, to judge afresh on settled windows.
    return Set(trial_from_, b, p,
               Fmt("back to %.0f workers: throughput %+.1f %% at %.0f, the workload changed "
                   "under the trial",
                   trial_from_, gain * 100, workers_),
               t_s);
  }
  if (workers_ > 2 * trial_from_) {
    // One window after a jump of more than twice the pool is no knee: it
    // holds the new threads' start-up. Confirm with a step of twice the
    // pool, judged against the same reading before the jump.
    phase_ = Phase::kTrialUp;
    return Set(2 * trial_from_, b, p,
               Fmt("%.0f gained only %+.1f %% on one window after a jump from %.0f: trying %.0f",
                   workers_, gain * 100, trial_from_, 2.0 * trial_from_),
               t_s);
  }
  const double noise = ReadingNoise(p.window_s, params_.trial_window_s);
  if (store_linear_ == trial_from_ && p.stall() > params_.stall_high &&
      params_.gain - gain < noise && std::exchange(doubted_from_, trial_from_) != trial_from_) {
    // The rate grew in proportion up to the count the step left, the
    // consumer still waits, and the reading lies within a spread of the
    // bar: one window may have held the dip after the pool grew. Back, and
    // the step once more from a settled reading before a knee holds.
    reference_.reset();
    return Set(trial_from_, b, p,
               Fmt("back to %.0f workers: %.0f gained only %+.1f %%, within the noise of a "
                   "reading (%.1f %%): it is tried again",
                   trial_from_, workers_, gain * 100, noise * 100),
               t_s);
  }
  knee_ = trial_from_;
  std::string why =
      Fmt("knee at %.0f workers: %.0f gained only %+.1f %%", trial_from_, workers_, gain * 100);
  // A knee that io_headroom put above the count whose CPU share fills the
  // cores (measured there, before the trial) is a prior: steps down verify
  // it, each judged by throughput.
  if (trial_fill_before_ > 0) why += TrimAbove(trial_from_, trial_fill_before_);
  return Set(trial_from_, b, p, std::move(why), t_s);
}

std::optional<TunerDecision> TunerCore::JudgeTrialDown(const Pooled& p, const Budgets& b,
                                                       double t_s) {
  phase_ = Phase::kRefine;
  store_trial_s_ = 0;
  if (store_trial_) return JudgeStoreTrial(p, b, t_s, /*up=*/false);
  if (trim_fill_ > 0) return JudgeTrim(p, b, t_s);
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
  bool early = false;
  if (reference_workers_ != workers_ || !reference_) {
    // The reference for workload changes: a settled window (see StepUp),
    // or the first jump's first one where it already grew the rate in
    // proportion (start-up only reads low), or lost most of it with each
    // read waiting longer (JumpLostEarly).
    if (windows_at_count_ < 2) {
      early = JumpPaysEarly(p) || JumpLostEarly(p);
      if (!early) return std::nullopt;
    }
    reference_ = p;
    reference_workers_ = workers_;
  } else if (const double change = Changed(p, b); change > 0) {
    return Remodel(p, b, change, t_s);
  } else {
    changed_windows_ = 0;
  }
  if (p.stall() > params_.stall_high) return StepUp(p, b, t_s, /*settled=*/early);
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
  jump_.reset();
  trim_fill_ = 0;
  careful_ = false;
  last_gain_ = 0;
  // The store's points hold until the store changes: reads served faster
  // than its service time, or a wait and a rate that both changed at this
  // count. Contention, the CPU time per sample, or the wait alone changing
  // do not change it: a saturated store's wait per sample wanders widely
  // from window to window, and forgetting the small pool's point would hold
  // the large pool (docs/tuner.md, "Storage that saturates").
  // A store that saturated keeps its points unless reads got faster than
  // its service: its wait and rate move together when a large pool's
  // pipeline settles, and its steps start from the model's knee.
  const bool known = store_seen_ || store_.Saturated();
  const bool faster = p.wait_per_sample() < (1 - params_.change) * store_.service_s();
  if (!reference_ || faster ||
      (!known && RelChange(p.wait_per_sample(), reference_->wait_per_sample()) > params_.change &&
       RelChange(p.produced_rate(), reference_->produced_rate()) > params_.change)) {
    store_.Clear();
    store_floor_.reset();
    store_linear_.reset();
    store_unresolved_.reset();
    // This window too (Observe fed it): it may straddle the change, and a
    // wait averaged across it would teach the model a false service time.
  }
  const double changed_rate = reference_ ? p.produced_rate() - reference_->produced_rate() : 0;
  reference_ = p;
  store_top_.reset();
  store_falls_.clear();
  store_climb_ = 0;
  store_falling_.reset();
  store_kept_ = 1;
  lost_step_ = {0, 0};
  doubted_from_ = 0;
  trim_doubted_ = 0;
  store_moved_windows_ = 0;
  store_moved_s_ = 0;
  store_way_ = 0;
  const bool was_held = std::exchange(store_held_, false);
  // Reads still most of the wait: on a loaded machine a large pool's run
  // queue can outgrow twice the CPU time (WaitsOnReads), but it is no
  // reason to re-size by the model.
  if (known && !CpuBound(p) && p.reads_wait()) {
    // The store saturated before and reads are still the wait: the model's
    // jump (Little's law, as if reads were parallel) would go far past its
    // knee. Verify around this count with steps instead, one way: up where
    // the rate rose, down where it fell (as for a held count's rate).
    // The first step is judged against a second measured after the change.
    // A search still under way goes on both ways.
    store_seen_ = true;
    store_floor_.reset();
    store_linear_.reset();
    store_unresolved_.reset();
    store_recheck_.reset();
    if (was_held) store_way_ = changed_rate >= 0 ? 1 : -1;
    settled_s_ = 0;
    settled_produced_ = 0;
    // The verdict may go unrecorded (repeat_s): the first step names it too.
    store_why_ =
        Say("workload changed (%.2f ms wall, %.2f ms CPU per {item}) on a store that "
            "saturated: steps, not the model, find its knee",
            p.wall_per_sample() * 1e3, p.cpu_per_sample() * 1e3);
    return Set(workers_, b, p, store_why_, t_s);
  }
  store_seen_ = false;
  store_prior_tried_ = false;
  store_peaked_ = false;
  store_drift_known_ = false;
  store_why_.clear();
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

std::optional<TunerDecision> TunerCore::StepUp(const Pooled& p, const Budgets& b, double t_s,
                                               bool settled) {
  calm_windows_ = 0;
  // A trial is judged against a settled window: the first after the pool
  // grew holds the new threads' start-up and would make any step look good.
  if (!settled && windows_at_count_ < 2) return std::nullopt;
  const bool cpu_bound = CpuBound(p);
  // CPU-bound work never holds more than the budget + over_budget workers,
  // whatever else runs: more threads would only win CPU time from other
  // processes (and cost a worker's memory each).
  int cap = cpu_bound ? std::min(Cap(b), CpuBoundCap(b)) : Cap(b);
  // The first jump, or the step just judged, grew the rate in proportion:
  // far from any store limit, a step up from here may pay clearly sooner.
  const bool linear = JumpInProportion(p) || store_linear_ == workers_;
  const std::optional<Jump> jump = std::exchange(jump_, std::nullopt);
  if (jump && jump->to == workers_ && !cpu_bound && p.reads_wait() &&
      p.produced_rate() < (1 - params_.change) * jump->rate) {
    // The first jump lost most of the rate the count it left made: the
    // store is overloaded there, and its model, reading slots in that
    // state, errs low. The best count lies between the two (or below the
    // first): halfway on a log scale is the first trial, judged against
    // this count; its steps go on from there.
    store_seen_ = true;
    knee_.reset();
    NoteFall(workers_, p.produced_rate());
    store_peaked_ = true;
    store_prior_tried_ = true;
    const int mid = static_cast<int>(std::lround(std::sqrt(1.0 * jump->from * jump->to)));
    const bool prior = store_.Saturated() && store_.Knee() < mid;
    const int to = std::clamp(prior ? store_.Knee() : mid, 1, workers_ - 1);
    StartStoreTrial(workers_, p.produced_rate(), p.mid_s(), /*down=*/true, prior);
    return Set(to, b, p,
               Say("the jump from %.0f to %.0f workers lost %.1f %% of the rate (%.0f {items}/s "
                   "against %.0f): the store is overloaded",
                   jump->from, jump->to, (1 - p.produced_rate() / jump->rate) * 100,
                   p.produced_rate(), jump->rate) +
                   Fmt("; trying %.0f workers", to),
               t_s);
  }
  // A store that saturated: its knee is found by the tuner's own steps
  // around the model's, never by a jump.
  if (!cpu_bound && (store_seen_ || store_.Saturated())) return StoreStep(p, b, t_s);
  if (trim_fill_ > 0 && knee_ == workers_) return TrimDown(p, b, t_s);
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
  // Our workers keep the cores busy: no step up can add `gain`, whatever a
  // noisy reading says (docs/tuner.md, "Steps up and down").
  if (const double room = CpuRoom(p, b); room < params_.gain) {
    const double headroom = IoHeadroom(p) ? params_.io_headroom : 1;
    return KneeHere(b, p,
                    Fmt("knee at %.0f workers: the CPUs are full (%.2f of %.2f cores busy), a "
                        "step up cannot add %.0f %%",
                        workers_, p.worker_cores(), AvailableCores(p, b), params_.gain * 100) +
                        TrimAbove(workers_, CpuFill(p, b) / headroom),
                    t_s);
  }
  if (workers_ >= cap) return std::nullopt;
  // Steps of half the pool, whole while they keep paying handsomely: big
  // enough that their gain stands out of the noise of a one-second window.
  const int step = std::max(1, last_gain_ > params_.big_gain ? workers_ : workers_ / 2);
  int target = std::max(Model(p, b), workers_ + step);
  // Where reads are the wait, at most twice the pool: a store that slows
  // when overloaded serves a fraction of its rate far past its knee.
  if (p.reads_wait()) target = std::min(target, 2 * workers_);
  if (knee_) target = std::min(target, *knee_);
  target = std::min(target, cap);
  if (target <= workers_) return std::nullopt;
  trial_from_ = workers_;
  trial_rate_before_ = p.produced_rate();
  trial_wait_before_ = p.wait_per_sample();
  trial_reads_before_ = WaitsOnReads(p, b);
  trial_fill_before_ = IoHeadroom(p) ? CpuFill(p, b) / params_.io_headroom : 0;
  short_refill_ = linear && p.reads_wait();
  phase_ = Phase::kTrialUp;
  return Set(target, b, p,
             Say("consumer waited %.1f %% of the time at %.0f {items}/s: trying %.0f workers",
                 p.stall() * 100, p.rate(), target),
             t_s);
}

std::optional<TunerDecision> TunerCore::TrimDown(const Pooled& p, const Budgets& b, double t_s) {
  // A step of store_step x the pool, never below the count that fills the
  // cores (below it the CPUs idle: a certain loss, not worth a trial).
  // Above a count that lost, halving toward it, until within two of it.
  // Steps that gained handsomely (workers past the cores each costing CPU)
  // halve toward the fill instead.
  int step = trim_paid_ ? std::max(StoreStepOf(workers_), (workers_ - trim_fill_) / 2)
                        : StoreStepOf(workers_);
  if (floor_) step = workers_ - *floor_ > 2 ? std::min(step, (workers_ - *floor_) / 2) : 0;
  const int to = std::max({workers_ - step, trim_fill_, floor_.value_or(0) + 1});
  if (to >= workers_ || CpuBound(p)) {
    trim_fill_ = 0;
    return std::nullopt;
  }
  // Judged on as long a reading each side as a store step: heavy-tailed
  // reads scatter one second's rate by 5 % and more.
  if (settled_s_ < StoreEvidence()) return std::nullopt;
  const double rate = static_cast<double>(settled_produced_) / settled_s_;
  trial_from_ = workers_;
  trial_rate_before_ = rate;
  store_trial_s_ = StoreEvidence();
  phase_ = Phase::kTrialDown;
  return Set(to, b, p,
             Say("verifying the knee by a step down: trying %.0f workers (%.0f {items}/s at %.0f)",
                 to, rate, workers_),
             t_s);
}

std::optional<TunerDecision> TunerCore::JudgeTrim(const Pooled& p, const Budgets& b, double t_s) {
  // Kept where it lost under `gain` of the count it left, and the steps
  // down of this trim under `gain` in all; otherwise a floor.
  const double change = p.produced_rate() / std::max(trial_rate_before_, 1e-9) - 1;
  const double kept = std::min(1.0, trim_kept_ * (1 + change));
  reference_.reset();
  if (KeepsRate(change, kept)) {
    trim_kept_ = kept;
    trim_paid_ = change > params_.big_gain;
    knee_ = workers_;
    return Set(workers_, b, p,
               Say("%.0f -> %.0f workers keep the rate (%+.1f %%, %.0f {items}/s against %.0f)",
                   trial_from_, workers_, change * 100, p.produced_rate(), trial_rate_before_),
               t_s);
  }
  // A loss within a spread of the bar (ReadingNoise: heavy-tailed reads
  // scatter a reading): back, and the same step once more from a fresh
  // reading before the count below marks a floor.
  const double noise = ReadingNoise(p.window_s, StoreEvidence());
  if (-params_.gain - change < noise && std::exchange(trim_doubted_, workers_) != workers_) {
    return Set(trial_from_, b, p,
               Say("back to %.0f workers: %.0f lost %.1f %% (%.0f {items}/s against %.0f)",
                   trial_from_, workers_, -change * 100, p.produced_rate(), trial_rate_before_) +
                   Fmt(", within the noise of a reading (%.1f %%): it is tried again", noise * 100),
               t_s);
  }
  floor_ = workers_;
  knee_ = trial_from_;
  trim_paid_ = false;
  const bool more = trial_from_ - workers_ > 2;  // counts between are tried (TrimDown)
  if (!more) trim_fill_ = 0;
  return Set(trial_from_, b, p,
             Say(more ? "back to %.0f workers: %.0f lost %.1f %% of the rate (%.0f {items}/s "
                        "against %.0f)"
                      : "knee at %.0f workers: %.0f lost %.1f %% of the rate (%.0f {items}/s "
                        "against %.0f)",
                 trial_from_, workers_, -change * 100, p.produced_rate(), trial_rate_before_) +
                 (change >= -params_.gain ? Fmt(", %.1f %% in all", (1 - kept) * 100) : ""),
             t_s);
}

std::optional<TunerDecision> TunerCore::StepDown(const Pooled& p, const Budgets& b, double t_s) {
  jump_.reset();
  const double busy = p.busy_s / (workers_ * p.window_s);
  if (++calm_windows_ < 2 || workers_ <= 1 || (floor_ && *floor_ >= workers_) ||
      !(busy * workers_ / (workers_ - 1) < params_.down_busy)) {
    return std::nullopt;
  }
  calm_windows_ = 0;
  trim_fill_ = 0;  // the consumer is fed: a stall, not the rate, judges this step
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

bool TunerCore::WaitsOnReads(const Pooled& p, const Budgets& b) const {
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
  return p.produced > 0 && p.window_s > 0 && !CpuBound(p) && wait > 0 &&
         wait >= 2 * (p.cpu_per_sample() + p.queue_per_sample()) && waits_seen;
}

bool TunerCore::ServiceReference(const Pooled& p, const Budgets& b) const {
  // Not on the CPU, its cores idle in part (no run queue hidden in the
  // wait): its wait off the CPU is a read, though under twice the CPU time.
  // The least such wait is the store's service time, against which a
  // larger pool's reads show queued.
  return p.produced > 0 && p.window_s > 0 && p.wait_per_sample() > 0 && !p.on_cpu(params_) &&
         p.machine_known && p.idle_cores() > params_.no_idle_share * b.cpu_cores;
}

void TunerCore::Learn(const Pooled& p, const Budgets& b) {
  const bool reads = WaitsOnReads(p, b);
  if (!reads && !ServiceReference(p, b)) return;
  const double wait = p.wait_per_sample();
  store_.Add({workers_, p.produced_rate(), wait, p.wall_per_sample() - wait, p.t_s, !reads});
}

double TunerCore::StoreEvidence() const {
  // A second of ticks whose rate spreads by store_noise or less: a trial
  // window's worth. More spread (heavy-tailed reads, a lumpy large pool):
  // longer, as the spread squared (a mean's error falls as the root of its
  // length), at most store_evidence times.
  const double times =
      std::clamp(std::pow(store_spread_ / params_.store_noise, 2), 1.0, params_.store_evidence);
  return params_.trial_window_s * times;
}

double TunerCore::ReadingNoise(double a_s, double b_s) const {
  return store_spread_ * std::sqrt(1 / a_s + 1 / b_s);
}

void TunerCore::StartStoreTrial(int from, double rate, double rate_t, bool down, bool prior) {
  trial_from_ = from;
  trial_rate_before_ = rate;
  trial_t_before_ = rate_t;
  phase_ = down ? Phase::kTrialDown : Phase::kTrialUp;
  store_trial_ = down;
  store_prior_trial_ = down && prior;
  store_trial_s_ = StoreEvidence();
  // The first step down of a chain: its reading is the search's best.
  if (down && store_kept_ >= 1) store_best_ = Reading{rate, rate_t};
}

bool TunerCore::KeepsRate(double change, double kept) const {
  return change >= -params_.gain && kept >= 1 - params_.gain;
}

double TunerCore::StoreUpBar(int from, int to) const {
  const double gain = params_.gain;
  // Where kept steps down lost over half a gain in all, half a gain (above
  // a window's noise) pays: it returns toward the best count, and a few
  // workers too many cost less than a rate lost.
  const double back = store_kept_ < 1 - gain / 2 ? gain / 2 : gain;
  // A step too small for `gain` to be in proportion to it (one worker of
  // 36: +2.8 % where the store still has room) pays what proportion asks
  // (store_linear of its size), at least half a gain.
  const double size = (to - from) / static_cast<double>(std::max(from, 1));
  return std::min(back, std::max(gain / 2, params_.store_linear * size));
}

std::optional<TunerCore::LinesMeet> TunerCore::PeakOfLines(int at, double rate) const {
  const double rise = store_.UnqueuedRate();
  if (rise <= 0 || !store_.Saturated()) return std::nullopt;
  // Past the peak: counts whose step up lost, above this one, and this one
  // where it reads clearly (big_gain) under the rise: the corner of a
  // store's knee rounds off within a few percent of it.
  std::vector<std::pair<int, double>> past;
  for (const auto& f : store_falls_) {
    if (f.first > at) past.push_back(f);
  }
  if (!OnTheRise(at, rate)) past.emplace_back(at, rate);
  if (past.size() < 2) return std::nullopt;
  std::sort(past.begin(), past.end());
  const auto [a, rate_a] = past[0];
  const auto [b, rate_b] = past[1];
  // A fall of more than `gain`: on a flat store the lines meet at the knee
  // itself, where a pool has no headroom to show the store gaining slots.
  if (rate_b > (1 - params_.gain) * rate_a) return std::nullopt;
  const double fall = (rate_b - rate_a) / (b - a);
  // Up, as the lines meet above a rounded peak.
  const int meet = static_cast<int>(std::ceil((rate_a - fall * a) / (rise - fall)));
  return LinesMeet{meet, rise, fall, a, b, rate_a, rate_b};
}

bool TunerCore::OnTheRise(int workers, double rate) const {
  const double rise = store_.UnqueuedRate();
  return rise > 0 && rate >= (1 - params_.big_gain) * rise * workers;
}

void TunerCore::NoteFall(int workers, double rate) {
  store_top_ = workers;
  // One reading a count, the latest: two of one count would make no line.
  auto same = std::find_if(store_falls_.begin(), store_falls_.end(),
                           [workers](const auto& f) { return f.first == workers; });
  if (same != store_falls_.end()) {
    same->second = rate;
  } else {
    store_falls_.emplace_back(workers, rate);
  }
}

int TunerCore::StoreStepOf(int workers) const {
  return std::max(1, static_cast<int>(std::lround(params_.store_step * workers)));
}

void TunerCore::NoteLostStepUp(int from, double change) {
  // The first step from below a cliff: the fewest workers whose gain, in
  // proportion, would be twice `gain` (a step whose whole gain is the bar
  // reads either way) and twice the noise of two readings (two workers of
  // 32 on a steady store; more where their share would hide in the noise).
  if (change < -params_.change) {
    const double size = 2 * std::max(params_.gain, ReadingNoise());
    store_climb_ = std::max(1, static_cast<int>(std::lround(size * from)));
  }
}

std::optional<TunerDecision> TunerCore::StoreStep(const Pooled& p, const Budgets& b, double t_s) {
  if (!store_seen_) {
    // Saturated for the first time: a knee the plain steps marked was
    // judged without the store in view.
    store_seen_ = true;
    knee_.reset();
  }
  if (store_held_) {
    // Held. The store's queue gone from the model (a larger pool's point
    // produced clearly less than this count does now: the store gained
    // slots or got faster; not a model that forgot its old points, nor a
    // peaked store, where a larger pool producing less is its shape), or
    // the rate moved well away from the one held (two windows running):
    // look around again, one way.
    const bool unqueued = store_held_saturated_ && !store_peaked_ &&
                          store_.outrun() > store_held_outrun_ && !store_.Saturated();
    const double moved = RelChange(p.produced_rate(), store_hold_rate_);
    // Or, held for store_faster_s, faster at the held count by twice
    // `gain`, beyond three of a reading's noise: a pool held at the knee
    // itself (no queue to see empty) shows a store that gained slots only
    // so. Not sooner: a store whose service drifts shorter would have each
    // hold looked at again within seconds.
    const double noise = ReadingNoise(p.window_s, StoreEvidence());
    const bool faster_here =
        t_s - store_held_at_ >= params_.store_faster_s &&
        p.produced_rate() > store_hold_rate_ * (1 + std::max(2 * params_.gain, 3 * noise));
    if (!unqueued && moved <= params_.store_moved && !faster_here) {
      store_moved_windows_ = 0;
      store_moved_s_ = 0;
      return std::nullopt;
    }
    // Two windows running, and a store step's evidence of them: a burst of
    // slow reads moves a heavy-tailed store's rate by half for a second.
    store_moved_s_ += p.window_s;
    if (!unqueued && (++store_moved_windows_ < 2 || store_moved_s_ < StoreEvidence())) {
      return std::nullopt;
    }
    store_moved_windows_ = 0;
    store_moved_s_ = 0;
    store_held_ = false;
    store_moved_trial_ = true;
    store_kept_ = 1;
    knee_.reset();
    // A store that got faster (service shorter, or more slots) may keep
    // more workers busy; one that got slower needs fewer to keep its slots
    // busy (each spends less of its time computing).
    const bool faster = unqueued || p.produced_rate() > store_hold_rate_;
    store_way_ = faster ? 1 : -1;
    (faster ? store_top_ : store_floor_).reset();
    store_falls_.clear();
    store_unresolved_.reset();
    (faster ? store_falling_ : store_linear_).reset();
    if (faster) store_climb_ = 0;
    return StoreVerify(
        workers_, p.produced_rate(), p.mid_s(), p, b,
        (unqueued ? Say("reads no longer queue at the store (%.0f {items}/s at %.0f workers)",
                        p.produced_rate(), workers_)
                  : Say("the store's rate moved from %.0f to %.0f {items}/s at %.0f workers",
                        store_hold_rate_, p.produced_rate(), workers_)) +
            (faster ? ", more may pay" : ", fewer may keep it"),
        t_s);
  }
  // A step is judged against a second of settled windows here, measured
  // just before it: a single window at a large pool reads 10 % high at
  // times, and every step judged against it would lose.
  if (settled_s_ < StoreEvidence()) return std::nullopt;
  const double rate = static_cast<double>(settled_produced_) / settled_s_;
  const double rate_t = (settled_from_s_ + settled_to_s_) / 2;
  if (store_recheck_) return StoreRecheck(rate, rate_t, p, b, t_s);
  return StoreVerify(workers_, rate, rate_t, p, b, std::exchange(store_why_, {}), t_s);
}

std::optional<TunerDecision> TunerCore::StoreRecheck(double rate, double rate_t, const Pooled& p,
                                                     const Budgets& b, double t_s) {
  const Recheck r = *std::exchange(store_recheck_, std::nullopt);
  // The count's rate at the trial's time, between its readings before and
  // after: a store whose rate drifts would otherwise make the drift the
  // trial's gain or loss, and a falling rate reads every step up as a loss and every step
  // down, judged against the count above measured again, as keeping it.
  const double span = rate_t - r.before_t;
  const double w = r.after    ? 1.0
                   : span > 0 ? std::clamp((r.rate_t - r.before_t) / span, 0.0, 1.0)
                              : 0.5;
  const double baseline = r.before + (rate - r.before) * w;
  const double change = r.rate / std::max(baseline, 1e-9) - 1;
  // The store's drift: the count's rate per second, relative, between its
  // two readings, where they differ by more than twice their noise
  // (ReadingNoise): heavy-tailed reads scatter readings by 10 % and more. It
  // says how far a later trial's reading may be from its trend
  // (JudgeStoreTrial).
  if (span >= params_.trial_window_s && !r.after) {
    const double moved = (rate - r.before) / std::max((rate + r.before) / 2, 1e-9);
    store_drift_ = std::abs(moved) > 2 * ReadingNoise() ? moved / span : 0;
    store_drift_known_ = true;
    // A store that drifts by `change` within store_age_s: its model's older
    // points measured another store (an old wait read against today's
    // service time shows reads queued where none are, and too few slots).
    if (std::abs(store_drift_) * params_.store_age_s > params_.change) {
      store_.ForgetBefore(rate_t - params_.store_age_s);
    }
  }
  return StoreVerdict(
      r, change,
      Say("%.0f {items}/s against %.0f at %.0f workers then (%.0f before, %.0f after)", r.rate,
          baseline, workers_, r.before, rate),
      /*at_trial=*/false, rate, rate_t, p, b, t_s);
}

std::optional<TunerDecision> TunerCore::StoreVerify(int at, double rate, double rate_t,
                                                    const Pooled& p, const Budgets& b,
                                                    std::string why, double t_s) {
  int cap = Cap(b);
  if (CpuBound(p)) cap = std::min(cap, CpuBoundCap(b));
  if (!why.empty()) why += ": ";
  // The last step up paid handsomely, or reads here do not queue (their
  // wait within store_queued of the least seen): in a search both ways (so
  // that an overshoot comes back), the next step up may double the pool.
  // Not where reads queue: the store is full here, whatever the last step paid.
  const bool measured = store_.service_s() > 0 && p.wait_per_sample() > 0 && p.workers == at;
  const bool unqueued = measured && p.wait_per_sample() < params_.store_queued * store_.service_s();
  const bool paid = std::exchange(store_last_gain_, 0.0) > params_.big_gain;
  const bool grow = (unqueued || (paid && !measured)) && store_way_ == 0;
  // The last step down gained handsomely: the next one may halve the pool.
  const bool shrink = std::exchange(store_shrink_, false) && store_way_ == 0;
  if (!store_prior_tried_ && store_.Saturated()) {
    // The model's knee, once: a pool far above it (the first jump, sized as
    // if reads were parallel) tries it, judged by throughput.
    store_prior_tried_ = true;
    const int prior = std::min(store_.Knee(), cap);
    // Not below a count where the rate grew in proportion: there the
    // model reads too few slots.
    const bool below_linear = store_linear_ && prior < *store_linear_;
    if (at - prior > StoreStepOf(at) && !below_linear) {
      StartStoreTrial(at, rate, rate_t, /*down=*/true, /*prior=*/true);
      return Set(prior, b, p,
                 why + store_.Describe(item_) +
                     Say(": trying the model's knee, %.0f workers (%.0f {items}/s at %.0f)", prior,
                         rate, at),
                 t_s);
    }
  }
  // Steps of store_step x the pool, halved within a bracket: between a
  // floor and a top, the best count is found by halving (a peaked store's
  // best count lies between them, and a quarter step may jump over it).
  const int step = StoreStepOf(at);
  // Only where a step showed the rate falling past the best count, or the
  // rate still grew in proportion up to here (the best count lies between
  // here and the top; on a flat store any count of the plateau will do),
  // and in the first search: a re-check after a change takes one step each
  // way at most, so that a drifting store is not chased (at most one trial
  // per change).
  const bool linear = store_linear_ && *store_linear_ >= at;
  const bool halve = (store_peaked_ || linear) && store_way_ == 0;
  int up_step = grow ? std::max(step, at) : step;
  if (store_top_ && (halve || grow)) {
    up_step = std::min(up_step, std::max(halve ? 1 : step, (*store_top_ - at) / 2));
  }
  if (store_climb_ > 0) up_step = std::min(up_step, store_climb_);
  // Down, also on a flat store: a count past its knee holds threads (and
  // a process worker's memory) for nothing, so steps down halve toward the
  // floor until the pool is within three workers of a count that lost (two
  // of the fewest that keep the rate; at the knee itself a store that gains
  // slots would barely show it).
  const bool halve_down =
      store_floor_ && store_way_ == 0 && (store_peaked_ || at - *store_floor_ > 3);
  int down_step = halve_down ? std::min(step, std::max(1, (at - *store_floor_) / 2)) : step;
  if (shrink) {
    down_step =
        store_floor_ ? std::max(down_step, (at - *store_floor_) / 2) : std::max(step, at / 2);
  }
  const int up = std::min(at + up_step, cap);
  // Not below the fewest workers that keep the store's slots busy, where
  // the model is sure of them: fewer leave slots idle, each losing a
  // slot's share of the rate.
  const int least = store_.Saturated() ? store_.SureKnee() : 0;
  const int down = std::max({1, least, at - down_step});
  // From a count whose step down gained in proportion to its size, the
  // rate fell as the pool grew (an overloaded store): no step up from it.
  const bool falling = store_falling_ && at >= *store_falling_;
  const bool up_open = store_way_ >= 0 && up > at && !falling && (!store_top_ || *store_top_ > up);
  // Up to a count whose step up paid in proportion to its size, the rate
  // still grew with the pool: a step down from there would lose as much.
  const bool unresolved = store_unresolved_ && at <= *store_unresolved_;
  const bool down_open = store_way_ <= 0 && down < at && !linear && !unresolved &&
                         (!store_floor_ || *store_floor_ < down);
  // Toward the model's knee first: above it, a step down (a knee below a
  // count where the rate still grew is the model's error: an overloaded
  // store stretches its service, and it reads too few slots).
  const bool above_model = store_.Saturated() && at > store_.Knee() && !linear && !unresolved;
  const std::string model = store_.Saturated() ? store_.Describe(item_) + "; " : std::string();
  // The rate's rise below the knee and its fall past the peak meet within
  // the bracket: that count is the next trial, not a quarter step.
  if (const std::optional<LinesMeet> m = PeakOfLines(at, rate);
      m && m->workers != at && m->workers >= 1 && m->workers <= cap && store_way_ == 0 &&
      (!store_floor_ || m->workers > *store_floor_) && (!store_top_ || m->workers < *store_top_) &&
      (m->workers > at ? !falling : !linear && !unresolved)) {
    StartStoreTrial(at, rate, rate_t, /*down=*/m->workers < at, /*prior=*/false);
    return Set(m->workers, b, p,
               why +
                   Say("the rate grows by %.1f {items}/s a worker below the store's knee and "
                       "falls by %.1f past its peak (%.0f at %.0f workers, ",
                       m->rise, -m->fall, m->rate_a, m->a) +
                   Say("%.0f at %.0f): the two meet at %.0f workers, tried (%.0f {items}/s at "
                       "%.0f)",
                       m->rate_b, m->b, m->workers, rate, at),
               t_s);
  }
  if (down_open || up_open) {
    const bool step_down = down_open && (above_model || !up_open);
    const int to = step_down ? down : up;
    StartStoreTrial(at, rate, rate_t, step_down, /*prior=*/false);
    return Set(to, b, p,
               why + model +
                   Say(step_down ? "verifying by a step down of %.0f: trying %.0f workers (%.0f "
                                   "{items}/s at %.0f)"
                                 : "verifying by a step up of %.0f: trying %.0f workers (%.0f "
                                   "{items}/s at %.0f)",
                       std::abs(to - at), to, rate, at),
               t_s);
  }
  // No step left between the top and the floor: hold here.
  knee_ = at;
  store_way_ = 0;
  store_held_ = true;
  store_held_saturated_ = store_.Saturated();
  store_held_outrun_ = store_.outrun();
  store_hold_rate_ = rate;
  store_held_at_ = t_s;
  store_moved_windows_ = 0;
  store_moved_s_ = 0;
  reference_.reset();
  std::string evidence;
  auto cite = [&evidence](const std::string& what) {
    evidence += (evidence.empty() ? "" : ", ") + what;
  };
  if (store_top_)
    cite(Fmt("a step up to %.0f paid less than %.0f %%", *store_top_, params_.gain * 100));
  if (store_floor_)
    cite(Fmt("a step down to %.0f lost %.0f %% or more", *store_floor_, params_.gain * 100));
  if (linear) cite(Fmt("the rate grew in proportion to the pool up to %.0f", *store_linear_));
  if (unresolved)
    cite(Fmt("the model's knee, %.0f, lost within a reading's noise", *store_unresolved_));
  if (falling) cite(Fmt("the rate rose as the pool shrank down to %.0f", *store_falling_));
  if (least >= at)
    cite(Fmt("fewer than %.0f workers leave some of the store's ~%.1f slots idle", least,
             store_.slots()));
  if (evidence.empty()) evidence = "no step left within the budget";
  return Set(at, b, p, why + Fmt("knee at %.0f workers (", at) + evidence + ")", t_s);
}

std::optional<TunerDecision> TunerCore::JudgeStoreTrial(const Pooled& p, const Budgets& b,
                                                        double t_s, bool up) {
  store_seen_ = true;
  store_trial_ = false;
  reference_.reset();
  const Recheck r{workers_,
                  p.produced_rate(),
                  p.mid_s(),
                  trial_rate_before_,
                  trial_t_before_,
                  up,
                  std::exchange(store_prior_trial_, false),
                  std::exchange(store_moved_trial_, false)};
  const double gap = std::max(0.0, r.rate_t - r.before_t);
  const double drift = store_drift_known_ ? store_drift_ : 0;
  const double change = r.rate / std::max(r.before, 1e-9) - 1;
  if (up) last_gain_ = change;
  // Decided on this reading: the model's knee keeping the rate, or a
  // verdict farther from the bar than the store's drift could make it over
  // the time between the two readings, and half a gain of noise. The drift
  // is known from two readings of one count around a trial; before that,
  // it may be as much as store_drift_bound a second, and a reading older
  // than store_fresh_s (a chain of steps judged against one reading) may
  // have drifted any way; once it is known, one older than
  // store_fresh_known_s (a lucky reading makes every step after it lose).
  // Any other verdict waits for the count left, measured again.
  const double bar = up ? StoreUpBar(trial_from_, workers_) : -params_.gain;
  const double doubt =
      (store_drift_known_ ? std::abs(drift) : params_.store_drift_bound) * gap + params_.gain / 2;
  const bool stale =
      gap > (store_drift_known_ ? params_.store_fresh_known_s : params_.store_fresh_s);
  // The first trial since the held count's rate moved is always judged
  // against that count measured again, after it: the reading before may
  // have been a burst of slow reads that ended during the trial.
  const bool decided = !r.after && ((r.prior && change >= -params_.gain) ||
                                    (!stale && std::abs(change - bar) > doubt));
  if (decided) {
    std::string evidence = Say("%.0f {items}/s against %.0f before", r.rate, r.before);
    evidence += store_drift_known_ ? Fmt(", %.1f s apart, beyond the store's drift of %+.1f %%/s",
                                         gap, drift * 100)
                                   : Fmt(", %.1f s apart, beyond any drift of the store", gap);
    return StoreVerdict(r, change, std::move(evidence), /*at_trial=*/true, r.before, r.before_t, p,
                        b, t_s);
  }
  store_recheck_ = r;
  return Set(trial_from_, b, p,
             Say("%.0f workers: %+.1f %% of the rate at %.0f before (%.0f {items}/s): back, to "
                 "measure it again",
                 workers_, change * 100, trial_from_, r.before),
             t_s);
}

std::optional<TunerDecision> TunerCore::StoreVerdict(const Recheck& r, double change,
                                                     std::string evidence, bool at_trial,
                                                     double rate, double rate_t, const Pooled& p,
                                                     const Budgets& b, double t_s) {
  const int from = trial_from_;
  // The trial's count won: a step up that paid `gain`, a step down that
  // lost less than that. Taken: at once where the pool is there, otherwise
  // by going back (the next step is judged on readings there).
  // A step down that keeps the rate within `gain` of the count it left may
  // still, after others like it, have lost more than that of the best count
  // in this search: the losses add up (store_kept_), and such a step is a
  // floor.
  double kept = std::min(1.0, store_kept_ * (1 + change));
  // And against the reading the first of them was judged against (moved by
  // the store's drift since): chained, each step judged against a reading
  // of the count above, one low reading there (a heavy tail) lets the next
  // step lose as much again unseen.
  if (!r.up && store_best_) {
    const double drift = store_drift_known_ ? store_drift_ : 0;
    const double moved = std::max(0.1, 1 + drift * (r.rate_t - store_best_->t));
    kept = std::min(kept, r.rate / std::max(store_best_->rate * moved, 1e-9));
  }
  const double up_bar = StoreUpBar(from, r.workers);
  // The model's knee losing less than a reading's noise beyond `gain`: the
  // readings cannot tell, and the model says it keeps the rate (the steps
  // up from it say whether more pay).
  const bool keeps = KeepsRate(change, kept);
  const bool unresolved = !r.up && r.prior && !keeps && change >= -params_.gain - ReadingNoise();
  const bool won = r.up ? change >= up_bar : keeps || unresolved;
  std::string why = Fmt(r.up ? (won ? "step up from %.0f to %.0f paid %+.1f %% ("
                                    : "step up from %.0f to %.0f gained only %+.1f %% (")
                             : (keeps ? "%.0f -> %.0f workers keep the store's rate (%+.1f %%, "
                                      : "%.0f -> %.0f workers lost %.1f %% of the store's rate ("),
                        from, r.workers, keeps || r.up ? change * 100 : -change * 100) +
                    evidence + ")";
  if (unresolved) {
    store_unresolved_ = r.workers;
    why +=
        Fmt(": the model's knee, kept: %.1f %% past %.0f %% is within a reading's noise (%.1f %%)",
            -(change + params_.gain) * 100, params_.gain * 100, ReadingNoise() * 100);
  }
  if (!r.up && !won && change >= -params_.gain) {
    why += Fmt(": %.1f %% in all since the best count of this search", (1 - kept) * 100);
  }
  if (r.up && won && change < params_.gain) {
    why += store_kept_ < 1 - params_.gain / 2
               ? Fmt(": half a gain, the steps down having lost %.1f %% in all",
                     (1 - store_kept_) * 100)
               : Fmt(": in proportion to a step of %.1f %% of the pool",
                     100.0 * (r.workers - from) / from);
  }
  if (won) {
    store_kept_ = r.up ? 1.0 : kept;
    if (r.up) {
      store_floor_ = from;  // fewer than the trial's count lose
      store_last_gain_ = change;
      // The rate grew in proportion to the step (the store had room for
      // every read): any count below the trial's makes less, and a climb
      // toward a cliff may take twice the step.
      if (InProportion(from, r.workers, change)) {
        store_linear_ = r.workers;
        store_climb_ *= 2;
      }
    } else {
      // The model's knee paying handsomely over the pool far above it: that
      // pool overloaded the store, and the model, reading its slots there,
      // errs low: steps up from it may double, as after a step up that paid
      // as much.
      if (r.prior && change > params_.big_gain) store_last_gain_ = change;
      store_top_ = from;  // more workers paid nothing over the trial's count
      // Fewer workers made more, in proportion to the step: the store was
      // overloaded down to the trial's count, and steps go on down.
      // Not where the trial's count still reads on the rise: the peak lies
      // above it, below the count left.
      if (!r.prior && InProportion(from, r.workers, change) && !OnTheRise(r.workers, r.rate)) {
        store_falling_ = r.workers;
        store_shrink_ = change > params_.big_gain;
      }
      store_peaked_ = store_peaked_ || (change >= params_.gain && !r.prior);
      if (store_floor_ && *store_floor_ >= r.workers) store_floor_.reset();
    }
    if (at_trial) return StoreVerify(r.workers, r.rate, r.rate_t, p, b, std::move(why), t_s);
    return Set(r.workers, b, p, why, t_s);
  }
  if (r.up) {
    NoteFall(r.workers, r.rate);
    store_peaked_ = store_peaked_ || change <= -params_.gain;
    NoteLostStepUp(from, change);
    return StoreVerify(from, rate, rate_t, p, b, std::move(why), t_s);
  }
  store_floor_ = r.workers;
  const int mid = (r.workers + from + 1) / 2;
  if (r.prior && from - mid > StoreStepOf(from)) {
    // The model's knee was too low (an overloaded store serves fewer reads
    // at once than it could): halfway back, judged against this count.
    StartStoreTrial(from, rate, rate_t, /*down=*/true, /*prior=*/true);
    return Set(mid, b, p, why + Fmt(": trying %.0f workers, halfway back", mid), t_s);
  }
  return StoreVerify(from, rate, rate_t, p, b, std::move(why), t_s);
}

}  // namespace stoker
