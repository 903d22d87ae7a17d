#include "tune/tuner_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numbers>
#include <vector>

namespace stoker {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTick = 0.2;

// A workload model with a simulated clock: workers share `cores` for the CPU
// part of each sample and wait `io_s` for the rest; the consumer takes at
// most `demand` samples/s. Deterministic +-`noise` jitter on throughput.
struct SimWorkload {
  double cores = 2;
  double cpu_s = 0.005;
  double io_s = 0;
  double demand = kInf;
  int64_t batch = 64;
  double noise = 0.01;
  int hogs = 0;          // other processes' always-runnable threads on the same cores
  double elsewhere = 0;  // cores other processes keep busy on CPUs beyond ours
  int slots = 0;         // the store serves at most this many reads at once (0: any)
  double behind_s = 0;   // per sample, a wait for a core behind other processes (run queue)
  // The store's shape (ServiceSlots' StoreShape): past its slots, service
  // grows by `overload` per read waiting; it drifts between 1x and `drift`
  // x over `drift_period_s`; `tail` of the reads are 10-50x slower.
  double overload = 0;
  double drift = 1;
  double drift_period_s = 120;
  double tail = 0;
  // Reads and CPU times exponential, the cores taken in turn (the
  // machine-repairman queue): the cores approach full use only well past
  // the count whose CPU share fills them, as on a real machine.
  bool random = false;
  double now = 0;   // the simulated clock, set by each window
  double slow = 1;  // this window's service factor from its slow reads
  // After the pool grows more than twofold, its windows from 1 to 1.6 s
  // later read this much above the rate (work in flight when it grew,
  // landing at once).
  double lump = 0;
  // The first time a pool of 3 or more grows more than twofold, its first
  // 2.5 s read this much below the rate (the new threads' start-up on a
  // busy machine).
  double dip = 0;
  double dipped_at = -1;
  // From `burst_at` for `burst_s`, the rate times `burst` (slow reads
  // arriving together: a second in which most slots hold one).
  double burst_at = -1;
  double burst_s = 0;
  double burst = 1;
  // The first time the pool reaches `doubling_dip_at` workers by doubling,
  // its first 1.5 s read `doubling_dip` below the rate (a trial's window
  // catching the dip that follows a pool's growth on a loaded machine).
  int doubling_dip_at = 0;
  double doubling_dip = 0;
  double doubling_dipped_at = -1;
  // New workers start at most this many a second (worker processes forked
  // one after another; 0: at once); until then the pool is smaller than its
  // count, and windows say how many still start unless `hide_starting`.
  // While some start, the rest make `start_slow` of their rate (the starts
  // take the cores).
  double start_per_s = 0;
  double start_slow = 1;
  // Each worker past the cores adds this share to the CPU per sample (worker
  // processes: switches, memory), so the rate falls past the count whose
  // CPU share fills them.
  double crowd = 0;
  bool hide_starting = false;
  double started = 0;
  int last_workers = 0;
  double grew_at = -1;
  uint64_t tick = 0;
  int64_t carry = 0;    // samples of a batch not yet complete
  double fraction = 0;  // of a sample not yet complete

  // Little's law with a CPU ceiling: N workers each spend io_s + cpu_s per
  // sample until together they need more than `cores`.
  // With hogs, the scheduler shares the cores per runnable thread.
  // With slots, the store serves at most slots / io_s reads a second, less
  // when overloaded.
  double Capacity(int workers) const {
    if (rate_of) return rate_of(workers);
    return std::min({workers / (Service() + CpuAt(workers)), CpuRate(workers), StoreRate(workers)});
  }
  // A store measured on a real machine: its rate at each count, given
  // (workers wait for it; none queue for a CPU).
  std::function<double(int)> rate_of;
  double CpuAt(int workers) const { return cpu_s * (1 + crowd * std::max(0.0, workers - cores)); }
  double CpuRate(int workers) const {
    if (random) return RandomCpuRate(workers);
    return cores * workers / (workers + hogs) / CpuAt(workers);
  }
  // The finite-source queue: P(n computing) grows by (N - n + 1) x cpu/io
  // / min(n, cores) a step; the rate is the busy cores' over cpu_s.
  double RandomCpuRate(int workers) const {
    const double r = cpu_s / Service();
    const int k = static_cast<int>(cores);
    double p = 1, sum = 1, busy = 0;
    for (int n = 1; n <= workers; ++n) {
      p *= (workers - n + 1) * r / std::min(n, k);
      sum += p;
      busy += std::min(n, k) * p;
      if (sum > 1e200) p /= 1e200, sum /= 1e200, busy /= 1e200;
    }
    return busy / sum / cpu_s;
  }
  // Mean service time now: drifted, and stretched by the slow reads' share.
  double Service() const {
    const double drifted =
        io_s * (1 + (drift - 1) * (1 - std::cos(2 * std::numbers::pi * now / drift_period_s)) / 2);
    return drifted * (1 + tail * (kMeanTail - 1));
  }
  // The closed loop on a store with slots: n of the workers at the store
  // (the rest computing) serve min(n, slots) / (service x (1 + overload x
  // reads waiting)) a second, and the computing ones hand it reads as fast:
  // (workers - n) / cpu_s. Bisection on n.
  double StoreRate(int workers) const {
    if (slots <= 0) return kInf;
    const double s = Service();
    auto store = [&](double n) {
      return std::min(n, static_cast<double>(slots)) /
             (s * (1 + overload * std::max(0.0, n - slots)));
    };
    if (cpu_s <= 0) return store(workers);
    double lo = 0, hi = workers;
    for (int i = 0; i < 60; ++i) {
      const double n = (lo + hi) / 2;
      (store(n) < (workers - n) / cpu_s ? lo : hi) = n;
    }
    return store(lo);
  }
  double Rate(int workers) const { return std::min(Capacity(workers), demand); }
  static constexpr double kMeanTail = 24.85;  // log-uniform 10..50: (50 - 10) / ln 5

  Observation Window(int workers, int prefetch, double t) {
    ++tick;
    now = t;
    if (workers > 2 * last_workers && last_workers > 0) grew_at = t;
    if (workers > 2 * last_workers && last_workers >= 3 && dipped_at < 0) dipped_at = t;
    if (workers == doubling_dip_at && workers == 2 * last_workers && doubling_dipped_at < 0) {
      doubling_dipped_at = t;
    }
    last_workers = workers;
    const int target = workers;
    if (start_per_s > 0) {
      started = std::min<double>(workers, std::max(1.0, started + start_per_s * kTick));
      workers = static_cast<int>(started);
    }
    double jitter = 1 + noise * (static_cast<double>((tick * 2654435761u) % 2001) / 1000.0 - 1);
    if (grew_at >= 0 && t - grew_at >= 1.0 && t - grew_at < 1.6) jitter += lump;
    if (dipped_at >= 0 && t - dipped_at < 2.5) jitter -= dip;
    if (doubling_dipped_at >= 0 && t - doubling_dipped_at < 1.5) jitter -= doubling_dip;
    double cap = Capacity(workers) * jitter * (workers < target ? start_slow : 1);
    if (burst_at >= 0 && t > burst_at && t <= burst_at + burst_s) cap *= burst;
    if (tail > 0 && slots > 0) {
      // The window's slow reads: each holds a slot ~25x longer; they come
      // a few per second, so a window has 0, 1, 2 ... of them (Poisson,
      // drawn from the tick), and its rate falls by their slot time.
      const double expected = tail * StoreRate(workers) * kTick;
      const double u =
          static_cast<double>((tick * 0x9E3779B97F4A7C15ull) >> 11) / 9007199254740992.0;
      int n = 0;
      for (double pk = std::exp(-expected), cdf = pk; u > cdf && n < 50; cdf += pk) {
        pk *= expected / ++n;
      }
      // Each slow read holds a slot (kMeanTail - 1) plain services longer
      // than the mean counts on.
      const double extra = (kMeanTail - 1) * Service() / (1 + tail * (kMeanTail - 1));
      cap *= std::max(0.1, 1 - (n - expected) * extra / (slots * kTick));
    }
    double rate = std::min(cap, demand);
    // Below capacity the workers are idle part of the time, not slower.
    double wall = rate < cap ? Service() + CpuAt(workers) : workers / rate;
    Observation o;
    o.t_s = t;
    o.window_s = kTick;
    o.workers = target;
    o.starting = hide_starting ? 0 : target - workers;
    o.prefetch = prefetch;
    // Fractions of a sample carry over: a store serving one read a second
    // still delivers one a second, not none in every 0.2 s window.
    const double due = rate * kTick + fraction;
    o.samples = static_cast<int64_t>(due);
    fraction = due - static_cast<double>(o.samples);
    carry += o.samples;
    o.batches = carry / batch;
    carry %= batch;
    o.step_s = std::isinf(demand) ? 0 : std::min(kTick, rate / demand * kTick);
    o.wait_s = kTick - o.step_s;
    o.produced = o.samples;
    o.busy_s = static_cast<double>(o.produced) * wall;
    o.cpu_s = static_cast<double>(o.produced) * CpuAt(workers);
    // What the wall time holds beyond the work and the I/O is a wait for a
    // core (the kernel's run-queue delay), or, where the store is the
    // limit, for a slot at the store (off the CPU, like the read).
    const bool store_bound = rate_of || StoreRate(workers) <= CpuRate(workers);
    o.queue_s =
        store_bound ? 0 : static_cast<double>(o.produced) * std::max(0.0, wall - Service() - cpu_s);
    o.queue_s += static_cast<double>(o.produced) * behind_s;
    o.busy_s += static_cast<double>(o.produced) * behind_s;
    // Hogs take whatever the workers leave; without them that is idle.
    const double left = std::max(0.0, cores * kTick - o.cpu_s);
    o.others_s = (hogs > 0 ? left : 0) + elsewhere * kTick;
    o.idle_s = hogs > 0 ? 0 : left;
    return o;
  }
};

struct SimRun {
  std::vector<int> workers;  // per tick
  std::vector<TunerDecision> decisions;
  std::vector<double> rates;  // true rate per tick
  int Final() const { return workers.back(); }
};

SimRun Drive(TunerCore& core, SimWorkload& w, const Budgets& b, int ticks, double t0 = 0) {
  SimRun r;
  for (int i = 0; i < ticks; ++i) {
    double t = t0 + (i + 1) * kTick;
    auto d = core.Observe(w.Window(core.workers(), core.prefetch(), t), b);
    if (d) r.decisions.push_back(*d);
    // SIM_TRACE=1 prints each decision: how a simulation went, when one fails.
    if (d && std::getenv("SIM_TRACE")) {
      std::printf("  %6.1f %3d -> %-3d %6.0f/s %s\n", d->t_s, d->workers_before, d->workers_after,
                  w.Rate(d->workers_after), d->reason.c_str());
    }
    r.workers.push_back(core.workers());
    r.rates.push_back(w.Rate(core.workers()));
  }
  return r;
}

Budgets TwoCores() {
  Budgets b;
  b.cpu_cores = 2;
  b.max_workers = 128;
  b.memory_bytes = size_t{8} << 30;
  b.batch_bytes = 64 * 150528;
  b.worker_bytes = 16 << 20;
  return b;
}

double BestStatic(const SimWorkload& w, int max_workers) {
  double best = 0;
  for (int n = 1; n <= max_workers; ++n) best = std::max(best, w.Rate(n));
  return best;
}

// First tick index at which the rate reaches `frac` of the best static.
int TicksTo(const SimRun& r, double best, double frac) {
  for (size_t i = 0; i < r.rates.size(); ++i) {
    if (r.rates[i] >= frac * best) return static_cast<int>(i);
  }
  return 1 << 30;
}

int Changes(const std::vector<TunerDecision>& ds, double after_t) {
  int n = 0;
  for (auto& d : ds) n += d.t_s > after_t && d.workers_after != d.workers_before;
  return n;
}

TEST(TunerCoreTest, CpuBoundStopsAtTheKnee) {
  SimWorkload w;  // 5 ms CPU per sample, 2 cores, consumer as fast as possible
  TunerCore core(1, 4);
  SimRun r = Drive(core, w, TwoCores(), 150);
  double best = BestStatic(w, 128);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * best);
  EXPECT_LE(r.Final(), 3);  // no more than the knee needs
  EXPECT_LE(TicksTo(r, best, 0.95) * kTick, 5.0);
  EXPECT_EQ(Changes(r.decisions, 10.0), 0) << "oscillates after settling";
}

