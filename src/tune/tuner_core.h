#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stoker/defaults.h"
#include "stoker/tuning.h"
#include "tune/store_model.h"
#include "tune/tuner_params.h"

namespace stoker {

/// What the loader did over one measurement window (between two ticks).
struct Observation {
  double t_s = 0;        // end of the window, seconds since start
  double window_s = 0;   // its length
  int workers = 0;       // worker target during the window
  int prefetch = 0;      // prefetch depth during the window
  int64_t batches = 0;   // batches delivered
  int64_t samples = 0;   // samples delivered
  double wait_s = 0;     // consumer time inside Next()
  double step_s = 0;     // consumer time between Next() calls
  int64_t produced = 0;  // samples produced by workers
  double busy_s = 0;     // workers' task wall time
  double cpu_s = 0;      // workers' task CPU time
  double queue_s = 0;    // of busy_s, runnable but waiting for a CPU (0: unknown)
  // The CPUs this process may run on, over the window (core-seconds; < 0:
  // unknown): time other processes ran there, and time they were idle.
  double others_s = -1;
  double idle_s = -1;
  // Workers of the count still starting at the window's end (a worker
  // process not yet up): the pool is not yet what `workers` says. 0: none,
  // or unknown.
  int starting = 0;
};

/// Limits the tuner must keep, re-read as the machine changes.
struct Budgets {
  double cpu_cores = 1;           // cores this loader's workers may use
  int max_workers = kMaxWorkers;  // hard cap (configuration, rlimits)
  size_t memory_bytes = 0;        // 0 = unbounded
  size_t batch_bytes = 0;         // one batch buffer
  int64_t batch_items = 64;       // items a batch holds (1: a kind's whole user batch)
  size_t worker_bytes = 0;        // one worker's footprint, measured or assumed
  // Cores of the CPUs we may run on that are not ours to use (other ranks',
  // or beyond a quota): other processes running there take nothing from us.
  double others_room = 0;
};

/// The decision logic of the tuner, free of clocks and threads: fed one
/// Observation per tick, it returns a decision when the knobs should change.
/// Deterministic, so tests drive it with a simulated workload and clock.
/// Not thread-safe: one caller at a time.
///
/// Method: windows are pooled until they hold enough evidence (time, and
/// batches or samples; none while workers of the count still start, for at
/// most max_start_s); the first pooled window sizes the pool by Little's
/// law (workers = demand rate x wall time per sample, the wall time counted
/// without its queueing for a CPU; a consumer with no measurable demand
/// takes what the CPUs allow, so its demand is not a bound), capped where
/// the CPU-bound share saturates the cores left to us: the CPU budget less
/// what other processes take of it. Their load lowers that aim and never
/// raises it: the tuner does not size the pool to win CPU time from them.
/// Work is CPU-bound when its wall time, run-queue delay aside, is within
/// on_cpu of its CPU time, however busy the machine; such a pool never
/// holds more than the CPU budget + over_budget workers. Only work that
/// measurably waits off the CPU (I/O) gets more threads than cores.
/// Where reads are the wait, the first jump is at most first_jump x the
/// pool and later plain steps at most double it (a store that slows when
/// overloaded serves a fraction of its rate far past its knee).
/// Then, while the consumer waits, it tries steps of half the pool (whole
/// while steps pay > big_gain), each judged against a settled window (not
/// the first after the pool grew; after a step that paid > big_gain, the
/// consumer still waiting, the window that judged it; where reads are the
/// wait, the first jump's count on its first window if that grew the rate
/// in proportion, a step on its first min_window_s if that paid more than
/// big_gain beyond its noise), going on while they pay >= gain, and marks
/// the knee when one does not (unless it lost more than `change`: the
/// workload changed under it) or when a CPU-bound pool fills the budget
/// (or, with other processes on our CPUs, reaches budget + over_budget); a
/// knee io_headroom put above the count whose CPU share fills the cores is
/// verified by steps down of store_step x the pool,
/// judged by throughput (kept while they lose under `gain`, each and in
/// all), never below that count; it steps down while the consumer never
/// waits and the workers are idle enough that fewer would still keep up,
/// marking the floor when that stalls. A workload change (demand, CPU time
/// per sample, wall time less its queueing for a CPU unless the work is
/// CPU-bound, at the same worker count; other processes' CPU use, or
/// contention starting or ending) clears the marks and re-sizes by the
/// model; a change of more than 2x is believed at once.
/// I/O-bound pools also feed a StoreModel: when more workers made each read
/// wait longer (store_queued x its service time), the store serves a limited
/// number of reads at once, and more workers only queue there, or, on a
/// store that slows down when overloaded, lose. The model's knee (the fewest
/// workers that keep its slots busy, with store_headroom) is a prior, not a
/// verdict: a pool far above it tries it once, judged by throughput (kept if
/// it loses less than `gain`; if it loses more, halfway back is tried). From
/// then on, and after any workload change, the tuner verifies with its own
/// steps of store_step x the pool (at least one worker; twice that while
/// steps up pay over big_gain) both ways, toward the model's knee first: a
/// step up is kept when it gains `gain`, a step down when it loses less than
/// `gain`; a step up that did not pay marks a top, a step down that lost
/// marks a floor, and with no step left between them the count holds, until
/// the workload changes or its rate moves by store_moved. A step up that
/// paid in proportion to its size (store_linear) rules out steps down from
/// its count and a model's knee below it; a step down that gained so rules
/// out steps up from its count, and the next step down may halve the pool.
/// After a step up that lost more than `change` (a cliff past an overloaded
/// store's peak), steps up from below it start at `gain` of the pool (more
/// where readings are noisy) and double while they pay in proportion. No
/// jump past a store that saturated. Each step is judged against at least
/// trial_window_s of settled windows at the count it leaves, measured just
/// before it: at once where the verdict is farther from the bar than the
/// store's drift could make it (known from earlier steps; unknown: up to
/// store_drift_bound a second), otherwise after going back and measuring
/// that count again, against its rate at the step's time, interpolated
/// between the two readings (a store whose rate drifts moves it between
/// them). The two readings give the drift; a drift of `change` within
/// store_age_s makes the store model forget its older points.
/// A generic step up whose reads queued (store_queued x the wait before)
/// and that paid nothing shows such a store too: its steps take over.
/// A decision that changes neither knob is returned (and so recorded) only
/// when it is the first verdict after a change, or when repeat_s has passed
/// since the last one returned: a steady state is not logged over and over.
/// docs/tuner.md has the figures behind the parameters.
///
/// Its unit is the engine's item: a sample for a loader over a Source, a
/// whole user batch for stoker.DataLoader's worker kinds. `item` names it
/// ("sample", "batch", or "item" for a kind that does not say): decision
/// reasons say "ms CPU per batch", "40 batches/s" where the items are
/// batches, and TunerDecision::unit carries the word.
class TunerCore {
 public:
  explicit TunerCore(int initial_workers, int initial_prefetch, TunerParams params = {},
                     std::string item = "sample");

