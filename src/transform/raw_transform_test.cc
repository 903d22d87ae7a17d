#include <gtest/gtest.h>

#include <vector>

#include "stoker/synthetic.h"

namespace stoker {
namespace {

TEST(RawTransformTest, CopiesAndMixesDeterministically) {
  auto t = MakeRawTransform({{2, 8}, DType::kUInt8}, /*mix_rng=*/true);
  ASSERT_TRUE(t.ok());
  std::vector<std::byte> in(16, std::byte{0});
  Record rec{in, 0};
  std::vector<std::byte> a(16), b(16), c(16);
  SampleRng r1(1, 0, 5), r2(1, 0, 5), r3(1, 1, 5);
  ASSERT_TRUE((*t)->Apply(rec, r1, a, nullptr).ok());
  ASSERT_TRUE((*t)->Apply(rec, r2, b, nullptr).ok());
  ASSERT_TRUE((*t)->Apply(rec, r3, c, nullptr).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, in);
}

TEST(RawTransformTest, SizeMismatchIsAnError) {
  auto t = MakeRawTransform({{4}, DType::kUInt8});
  std::vector<std::byte> in(3), out(4);
  SampleRng r(0, 0, 0);
  Status s = (*t)->Apply(Record{in, 0}, r, out, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_FALSE(MakeRawTransform({{0}, DType::kUInt8}).ok());
}

}  // namespace
}  // namespace stoker