TEST(TunerCoreTest, IoBoundGoesFarAboveTheCoreCount) {
  SimWorkload w;
  w.cpu_s = 0.00005;
  w.io_s = 0.002;  // 2 ms per read: the knee is near 2 * 2.05 / 0.05 = 82 workers
  TunerCore core(2, 4);
  SimRun r = Drive(core, w, TwoCores(), 150);
  double best = BestStatic(w, 128);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * best);
  EXPECT_GT(r.Final(), 40);
  EXPECT_LE(TicksTo(r, best, 0.95) * kTick, 5.0);
  EXPECT_EQ(Changes(r.decisions, 15.0), 0);
}

// The fewest workers within 3 % of the best static rate.
int KneeOf(const SimWorkload& w, int max_workers) {
  const double best = BestStatic(w, max_workers);
  for (int n = 1; n <= max_workers; ++n) {
    if (w.Rate(n) >= 0.97 * best) return n;
  }
  return max_workers;
}

int MostAfter(const SimRun& r, double t_s) {
  int most = 0;
  for (size_t i = static_cast<size_t>(t_s / kTick); i < r.workers.size(); ++i) {
    most = std::max(most, r.workers[i]);
  }
  return most;
}

// stoker.DataLoader's items on 2 cores: whole batches of one sample that
// waits 5 ms (a slow store) for 0.6 ms of CPU, on worker processes each of
// which past the cores adds `crowd` to the CPU per item.
SimWorkload WaitingBatches(double crowd = 0) {
  SimWorkload w;
  w.cpu_s = 0.0006;
  w.io_s = 0.005;
  w.batch = 1;
  w.crowd = crowd;
  return w;
}

// Worker processes start one after another (about 18 a second on 2 busy
// cores): a pool grown from 2 to 32 reads low for seconds, and steps judged
// against such a reading all pay, up to far past the best count.
// SIM_HIDE_STARTING=1 hides the starts from the tuner: the test then fails.
TEST(TunerCoreTest, APoolStillStartingIsNotJudged) {
  SimWorkload w = WaitingBatches();
  w.start_per_s = 18;
  w.start_slow = 0.15;
  w.hide_starting = std::getenv("SIM_HIDE_STARTING") != nullptr;
  TunerCore core(2, 4);
  SimRun r = Drive(core, w, TwoCores(), 150);
  const double best = BestStatic(w, 128);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * best);
  // The model's count (io_headroom above the count whose CPU share fills
  // the cores) is the most it tries.
  EXPECT_LE(MostAfter(r, 0), 3 * KneeOf(w, 128)) << "climbed on readings of a pool half up";
  EXPECT_LE(r.Final(), KneeOf(w, 128) + 4);
}

// A store with 8 service slots and 20 ms of service per read, 0.7 ms CPU
// per sample on 2 cores: 400 samples/s whatever the pool past 9 workers.
SimWorkload EightSlotStore() {
  SimWorkload w;
  w.cpu_s = 0.0007;
  w.io_s = 0.02;
  w.slots = 8;
  return w;
}

// stoker.DataLoader's items are whole user batches: its reasons and
// figures say "batch", never "sample" (issue 23). Without a word, "sample".
TEST(TunerCoreTest, ReasonsNameTheEnginesItem) {
  auto reasons_with = [](const char* item, SimWorkload w, int initial) {
    TunerCore core = item != nullptr ? TunerCore(initial, 4, {}, item) : TunerCore(initial, 4);
    return Drive(core, w, TwoCores(), 200).decisions;
  };
  SimWorkload slow_consumer;  // demand-bound: the reasons give the demand
  slow_consumer.demand = 150;
  for (const SimWorkload& w : {SimWorkload{}, slow_consumer, EightSlotStore()}) {
    const auto batches = reasons_with("batch", w, 1);
    ASSERT_FALSE(batches.empty());
    bool per_batch = false;
    for (const TunerDecision& d : batches) {
      EXPECT_EQ(d.unit, "batch");
      EXPECT_EQ(d.reason.find("sample"), std::string::npos) << d.reason;
      per_batch = per_batch || d.reason.find("per batch") != std::string::npos ||
                  d.reason.find("batches/s") != std::string::npos;
    }
    EXPECT_TRUE(per_batch) << batches.front().reason;
    for (const TunerDecision& d : reasons_with(nullptr, w, 1)) {
      EXPECT_EQ(d.unit, "sample");
      EXPECT_EQ(d.reason.find("batch"), std::string::npos) << d.reason;
    }
  }
}

TEST(TunerCoreTest, SaturatingStoreSettlesAtTheKneeAndDoesNotClimb) {
  // More workers than the knee only queue at the store. The model's first
  // jump sizes the pool as if reads were served in parallel (128); the
  // waits it then shows give the store away, and the pool comes down.
  SimWorkload w = EightSlotStore();
  const Budgets b = TwoCores();
  TunerCore core(2, 4);
  SimRun r = Drive(core, w, b, 200);
  const int knee = KneeOf(w, 128);
  ASSERT_EQ(knee, 9);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " workers";
  EXPECT_GE(r.Final(), knee);
  EXPECT_LE(r.Final(), knee + 3);
  // Settled by 15 s: the first step that does not clearly pay or lose is
  // judged once the count it left is measured again (no drift known yet).
  EXPECT_LE(MostAfter(r, 15.0), knee + 3) << "climbs past the knee";
  EXPECT_EQ(Changes(r.decisions, 15.0), 0);
  bool told = false;
  for (const TunerDecision& d : r.decisions) {
    // ~8 (7.9 with the simulation's jitter).
    told = told || d.reason.find("the store serves ~8.0 reads") != std::string::npos ||
           d.reason.find("the store serves ~7.9 reads") != std::string::npos;
  }
  EXPECT_TRUE(told) << "no decision names the store's concurrency";
  // Other processes keep the CPUs busy (no idle time, a short run queue):
  // the first jump stops at the CPU-bound cap, the next step goes to the
  // model's count, and the pool still comes down to the knee.
  w.hogs = 2;
  w.behind_s = 0.0002;
  TunerCore busy(1, 4);
  SimRun h = Drive(busy, w, b, 200);
  const int busy_knee = KneeOf(w, 128);
  EXPECT_GE(w.Rate(h.Final()), 0.97 * BestStatic(w, 128)) << h.Final() << " workers";
  EXPECT_LE(h.Final(), busy_knee + 3);
  EXPECT_LE(MostAfter(h, 15.0), busy_knee + 3) << "climbs past the knee";
  w.hogs = 0;
  w.behind_s = 0;
  // The same reads served in parallel (no slots): latency stays flat as the
  // pool grows, and the pool still scales far above the core count.
  w.slots = 0;
  TunerCore parallel(2, 4);
  SimRun p = Drive(parallel, w, b, 200);
  EXPECT_GT(p.Final(), 40);
  EXPECT_GE(w.Rate(p.Final()), 0.97 * BestStatic(w, 128));
}

TEST(TunerCoreTest, StepsDownStopWhereTheStoresSlotsWouldIdle) {
  // Eight slots of 20 ms, 0.7 ms of CPU per sample: eight workers keep
  // fewer than eight reads in service (each computes a thirtieth of its
  // time), seven lose an eighth of the rate, whatever the store. Once the
  // model has read the slots, no trial goes below the nine that keep them
  // busy.
  SimWorkload w = EightSlotStore();
  for (int initial : {1, 2, 3}) {
    TunerCore core(initial, 4);
    const SimRun r = Drive(core, w, TwoCores(), 200);
    bool known = false;
    for (const TunerDecision& d : r.decisions) {
      if (known) EXPECT_GE(d.workers_after, 9) << "from " << initial << ": " << d.reason;
      known = known || d.reason.find("the store serves ~8.0 reads") != std::string::npos;
    }
    EXPECT_TRUE(known) << "from " << initial;
    EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << "from " << initial;
  }
}

TEST(TunerCoreTest, ASecondsBurstOfSlowReadsDoesNotRestartTheSteps) {
  // Eight slots of 20 ms, 1 % of reads 10-50x slower: held at its knee,
  // a second in which slow reads hold most slots (the rate at a quarter)
  // is the tails' noise, not a store that changed; the held count stays.
  // Three seconds of it do restart the steps.
  for (double seconds : {1.0, 3.0}) {
    SimWorkload w = EightSlotStore();
    w.tail = 0.01;
    w.burst_at = 60;
    w.burst_s = seconds;
    w.burst = 0.25;
    TunerCore core(1, 4);
    const SimRun r = Drive(core, w, TwoCores(), 400);
    int before = 0, after = 0;
    for (const TunerDecision& d : r.decisions) {
      before += d.t_s > 30 && d.t_s <= 60;
      after += d.t_s > 60;
    }
    ASSERT_EQ(before, 0) << "not held before the burst";
    if (seconds < 2) {
      EXPECT_EQ(after, 0) << "a second's burst restarted the steps";
    } else {
      EXPECT_GT(after, 0) << "three seconds at a quarter of the rate went unseen";
    }
    // Whatever the steps did, the count comes back to the knee.
    EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " workers";
  }
}

TEST(TunerCoreTest, StoreThatGainsSlotsIsExploredAgain) {
  SimWorkload w = EightSlotStore();
  const Budgets b = TwoCores();
  TunerCore core(2, 4);
  SimRun before = Drive(core, w, b, 100);
  ASSERT_LE(before.Final(), KneeOf(w, 128) + 3);
  // The store now serves 16 reads at once: the knee it set no longer holds.
  w.slots = 16;
  SimRun after = Drive(core, w, b, 200, 20.0);
  EXPECT_GE(w.Rate(after.Final()), 0.97 * BestStatic(w, 128)) << after.Final() << " workers";
  EXPECT_LE(after.Final(), KneeOf(w, 128) + 4);
}