  /// Feeds one window; returns a decision when workers or prefetch change,
  /// and a verdict that changes nothing when it is the first since a change
  /// or repeat_s has passed since the last decision returned.
  std::optional<TunerDecision> Observe(const Observation& o, const Budgets& b);

  int workers() const { return workers_; }
  int prefetch() const { return prefetch_; }
  /// "measuring", "refining", "steady", "trying more workers" or "trying
  /// fewer workers".
  const char* phase() const;
  /// Latest pooled figures (for the view).
  double samples_per_s() const { return last_rate_; }
  double stall_fraction() const { return last_stall_; }
  int cpu_cap() const { return last_cpu_cap_; }
  /// The engine's item, as the reasons name it.
  const std::string& item() const { return item_; }

 private:
  enum class Phase { kStart, kRefine, kTrialUp, kTrialDown };

  struct Pooled {
    double window_s = 0, wait_s = 0, step_s = 0, busy_s = 0, cpu_s = 0, queue_s = 0;
    double others_s = 0, idle_s = 0;
    bool machine_known = true;  // others_s and idle_s were known in every window
    bool contended = false;     // other processes compete for our CPUs (see contended_)
    double cpu_cores = 0;       // the CPU budget while pooled (Budgets::cpu_cores)
    int workers = 0;            // the worker count throughout
    double t_s = 0;             // the end of its last window
    int64_t batches = 0, samples = 0, produced = 0;
    // The ticks' produced rates: how many, their sum and sum of squares.
    int ticks = 0;
    double tick_rate_sum = 0, tick_rate_sq = 0;
    double rate() const { return window_s > 0 ? samples / window_s : 0; }
    // The middle of the time it covers: when its rate was measured.
    double mid_s() const { return t_s - window_s / 2; }
    // Samples/s the workers finished: finer-grained than whole batches.
    double produced_rate() const { return window_s > 0 ? produced / window_s : 0; }
    // Cores: the workers', other processes' (on our CPUs), and idle.
    double worker_cores() const { return window_s > 0 ? cpu_s / window_s : 0; }
    double other_cores() const { return window_s > 0 ? others_s / window_s : 0; }
    // Other processes' use beyond `room`: what they take of our budget.
    double intruding_cores(double room) const { return std::max(0.0, other_cores() - room); }
    double idle_cores() const { return window_s > 0 ? idle_s / window_s : 0; }
    double stall() const { return StallFraction(wait_s, window_s); }
    double wall_per_sample() const { return produced > 0 ? busy_s / produced : 0; }
    double cpu_per_sample() const { return produced > 0 ? cpu_s / produced : 0; }
    double queue_per_sample() const { return produced > 0 ? queue_s / produced : 0; }
    // Wall time per sample off the CPU and not queued for one: waiting for reads.
    double wait_per_sample() const {
      return produced > 0 ? std::max(0.0, busy_s - queue_s - cpu_s) / produced : 0;
    }
    // Workers that hardly ever wait for anything but a core: wall time
    // mostly CPU plus run-queue delay, however busy the machine.
    bool on_cpu(const TunerParams& params) const {
      return cpu_s > 0 && unqueued_per_sample() < params.on_cpu * cpu_per_sample();
    }
    // Reads are the wait: time off the CPU, not queued for one, is twice
    // the CPU time or more.
    bool reads_wait() const { return wait_per_sample() >= 2 * cpu_per_sample(); }
    // Wall time per sample less its queueing for a CPU (computing or I/O):
    // what a sample needs whatever the number of threads sharing the cores.
    double unqueued_per_sample() const {
      return produced > 0 ? std::max(cpu_s, busy_s - queue_s) / produced : 0;
    }
    // Samples/s the consumer would take if it never waited; infinite when it
    // spends (almost) no time outside Next().
    double demand() const {
      if (window_s <= 0 || step_s < 0.01 * window_s || batches == 0) {
        return std::numeric_limits<double>::infinity();
      }
      return samples / step_s;
    }
    void Add(const Observation& o);
  };

