#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "stoker/loader.h"

namespace stoker {
namespace {

TEST(LoaderStateJsonTest, StateRoundTrips) {
  LoaderState s;
  s.seed = UINT64_MAX;
  s.epoch = 3;
  s.position = 7;
  s.beyond = {9, 12};
  s.num_samples = 1000;
  s.batch_size = 32;
  s.shuffle = false;
  s.drop_last = true;
  s.rank = 2;
  s.world_size = 4;
  s.pad_shards = false;
  auto j = LoaderStateToJson(s);
  EXPECT_EQ(j["seed"], UINT64_MAX);
  auto back = LoaderStateFromJson(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->seed, s.seed);
  EXPECT_EQ(back->epoch, 3);
  EXPECT_EQ(back->position, 7);
  EXPECT_EQ(back->beyond, s.beyond);
  EXPECT_EQ(back->num_samples, 1000);
  EXPECT_EQ(back->batch_size, 32);
  EXPECT_FALSE(back->shuffle);
  EXPECT_TRUE(back->drop_last);
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->world_size, 4);
  EXPECT_FALSE(back->pad_shards);
  j.erase("beyond");
  back = LoaderStateFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->beyond.empty());
}

TEST(LoaderStateJsonTest, StateErrorsNameTheField) {
  const nlohmann::json good = LoaderStateToJson({1, 2, 3, {}});
  for (const char* field : {"seed", "epoch", "position", "num_samples", "batch_size", "shuffle",
                            "drop_last", "rank", "world_size", "pad_shards"}) {
    nlohmann::json missing = good;
    missing.erase(field);
    auto r = LoaderStateFromJson(missing);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("'") + field + "'"), std::string::npos)
        << r.status().message();
    nlohmann::json bad = good;
    bad[field] = "three";
    r = LoaderStateFromJson(bad);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_NE(r.status().message().find(std::string("'") + field + "'"), std::string::npos)
        << r.status().message();
  }
  nlohmann::json negative = good;
  negative["position"] = -1;
  EXPECT_FALSE(LoaderStateFromJson(negative).ok());
  nlohmann::json too_big = good;
  too_big["world_size"] = int64_t{1} << 40;  // does not fit an int
  auto big = LoaderStateFromJson(too_big);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("'world_size'"), std::string::npos)
      << big.status().message();
  nlohmann::json number_for_bool = good;
  number_for_bool["shuffle"] = 1;
  auto one = LoaderStateFromJson(number_for_bool);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("'shuffle'"), std::string::npos) << one.status().message();
  nlohmann::json bad_beyond = good;
  bad_beyond["beyond"] = {1, "x"};
  auto r = LoaderStateFromJson(bad_beyond);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'beyond'"), std::string::npos) << r.status().message();
  EXPECT_FALSE(LoaderStateFromJson(nlohmann::json::array()).ok());
  // The error quotes the value, even a string that is not UTF-8 (no throw).
  nlohmann::json bytes = good;
  bytes["seed"] = "\xff\xfe";
  r = LoaderStateFromJson(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\\udcff\\udcfe"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace stoker