TEST(TunerCoreTest, StoreWithFewSlotsFromTheStartHoldsNearItsKnee) {
  // Two slots and 5 ms reads (400/s), the pool starting above the knee: the
  // least wait seen is already queued, so the model's knee errs high; the
  // throughput-judged steps down still end near the true knee.
  SimWorkload w;
  w.cpu_s = 0.0005;
  w.io_s = 0.005;
  w.slots = 2;
  TunerCore core(4, 4);
  SimRun r = Drive(core, w, TwoCores(), 300);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " workers";
  EXPECT_LE(r.Final(), 2 * KneeOf(w, 128));
  EXPECT_EQ(Changes(r.decisions, 30.0), 0);
}

TEST(TunerCoreTest, StepDownTrialTakenWhenAStepUpPaidNothing) {
  // A model sized without headroom lands above the store's knee without
  // showing queued reads (14 workers: 31.5 ms wait for 20 ms of service,
  // under store_queued 2); the step up to 21 pays nothing and shows them.
  // Then a step down is tried, judged by throughput, and kept.
  SimWorkload w;
  w.cpu_s = 0.0035;
  w.io_s = 0.02;
  w.slots = 8;
  TunerParams k;
  k.io_headroom = 1;
  k.store_queued = 2;
  TunerCore core(2, 4, k);
  SimRun r = Drive(core, w, TwoCores(), 150);
  size_t paid_nothing = r.decisions.size(), down = r.decisions.size();
  for (size_t i = 0; i < r.decisions.size(); ++i) {
    const TunerDecision& d = r.decisions[i];
    if (paid_nothing == r.decisions.size() && d.reason.find("gained only") != std::string::npos) {
      paid_nothing = i;
    } else if (i > paid_nothing && d.workers_after < d.workers_before) {
      down = i;
      break;
    }
  }
  ASSERT_LT(paid_nothing, r.decisions.size()) << "no step up that paid nothing";
  ASSERT_LT(down, r.decisions.size()) << "no step down after it";
  EXPECT_NE(r.decisions[down].reason.find("the store serves"), std::string::npos)
      << r.decisions[down].reason;
  EXPECT_LT(r.Final(), r.decisions[paid_nothing].workers_after);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " workers";
}

// Real stores are not flat past their knee (issue 27). A FUSE server
// that thrashes: 8 slots, 8 ms of service, 3 ms CPU per sample, and past
// its slots each read waiting makes service 2 % slower: the rate rises to
// ~1000/s near 11 workers, then falls (~70 % of that at 32; the issue's
// FUSE store: 863/s at 14, 632/s at 32).
SimWorkload PeakedStore() {
  SimWorkload w;
  w.cores = 8;
  w.cpu_s = 0.003;
  w.io_s = 0.008;
  w.slots = 8;
  w.overload = 0.02;
  return w;
}

Budgets EightCores() {
  Budgets b = TwoCores();
  b.cpu_cores = 8;
  return b;
}

// The count with the best rate (the least of equals).
int PeakOf(const SimWorkload& w, int max_workers) {
  int best = 1;
  for (int n = 2; n <= max_workers; ++n) {
    if (w.Rate(n) > w.Rate(best) * (1 + 1e-9)) best = n;
  }
  return best;
}

// Worker processes on 2 cores: each past the cores adds CPU per batch, and
// the rate falls past the count whose CPU share fills them (measured, 5 ms
// waits: 16 workers the best, 48 half of it). No io_headroom above that
// count: a pool sized 3x past it, and steps tried from there, lose.
// SIM_THREAD_HEADROOM=1 gives them the threads' io_headroom: it then fails.
TEST(TunerCoreTest, ProcessesPastTheCoresGetLittleHeadroom) {
  SimWorkload w = WaitingBatches(0.04);
  TunerParams k;
  if (!std::getenv("SIM_THREAD_HEADROOM")) k.io_headroom = k.process_io_headroom;
  TunerCore core(2, 4, k);
  SimRun r = Drive(core, w, TwoCores(), 150);
  const double best = BestStatic(w, 128);
  const int peak = PeakOf(w, 128);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * best);
  // The model's count (1.2x the count whose CPU share fills the cores, as
  // read at the first window) and one step up from it at most.
  EXPECT_LE(MostAfter(r, 0), 5 * peak / 2) << "tried far past the peak (" << peak << ")";
  double sum = 0;
  for (double rate : r.rates) sum += rate;
  EXPECT_GE(sum / static_cast<double>(r.rates.size()), 0.9 * best) << "over the whole run";
}

// Worker processes past the cores, each adding 15 % to the CPU per sample:
// steps up lose more than `change`. Two such steps from one count, whatever
// their sizes, mark its knee: it is the steps that lose, not a workload
// that changed under them.
TEST(TunerCoreTest, StepsUpOfAnySizeThatLoseTwiceFromOneCountMarkItsKnee) {
  SimWorkload w = WaitingBatches(0.15);
  TunerCore core(2, 4);
  SimRun r = Drive(core, w, TwoCores(), 200);
  const int peak = PeakOf(w, 128);
  int lost = 0;
  for (const TunerDecision& d : r.decisions) {
    lost += d.reason.find("the workload changed under the trial") != std::string::npos;
  }
  EXPECT_LE(lost, 1);
  EXPECT_GE(w.Rate(r.Final()), 0.85 * BestStatic(w, 128)) << r.Final() << " workers, peak " << peak;
  EXPECT_EQ(Changes(r.decisions, 15.0), 0) << "oscillates after settling";
}

// Steady state from `from_s` on, by 10 s spans: at most one trial (a step
// and the step back: two changes) in each, and the count held at most
// `most` workers for all but that trial's ticks.
void ExpectSteadyFrom(const SimRun& r, double from_s, int most) {
  const double end_s = r.workers.size() * kTick;
  for (double t = from_s; t + 10 <= end_s + 1e-9; t += 10) {
    int changes = 0;
    for (const TunerDecision& d : r.decisions) {
      changes += d.t_s > t && d.t_s <= t + 10 && d.workers_after != d.workers_before;
    }
    EXPECT_LE(changes, 2) << "oscillates in " << t << "-" << t + 10 << " s";
    int past = 0;
    for (size_t i = static_cast<size_t>(t / kTick); i < static_cast<size_t>((t + 10) / kTick);
         ++i) {
      past += r.workers[i] > most;
    }
    EXPECT_LE(past * kTick, 3.0) << "held past " << most << " workers in " << t << "-" << t + 10
                                 << " s";
  }
}

TEST(TunerCoreTest, StoreThatSlowsWhenOverloadedIsHeldNearItsPeak) {
  SimWorkload w = PeakedStore();
  const Budgets b = EightCores();
  const int peak = PeakOf(w, 128);
  ASSERT_GE(peak, 7);
  ASSERT_LE(peak, 13);
  ASSERT_LT(w.Rate(32), 0.8 * w.Rate(peak));
  for (int initial : {2, 32}) {
    TunerCore core(initial, 4);
    SimRun r = Drive(core, w, b, 300);
    const double best = BestStatic(w, 128);
    EXPECT_GE(w.Rate(r.Final()), 0.97 * best) << r.Final() << " workers from " << initial;
    EXPECT_LE(r.Final(), peak + 2) << "from " << initial;
    EXPECT_LE(TicksTo(r, best, 0.95) * kTick, 10.0) << "from " << initial;
    ExpectSteadyFrom(r, 20, peak + 2);
    // The trace says which evidence each step used: the model's, then its own.
    bool model = false, steps = false;
    for (const TunerDecision& d : r.decisions) {
      model = model || d.reason.find("the model's knee") != std::string::npos;
      steps = steps || d.reason.find("verifying by a step") != std::string::npos;
    }
    EXPECT_TRUE(steps) << "from " << initial;
    if (initial == 2) {
      EXPECT_TRUE(model);
    }
  }
  // Steeper (10 % per read waiting) and gentler (1 %) overloads.
  for (double overload : {0.1, 0.01}) {
    w.overload = overload;
    TunerCore core(2, 4);
    SimRun r = Drive(core, w, b, 300);
    const int top = PeakOf(w, 128);
    EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " at " << overload;
    EXPECT_LE(r.Final(), top + 2) << overload;
    ExpectSteadyFrom(r, 20, top + 2);
  }
}

TEST(TunerCoreTest, StoreWhoseServiceDriftsIsFollowed) {
  // Service time doubles over a minute and comes back (a cache going cold,
  // other tenants): the count follows without a jump past the peak.
  SimWorkload w = PeakedStore();
  w.drift = 2;
  w.drift_period_s = 120;
  const Budgets b = EightCores();
  TunerCore core(2, 4);
  SimRun r = Drive(core, w, b, 900);
  double got = 0, best = 0;
  int most_peak = 0;
  for (size_t i = static_cast<size_t>(20 / kTick); i < r.workers.size(); ++i) {
    SimWorkload at = w;
    at.now = (i + 1) * kTick;
    got += at.Rate(r.workers[i]);
    best += BestStatic(at, 64);
    most_peak = std::max(most_peak, PeakOf(at, 64));
  }
  EXPECT_GE(got / best, 0.95);
  ExpectSteadyFrom(r, 20, most_peak + 2);
}

TEST(TunerCoreTest, StoreWithHeavyTailedReadsIsHeldNearItsPeak) {
  // One read in 200 is 10-50x slower: each holds a slot ~25 services long,
  // and the windows' rates scatter by +-15 % around the mean.
  for (double overload : {0.0, 0.03}) {
    SimWorkload w = PeakedStore();
    w.overload = overload;
    w.tail = 0.005;
    const Budgets b = EightCores();
    TunerCore core(2, 4);
    SimRun r = Drive(core, w, b, 450);
    const int peak = PeakOf(w, 128);
    EXPECT_GE(w.Rate(r.Final()), 0.95 * BestStatic(w, 128)) << r.Final() << " at " << overload;
    EXPECT_LE(r.Final(), std::max(peak, KneeOf(w, 128)) + 2) << overload;
    ExpectSteadyFrom(r, 30, std::max(peak, KneeOf(w, 128)) + 2);
  }
}

// The stores of bench/tuner_scenarios' io-overload and io-drift: 8 slots,
// 20 ms of service, +3 % per read waiting past the slots, 3 ms CPU per
// sample on 2 cores: ~390 samples/s at 10 workers, falling past it.
SimWorkload OverloadedEightSlotStore() {
  SimWorkload w = EightSlotStore();
  w.cpu_s = 0.003;
  w.overload = 0.03;
  return w;
}

// The best static count's rate at each tick from `from_s`: that at the
// time (the store drifting), and the mean of the tuned rate over it.
struct DriftScore {
  double ratio = 0;    // tuned / best at each tick, over the stretch
  double below_s = 0;  // the longest run of ticks under 90 % of that tick's best
  int most_peak = 0;   // the largest best count over the stretch
};

