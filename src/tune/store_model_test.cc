#include "tune/store_model.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace stoker {
namespace {

// A closed loop of `workers` workers on a store with `slots` slots (0: any
// number) and `service_s` per read, each spending `rest_s` elsewhere per
// sample: the point it shows once settled.
StoreModel::Point Loop(int workers, int slots, double service_s, double rest_s) {
  const double parallel = workers / (service_s + rest_s);
  const double rate = slots > 0 ? std::min(parallel, slots / service_s) : parallel;
  return {workers, rate, workers / rate - rest_s, rest_s};
}

TEST(StoreModelTest, FlatWaitIsAParallelStore) {
  StoreModel m(1.5, 1.2, 0.15);
  for (int n : {2, 16, 128}) m.Add(Loop(n, 0, 0.02, 0.001));
  EXPECT_FALSE(m.Saturated());
  EXPECT_DOUBLE_EQ(m.service_s(), 0.02);
}

TEST(StoreModelTest, WaitGrowingWithThePoolGivesTheSlotsAndTheKnee) {
  StoreModel m(1.5, 1.2, 0.15);
  m.Add(Loop(2, 8, 0.02, 0.001));
  EXPECT_FALSE(m.Saturated());
  m.Add(Loop(128, 8, 0.02, 0.001));
  ASSERT_TRUE(m.Saturated());
  EXPECT_NEAR(m.slots(), 8, 1e-9);
  // 8 slots x (20 + 1) / 20 ms x 1.2 headroom = 10.08: 11 workers.
  EXPECT_EQ(m.Knee(), 11);
  EXPECT_NE(m.Describe().find("~8.0 reads at once"), std::string::npos) << m.Describe();
  EXPECT_NE(m.Describe().find("at 128 workers"), std::string::npos) << m.Describe();
}

TEST(StoreModelTest, TheKneeIsSureOnlyWhereTheLeastWaitCouldNotQueue) {
  // The least wait at 2 workers, fewer than the 8 slots: the service time.
  // 8 slots x (20 + 1) / 20 ms = 8.4: 9 workers keep them busy.
  StoreModel m(1.5, 1.2, 0.15);
  m.Add(Loop(2, 8, 0.02, 0.001));
  m.Add(Loop(128, 8, 0.02, 0.001));
  EXPECT_EQ(m.SureKnee(), 9);
  // The least wait at 24 workers, already queued (60 ms for 20 of
  // service): it reads ~24 slots, and they are not sure.
  StoreModel q(1.5, 1.2, 0.15);
  q.Add(Loop(24, 8, 0.02, 0.001));
  q.Add(Loop(128, 8, 0.02, 0.001));
  ASSERT_TRUE(q.Saturated());
  EXPECT_GT(q.slots(), 20);
  EXPECT_EQ(q.SureKnee(), 0);
}

TEST(StoreModelTest, TheUnqueuedRateIsOneWorkersAtTheLeastWait) {
  StoreModel m(1.5, 1.2, 0.15);
  EXPECT_EQ(m.UnqueuedRate(), 0);
  m.Add(Loop(128, 8, 0.02, 0.001));
  m.Add(Loop(2, 8, 0.02, 0.001));
  // One worker, its read unqueued: a sample every 20 + 1 ms.
  EXPECT_NEAR(m.UnqueuedRate(), 1 / 0.021, 1e-9);
}

TEST(StoreModelTest, ALargerPoolThatProducedLessIsForgotten) {
  // The store gained slots: 12 workers now produce more than 128 did.
  StoreModel m(1.5, 1.2, 0.15);
  m.Add(Loop(2, 4, 0.02, 0.001));
  m.Add(Loop(128, 4, 0.02, 0.001));
  ASSERT_TRUE(m.Saturated());
  m.Add(Loop(12, 64, 0.02, 0.001));
  EXPECT_FALSE(m.Saturated());
  m.Clear();
  EXPECT_EQ(m.service_s(), 0);
}

TEST(StoreModelTest, AReferencePointGivesTheServiceTimeButNeverSaturates) {
  // Reads of 5 ms beside 4 ms of CPU: a pool of one is not read-bound
  // (under twice the CPU), yet its wait is the service time that shows
  // the 14-worker pool's reads queued ten times over.
  StoreModel m(1.5, 1.2, 0.15);
  StoreModel::Point one = Loop(1, 2, 0.005, 0.004);
  one.reference = true;
  StoreModel::Point two = Loop(2, 2, 0.005, 0.004);
  two.reference = true;
  two.wait_s *= 2;  // a reference's longer wait is not a queue
  m.Add(one);
  m.Add(two);
  EXPECT_FALSE(m.Saturated());
  EXPECT_DOUBLE_EQ(m.service_s(), 0.005);
  m.Add(Loop(14, 2, 0.005, 0.004));
  ASSERT_TRUE(m.Saturated());
  EXPECT_NEAR(m.slots(), 2, 1e-9);
  // 2 slots x (5 + 4) / 5 ms x 1.2 headroom = 4.32: 5 workers.
  EXPECT_EQ(m.Knee(), 5);
  EXPECT_NE(m.Describe().find("at 14 workers, 5.0 ms at 1"), std::string::npos) << m.Describe();
}

}  // namespace
}  // namespace stoker
