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

}  // namespace
}  // namespace stoker