DriftScore ScoreThroughTheDrift(const SimWorkload& w, const SimRun& r, double from_s) {
  DriftScore s;
  double got = 0, best = 0, run_s = 0;
  for (size_t i = static_cast<size_t>(from_s / kTick); i < r.workers.size(); ++i) {
    SimWorkload at = w;
    at.now = (i + 1) * kTick;
    const double top = BestStatic(at, 64);
    got += at.Rate(r.workers[i]);
    best += top;
    run_s = at.Rate(r.workers[i]) < 0.9 * top ? run_s + kTick : 0;
    s.below_s = std::max(s.below_s, run_s);
    s.most_peak = std::max(s.most_peak, PeakOf(at, 64));
  }
  s.ratio = got / best;
  return s;
}

// The overloaded 8-slot store, its service rising 1x -> 2x over half of
// `period_s` from the start and back over the other half.
SimWorkload DriftingStore(double period_s) {
  SimWorkload w = OverloadedEightSlotStore();
  w.drift = 2;
  w.drift_period_s = period_s;
  return w;
}

// The drifting store's rate summed over ticks [from, to), at count(tick).
template <typename Count>
double RateOver(const SimWorkload& w, int from, int to, Count count) {
  double sum = 0;
  for (int i = from; i < to; ++i) {
    SimWorkload at = w;
    at.now = (i + 1) * kTick;
    sum += at.Rate(count(i));
  }
  return sum;
}

TEST(TunerCoreTest, StoreWhoseServiceDoublesOverAMinuteIsHeldNearTheBest) {
  // The service time rises 1x -> 2x over a minute and comes back over the
  // next: every trial's windows straddle a rate that falls (then rises) by
  // up to 2.6 % a second, more than a step's gain. The count follows the
  // best, never stuck far below it (a trial's few seconds aside) nor past
  // it, and a steady state has at most one trial per 10 s.
  for (int initial : {2, 3, 24}) {
    SimWorkload w = DriftingStore(120);
    TunerCore core(initial, 4);
    SimRun r = Drive(core, w, TwoCores(), 600);
    const DriftScore s = ScoreThroughTheDrift(w, r, 20);
    EXPECT_GE(s.ratio, 0.97) << "from " << initial;
    EXPECT_LE(s.below_s, 3.0) << "stuck under 90 % of the best, from " << initial;
    ExpectSteadyFrom(r, 20, s.most_peak + 2);
  }
}

TEST(TunerCoreTest, StoreWhoseServiceDoublesInTwentySecondsIsFollowed) {
  // bench's io-drift: the service rises 1x -> 2x over 20 s from the start,
  // the run judged from 12 to 22 s against the best static count through
  // the same drift. Trials judged against the count they left, measured
  // just before them, read the drift as a loss and let the count fall
  // far below the best. From 24 workers the first jump
  // goes to 128, where the overloaded store serves a fifth of its rate.
  for (int initial : {1, 3, 24}) {
    SimWorkload w = DriftingStore(40);
    TunerCore core(initial, 4);
    SimRun r = Drive(core, w, TwoCores(), 110);
    double best = 0;
    for (int n = 1; n <= 64; ++n)
      best = std::max(best, RateOver(w, 60, 110, [n](int) { return n; }));
    const double got = RateOver(w, 60, 110, [&r](int i) { return r.workers[i]; });
    EXPECT_GE(got / best, initial == 24 ? 0.95 : 0.97) << "from " << initial;
    EXPECT_LE(r.Final(), PeakOf(w, 64) + 2) << "from " << initial;
    EXPECT_GE(r.Final(), PeakOf(w, 64) - 2) << "from " << initial;
  }
}

TEST(TunerCoreTest, DriftingStoresOfOtherPeriodsAreFollowed) {
  // io-drift's store doubling its service in 15 to 40 s, judged over the
  // steepest stretch (0.3 to 0.55 of the period) against the best static
  // count at each tick: a verdict read against a count measured long
  // before reads the drift as the step's loss or gain.
  double sum = 0;
  int runs = 0;
  for (double period : {30.0, 40.0, 50.0, 60.0, 80.0})
    for (int initial : {1, 3, 24}) {
      SimWorkload w = DriftingStore(period);
      TunerCore core(initial, 4);
      SimRun r = Drive(core, w, TwoCores(), 250);
      const int from = static_cast<int>(period * 0.3 / kTick);
      const int to = static_cast<int>(period * 0.55 / kTick);
      double best = 0;
      for (int n = 1; n <= 64; ++n)
        best = std::max(best, RateOver(w, from, to, [n](int) { return n; }));
      const double got = RateOver(w, from, to, [&r](int i) { return r.workers[i]; }) / best;
      EXPECT_GE(got, 0.88) << "period " << period << " from " << initial;
      sum += got;
      ++runs;
    }
  // A little below what it reads (docs/tuner.md, the eighth pass).
  EXPECT_GE(sum / runs, 0.972);
}

TEST(TunerCoreTest, OverloadedStoreIsHeldNearItsPeakNeverPastIt) {
  // bench's io-overload, from a few workers, from the model's first jump's
  // size and from the cap: held within two of the peak, at 97 % of its rate.
  SimWorkload w = OverloadedEightSlotStore();
  const int peak = PeakOf(w, 128);
  ASSERT_GE(peak, 8);
  ASSERT_LE(peak, 12);
  ASSERT_LT(w.Rate(40), 0.8 * w.Rate(peak));
  const double best = BestStatic(w, 128);
  for (int initial : {1, 3, 24}) {
    TunerCore core(initial, 4);
    SimRun r = Drive(core, w, TwoCores(), 400);
    EXPECT_GE(w.Rate(r.Final()), 0.97 * best) << r.Final() << " workers from " << initial;
    EXPECT_LE(r.Final(), peak + 2) << "from " << initial;
    EXPECT_LE(TicksTo(r, best, 0.95) * kTick, 10.0) << "from " << initial;
    ExpectSteadyFrom(r, 20, peak + 2);
  }
}

TEST(TunerCoreTest, CpuTimeWanderingOnASaturatedStoreIsNoWorkloadChange) {
  // On a loaded machine the CPU time per sample of a store-bound pool
  // wanders by half and more; with reads still most of the wall time it changes nothing
  // the store's steps judge by, and must not restart them.
  SimWorkload w = OverloadedEightSlotStore();
  TunerCore core(3, 4);
  const Budgets b = TwoCores();
  SimRun before = Drive(core, w, b, 150);
  const int held = before.Final();
  w.cpu_s = 0.0012;
  SimRun after = Drive(core, w, b, 100, 30.0);
  for (const TunerDecision& d : after.decisions) {
    EXPECT_EQ(d.reason.find("workload changed"), std::string::npos) << d.reason;
  }
  EXPECT_EQ(after.Final(), held);
}

TEST(TunerCoreTest, FlatStoreWhoseLargePoolReadsHighIsNotHeldThere) {
  // The 8-slot store, its first settled windows at a grown pool reading
  // 10 % above the store's rate: steps down judged against that reading
  // all lose, and a pool that trusted it held 128 workers. The count above
  // is measured again before a loss counts.
  for (double lump : {0.1, 0.2}) {
    SimWorkload w = EightSlotStore();
    w.lump = lump;
    TunerCore core(2, 4);
    SimRun r = Drive(core, w, TwoCores(), 200);
    const int knee = KneeOf(w, 128);
    EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " workers";
    EXPECT_LE(r.Final(), knee + 3) << lump;
    EXPECT_LE(MostAfter(r, 20.0), knee + 3) << "held far past the knee, lump " << lump;
  }
}

TEST(TunerCoreTest, StepUpThatLosesOnAnOverloadedStoreStartsTheStoresSteps) {
  // Other processes take 1.7 of the 2 cores at first, so the first jump is
  // small (a few workers, below the peak); then they stop and the next
  // step up, sized by the model as if reads were parallel, lands far past
  // the peak of a store that slows when overloaded and loses. That is the
  // store, not a workload change: its steps go up from the small count
  // and hold near the peak.
  SimWorkload w;
  w.cpu_s = 0.001;
  w.io_s = 0.008;
  w.slots = 8;
  w.overload = 0.1;
  w.elsewhere = 1.85;
  const Budgets b = TwoCores();
  TunerCore core(1, 4);
  SimRun first = Drive(core, w, b, 4);
  ASSERT_LT(first.Final(), PeakOf(w, 128)) << "the first jump is not below the peak";
  w.elsewhere = 0;
  SimRun r = Drive(core, w, b, 200, 0.8);
  const int peak = PeakOf(w, 128);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " workers";
  EXPECT_LE(r.Final(), peak + 2);
  ExpectSteadyFrom(r, 20, peak + 2);
  bool store = false;
  for (const TunerDecision& d : r.decisions) {
    // "the store saturates" (the step read as the store at once), or "the
    // store serves ~N reads at once" (its model, once the step's window
    // showed reads queued).
    store = store || d.reason.find("the store s") != std::string::npos;
  }
  EXPECT_TRUE(store) << "the lost step up is not read as the store";
}

// Store shapes outside the suite, as a grid: slots, service time, overload
// past the slots, heavy tails, CPU per sample and cores. Each shape from a
// few workers: judged over the run from 10 s on (the tuned rate against the
// best static count's), time to 95 % of it, the count at the end against
// the fewest within 3 % of the best (+2), and steady from 20 s; under three
// draws of the noise. SIM_GRID=1 prints the shapes that miss one of those,
// SIM_GRID=2 every shape.
struct GridShape {
  int slots;
  double io_s, overload, tail, cpu_s, cores;
  int seed = 0;  // which draws of the ticks' noise and slow reads
};

// The grid's draws: SIM_SEED=N alone, else 0, 1 and 2 (a verdict within
// the noise goes either way, so one draw would judge a rule by its luck).
std::vector<int> GridSeeds() {
  if (const char* seed = std::getenv("SIM_SEED")) return {std::atoi(seed)};
  return {0, 1, 2};
}

struct GridScore {
  double ratio = 0, to95_s = 0;
  int final = 0, knee = 0, peak = 0, changes_late = 0;
};

SimWorkload WorkloadOf(const GridShape& g) {
  SimWorkload w;
  w.slots = g.slots;
  w.io_s = g.io_s;
  w.overload = g.overload;
  w.tail = g.tail;
  w.cpu_s = g.cpu_s;
  w.cores = g.cores;
  w.tick = static_cast<uint64_t>(g.seed) * 7919;
  return w;
}

// A grid shape driven from `initial` workers for `ticks` (90 s), the
// budget its cores.
SimRun DriveShape(const GridShape& g, int initial, int ticks = 450) {
  SimWorkload w = WorkloadOf(g);
  Budgets b = TwoCores();
  b.cpu_cores = g.cores;
  TunerCore core(initial, 4);
  return Drive(core, w, b, ticks);
}

GridScore ScoreShape(const GridShape& g, int initial, int ticks) {
  const SimWorkload w = WorkloadOf(g);
  SimRun r = DriveShape(g, initial, ticks);
  GridScore s;
  const double best = BestStatic(w, 128);
  double got = 0;
  int n = 0;
  for (size_t i = static_cast<size_t>(10 / kTick); i < r.rates.size(); ++i, ++n) got += r.rates[i];
  s.ratio = got / n / best;
  s.to95_s = TicksTo(r, best, 0.95) * kTick;
  s.final = r.Final();
  s.knee = KneeOf(w, 128);
  s.peak = PeakOf(w, 128);
  s.changes_late = Changes(r.decisions, ticks * kTick - 30);
  return s;
}

