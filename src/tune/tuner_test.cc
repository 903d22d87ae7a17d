// The tuner attached to a real loader by Loader::Make: it may resize at any
// moment, and the loader must still deliver exactly the single-worker data;
// budgets hold; the tuner's options are checked.

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <thread>

#include "stoker/defaults.h"
#include "stoker/loader.h"
#include "stoker/probe.h"
#include "testing/loader_harness.h"

namespace stoker {
namespace {

// A CPU-bound synthetic data set (64-byte samples) loaded with workers = auto
// and a short tuning interval: many decisions in a short test.
LoaderOptions TunedOptions(int64_t size, int64_t batch_size, std::chrono::microseconds cpu_cost,
                           double interval_s = 0.02) {
  SyntheticOptions so;
  so.cpu_cost = cpu_cost;
  auto o = testing::SyntheticLoaderOptions(size, batch_size, 64, so);
  o.workers = kAutoWorkers;
  o.tuner.interval_s = interval_s;
  return o;
}

// Drains epochs until the tuner has decided (the first model jump is always
// logged), however fast this machine is.
void DrainUntilDecided(Loader& loader) {
  for (int epoch = 0; epoch < 50 && loader.tuner_trace().empty(); ++epoch) {
    testing::DrainEpoch(loader);
  }
}

TEST(TunerTest, AutoWorkersDeliverTheSameData) {
  auto o = TunedOptions(3000, 32, std::chrono::microseconds(100));
  o.workers = 1;
  auto reference = testing::DrainEpoch(*testing::MakeLoader(o));
  o.workers = kAutoWorkers;
  auto loader = Loader::Make(o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  auto epoch = testing::DrainEpoch(**loader);
  EXPECT_EQ(epoch, reference);
  auto view = (*loader)->tuner_view();
  ASSERT_TRUE(view.has_value());
  EXPECT_GE(view->workers, 1);
  for (const auto& d : (*loader)->tuner_trace()) EXPECT_FALSE(d.reason.empty());
}

TEST(TunerTest, AutoWorkersMakeATunedLoaderWhoseTraceGrows) {
  auto loader = Loader::Make(TunedOptions(3000, 32, std::chrono::microseconds(100)));
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  Loader& l = **loader;
  ASSERT_TRUE(l.tuner_view().has_value());
  EXPECT_EQ(l.tuner_view()->decisions, 0);
  EXPECT_TRUE(l.tuner_trace().empty());
  DrainUntilDecided(l);
  const std::vector<TunerDecision> trace = l.tuner_trace();
  ASSERT_FALSE(trace.empty());
  const std::optional<TunerView> view = l.tuner_view();
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->decisions, static_cast<int64_t>(trace.size()));
  ASSERT_TRUE(view->last_decision.has_value());
  EXPECT_EQ(view->last_decision->reason, trace.back().reason);
}

// CPU-bound work never holds more workers than the CPU budget + 1, whatever
// else runs on the machine (these machines are shared: other processes'
// load is what the tuner once outbid); and a decision that changes nothing
// is recorded at most once after a change, then once per 30 s.
TEST(TunerTest, CpuBoundWorkStaysWithinTheBudgetAndUnchangedDecisionsAreNotRepeated) {
  const MachineFacts facts = ProbeMachine();
  const double budget = facts.cpu.budget_cores.value_or(facts.cpu.logical.value_or(1));
  const int most = static_cast<int>(std::floor(budget + 1.05));
  auto loader = Loader::Make(TunedOptions(4000, 16, std::chrono::microseconds(200), 0.01));
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  Loader& l = **loader;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(4)) {
    testing::DrainEpoch(l);
    EXPECT_LE(l.workers(), most);
  }
  const std::vector<TunerDecision> trace = l.tuner_trace();
  ASSERT_FALSE(trace.empty());
  auto unchanged = [](const TunerDecision& d) {
    return d.workers_after == d.workers_before && d.prefetch_after == d.prefetch_before;
  };
  for (size_t i = 0; i < trace.size(); ++i) {
    EXPECT_LE(trace[i].workers_after, most) << trace[i].reason;
    if (i > 0 && unchanged(trace[i]) && unchanged(trace[i - 1])) {
      EXPECT_GE(trace[i].t_s - trace[i - 1].t_s, 30.0) << trace[i].reason;
    }
  }
}

TEST(TunerTest, FixedWorkersHaveNoTuner) {
  auto o = testing::SyntheticLoaderOptions(100, 10, 8);
  o.workers = 2;
  o.tuner.interval_s = 0.02;  // tuner options with a fixed count are fine
  auto loader = Loader::Make(o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  testing::DrainEpoch(**loader);
  EXPECT_FALSE((*loader)->tuner_view().has_value());
  EXPECT_TRUE((*loader)->tuner_trace().empty());
}

// tuner_view() and tuner_trace() are safe from any thread while the consumer
// runs the tuner (Python's stats() may be called from another thread).
TEST(TunerTest, ViewAndTraceAreReadableFromAnotherThread) {
  auto loader = testing::MakeLoader(TunedOptions(2000, 16, std::chrono::microseconds(50), 0.005));
  ASSERT_NE(loader, nullptr);
  std::atomic<bool> done{false};
  int64_t reads = 0;
  std::thread reader([&] {
    size_t last = 0;
    do {
      EXPECT_TRUE(loader->tuner_view().has_value());
      const size_t decisions = loader->tuner_trace().size();
      EXPECT_GE(decisions, last);  // the trace only grows
      last = decisions;
      ++reads;
    } while (!done.load());
  });
  for (int epoch = 0; epoch < 3; ++epoch) testing::DrainEpoch(*loader);
  done.store(true);
  reader.join();
  EXPECT_GT(reads, 0);
}

// Every bad tuner option is an error naming it, with a fixed worker count as
// with kAutoWorkers.
TEST(TunerTest, MakeRejectsBadTunerOptions) {
  struct Case {
    const char* option;
    void (*set)(TunerOptions&);
  };
  const Case cases[] = {
      {"interval_s", [](TunerOptions& t) { t.interval_s = 0; }},
      {"interval_s", [](TunerOptions& t) { t.interval_s = -1; }},
      {"interval_s", [](TunerOptions& t) { t.interval_s = std::nan(""); }},
      {"interval_s",
       [](TunerOptions& t) { t.interval_s = std::numeric_limits<double>::infinity(); }},
      {"max_workers", [](TunerOptions& t) { t.max_workers = -1; }},
      {"max_workers", [](TunerOptions& t) { t.max_workers = kMaxWorkers + 1; }},
      {"initial_workers", [](TunerOptions& t) { t.initial_workers = -1; }},
      {"initial_workers", [](TunerOptions& t) { t.initial_workers = kMaxWorkers + 1; }},
      // Below two batch buffers (10 samples x 8 bytes each).
      {"memory_budget_bytes", [](TunerOptions& t) { t.memory_budget_bytes = 159; }},
  };
  for (int workers : {kAutoWorkers, 2}) {
    for (const Case& c : cases) {
      auto o = testing::SyntheticLoaderOptions(100, 10, 8);
      o.workers = workers;
      c.set(o.tuner);
      auto loader = Loader::Make(o);
      ASSERT_FALSE(loader.ok()) << c.option << " with workers " << workers;
      EXPECT_EQ(loader.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(loader.status().message().find(c.option), std::string::npos)
          << loader.status().ToString();
    }
  }
  // The bounds themselves are fine.
  auto o = testing::SyntheticLoaderOptions(100, 10, 8);
  o.workers = kAutoWorkers;
  o.tuner.max_workers = kMaxWorkers;
  o.tuner.memory_budget_bytes = 168;  // two 80-byte batches and an 8-byte sample
  auto loader = Loader::Make(o);
  EXPECT_TRUE(loader.ok()) << loader.status().ToString();
}

TEST(TunerTest, StartsFromInitialWorkersWhenGiven) {
  auto o = testing::SyntheticLoaderOptions(100, 10, 8);
  o.workers = kAutoWorkers;
  o.tuner.initial_workers = 3;
  auto loader = Loader::Make(o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  EXPECT_EQ((*loader)->workers(), 3);
  o.tuner.max_workers = 2;  // never above the cap
  loader = Loader::Make(o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  EXPECT_EQ((*loader)->workers(), 2);
}

TEST(TunerTest, NeverGrowsPastWhatTheOpenFileLimitAllows) {
  // I/O-bound work asks for many workers; past RLIMIT_NOFILE their opens
  // failed with EMFILE and the run ended. 64 files: 16 workers at most.
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  rlimit low = before;
  low.rlim_cur = std::min<rlim_t>(64, before.rlim_max);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  SyntheticOptions so;
  so.read_latency = std::chrono::microseconds(2000);
  auto o = testing::SyntheticLoaderOptions(12000, 8, 64, so);
  o.workers = kAutoWorkers;
  o.tuner.interval_s = 0.02;
  auto loader = Loader::Make(o);
  ::setrlimit(RLIMIT_NOFILE, &before);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  const int cap = static_cast<int>(low.rlim_cur / 4);
  int most = 0;
  while (true) {
    auto r = (*loader)->Next();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!r->has_value()) break;
    most = std::max(most, (*loader)->workers());
  }
  EXPECT_LE(most, cap);
  EXPECT_GT(most, 2);  // it did grow, up to the cap
  EXPECT_EQ((*loader)->tuner_view()->max_workers, cap);
}

TEST(TunerTest, MemoryBudgetBoundsBuffersInFlight) {
  SyntheticOptions so;
  so.read_latency = std::chrono::microseconds(300);  // I/O-bound: wants many workers
  auto o = testing::SyntheticLoaderOptions(4000, 16, 4096, so);
  o.workers = kAutoWorkers;
  TunerOptions& t = o.tuner;
  t.interval_s = 0.02;
  t.memory_budget_bytes = 2u << 20;  // 2 MiB: a few 64 KiB batches and small workers
  auto loader = Loader::Make(o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  while (true) {
    auto r = (*loader)->Next();
    ASSERT_TRUE(r.ok());
    if (!r->has_value()) break;
    auto m = (*loader)->Metrics();
    EXPECT_LE(m.bytes_in_flight + m.worker_bytes, t.memory_budget_bytes);
  }
}

TEST(TunerTest, UnwritableTracePathFailsAtCreation) {
  auto o = testing::SyntheticLoaderOptions(100, 10, 8);
  o.workers = kAutoWorkers;
  o.tuner.trace_path = ::testing::TempDir() + "no_such_dir_for_stoker/trace.jsonl";
  auto loader = Loader::Make(o);
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find(o.tuner.trace_path), std::string::npos)
      << loader.status().ToString();
}

TEST(TunerTest, TraceFileHoldsEveryDecision) {
  auto o = TunedOptions(3000, 32, std::chrono::microseconds(100));
  TunerOptions& t = o.tuner;
  // Named by process: other runs of this test may share the temporary folder.
  t.trace_path =
      ::testing::TempDir() + "stoker_tuner_test_trace." + std::to_string(getpid()) + ".jsonl";
  std::remove(t.trace_path.c_str());
  size_t decisions = 0;
  {
    auto loader = Loader::Make(o);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    DrainUntilDecided(**loader);
    decisions = (*loader)->tuner_trace().size();
  }  // the loader's tuner drains its trace writer
  std::ifstream in(t.trace_path);
  size_t lines = 0;
  for (std::string line; std::getline(in, line);) {
    EXPECT_NE(line.find("\"reason\""), std::string::npos) << line;
    ++lines;
  }
  EXPECT_GE(decisions, 1u);
  EXPECT_EQ(lines, decisions);
  std::remove(t.trace_path.c_str());
}

}  // namespace
}  // namespace stoker
