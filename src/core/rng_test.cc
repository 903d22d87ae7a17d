#include "stoker/rng.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace stoker {
namespace {

TEST(RngTest, PhiloxKnownAnswer) {
  // Random123's published known-answer vectors for philox4x32-10.
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdcceb, 0x5001e420u, 0x24126ea1u}));
}

TEST(RngTest, SameKeySameStream) {
  SampleRng a(7, 2, 12345), b(7, 2, 12345);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.NextU32(), b.NextU32());
}

TEST(RngTest, StreamsDifferByEpochIndexAndSeed) {
  std::set<uint64_t> firsts;
  for (uint64_t seed : {0ull, 1ull}) {
    for (uint64_t epoch : {0ull, 1ull, 2ull}) {
      for (uint64_t index : {0ull, 1ull, 2ull, 1ull << 32, (1ull << 32) + 1}) {
        firsts.insert(SampleRng(seed, epoch, index).NextU64());
      }
    }
  }
  EXPECT_EQ(firsts.size(), 2u * 3u * 5u);
  EXPECT_NE(EpochRng(0, 0).NextU64(), SampleRng(0, 0, 0).NextU64());
}

TEST(RngTest, UniformAndBelowStayInRange) {
  SampleRng r(1, 0, 0);
  std::vector<int> counts(10, 0);
  for (int i = 0; i < 100000; ++i) {
    double u = r.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    uint64_t k = r.Below(10);
    ASSERT_LT(k, 10u);
    ++counts[k];
  }
  for (int c : counts) {
    EXPECT_GT(c, 9000);  // loose: a broken generator lands far outside
    EXPECT_LT(c, 11000);
  }
}

}  // namespace
}  // namespace stoker