// 4 ms of CPU on 2 cores past 4 slots of 5 ms with heavy-tailed reads:
// the cores are the limit (500 samples/s) from 6 workers on, and slow reads
// scatter a window's rate by 10 %: steps up would "pay" on that noise. With
// the cores full no step up can add `gain`: a knee, verified by steps down.
TEST(TunerCoreTest, NoStepUpPastCoresOurWorkersFill) {
  const GridShape g{4, 0.005, 0, 0.01, 0.004, 2, /*seed=*/2};
  const SimWorkload w = WorkloadOf(g);
  const SimRun r = DriveShape(g, 3);
  const bool said = std::any_of(r.decisions.begin(), r.decisions.end(), [](const auto& d) {
    return d.reason.find("the CPUs are full") != std::string::npos;
  });
  EXPECT_TRUE(said);
  EXPECT_LE(MostAfter(r, 0), 24) << "climbed on the noise of full cores";
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128));
}

// 4 ms of CPU on 2 cores past 16 slots of 5 ms with heavy-tailed reads:
// the cores are the limit from 5 workers on, and steps down from the knee
// read at 16 verify it. One 3 s reading scatters by 3-6 %: a step down
// whose loss lies within that noise is tried again before it is a floor
// (the descent held 11 workers on one unlucky reading of 9).
TEST(TunerCoreTest, AStepDownWithinTheNoiseIsTriedAgain) {
  const GridShape g{16, 0.005, 0, 0.01, 0.004, 2, /*seed=*/2};
  const SimWorkload w = WorkloadOf(g);
  const SimRun r = DriveShape(g, 3);
  const bool again = std::any_of(r.decisions.begin(), r.decisions.end(), [](const auto& d) {
    return d.reason.find("lost") != std::string::npos &&
           d.reason.find("it is tried again") != std::string::npos;
  });
  EXPECT_TRUE(again);
  EXPECT_LE(r.Final(), PeakOf(w, 128) + 2);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128));
}

TEST(TunerCoreTest, StoreShapesOutsideTheSuite) {
  // SIM_SHAPE="slots io_ms overload tail cpu_ms cores initial" (with
  // SIM_TRACE=1): that one shape alone.
  if (const char* one = std::getenv("SIM_SHAPE")) {
    GridShape g{};
    int initial = 1;
    double io_ms = 0, cpu_ms = 0;
    ASSERT_EQ(std::sscanf(one, "%d %lf %lf %lf %lf %lf %d", &g.slots, &io_ms, &g.overload, &g.tail,
                          &cpu_ms, &g.cores, &initial),
              7);
    g.io_s = io_ms / 1e3;
    g.cpu_s = cpu_ms / 1e3;
    g.seed = GridSeeds()[0];
    const GridScore s = ScoreShape(g, initial, 450);
    std::printf("%.3f, 95%% %5.1f s, end %3d (knee %d peak %d), late changes %d\n", s.ratio,
                s.to95_s, s.final, s.knee, s.peak, s.changes_late);
    return;
  }
  int shapes = 0, bad = 0, slow = 0, past = 0;
  double sum = 0;
  const std::vector<int> seeds = GridSeeds();
  for (int seed : seeds)
    for (int slots : {2, 4, 16, 32})
      for (double io_s : {0.005, 0.02, 0.08})
        for (double overload : {0.0, 0.01, 0.05, 0.15})
          for (double tail : {0.0, 0.01})
            for (double cpu_s : {0.001, 0.004})
              for (double cores : {2.0, 8.0})
                for (int initial : {1, 3}) {
                  const GridShape g{slots, io_s, overload, tail, cpu_s, cores, seed};
                  const GridScore s = ScoreShape(g, initial, 450);
                  ++shapes;
                  const bool ok = s.ratio >= 0.95 && s.to95_s <= 10 &&
                                  s.final <= std::max(s.knee, s.peak) + 2 && s.changes_late <= 6;
                  bad += !ok;
                  slow += s.to95_s > 10;
                  past += s.final > std::max(s.knee, s.peak) + 2;
                  sum += s.ratio;
                  // Never stuck far past an overloaded store's peak, nor
                  // oscillating.
                  EXPECT_GE(s.ratio, overload > 0 ? 0.65 : 0.93)
                      << "slots " << slots << " io " << io_s << " overload " << overload << " tail "
                      << tail << " cpu " << cpu_s << " cores " << cores << " from " << initial
                      << " seed " << seed;
                  EXPECT_LE(s.changes_late, 10)
                      << "oscillates: slots " << slots << " io " << io_s << " overload " << overload
                      << " tail " << tail << " cpu " << cpu_s << " cores " << cores << " seed "
                      << seed;
                  if (std::getenv("SIM_GRID") && (!ok || std::getenv("SIM_GRID")[0] == '2')) {
                    std::printf(
                        "seed %d slots %2d io %3.0f ms over %.2f tail %.2f cpu %.0f ms cores %.0f "
                        "from %d: %.3f, 95%% %5.1f s, end %3d (knee %d peak %d), late changes "
                        "%d%s\n",
                        seed, slots, io_s * 1e3, overload, tail, cpu_s * 1e3, cores, initial,
                        s.ratio, s.to95_s, s.final, s.knee, s.peak, s.changes_late,
                        ok ? "" : "  <--");
                  }
                }
  std::printf(
      "%d of %d shapes missed 0.95 of the best, 95 %% within 10 s, the best + 2 or "
      "steady; mean %.4f of the best\n",
      bad, shapes, sum / shapes);
  // A little below what the grid reads now (docs/tuner.md, "Store shapes
  // outside the suite"): the simulation is deterministic, so a change that
  // loses ground on these shapes fails here.
  EXPECT_GE(sum / shapes, 0.991);
  if (seeds.size() == 3) {  // the counts are over the three draws
    EXPECT_LE(slow, 195);
    EXPECT_LE(past, 85);
  }
}

TEST(TunerCoreTest, AFirstJumpThatLostMostOfTheRateIsReadOnItsFirstWindow) {
  // 4 slots of 20 ms losing 5 % per waiting read, 4 ms of CPU on 8 cores:
  // the first jump, 3 -> 48, makes half the rate of 3, each read waiting
  // ten times longer. Its first window says so (start-up only reads low,
  // the lump of work in flight high): the trial below starts then, not
  // after the settled windows that a gain would need.
  for (int seed : {0, 1, 2}) {
    const GridShape g{4, 0.02, 0.05, 0, 0.004, 8, seed};
    SimRun r = DriveShape(g, 3);
    ASSERT_FALSE(r.decisions.empty());
    const double jumped = r.decisions.front().t_s;
    const auto lost = std::find_if(r.decisions.begin(), r.decisions.end(), [](const auto& d) {
      return d.reason.find("the store is overloaded") != std::string::npos;
    });
    ASSERT_NE(lost, r.decisions.end()) << "seed " << seed;
    EXPECT_LT(lost->t_s - jumped, 2 * TunerParams{}.max_refill_s) << "seed " << seed;
    const GridScore s = ScoreShape(g, 3, 450);
    EXPECT_GE(s.ratio, 0.97) << "seed " << seed;
    EXPECT_LE(s.final, s.peak + 2) << "seed " << seed;
  }
}

TEST(TunerCoreTest, ALongChainOfStepsIsNotJudgedAgainstOneOldReading) {
  // 32 slots of 20 ms losing 1 % per waiting read, heavy tails, from 3
  // workers (third draw): the steps around the peak were judged against a
  // reading of the count they left, 12 s old and more, that read high, and
  // each lost against it; the pool held 32 of a peak at 34. A reading that
  // old is measured again, even where the store's drift is known (zero).
  const GridShape g{32, 0.02, 0.01, 0.01, 0.001, 8, /*seed=*/2};
  const GridScore s = ScoreShape(g, 3, 450);
  EXPECT_GE(s.ratio, 0.97);
  EXPECT_GE(s.final, s.peak - 1);
}

TEST(TunerCoreTest, AModelKneeWithinTheNoiseOfAHeavyTailedStoreIsKept) {
  // Two flat slots of 20 ms, 1 % of reads 10-50x slower: any count from 3
  // keeps the rate, and a second's rate scatters by a tenth. The model's
  // knee, tried from the first jump's count, may read a few percent under
  // it, which the readings cannot tell from nothing: held near the knee,
  // not halfway back and lower by steps that each lose within the noise.
  for (int seed : {0, 1, 2}) {
    const GridShape g{2, 0.02, 0, 0.01, 0.001, 2, seed};
    const GridScore s = ScoreShape(g, 3, 450);
    EXPECT_LE(s.final, s.knee + 2) << "seed " << seed;
    EXPECT_GE(s.ratio, 0.97) << "seed " << seed;
  }
}

TEST(TunerCoreTest, WhereTheRiseAndTheFallMeetIsTriedAtOnce) {
  // 32 slots of 80 ms losing 5 % per waiting read, 4 ms of CPU: the rate
  // grows by 11.9/s a worker up to the peak (33) and falls past it. Once
  // two counts read past it, the count where the lines meet is tried at
  // once, not a quarter step down and steps of one back.
  for (int seed : {0, 1, 2}) {
    const GridShape g{32, 0.08, 0.05, 0, 0.004, 8, seed};
    const GridScore s = ScoreShape(g, 3, 450);
    EXPECT_LE(s.to95_s, 10.0) << "seed " << seed;
    EXPECT_GE(s.ratio, 0.97) << "seed " << seed;
    EXPECT_LE(s.final, s.peak + 2) << "seed " << seed;
  }
  SimRun r = DriveShape(GridShape{32, 0.08, 0.05, 0, 0.004, 8}, 3);
  bool met = false;
  for (const TunerDecision& d : r.decisions)
    met = met || d.reason.find("the two meet") != std::string::npos;
  EXPECT_TRUE(met);
}

TEST(TunerCoreTest, TheFirstClimbFromBelowACliffClearsTheNoise) {
  // 32 slots of 5 ms losing 15 % per waiting read, 1 % of reads 10-50x
  // slower, from 1 worker: 32 -> 64 loses most of the rate. A first climb
  // of one worker from 32 (+3.1 % in proportion, the bar itself) reads
  // either way under the tails' noise and may hold 32 of a peak at 37; two
  // workers clear the bar twice over.
  for (int seed : {0, 1, 2}) {
    const GridShape g{32, 0.005, 0.15, 0.01, 0.001, 8, seed};
    const GridScore s = ScoreShape(g, 1, 450);
    EXPECT_GE(s.ratio, 0.95) << "seed " << seed;
    EXPECT_GE(s.final, s.peak - 2) << "seed " << seed;
  }
}

TEST(TunerCoreTest, AFirstJumpThatLosesMostOfTheRateTriesHalfwayBack) {
  // Two slots that slow by 15 % per waiting read, 4 ms of CPU on 8 cores:
  // the first jump (1 -> 54) serves 46/s of the 110 one worker made. The
  // model, reading slots there, errs; halfway back on a log scale (7) is
  // near the peak (4), reached within 10 s.
  const GridShape g{2, 0.005, 0.15, 0, 0.004, 8};
  const GridScore s = ScoreShape(g, 1, 450);
  EXPECT_GE(s.ratio, 0.97);
  EXPECT_LE(s.to95_s, 10.0);
  EXPECT_LE(s.final, s.peak + 2);
}

