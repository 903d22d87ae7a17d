#include "source/brace_pattern.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "stoker/image_sources.h"

namespace stoker {
namespace {

using V = std::vector<std::string>;

V Expand(const std::string& pattern) {
  auto names = ExpandBraces(pattern);
  EXPECT_TRUE(names.ok()) << pattern << ": " << names.status().ToString();
  return names.ok() ? *names : V{};
}

TEST(ExpandBracesTest, RangesListsAndLiterals) {
  EXPECT_EQ(Expand("s-{000..003}.tar"), (V{"s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"}));
  EXPECT_EQ(Expand("{8..11}"), (V{"8", "9", "10", "11"}));
  EXPECT_EQ(Expand("{08..10}"), (V{"08", "09", "10"}));
  EXPECT_EQ(Expand("{3..1}"), (V{"3", "2", "1"}));
  EXPECT_EQ(Expand("{-1..1}"), (V{"-1", "0", "1"}));
  EXPECT_EQ(Expand("{-01..1}"), (V{"-01", "000", "001"}));
  EXPECT_EQ(Expand("{a,b}-{0..1}"), (V{"a-0", "a-1", "b-0", "b-1"}));
  EXPECT_EQ(Expand("{a,,b}"), (V{"a", "", "b"}));
  EXPECT_EQ(Expand("plain.tar"), (V{"plain.tar"}));
  EXPECT_EQ(Expand(""), (V{""}));
  EXPECT_EQ(Expand("odd{x}{1..2"), (V{"odd{x}{1..2"}));
  EXPECT_EQ(Expand("{}{a..b}"), (V{"{}{a..b}"}));
  EXPECT_EQ(Expand("{1..x}"), (V{"{1..x}"}));
}

TEST(ExpandBracesTest, GroupsDoNotNest) {
  // A group holding a '{' is literal; the inner one expands.
  EXPECT_EQ(Expand("{a{0..1}}"), (V{"{a0}", "{a1}"}));
  EXPECT_EQ(Expand("{{a,b}}"), (V{"{a}", "{b}"}));
  // Expanded text is not expanded again.
  EXPECT_EQ(Expand("{{,}0..1}"), (V{"{0..1}", "{0..1}"}));
}

TEST(ExpandBracesTest, ExtremeBoundsNeitherOverflowNorExpand) {
  EXPECT_EQ(Expand("{9223372036854775806..9223372036854775807}"),
            (V{"9223372036854775806", "9223372036854775807"}));
  EXPECT_EQ(Expand("{-9223372036854775808..-9223372036854775807}"),
            (V{"-9223372036854775808", "-9223372036854775807"}));
  // Past 64 bits a bound is not a number: literal text.
  EXPECT_EQ(Expand("{0..99999999999999999999}"), (V{"{0..99999999999999999999}"}));
  // The widest range: 2^64 names, refused.
  auto all = ExpandBraces("{-9223372036854775808..9223372036854775807}");
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureBraces("{-9223372036854775808..9223372036854775807}").names, UINT64_MAX);
}

TEST(ExpandBracesTest, AHugePatternIsRefusedBeforeAnyNameIsMade) {
  const std::string pattern = "shard-{000000..999999}-{000000..999999}.tar";
  EXPECT_EQ(MeasureBraces(pattern).names, 1'000'000'000'000u);
  const auto start = std::chrono::steady_clock::now();
  auto names = ExpandBraces(pattern);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ASSERT_FALSE(names.ok());
  EXPECT_EQ(names.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = names.status().message();
  EXPECT_NE(message.find(pattern), std::string::npos) << message;
  EXPECT_NE(message.find("1000000000000 names"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(kMaxBraceNames)), std::string::npos) << message;

  // Many small groups multiply past every limit: 2^200 saturates.
  std::string doubling;
  for (int i = 0; i < 200; ++i) doubling += "{a,b}";
  EXPECT_EQ(MeasureBraces(doubling).names, UINT64_MAX);
  EXPECT_FALSE(ExpandBraces(doubling).ok());
}

TEST(ExpandBracesTest, TheLimitsAreInclusive) {
  EXPECT_EQ(MeasureBraces("{1..1000000}").names, kMaxBraceNames);
  auto at_limit = ExpandBraces("{1..1000000}");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status().ToString();
  EXPECT_EQ(at_limit->size(), kMaxBraceNames);
  EXPECT_EQ(at_limit->back(), "1000000");
  EXPECT_FALSE(ExpandBraces("{0..1000000}").ok());
  // Few names, but long ones: the byte limit.
  const std::string long_name(kMaxBraceBytes / 100, 'x');
  EXPECT_FALSE(ExpandBraces(long_name + "{1..200}").ok());
  EXPECT_TRUE(ExpandBraces(long_name + "{1..50}").ok());
}

TEST(MeasureBracesTest, MatchesTheExpansion) {
  for (const std::string pattern :
       {"s-{000..003}.tar", "{a,bb,ccc}{-10..10}", "{a{0..1}}", "x", "{}", "{-01..1}x{,}"}) {
    const BraceExpansionSize size = MeasureBraces(pattern);
    const V names = Expand(pattern);
    EXPECT_EQ(size.names, names.size()) << pattern;
    size_t longest = 0;
    for (const std::string& n : names) longest = std::max(longest, n.size());
    EXPECT_EQ(size.longest, longest) << pattern;
    EXPECT_LE(size.longest, pattern.size()) << pattern;
  }
}

}  // namespace
}  // namespace stoker
