#include "source/label_text.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace stoker {
namespace {

TEST(LabelTextTest, SkipsOnlyALeadingByteOrderMark) {
  EXPECT_EQ(SkipByteOrderMark("\xEF\xBB\xBF"
                              "a.jpg\t1\n"),
            "a.jpg\t1\n");
  EXPECT_EQ(SkipByteOrderMark("a.jpg\t1\n"), "a.jpg\t1\n");
  EXPECT_EQ(SkipByteOrderMark("x\xEF\xBB\xBF"), "x\xEF\xBB\xBF");
  EXPECT_EQ(SkipByteOrderMark("\xEF\xBB"), "\xEF\xBB");  // a cut mark is text, not a mark
  EXPECT_EQ(SkipByteOrderMark(""), "");
}

TEST(LabelTextTest, ALabelIsANonNegativeInteger) {
  EXPECT_EQ(*ParseLabel("0"), 0);
  EXPECT_EQ(*ParseLabel("17"), 17);
  EXPECT_EQ(*ParseLabel("9223372036854775807"), INT64_MAX);
  for (const char* negative : {"-1", "-100"}) {
    Result<int64_t> r = ParseLabel(negative);
    ASSERT_FALSE(r.ok()) << negative;
    EXPECT_EQ(r.status().code(), StatusCode::kDataError);
    EXPECT_NE(r.status().message().find(std::string("'") + negative + "' is negative"),
              std::string::npos)
        << r.status().message();
  }
  for (const char* huge : {"9223372036854775808", "99999999999999999999"}) {
    Result<int64_t> r = ParseLabel(huge);
    ASSERT_FALSE(r.ok()) << huge;
    EXPECT_NE(r.status().message().find(std::string("'") + huge + "' is out of range"),
              std::string::npos)
        << r.status().message();
  }
  Result<int64_t> below = ParseLabel("-99999999999999999999");
  ASSERT_FALSE(below.ok());
  EXPECT_NE(below.status().message().find("is negative"), std::string::npos);
  for (const char* bad : {"", "cat", "1x", "+1", " 1", "1.0", "-", "--1"}) {
    Result<int64_t> r = ParseLabel(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("is not an integer"), std::string::npos)
        << r.status().message();
  }
  Result<int64_t> long_garbage = ParseLabel(std::string(1000, 'z'));
  ASSERT_FALSE(long_garbage.ok());
  EXPECT_LT(long_garbage.status().message().size(), 100u);
}

}  // namespace
}  // namespace stoker