  // The phases of Observe, in the order a pooled window meets them.
  // Pools `o`; returns the pool once it holds enough evidence to judge.
  std::optional<Pooled> Accumulate(const Observation& o);
  // A store trial's window so far (`w`) already tells its verdict, far
  // beyond its noise: it need not run its whole length.
  bool TrialIsClear(const Pooled& w) const;
  // A plain step up whose window so far already paid more than big_gain,
  // beyond its noise (reads the wait, the consumer still waiting): judged
  // at once.
  bool PaysClearly(const Pooled& w) const;
  // Contention, the window count at this worker count, the view's figures.
  void Note(Pooled& p, const Budgets& b);
  // The first model jump, logged even when it keeps the count; contended,
  // at most CpuBoundCap workers (the first window holds the pool's start-up).
  std::optional<TunerDecision> Start(const Pooled& p, const Budgets& b, double t_s);
  // The most the first jump may reach: first_jump x the pool where reads
  // are the wait (a store may slow when overloaded), else the cap.
  int FirstJumpCap(const Pooled& p) const;
  // A step from `from` to `to` workers that changed the rate by `change`
  // (up: a gain; down: the gain of having fewer) did so in proportion to
  // its size relative to `from` (store_linear).
  bool InProportion(int from, int to, double change) const;
  // The first jump's count, `p` read there, grew the rate in proportion to
  // the jump, reads being the wait.
  bool JumpInProportion(const Pooled& p) const;
  // And the consumer waits: the jump's count is judged on this reading
  // (Refine), before a settled window.
  bool JumpPaysEarly(const Pooled& p) const;
  // Or the first jump's count made less than the count it left by
  // `change`, each read waiting store_queued x longer: an overloaded store,
  // on its first window (start-up reads low, but does not make each read
  // wait longer, and the lump of work in flight when it grew reads high).
  bool JumpLostEarly(const Pooled& p) const;
  std::optional<TunerDecision> JudgeTrialUp(const Pooled& p, const Budgets& b, double t_s);
  std::optional<TunerDecision> JudgeTrialDown(const Pooled& p, const Budgets& b, double t_s);
  // Settled windows between trials: reference, workload change, steps.
  std::optional<TunerDecision> Refine(const Pooled& p, const Budgets& b, double t_s);
  // A workload change of `change`: re-model once it is believed.
  std::optional<TunerDecision> Remodel(const Pooled& p, const Budgets& b, double change,
                                       double t_s);
  std::optional<TunerDecision> StepUp(const Pooled& p, const Budgets& b, double t_s,
                                      bool settled = false);
  std::optional<TunerDecision> StepDown(const Pooled& p, const Budgets& b, double t_s);
  // A knee above the count that fills the cores (io_headroom's): a step
  // down, judged by throughput (JudgeTrim), while steps keep the rate.
  std::optional<TunerDecision> TrimDown(const Pooled& p, const Budgets& b, double t_s);
  std::optional<TunerDecision> JudgeTrim(const Pooled& p, const Budgets& b, double t_s);
  // Feeds an I/O-bound window, whose wait off the CPU is not a run queue in
  // disguise, to the store model.
  void Learn(const Pooled& p, const Budgets& b);
  // Whether the window's wall time is mostly a wait for reads (not a run
  // queue unseen): the windows the store model learns from.
  bool WaitsOnReads(const Pooled& p, const Budgets& b) const;
  // A pool hardly queued for a CPU, on cores idle in part, whose wait off
  // the CPU is a read though under twice the CPU time: a service time.
  bool ServiceReference(const Pooled& p, const Budgets& b) const;
  // The count a store step came back to, measured again: the step judged
  // against that count's rate at the step's time, interpolated between its
  // readings before and after the step (a drifting store's rate moves
  // between them).
  std::optional<TunerDecision> StoreRecheck(double rate, double rate_t, const Pooled& p,
                                            const Budgets& b, double t_s);
  // A store that saturated, the consumer waiting: the model's knee once
  // (when far above it), then the tuner's own steps, or held.
  std::optional<TunerDecision> StoreStep(const Pooled& p, const Budgets& b, double t_s);
  // The next step around a saturated store from `at` workers, whose rate
  // was `rate`, measured around `rate_t`: a trial up or down, or the count
  // held at `at`. `why` says what the last trial showed (empty: none).
  std::optional<TunerDecision> StoreVerify(int at, double rate, double rate_t, const Pooled& p,
                                           const Budgets& b, std::string why, double t_s);
  // A step around (or to the model's knee of) a saturated store, `up` or
  // down, judged by throughput: at once when it won by more than a drift
  // could make it (or the model's knee kept the rate), otherwise once the
  // count it left is measured again (StoreRecheck).
  std::optional<TunerDecision> JudgeStoreTrial(const Pooled& p, const Budgets& b, double t_s,
                                               bool up);
  // A store trial's verdict: it changed the rate by `change` (`evidence`
  // says against what). Taken where the pool is now: at the trial's count
  // (`at_trial`) or back at the count it left; `rate`, `rate_t`: that
  // count's latest reading and when.
  struct Recheck;
  std::optional<TunerDecision> StoreVerdict(const Recheck& r, double change, std::string evidence,
                                            bool at_trial, double rate, double rate_t,
                                            const Pooled& p, const Budgets& b, double t_s);
  // The tuner's step around a saturated store of `workers`.
  int StoreStepOf(int workers) const;
  // Where the rate's rise below the store's knee (UnqueuedRate a worker)
  // meets the line of its fall past the peak (the two least counts that
  // read under the rise, `rate` at `at` among them): the store's peak, or
  // a flat store's knee. Empty without two such counts, or a fall.
  struct LinesMeet {
    int workers;            // where they meet, rounded
    double rise, fall;      // each line's {items}/s a worker
    int a, b;               // the fall's two counts
    double rate_a, rate_b;  // and their rates
  };
  std::optional<LinesMeet> PeakOfLines(int at, double rate) const;
  // `rate` at `workers` reads within big_gain of the rise below the store's
  // knee (UnqueuedRate each): the count is not past the store's peak.
  bool OnTheRise(int workers, double rate) const;
  // A step up to `workers` lost, reading `rate` there: the top of the
  // search, and a count past the peak (store_falls_).
  void NoteFall(int workers, double rate);
  // A step up from `from` workers lost `change` of the rate: past a cliff,
  // steps up start small (store_climb_).
  void NoteLostStepUp(int from, double change);
  // A step down that changed the rate by `change`, the steps down before it
  // having kept `kept` of the best count's (itself included): it is kept.
  bool KeepsRate(double change, double kept) const;
  // What a store step up from `from` to `to` workers must gain to be kept.
  double StoreUpBar(int from, int to) const;
  // Starts a store step from `from` workers, whose rate was `rate` around
  // `rate_t`: down (`prior`: to the model's knee) or up.
  void StartStoreTrial(int from, double rate, double rate_t, bool down, bool prior);
  // Seconds of windows a store step is judged on, each side: trial_window_s,
  // longer when the settled windows' rates spread (StoreEvidence in .cc).
  double StoreEvidence() const;
  // The relative spread of the difference between two readings, of `a_s`
  // and `b_s` seconds (both StoreEvidence() when not given).
  double ReadingNoise(double a_s, double b_s) const;
  double ReadingNoise() const { return ReadingNoise(StoreEvidence(), StoreEvidence()); }