TEST(TunerCoreTest, ReadsUnderTwiceTheCpuStillGiveTheStoresServiceTime) {
  // Two slots of 5 ms that slow by 5 % per waiting read, 4 ms of CPU on 2
  // cores: one worker's reads are under twice its CPU time, so the store
  // model had no service time and read the first jump's queued wait (50 ms)
  // as one; it took 14 -> 21 -> 17 -> 15 -> 10 -> ... -> 4 (95 % after 25 s).
  // The pool of one, its reads unqueued, gives the service time: the
  // model's knee (3) is tried at once.
  for (int initial : {1, 3}) {
    const GridShape g{2, 0.005, 0.05, 0, 0.004, 2};
    const GridScore s = ScoreShape(g, initial, 450);
    EXPECT_GE(s.ratio, 0.97) << "from " << initial;
    EXPECT_LE(s.to95_s, 12.0) << "from " << initial;
    EXPECT_LE(s.final, s.peak + 1) << "from " << initial;
  }
}

TEST(TunerCoreTest, StepsDownThatEachKeepTheRateStopWhereTogetherTheyLoseAGain) {
  // 32 slots of 5 ms that slow by 1 % per waiting read, 1 ms of CPU on 8
  // cores (peak at 39 workers): from 41, steps down to 38, 37 and 36 each
  // lost under 3 % of the count they left and were kept, 5.6 % in all
  // (0.949 of the best). The losses add up against the search's best count.
  const GridShape g{32, 0.005, 0.01, 0, 0.001, 8};
  const GridScore s = ScoreShape(g, 3, 450);
  EXPECT_GE(s.ratio, 0.965);
  EXPECT_GE(s.final, s.peak - 2);
  EXPECT_LE(s.final, s.peak + 2);
}

TEST(TunerCoreTest, AStepUpThatWinsBackWhatAStepDownLostIsKept) {
  // The 8-slot store of 20 ms as tuner_scenarios' io-slots measured it:
  // 8 workers read 2.5 % under the 400/s of 9 and more. From the model's
  // knee (11), a step down to 8 lost under `gain` and was kept; the step
  // back up to 10 gained 2.6 %, under `gain`, and the pool held at 8, 2.5 %
  // under the best. Once kept steps lost over half a gain, a step up that
  // gains half a gain pays. From 12 workers, whose reads already queue:
  // the model is not sure of the slots, and steps may go below them.
  SimWorkload w;
  w.io_s = 0.020;
  w.cpu_s = 0.0023;
  w.noise = 0;
  w.rate_of = [](int n) {
    // A read of 20.4 ms, 2.3 ms of CPU: 44/s a worker until reads queue.
    constexpr double kRates[] = {0, 44, 88, 132, 176, 220, 264, 330, 390};
    return n < 9 ? kRates[n] : 400.0;
  };
  TunerCore core(12, 4);
  SimRun r = Drive(core, w, TwoCores(), 300);
  bool came_down_to_8 = false, said = false;
  for (const TunerDecision& d : r.decisions) {
    came_down_to_8 |= d.workers_after == 8;
    said |=
        d.reason.find("half a gain, the steps down having lost 2.5 % in all") != std::string::npos;
  }
  EXPECT_TRUE(came_down_to_8) << "the search did not take the path this test is about";
  EXPECT_TRUE(said) << "the trace does not say why the step up was kept";
  EXPECT_GE(r.Final(), 9);
  EXPECT_DOUBLE_EQ(w.Rate(r.Final()), 400);
}

TEST(TunerCoreTest, AKneeTheIoHeadroomPutAboveTheCoresIsVerifiedByStepsDown) {
  // 5 ms reads and 1 ms of CPU on 2 cores, no store limit: the cores fill
  // at 12 workers, the model (with io_headroom) says 36, and a step up to
  // 54 pays nothing. Perfectly shared cores keep the rate down to 12:
  // steps down find it, none below it.
  SimWorkload w;
  w.io_s = 0.005;
  w.cpu_s = 0.001;
  TunerCore core(3, 4);
  SimRun r = Drive(core, w, TwoCores(), 300);
  bool said = false;
  for (const TunerDecision& d : r.decisions) {
    said |= d.reason.find("steps down verify") != std::string::npos;
  }
  EXPECT_TRUE(said) << "the knee was not verified down";
  EXPECT_GE(r.Final(), 12);
  EXPECT_LE(r.Final(), 14);
  EXPECT_GE(w.Rate(r.Final()), 0.99 * BestStatic(w, 128));
  ExpectSteadyFrom(r, 40, 14);
}

TEST(TunerCoreTest, StepsDownFromTheIoHeadroomStopWhereTheCoresStartToIdle) {
  // The same work with random reads and CPU times (and 4 ms of CPU, and 8
  // cores): on 2 cores with 1 ms, they are 86 % used at 12 workers, 99 %
  // at 18. Steps down from the model's count stop before they lose `gain`
  // in all.
  for (double cores : {2.0, 8.0})
    for (double cpu_ms : {1.0, 4.0}) {
      SimWorkload w;
      w.io_s = 0.005;
      w.cpu_s = cpu_ms / 1e3;
      w.random = true;
      w.cores = cores;
      Budgets b = TwoCores();
      b.cpu_cores = cores;
      TunerCore core(3, 4);
      SimRun r = Drive(core, w, b, 300);
      const double best = BestStatic(w, 128);
      EXPECT_GE(w.Rate(r.Final()), 0.97 * best)
          << r.Final() << " workers, " << cores << " cores, " << cpu_ms << " ms";
      EXPECT_LE(r.Final(), KneeOf(w, 128) + 3) << cores << " cores, " << cpu_ms << " ms";
    }
}

TEST(TunerCoreTest, AStoreTrialThatLosesHalfTheRateEndsOnItsFirstSecond) {
  // 16 slots of 80 ms losing 15 % per waiting read, 1 % of reads 10-50x
  // slower: a second's rate spreads so much that store trials are judged
  // on 3 s. A step past the peak that loses half the rate (from 3 workers:
  // 16 -> 32) tells so within a second, and the pool returns then, not 3 s
  // later.
  const GridShape g{16, 0.08, 0.15, 0.01, 0.001, 2};
  const SimWorkload w = WorkloadOf(g);
  const SimRun r = DriveShape(g, 3);
  int clear = 0;
  for (size_t i = 1; i < r.decisions.size(); ++i) {
    const TunerDecision& trial = r.decisions[i - 1];
    const TunerDecision& verdict = r.decisions[i];
    if (trial.reason.find("verifying by a step") == std::string::npos) continue;
    if (w.Rate(trial.workers_after) > 0.6 * w.Rate(trial.workers_before)) continue;
    ++clear;
    EXPECT_LE(verdict.t_s - trial.t_s, 2.5) << trial.reason << "\n" << verdict.reason;
  }
  EXPECT_GE(clear, 1) << "no trial lost half the rate: not the path this test is about";
}

TEST(TunerCoreTest, AOneWorkerStepThatPaysInProportionIsKept) {
  // 32 slots of 5 ms losing 15 % per waiting read, 1 ms of CPU on 8 cores:
  // the rate still grows by a worker's share up to the peak (38), then
  // falls off a cliff. From 36, a step of one (2.8 % of the pool) gained
  // 2.5 %, under `gain`, and the pool held at 36 (0.947 of the best). A
  // step too small for `gain` pays what proportion to its size asks.
  const GridShape g{32, 0.005, 0.15, 0, 0.001, 8};
  const SimWorkload w = WorkloadOf(g);
  const SimRun r = DriveShape(g, 3);
  const bool said = std::any_of(r.decisions.begin(), r.decisions.end(), [](const auto& d) {
    return d.reason.find("in proportion to a step of") != std::string::npos;
  });
  EXPECT_TRUE(said) << "no step kept in proportion: not the path this test is about";
  EXPECT_GE(r.Final(), PeakOf(w, 128) - 1);
  EXPECT_LE(r.Final(), PeakOf(w, 128));
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128));
}

TEST(TunerCoreTest, StepsThatPayHandsomelyGoOnWithoutASettledWindowMore) {
  // 20 ms reads and 0.2 ms of CPU per sample, a store with no limit in
  // sight: the best count is the 128 cap. The first jump stops at 16 (a
  // store may slow when overloaded), and steps double from there. A step
  // that paid handsomely, the consumer still waiting, takes the next step
  // on the window that judged it, not after one more window; the first
  // jump's count whose first window grew the rate in proportion, and a
  // step whose first half second already paid clearly, are judged on that;
  // a step up from a count that grew in proportion may pay clearly on the
  // windows after a shorter refill (linear_refill_samples).
  // The bound fails with either of the first two rules alone.
  const GridShape g{0, 0.02, 0, 0, 0.0002, 2};
  const SimWorkload w = WorkloadOf(g);
  const SimRun r = DriveShape(g, 1, 150);
  const double best = BestStatic(w, 128);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * best);
  EXPECT_LE(TicksTo(r, best, 0.95) * kTick, 3.4);
}

TEST(TunerCoreTest, AKneeReadWithinTheNoiseAfterARateInProportionIsTriedAgain) {
  // A store with no limit in sight (20 ms reads, 0.47 ms of CPU on 2
  // cores: 128 workers make 36 % more than 64), the first trial of 128
  // reading 30 % low through its window (the dip after a pool grows). The
  // rate grew in proportion up to 64 and the consumer waits: a reading
  // within the noise of the bar is tried again before a knee holds.
  SimWorkload w = WorkloadOf(GridShape{0, 0.02, 0, 0, 0.00047, 2});
  w.noise = 0.2;
  w.doubling_dip_at = 128;
  w.doubling_dip = 0.3;
  TunerCore core(1, 4);
  const SimRun r = Drive(core, w, TwoCores(), 150);
  const bool again = std::any_of(r.decisions.begin(), r.decisions.end(), [](const auto& d) {
    return d.reason.find("it is tried again") != std::string::npos;
  });
  EXPECT_TRUE(again) << "the dip did not make the step read within the noise: not this path";
  // 128 fills the cores: steps down verify the workers above the count
  // whose CPU share fills them (88), each judged by the rate.
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128)) << r.Final() << " workers";
}

TEST(TunerCoreTest, StepsUpFromBelowACliffStartSmall) {
  // 32 slots of 80 ms losing 15 % per waiting read: 32 -> 64 loses most of
  // the rate. Halving down from 64 would probe counts past the peak, each
  // losing much of it; steps up from 32 start at a few workers instead,
  // doubling while they pay in proportion.
  const GridShape g{32, 0.08, 0.15, 0, 0.001, 2};
  const SimWorkload w = WorkloadOf(g);
  const SimRun r = DriveShape(g, 1);
  bool cliff = false;
  for (const TunerDecision& d : r.decisions) {
    cliff = cliff || d.reason.find("the store saturates") != std::string::npos;
    if (!cliff || d.reason.find("verifying by a step up") == std::string::npos) continue;
    EXPECT_GE(w.Rate(d.workers_after), 0.75 * w.Rate(d.workers_before)) << d.reason;
  }
  EXPECT_TRUE(cliff) << "no step up lost the rate: not the path this test is about";
  const GridScore s = ScoreShape(g, 1, 450);
  EXPECT_GE(s.ratio, 0.98);
  EXPECT_EQ(s.final, s.peak);
}

