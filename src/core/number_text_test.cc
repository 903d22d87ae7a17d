#include "core/number_text.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace stoker {
namespace {

TEST(FormatNumberTest, DefaultIsPrintfG) {
  EXPECT_EQ(FormatNumber(0.5), "0.5");
  EXPECT_EQ(FormatNumber(3), "3");
  EXPECT_EQ(FormatNumber(-1.25), "-1.25");
  EXPECT_EQ(FormatNumber(1234567), "1.23457e+06");
  EXPECT_EQ(FormatNumber(0.1 + 0.2), "0.3");
}

TEST(FormatNumberTest, SignificantDigits) {
  EXPECT_EQ(FormatNumber(1.23456, 3), "1.23");
  EXPECT_EQ(FormatNumber(80, 3), "80");
  EXPECT_EQ(FormatNumber(12345, 3), "1.23e+04");
}

TEST(ParseIntegerTest, WholeTextOnly) {
  EXPECT_EQ(ParseInteger<int64_t>("42"), 42);
  EXPECT_EQ(ParseInteger<int64_t>("-7"), -7);
  EXPECT_EQ(ParseInteger<int64_t>("007"), 7);
  EXPECT_FALSE(ParseInteger<int64_t>(""));
  EXPECT_FALSE(ParseInteger<int64_t>(" 1"));
  EXPECT_FALSE(ParseInteger<int64_t>("1 "));
  EXPECT_FALSE(ParseInteger<int64_t>("+1"));
  EXPECT_FALSE(ParseInteger<int64_t>("12abc"));
  EXPECT_FALSE(ParseInteger<int64_t>("1.5"));
}

TEST(ParseIntegerTest, RangeOfTheType) {
  EXPECT_EQ(ParseInteger<uint64_t>("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(ParseInteger<uint64_t>("18446744073709551616"));
  EXPECT_FALSE(ParseInteger<uint64_t>("-1"));
  EXPECT_EQ(ParseInteger<int64_t>("-9223372036854775808"), std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(ParseInteger<int64_t>("9223372036854775808"));
  EXPECT_FALSE(ParseInteger<int>("4294967296"));
}

}  // namespace
}  // namespace stoker