  // Other processes take a good part of our CPUs and leave them no idle time.
  bool Contended(const Pooled& p, const Budgets& b) const;
  // Sets contended_ from a pooled window (and marks it): entered by
  // Contended, left when they take less than contended_held of the budget.
  void UpdateContention(Pooled& p, const Budgets& b);
  // The cores left to our workers: the budget less other processes' use of
  // it, when the CPUs had idle time (contended: the budget).
  double AvailableCores(const Pooled& p, const Budgets& b) const;
  // CPU-bound: on_cpu, or contended without a run-queue figure (time off the
  // CPU not shown to be I/O). At most CpuBoundCap workers.
  bool CpuBound(const Pooled& p) const;
  // Workers whose CPU share fills the available cores (I/O-bound work: with
  // io_headroom); 0 when nothing was produced.
  double CpuFill(const Pooled& p, const Budgets& b) const;
  // The most a step up could add while the CPU time per sample holds: the
  // share of the available cores our workers leave idle (infinite unknown).
  double CpuRoom(const Pooled& p, const Budgets& b) const;
  // A knee above `fill` (the count whose CPU share fills the cores) is a
  // prior: starts the steps down that verify it; the trace's words for it.
  std::string TrimAbove(int knee, double fill);
  // Work that waits off the CPU for half its wall time or more: its fill
  // gets io_headroom.
  bool IoHeadroom(const Pooled& p) const;
  int Model(const Pooled& p, const Budgets& b) const;
  int Cap(const Budgets& b) const;
  // The most workers CPU-bound work may hold: the budget + over_budget.
  int CpuBoundCap(const Budgets& b) const;
  int PrefetchFor(int workers, const Budgets& b) const;
  double Changed(const Pooled& p, const Budgets& b) const;
  // Sets the model's count; `reason_fmt` takes the wall, queued and CPU ms
  // per sample (%f), the demand (%s, which says when there is none) and the
  // count (%d); at most `most` workers.
  std::optional<TunerDecision> SetByModel(const Pooled& p, const Budgets& b, const char* reason_fmt,
                                          double t_s, int most = kMaxWorkers);
  // Marks the current count as the knee (and the reference) and logs why.
  std::optional<TunerDecision> KneeHere(const Budgets& b, const Pooled& p, std::string reason,
                                        double t_s);
  std::optional<TunerDecision> Set(int workers, const Budgets& b, const Pooled& p,
                                   std::string reason, double t_s);
  // A reason: `fmt` (printf, doubles only) with "{item}" and "{items}"
  // standing for the engine's item ("sample", "batch") and its plural.
  std::string Say(const char* fmt, double a, double b = 0, double c = 0, double d = 0,
                  double e = 0) const;
  std::string Words(const char* fmt) const;

