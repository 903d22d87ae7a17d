// The stand-in training loop's figures: what a stretch of a run delivered
// and produced, and which of the two a throughput figure believes.

#include "stoker/sweep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "stoker/synthetic.h"
#include "testing/loader_harness.h"

namespace stoker {
namespace {

TimelinePoint At(double t_s, double delivered, double produced) {
  TimelinePoint p;
  p.t_s = t_s;
  p.samples_per_s = delivered;
  p.produced_per_s = produced;
  return p;
}

TEST(SweepTest, ASettledRateIsTheLesserOfDeliveredAndProduced) {
  // A pool that shrank: the consumer catches up on batches the larger pool
  // part-filled (delivered > produced), then both agree.
  const std::vector<TimelinePoint> shrink = {At(1, 400, 400), At(2, 1400, 400), At(3, 400, 400)};
  EXPECT_DOUBLE_EQ(MeanRate(shrink, 0, 3), 2200.0 / 3);
  EXPECT_DOUBLE_EQ(SettledRate(shrink, 0, 3), 400);
  // A pipeline that fills its prefetch window: produced > delivered.
  const std::vector<TimelinePoint> filling = {At(1, 100, 700), At(2, 300, 500)};
  EXPECT_DOUBLE_EQ(SettledRate(filling, 0, 2), 200);
  EXPECT_DOUBLE_EQ(SettledRate({}, 0, 2), 0);
}

TEST(SweepTest, TheRecommendedCountIsTheFewestWorkersWithinNoiseOfTheTop) {
  // 3 workers measured highest, but 2 within 3 % of it: the third buys noise.
  const std::vector<SweepPoint> knee = {
      {4, 395, 0}, {0, 100, 0.5}, {3, 400, 0}, {1, 200, 0.2}, {2, 390, 0.01}};
  EXPECT_EQ(RecommendedSweepPoint(knee).workers, 2);
  EXPECT_DOUBLE_EQ(RecommendedSweepPoint(knee).samples_per_s, 390);
  // A clear gain is taken.
  EXPECT_EQ(RecommendedSweepPoint({{1, 100, 0}, {2, 200, 0}, {3, 300, 0}}).workers, 3);
  // Nothing measured faster than the consumer's own loop: no workers.
  EXPECT_EQ(RecommendedSweepPoint({{2, 0, 1}, {0, 0, 1}}).workers, 0);
  // A count listed twice: its first measurement.
  EXPECT_DOUBLE_EQ(RecommendedSweepPoint({{1, 99, 0}, {1, 100, 0}}).samples_per_s, 99);
}

TEST(SweepTest, AWindowRateIsWhatWasDeliveredUnlessTheConsumerCaughtUp) {
  // Noise: delivered a little above produced is believed.
  EXPECT_DOUBLE_EQ(WindowRate({At(1, 3450, 3300)}, 0, 1), 3450);
  EXPECT_DOUBLE_EQ(WindowRate({At(1, 3300, 3450)}, 0, 1), 3300);
  // A catch-up: what the workers produced meanwhile.
  EXPECT_DOUBLE_EQ(WindowRate({At(1, 1475, 400)}, 0, 1), 400);
}

TEST(SweepTest, ConsumeCountsWhatTheWorkersProduced) {
  auto o = testing::SyntheticLoaderOptions(2000, 32, 64, {});
  o.workers = 2;
  auto loader = testing::MakeLoader(o);
  ConsumeOptions co;
  co.epochs = 2;
  auto st = Consume(*loader, co);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->samples, 4000);
  // A fresh loader: every delivered sample was produced within the run, and
  // the look-ahead may have produced some of a third epoch.
  EXPECT_GE(st->produced, st->samples);
  EXPECT_LE(st->produced, 6000);
}

TEST(SweepTest, ARunShorterThanOneTimelineIntervalIsOnePoint) {
  // The tuned run of `stoker bench --tuned-seconds 0.2` had no point, so its
  // rate read 0 although it delivered samples.
  auto o = testing::SyntheticLoaderOptions(2000, 32, 64, {});
  o.workers = 1;
  auto loader = testing::MakeLoader(o);
  ConsumeOptions co;
  co.epochs = 1;
  co.timeline_interval_s = 3600;
  auto st = Consume(*loader, co);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->timeline.size(), 1u);
  EXPECT_DOUBLE_EQ(st->timeline[0].t_s, st->seconds);
  EXPECT_NEAR(st->timeline[0].samples_per_s * st->seconds, 2000, 1e-6);
  EXPECT_GT(SettledRate(st->timeline, 0, st->seconds), 0);
}

// The reference re-measured after the tuned run may fall below another row
// (a machine slowed by another job meanwhile): it named a lesser row "best
// static" and divided the tuned figure by it. The best is the best row.
TEST(SweepTest, TheBestStaticSettingIsTheBestRowAfterItIsMeasuredAgain) {
  auto o = testing::SyntheticLoaderOptions(100000, 1, 8, {});
  // Read-bound: 5 ms a read, so 3 workers deliver about 1.5 times what 2 do.
  auto slow = std::make_shared<SlowSource>(o.source, std::chrono::milliseconds(5));
  o.source = slow;
  SweepOptions so;
  so.workers = {2, 3};
  so.max_workers = 4;
  so.warmup_seconds = 0.1;
  so.point_seconds = 0.4;
  so.confirm_top = 0;
  so.tuned_seconds = 0.3;
  // Reads 20 times slower from the bracket on: the mean of 3 workers' row
  // falls below the row of 2.
  so.log = [&slow](const std::string& line) {
    if (line.find("after the tuned run") != std::string::npos) {
      slow->set_latency(std::chrono::milliseconds(100));
    }
  };
  auto r = RunSweep(o, so);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->sweep.size(), 2u);
  const SweepPoint top = *std::max_element(
      r->sweep.begin(), r->sweep.end(),
      [](const SweepPoint& x, const SweepPoint& y) { return x.samples_per_s < y.samples_per_s; });
  EXPECT_EQ(r->best_static.workers, top.workers);
  EXPECT_DOUBLE_EQ(r->best_static.samples_per_s, top.samples_per_s);
  EXPECT_DOUBLE_EQ(r->ratio, r->tuned_samples_per_s / top.samples_per_s);
}

}  // namespace
}  // namespace stoker