TEST(TunerCoreTest, BetweenACountThatGrewInProportionAndATopStepsHalve) {
  // 32 slots of 80 ms losing 15 % per waiting read, heavy tails, 1 ms of
  // CPU on 2 cores, from 3: 22 -> 35 paid nothing, 22 -> 28 paid +30 %, in
  // proportion. A quarter step from 28 reaches the top; the peak (32) lies
  // between, and halving finds it.
  const GridShape g{32, 0.08, 0.15, 0.01, 0.001, 2};
  const GridScore s = ScoreShape(g, 3, 450);
  EXPECT_GE(s.final, s.peak - 1);
  EXPECT_LE(s.final, s.peak);
}

TEST(TunerCoreTest, AStepDownThatStillReadsOnTheRiseIsBelowThePeak) {
  // 16 slots of 20 ms losing 15 % per waiting read, heavy tails, 4 ms of
  // CPU on 8 cores: the rate rises by one unqueued worker's rate up to a
  // sharp peak at 18 and falls past it. A step down from 20 to 15 gains in
  // proportion, yet 15 still reads on the rise: the peak lies between, and
  // steps up from 15 find it (held at 15, no step up ever tried, it lost a
  // sixth of the rate).
  for (int seed : {0, 1, 2}) {
    const GridShape g{16, 0.02, 0.15, 0.01, 0.004, 8, seed};
    const GridScore s = ScoreShape(g, 3, 450);
    EXPECT_GE(s.final, s.peak - 1) << "seed " << seed;
    EXPECT_LE(s.final, s.peak + 1) << "seed " << seed;
    EXPECT_GE(s.ratio, 0.92) << "seed " << seed;
  }
}

TEST(TunerCoreTest, KeptStepsDownAddUpAgainstTheBestCountsReading) {
  // 16 slots of 80 ms losing 5 % per waiting read, heavy tails, 1 ms of
  // CPU on 2 cores (the store the limit, the CPUs far from full): each step
  // down judged against a reading of the count above it, one low reading
  // there (a slow read's window) lets the next lose as much again unseen.
  // The kept losses add up against the reading the first step down was
  // judged against too. (The draw of the noise whose verdicts take this
  // path.)
  const GridShape g{16, 0.08, 0.05, 0.01, 0.001, 2, /*seed=*/1};
  const SimRun r = DriveShape(g, 1);
  const bool said = std::any_of(r.decisions.begin(), r.decisions.end(), [](const auto& d) {
    return d.reason.find("in all since the best count") != std::string::npos;
  });
  EXPECT_TRUE(said) << "no chain of steps down stopped: not the path this test is about";
  const GridScore s = ScoreShape(g, 1, 450);
  EXPECT_GE(s.ratio, 0.94);
  EXPECT_GE(s.final, s.knee);
}

TEST(TunerCoreTest, DeepFlatStoreIsHeldNearItsKnee) {
  // 32 slots of 80 ms, 4 ms of CPU: the model's knee with its headroom
  // (41) keeps the rate, and so do fewer; steps down halve toward the
  // count that lost until within three of it.
  for (double cores : {2.0, 8.0}) {
    const GridShape g{32, 0.08, 0, 0, 0.004, cores};
    const GridScore s = ScoreShape(g, 1, 450);
    EXPECT_GE(s.ratio, 0.97) << cores << " cores";
    EXPECT_LE(s.final, s.knee + 3) << cores << " cores";
  }
}

TEST(TunerCoreTest, ConsumerBoundUsesTheFewestWorkersThatKeepUp) {
  SimWorkload w;
  w.demand = 320;  // a 200 ms step per batch of 64
  TunerCore core(2, 4);
  SimRun r = Drive(core, w, TwoCores(), 200);
  // 5 ms per sample at 320/s needs 1.6 workers: 2 is the fewest that keep up.
  EXPECT_GE(r.Final(), 2);
  EXPECT_LE(r.Final(), 3);
  EXPECT_DOUBLE_EQ(w.Rate(r.Final()), 320);
}

TEST(TunerCoreTest, StartsTooHighAndComesDown) {
  SimWorkload w;
  w.demand = 100;
  w.cpu_s = 0.001;  // 0.1 workers' worth
  TunerCore core(16, 8);
  SimRun r = Drive(core, w, TwoCores(), 200);
  EXPECT_EQ(r.Final(), 1);
}

TEST(TunerCoreTest, ReactsToPhaseChanges) {
  SimWorkload w;
  w.demand = 320;
  TunerCore core(1, 4);
  Budgets b = TwoCores();
  SimRun before = Drive(core, w, b, 100);
  // The step time drops: the consumer now takes all it can get.
  w.demand = kInf;
  SimRun after = Drive(core, w, b, 100, 20.0);
  double best = BestStatic(w, 128);
  EXPECT_GE(w.Rate(after.Final()), 0.97 * best);
  EXPECT_LE(TicksTo(after, best, 0.95) * kTick, 5.0);
  // Read latency rises: many more workers pay.
  w.io_s = 0.004;
  w.cpu_s = 0.0002;
  SimRun slow = Drive(core, w, b, 150, 40.0);
  best = BestStatic(w, 128);
  EXPECT_GE(w.Rate(slow.Final()), 0.95 * best);
  EXPECT_LE(TicksTo(slow, best, 0.95) * kTick, 5.0);
}

// The best static count among those a CPU-bound pool may hold on `b`.
double BestWithinBudget(const SimWorkload& w, const Budgets& b) {
  return BestStatic(w, static_cast<int>(std::floor(b.cpu_cores + 1)));
}

int MostWorkers(const SimRun& r) { return *std::max_element(r.workers.begin(), r.workers.end()); }

TEST(TunerCoreTest, CpuHogsDoNotRaiseTheCountPastTheBudget) {
  SimWorkload w;
  w.cpu_s = 0.0006;  // a JPEG pipeline on 2 cores, consumer as fast as possible
  TunerCore core(1, 4);
  Budgets b = TwoCores();
  SimRun before = Drive(core, w, b, 100);
  EXPECT_LE(before.Final(), 3);
  // Two busy processes start: each runnable thread gets its share of the
  // cores, so many more workers would win CPU time from them. The tuner is
  // a good neighbour: at most the budget + 1, and the best that allows.
  w.hogs = 2;
  SimRun after = Drive(core, w, b, 150, 20.0);
  EXPECT_LE(MostWorkers(after), 3);
  EXPECT_GE(w.Rate(after.Final()), 0.97 * BestWithinBudget(w, b)) << after.Final() << " workers";
  EXPECT_EQ(Changes(after.decisions, 35.0), 0);
  // They stop: CPU-bound again, at the knee of an idle machine.
  w.hogs = 0;
  SimRun calm = Drive(core, w, b, 150, 50.0);
  EXPECT_LE(MostWorkers(calm), 3);
  EXPECT_GE(w.Rate(calm.Final()), 0.97 * BestStatic(w, 128));
  EXPECT_LE(calm.Final(), 3);
  EXPECT_LE(TicksTo(calm, BestStatic(w, 128), 0.95) * kTick, 5.0);
}

TEST(TunerCoreTest, AJumpThatReadsLowOnItsFirstWindowMarksNoKnee) {
  // I/O-bound work beside two hogs: the start is held to the CPU budget,
  // then the model's jump is far more than twice the pool, and its first
  // windows read two thirds low (start-up on a busy machine). One window
  // after such a jump is no knee: a step of twice the pool confirms it.
  SimWorkload w;
  w.cpu_s = 0.003;
  w.io_s = 0.01;
  w.hogs = 2;
  w.dip = 0.66;
  TunerCore core(1, 4);
  Budgets b = TwoCores();
  SimRun r = Drive(core, w, b, 150);
  EXPECT_GE(w.Rate(r.Final()), 1.5 * w.Rate(3)) << r.Final() << " workers";
  EXPECT_LE(Changes(r.decisions, 20.0), 1);
}

TEST(TunerCoreTest, ContendedCpuBoundWorkStaysWithinTheBudget) {
  // Hogs run from the start, the pool starts small: the model must not size
  // it to win CPU time from them (it once jumped to 24 workers per hog).
  SimWorkload w;
  w.cpu_s = 0.0006;
  w.hogs = 2;
  TunerCore core(1, 4);
  Budgets b = TwoCores();
  SimRun r = Drive(core, w, b, 300);
  for (const TunerDecision& d : r.decisions) EXPECT_LE(d.workers_after, 3) << d.reason;
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestWithinBudget(w, b)) << r.Final() << " workers";
  EXPECT_EQ(Changes(r.decisions, 20.0), 0);
  // Someone sets 128 workers: CPU-bound, so back within the budget.
  core.Observe(w.Window(128, core.prefetch(), 60.2), b);
  ASSERT_EQ(core.workers(), 128);
  SimRun back = Drive(core, w, b, 50, 60.2);
  EXPECT_LE(back.Final(), 3);
  // The samples get dearer: the re-model stays within the budget too.
  w.cpu_s = 0.0009;
  SimRun dear = Drive(core, w, b, 200, 70.4);
  EXPECT_LE(MostWorkers(dear), 3);
}

TEST(TunerCoreTest, AWindowInWhichWorkersFinishedNothingStartsNoStepUp) {
  // 20 ms sleeps took the pool to 64; then each sample costs 20 ms of CPU:
  // 64 workers on 2 cores finish a batch in seconds, and windows pass in
  // which the consumer takes buffered batches and the workers finish none.
  // A step up was judged against that window's rate, 0: "+581778816518.4
  // %", kept, and the pool went to 96 and 128.
  SimWorkload io;
  io.io_s = 0.02;
  TunerCore core(1, 4);
  const Budgets b = TwoCores();
  Drive(core, io, b, 150);
  const int before = core.workers();
  ASSERT_GE(before, 4);
  double t = 150 * kTick;
  for (int i = 0; i < 30; ++i) {
    Observation o;
    t += kTick;
    o.t_s = t;
    o.window_s = kTick;
    o.workers = core.workers();
    o.prefetch = core.prefetch();
    o.batches = 2;
    o.samples = 128;
    o.wait_s = 0.5 * kTick;  // the consumer waits half the window
    o.step_s = 0.5 * kTick;
    o.busy_s = core.workers() * kTick;  // every worker busy, none done
    o.others_s = 0;
    o.idle_s = 0;
    auto d = core.Observe(o, b);
    EXPECT_LE(core.workers(), before) << (d ? d->reason : "");
  }
}

// The model's first jump for `w`, from `initial` workers (workers_after 0
// when there was none).
TunerDecision FirstJump(const SimWorkload& w, const Budgets& b, int initial) {
  SimWorkload sim = w;
  TunerCore core(initial, 4);
  SimRun r = Drive(core, sim, b, 5);
  return r.decisions.empty() ? TunerDecision{} : r.decisions.front();
}