  const TunerParams params_;
  const std::string item_;   // the engine's item: "sample", "batch", "item"
  const std::string items_;  // its plural
  Phase phase_ = Phase::kStart;
  int workers_;
  int prefetch_;
  Pooled pool_;
  int skip_windows_ = 1;     // windows to ignore after a change (pipeline refill) ...
  double skip_until_s_ = 0;  // ... and until this time, for slow samples
  // After the first jump where reads are the wait, or a step up from a
  // count that grew the rate in proportion: the windows from this time on
  // (linear_refill_samples), pooled in early_, may show that it pays.
  double early_until_s_ = 0;
  Pooled early_;
  bool short_refill_ = false;  // the next change is such a jump or step
  // The skips' lengths after the last change (from its time), to start
  // again once every worker has started; windows while some still start
  // are not read until this time (max_start_s after the change).
  double skip_for_s_ = 0, early_for_s_ = 0, settle_for_s_ = 0;
  double starting_until_s_ = params_.max_start_s;
  // The settled reference at the current worker count.
  std::optional<Pooled> reference_;
  int reference_workers_ = -1;
  // Trial bookkeeping.
  int trial_from_ = 0;
  double trial_rate_before_ = 0;
  double trial_t_before_ = 0;  // when the rate before a store step was measured
  int calm_windows_ = 0;
  int windows_at_count_ = 0;  // pooled windows since the worker count changed
  int changed_windows_ = 0;
  bool careful_ = false;      // a multi-step descent stalled: step down by one
  double last_gain_ = 0;      // of the last step up
  std::optional<int> knee_;   // more than this did not pay
  std::optional<int> floor_;  // fewer than this stalled
  // A knee io_headroom put above the count that fills the cores (that
  // count; 0: none): steps down verify it, their losses adding up.
  int trim_fill_ = 0;
  double trim_kept_ = 1;
  bool trim_paid_ = false;  // the last step down of a trim gained over big_gain: halve next
  // The count a trim's step down reached whose loss lay within the noise of
  // a reading: the same step is tried once more before it marks a floor.
  int trim_doubted_ = 0;
  // Other processes compete for our CPUs.
  bool contended_ = false;
  // Storage that saturates: what the windows showed; whether it saturated
  // (its knee is then found by steps, never by a jump); whether its model's
  // knee was tried; whether the trial is a store step down, or the model's
  // knee; a count whose step up paid nothing (top) and one that lost
  // against the count above (floor); the rate where the count held.
  StoreModel store_;
  bool store_seen_ = false;
  bool store_prior_tried_ = false;
  bool store_trial_ = false;
  bool store_prior_trial_ = false;
  std::optional<int> store_top_;
  std::optional<int> store_floor_;
  // The model's knee kept where its loss lay within a reading's noise: no
  // step down from it or below (the readings there read as a loss).
  std::optional<int> store_unresolved_;
  // Counts of this search whose step up lost, with their latest rates: past
  // the store's peak, where the rate falls (PeakOfLines). One entry a count.
  std::vector<std::pair<int, double>> store_falls_;
  // The largest count a store step up reached paying in proportion to its
  // size (store_linear): no step down from it or below.
  std::optional<int> store_linear_;
  // The last plain step up (from, to) read as the workload changing under
  // it (it lost more than `change`): the same step losing again is a knee.
  std::pair<int, int> lost_step_{0, 0};
  // The count a plain step up left whose knee was doubted once (its gain
  // within the noise of the bar): the second such step marks it.
  int doubted_from_ = 0;
  // After a step up that lost over `change` (a cliff past an overloaded
  // store's peak): the size of steps up from below it, doubling while they
  // pay in proportion (0: no cliff). Halving down from the cliff would
  // probe counts past the peak, each losing much of the rate.
  int store_climb_ = 0;
  // The least count a store step down reached gaining in proportion to its
  // size: no step up from it or above.
  std::optional<int> store_falling_;
  bool store_shrink_ = false;  // the last store step down gained so, by more than big_gain
  double store_hold_rate_ = 0;
  double store_held_at_ = 0;    // when the count was last held at the store's knee
  double store_last_gain_ = 0;  // of the last store step up that paid (0: none since)
  // The rate the store steps down kept since the last step up that paid
  // (or the search's start), relative to the count they started from.
  double store_kept_ = 1;
  // A store step awaiting its verdict: the count it reached, its rate and
  // when it was measured, the rate of the count it left before it and when,
  // whether it went up, and whether it was the model's knee; judged once
  // the count it left is measured again.
  struct Recheck {
    int workers = 0;
    double rate = 0, rate_t = 0, before = 0, before_t = 0;
    bool up = false, prior = false;
    bool after = false;  // judged against the count's reading after the trial alone
  };
  std::optional<Recheck> store_recheck_;
  // The next trial is the first since the held count's rate moved: the
  // reading it starts from may be a burst of slow reads, not the store.
  bool store_moved_trial_ = false;
  // The store's rate drift, relative per second at one count, from the
  // last count measured before and after a trial.
  double store_drift_ = 0;
  bool store_drift_known_ = false;
  // The reading the first store step down since store_kept_ was 1 was
  // judged against (its rate and middle time): the kept steps' losses add
  // up against it too.
  struct Reading {
    double rate = 0, t = 0;
  };
  std::optional<Reading> store_best_;
  // Settled windows (after the first) at the current count: their time and
  // the items the workers produced, the rate store steps are judged against.
  double settled_s_ = 0;
  int64_t settled_produced_ = 0;
  double settled_from_s_ = 0, settled_to_s_ = 0;  // the time they cover
  double settle_after_s_ = 0;                     // none before this (a grown pool's lump)
  double store_trial_s_ = 0;                      // a store trial's window (0: trial_window_s)
  std::string store_why_;  // a workload change the next store step starts from
  // How much one second's rate spreads (relative), from the ticks' spread
  // within pooled windows; a moving average.
  double store_spread_ = 0;
  // At a generic step up's start: the wait per item, and whether reads
  // were the wait (a step that then queued reads shows a store).
  double trial_wait_before_ = 0;
  bool trial_reads_before_ = false;
  // And the count whose CPU share fills the cores, where io_headroom
  // sized the pool above it (0: it did not).
  double trial_fill_before_ = 0;
  int store_moved_windows_ = 0;
  double store_moved_s_ = 0;           // and their time
  int store_way_ = 0;                  // steps only up (1), only down (-1), or both (0) until held
  bool store_held_ = false;            // the count holds at the store's knee
  bool store_held_saturated_ = false;  // and the model showed reads queued then
  int store_held_outrun_ = 0;          // StoreModel::outrun() then
  bool store_peaked_ = false;          // a step showed the rate falling past the best count
  // The model's first jump up: the count it left and that count's rate,
  // until the first step up or down judged after it (or a new workload).
  struct Jump {
    int from = 0, to = 0;
    double rate = 0;    // at `from`
    double wait_s = 0;  // per sample off the CPU at `from`
  };
  std::optional<Jump> jump_;
  // The decision trace: when the last decision was returned, and whether it
  // changed a knob (the first verdict after a change is returned too).
  std::optional<double> last_record_s_;
  bool last_record_changed_ = false;
  double last_rate_ = 0, last_stall_ = 0;
  int last_cpu_cap_ = 0;
};

}  // namespace stoker
