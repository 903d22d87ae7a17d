#include "plan/epoch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace stoker {
namespace {

std::vector<int64_t> Order(const EpochPlan& p) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < p.num_samples(); ++i) v.push_back(p.sample(i));
  return v;
}

TEST(EpochPlanTest, SequentialWithoutShuffle) {
  PlanOptions o{.num_samples = 10, .batch_size = 4, .shuffle = false};
  EpochPlan p(o, 0);
  EXPECT_EQ(Order(p), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(p.num_batches(), 3);
  EXPECT_EQ(p.batch_length(2), 2);
  o.drop_last = true;
  EpochPlan q(o, 0);
  EXPECT_EQ(q.num_batches(), 2);
  EXPECT_EQ(q.num_samples(), 8);
}

TEST(EpochPlanTest, ShuffleIsAPermutationAndAPureFunction) {
  PlanOptions o{.num_samples = 1000, .batch_size = 32, .shuffle = true, .seed = 5};
  auto a = Order(EpochPlan(o, 3));
  EXPECT_EQ(a, Order(EpochPlan(o, 3)));
  EXPECT_NE(a, Order(EpochPlan(o, 4)));
  o.seed = 6;
  EXPECT_NE(a, Order(EpochPlan(o, 3)));
  std::sort(a.begin(), a.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], i);
}

TEST(EpochPlanTest, PaddedShardsCoverEveryoneEqually) {
  for (int world : {1, 2, 3, 7}) {
    PlanOptions o{.num_samples = 100,
                  .batch_size = 8,
                  .shuffle = true,
                  .seed = 1,
                  .world_size = world,
                  .pad_shards = true};
    std::map<int64_t, int> seen;
    int64_t per_rank = -1;
    for (int r = 0; r < world; ++r) {
      o.rank = r;
      EpochPlan p(o, 2);
      if (per_rank < 0) per_rank = p.num_samples();
      EXPECT_EQ(p.num_samples(), per_rank);
      for (int64_t s : Order(p)) ++seen[s];
    }
    EXPECT_EQ(per_rank, (100 + world - 1) / world);
    EXPECT_EQ(seen.size(), 100u);  // every sample somewhere
    int64_t total = 0;
    for (auto& [s, c] : seen) total += c;
    EXPECT_EQ(total, per_rank * world);  // padding repeats only as much as needed
  }
}

TEST(EpochPlanTest, DroppedShardsAreDisjoint) {
  PlanOptions o{.num_samples = 100,
                .batch_size = 8,
                .shuffle = true,
                .seed = 1,
                .world_size = 3,
                .pad_shards = false};
  std::map<int64_t, int> seen;
  for (int r = 0; r < 3; ++r) {
    o.rank = r;
    EpochPlan p(o, 0);
    EXPECT_EQ(p.num_samples(), 33);
    for (int64_t s : Order(p)) ++seen[s];
  }
  EXPECT_EQ(seen.size(), 99u);
  for (auto& [s, c] : seen) EXPECT_EQ(c, 1);
}

TEST(EpochPlanTest, TinySourcePadsByWrapping) {
  PlanOptions o{.num_samples = 2, .batch_size = 1, .shuffle = false, .world_size = 5};
  for (int r = 0; r < 5; ++r) {
    o.rank = r;
    EXPECT_EQ(EpochPlan(o, 0).sample(0), r % 2);
  }
}

TEST(EpochPlanTest, ShapeCountsWithoutBuildingAnOrder) {
  for (int64_t n : {1, 2, 7, 64, 65, 1000}) {
    for (int64_t bs : {1, 3, 64}) {
      for (int w : {1, 2, 3, 8}) {
        for (bool pad : {true, false}) {
          for (bool drop : {false, true}) {
            PlanOptions o{.num_samples = n,
                          .batch_size = bs,
                          .drop_last = drop,
                          .world_size = w,
                          .pad_shards = pad};
            if (!ValidatePlanOptions(o).ok()) continue;
            const PlanShape s = PlanShape::Of(o);
            // This rank's share, then whole batches only under drop_last.
            const int64_t share = pad ? (n + w - 1) / w : n / w;
            EXPECT_EQ(s.num_samples, drop ? share / bs * bs : share);
            int64_t sum = 0;
            for (int64_t b = 0; b < s.num_batches; ++b) {
              EXPECT_GE(s.batch_length(b), 1);
              EXPECT_LE(s.batch_length(b), bs);
              if (b + 1 < s.num_batches || drop) {
                EXPECT_EQ(s.batch_length(b), bs);
              }
              sum += s.batch_length(b);
            }
            EXPECT_EQ(sum, s.num_samples) << n << " " << bs << " " << w << " " << pad << drop;
          }
        }
      }
    }
  }
}

TEST(EpochPlanTest, ValidationNamesTheOption) {
  PlanOptions o{.num_samples = 10, .batch_size = 0};
  EXPECT_NE(ValidatePlanOptions(o).message().find("batch_size"), std::string::npos);
  o = {.num_samples = 10, .batch_size = 1, .rank = 2, .world_size = 2};
  EXPECT_NE(ValidatePlanOptions(o).message().find("rank"), std::string::npos);
  o = {.num_samples = 0};
  EXPECT_NE(ValidatePlanOptions(o).message().find("no samples"), std::string::npos);
}

}  // namespace
}  // namespace stoker