TEST(TunerCoreTest, OtherProcessesLoadLowersTheAim) {
  // Other processes keep one of our two cores busy, and leave the other
  // idle when our workers do not use it: they take a core of the budget,
  // so the model aims for one worker, not two.
  SimWorkload w;
  w.cpu_s = 0.005;
  w.demand = 400;  // would need 2.4 workers on an idle machine
  w.elsewhere = 1;
  const Budgets b = TwoCores();
  const TunerDecision shared = FirstJump(w, b, 1);
  EXPECT_EQ(shared.workers_after, 1) << shared.reason;
  // Without them, Little's law (400/s x 5 ms x 1.2 = 2.4) capped where two
  // CPU-bound workers fill the two cores.
  w.elsewhere = 0;
  const TunerDecision alone = FirstJump(w, b, 1);
  EXPECT_EQ(alone.workers_after, 2) << alone.reason;
}

TEST(TunerCoreTest, NoMeasurableDemandSizesByTheBudgetNotTheCap) {
  // A consumer that takes batches as fast as they come has no demand to
  // size by: "as fast as the budget allows". CPU-bound: the budget's worth.
  SimWorkload w;
  w.cpu_s = 0.0006;
  const Budgets b = TwoCores();
  const TunerDecision cpu = FirstJump(w, b, 1);
  EXPECT_GE(cpu.workers_after, 2) << cpu.reason;
  EXPECT_LE(cpu.workers_after, 3) << cpu.reason;
  EXPECT_NE(cpu.reason.find("no measurable demand"), std::string::npos) << cpu.reason;
  // I/O-bound: by the measured wait off the CPU (2 ms reads, 0.5 ms CPU:
  // the CPUs saturate at 2 x 2.5 / 0.5 = 10 workers, x io_headroom 3 = 30).
  w.cpu_s = 0.0005;
  w.io_s = 0.002;
  EXPECT_EQ(FirstJump(w, b, 2).workers_after, 30);
  TunerCore io(2, 4);
  SimRun r = Drive(io, w, b, 100);
  EXPECT_GE(MostWorkers(r), 10);
  EXPECT_LE(MostWorkers(r), 60);  // 30, and one trial of twice that at most
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128));
  // No CPU time measured at all: no saturation point, so double and judge
  // by trials, not the cap.
  w.cpu_s = 0;
  const TunerDecision blind = FirstJump(w, b, 2);
  EXPECT_EQ(blind.workers_after, 4) << blind.reason;
}

TEST(TunerCoreTest, UnchangedDecisionsAreNotLoggedOverAndOver) {
  // A consumer whose demand flips between bounded and unbounded every two
  // seconds, at one worker either way: each flip is a workload change the
  // model answers with the same count, for 120 s.
  auto flipping = [](TunerCore& core) {
    SimWorkload w;
    w.cpu_s = 0.001;
    w.batch = 8;
    Budgets b = TwoCores();
    b.max_workers = 1;
    std::vector<TunerDecision> ds;
    for (int i = 0; i < 600; ++i) {
      w.demand = (i / 10) % 2 == 0 ? 50 : kInf;
      auto d = core.Observe(w.Window(core.workers(), core.prefetch(), (i + 1) * kTick), b);
      if (d) ds.push_back(*d);
    }
    return ds;
  };
  // With repeat_s 0 every re-decision is recorded: there are many.
  TunerParams every;
  every.repeat_s = 0;
  TunerCore chatty(1, 4, every);
  EXPECT_GT(flipping(chatty).size(), 10u);
  // By default, one record, then at most one per repeat_s.
  TunerCore core(1, 4);
  const std::vector<TunerDecision> ds = flipping(core);
  ASSERT_FALSE(ds.empty());
  EXPECT_LE(ds.size(), 5u);
  auto unchanged = [](const TunerDecision& d) {
    return d.workers_after == d.workers_before && d.prefetch_after == d.prefetch_before;
  };
  for (size_t k = 1; k < ds.size(); ++k) {
    if (unchanged(ds[k]) && unchanged(ds[k - 1])) {
      EXPECT_GE(ds[k].t_s - ds[k - 1].t_s, TunerParams{}.repeat_s) << ds[k].reason;
    }
  }
}

TEST(TunerCoreTest, StartingFarTooHighComesDownByTheQueueingFigure) {
  // A pool far too large for the cores, CPU-bound: the wall time per sample
  // is mostly queueing behind each other. With the kernel's run-queue
  // figure the model leaves that out and comes down to the knee ...
  SimWorkload w;
  w.cpu_s = 0.0006;
  Budgets b = TwoCores();
  TunerCore seen(64, 16);
  SimRun q = Drive(seen, w, b, 100);
  EXPECT_LE(q.Final(), 3);
  // ... without it (kernels without schedstats: queue_s 0) the queueing
  // reads as slow, I/O-bound samples and the pool stays large; throughput
  // is kept either way.
  TunerCore blind(64, 16);
  SimRun r;
  for (int i = 0; i < 100; ++i) {
    Observation o = w.Window(blind.workers(), blind.prefetch(), (i + 1) * kTick);
    o.queue_s = 0;
    blind.Observe(o, b);
    r.workers.push_back(blind.workers());
  }
  EXPECT_GT(r.Final(), 3);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128));
}

TEST(TunerCoreTest, OtherRanksOnTheirOwnCpusAreNoContention) {
  // Eight ranks on 16 CPUs, each with a budget of 2: the other seven keep 14
  // CPUs busy. That is their share, not ours: no bidding war for them.
  SimWorkload w;
  w.cpu_s = 0.0006;
  w.elsewhere = 14;
  Budgets b = TwoCores();
  b.others_room = 14;
  TunerCore core(1, 2);
  SimRun r = Drive(core, w, b, 150);
  EXPECT_LE(r.Final(), 3);
  EXPECT_GE(w.Rate(r.Final()), 0.97 * BestStatic(w, 128));
  for (auto& d : r.decisions) EXPECT_LE(d.workers_after, 4) << d.reason;
}

// The node's loaders re-split its budget. Two ranks on 2 cores: this one's
// share grows from 1 to 1.75 cores when the other rank's consumer turns
// compute-bound (its workers then use 0.2 cores), and shrinks back when it
// is data-bound again. A knee found under the small share must not hold the
// pool there (the other rank's drop in CPU use is too small to read as a
// workload change); over the shrunk share, CPU-bound work comes back within
// it at once.
TEST(TunerCoreTest, AChangedShareOfTheNodeReSizesThePool) {
  SimWorkload w;
  auto share = [&](double cores, double others) {
    w.cores = cores;       // the CPU time this rank's workers get
    w.elsewhere = others;  // the other rank's
    Budgets b = TwoCores();
    b.cpu_cores = cores;
    b.others_room = 2 - cores;
    return b;
  };
  TunerCore core(1, 2);
  SimRun even = Drive(core, w, share(1, 1), 100);
  EXPECT_EQ(even.Final(), 1);
  SimRun grown = Drive(core, w, share(1.75, 0.2), 100, 100 * kTick);
  EXPECT_EQ(grown.Final(), 2);
  SimRun shrunk = Drive(core, w, share(1, 1), 20, 200 * kTick);
  EXPECT_LE(shrunk.Final(), 2);
  for (const SimRun* r : {&even, &grown, &shrunk}) {
    for (const TunerDecision& d : r->decisions) EXPECT_LE(d.workers_after, 3) << d.reason;
  }
}

TEST(TunerCoreTest, NeverExceedsTheMemoryBudget) {
  SimWorkload w;
  w.cpu_s = 0.00005;
  w.io_s = 0.005;  // throughput alone would want ~128 workers
  Budgets b = TwoCores();
  b.worker_bytes = 32 << 20;
  b.batch_bytes = 10 << 20;
  b.memory_bytes = 640 << 20;  // room for ~19 workers after two batches
  TunerCore core(2, 4);
  SimRun r = Drive(core, w, b, 150);
  for (auto& d : r.decisions) {
    size_t used = static_cast<size_t>(d.workers_after) * b.worker_bytes +
                  static_cast<size_t>(d.prefetch_after) * b.batch_bytes;
    EXPECT_LE(used, b.memory_bytes) << d.reason;
  }
  EXPECT_LE(r.Final(), 19);
  EXPECT_GE(r.Final(), 15);
}

TEST(TunerCoreTest, NoiseDoesNotCauseOscillation) {
  SimWorkload w;
  w.noise = 0.03;
  w.cpu_s = 0.0005;
  w.io_s = 0.001;
  TunerCore core(1, 4);
  SimRun r = Drive(core, w, TwoCores(), 400);
  EXPECT_LE(Changes(r.decisions, 10.0), 2);
}

TEST(TunerCoreTest, PrefetchGrowsWithManyWorkersAndStaysWithinTheMemoryBudget) {
  EXPECT_EQ(DefaultPrefetch(1, 64), 2);  // few workers share a batch: little slack needed
  EXPECT_EQ(DefaultPrefetch(3, 64), 2);
  EXPECT_EQ(DefaultPrefetch(4, 64), 3);
  EXPECT_EQ(DefaultPrefetch(56, 64), 16);  // many workers need a wide window to find work
  EXPECT_EQ(DefaultPrefetch(500, 64), 16);
  // Where a batch is one item (a kind's whole user batch), two for each
  // worker, as torch's prefetch_factor of 2: fewer leave workers idle.
  EXPECT_EQ(DefaultPrefetch(1, 1), 2);
  EXPECT_EQ(DefaultPrefetch(8, 1), 16);
  EXPECT_EQ(DefaultPrefetch(48, 1), 96);
  EXPECT_EQ(DefaultPrefetch(48, 4), 24);  // 96 items in 24 batches of 4
  EXPECT_EQ(DefaultPrefetch(0, 0), 2);
  // The model jumps to many workers, but the budget leaves room for few batches.
  SimWorkload w;
  w.cpu_s = 0.00005;
  w.io_s = 0.005;
  Budgets b = TwoCores();
  b.worker_bytes = 1 << 20;
  b.batch_bytes = 10 << 20;
  b.memory_bytes = 100 << 20;
  TunerCore core(2, 2);
  SimRun r = Drive(core, w, b, 100);
  ASSERT_FALSE(r.decisions.empty());
  for (auto& d : r.decisions) {
    EXPECT_LE(d.prefetch_after, DefaultPrefetch(d.workers_after, b.batch_items));
    EXPECT_LE(static_cast<size_t>(d.workers_after) * b.worker_bytes +
                  static_cast<size_t>(d.prefetch_after) * b.batch_bytes,
              b.memory_bytes)
        << d.reason;
  }
}

TEST(TunerCoreTest, EveryDecisionHasAReason) {
  SimWorkload w;
  TunerCore core(1, 4);
  SimRun r = Drive(core, w, TwoCores(), 50);
  ASSERT_FALSE(r.decisions.empty());
  for (auto& d : r.decisions) EXPECT_FALSE(d.reason.empty());
}

}  // namespace
}  // namespace stoker
