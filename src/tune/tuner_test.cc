// The tuner attached to a real loader: it may resize at any moment, and the
// loader must still deliver exactly the single-worker data; budgets hold.

#include "stoker/tuner.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include "testing/loader_harness.h"

namespace stoker {
namespace {

TEST(TunerTest, AutoWorkersDeliverTheSameData) {
  SyntheticOptions so;
  so.cpu_cost = std::chrono::microseconds(100);
  auto o = testing::SyntheticLoaderOptions(3000, 32, 64, so);
  o.workers = 1;
  auto reference = testing::DrainEpoch(*testing::MakeLoader(o));
  o.workers = kAutoWorkers;
  TunerOptions t;
  t.interval_s = 0.02;  // many decisions in a short test
  auto loader = OpenLoader(o, t);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  auto epoch = testing::DrainEpoch(**loader);
  EXPECT_EQ(epoch, reference);
  auto view = GetTunerView(**loader);
  ASSERT_TRUE(view.has_value());
  EXPECT_GE(view->workers, 1);
  for (const auto& d : GetTunerTrace(**loader)) EXPECT_FALSE(d.reason.empty());
}

TEST(TunerTest, FixedWorkersHaveNoTuner) {
  auto o = testing::SyntheticLoaderOptions(100, 10, 8);
  o.workers = 2;
  auto loader = OpenLoader(o);
  ASSERT_TRUE(loader.ok());
  EXPECT_FALSE(GetTunerView(**loader).has_value());
}

TEST(TunerTest, MemoryBudgetBoundsBuffersInFlight) {
  SyntheticOptions so;
  so.read_latency = std::chrono::microseconds(300);  // I/O-bound: wants many workers
  auto o = testing::SyntheticLoaderOptions(4000, 16, 4096, so);
  o.workers = kAutoWorkers;
  TunerOptions t;
  t.interval_s = 0.02;
  t.memory_budget_bytes = 2u << 20;  // 2 MiB: a few 64 KiB batches and small workers
  auto loader = OpenLoader(o, t);
  ASSERT_TRUE(loader.ok());
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
  TunerOptions t;
  t.trace_path = ::testing::TempDir() + "no_such_dir_for_stoker/trace.jsonl";
  auto loader = OpenLoader(o, t);
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find(t.trace_path), std::string::npos)
      << loader.status().ToString();
}

TEST(TunerTest, TraceFileHoldsEveryDecision) {
  SyntheticOptions so;
  so.cpu_cost = std::chrono::microseconds(100);
  auto o = testing::SyntheticLoaderOptions(3000, 32, 64, so);
  o.workers = kAutoWorkers;
  TunerOptions t;
  t.interval_s = 0.02;
  t.trace_path = ::testing::TempDir() + "stoker_tuner_test_trace.jsonl";
  std::remove(t.trace_path.c_str());
  size_t decisions = 0;
  {
    auto loader = OpenLoader(o, t);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    // Epochs until the tuner has decided (the first model jump is always
    // logged), however fast this machine is.
    for (int epoch = 0; epoch < 50 && GetTunerTrace(**loader).empty(); ++epoch) {
      testing::DrainEpoch(**loader);
    }
    decisions = GetTunerTrace(**loader).size();
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
