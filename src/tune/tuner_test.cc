// The tuner attached to a real loader: it may resize at any moment, and the
// loader must still deliver exactly the single-worker data; budgets hold.

#include <gtest/gtest.h>

#include <set>

#include "stoker/tuner.h"
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

}  // namespace
}  // namespace stoker
