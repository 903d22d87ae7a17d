#include "hw/sys_file.h"

#include <gtest/gtest.h>

namespace stoker::hw {
namespace {

TEST(SysFileTest, ParseUintAcceptsOnlyWholeDecimalNumbers) {
  EXPECT_EQ(ParseUint("150000\n"), 150000u);
  EXPECT_EQ(ParseUint("  0 "), 0u);
  EXPECT_FALSE(ParseUint(""));
  EXPECT_FALSE(ParseUint("max"));
  EXPECT_FALSE(ParseUint("-1"));
  EXPECT_FALSE(ParseUint("12abc"));
  EXPECT_FALSE(ParseUint("99999999999999999999999"));
}

TEST(SysFileTest, CountCpuListCountsRangesAndSingles) {
  EXPECT_EQ(CountCpuList("0-3"), 4);
  EXPECT_EQ(CountCpuList("0,2,5-7\n"), 5);
  EXPECT_EQ(CountCpuList("0-15"), 16);
  EXPECT_EQ(CountCpuList(""), 0);
  EXPECT_FALSE(CountCpuList("3-1"));
  EXPECT_FALSE(CountCpuList("0-3,"));
  EXPECT_FALSE(CountCpuList("a-b"));
  EXPECT_FALSE(CountCpuList("0,,1"));
}

TEST(SysFileTest, FindKeyedLineMatchesWholeKeys) {
  const char* text = "MemTotal:  100 kB\nMemAvailable:\t 50 kB\nmodel name\t: Some CPU\n";
  EXPECT_EQ(FindKeyedLine(text, "MemTotal"), "100 kB");
  EXPECT_EQ(FindKeyedLine(text, "MemAvailable"), "50 kB");
  EXPECT_EQ(FindKeyedLine(text, "model name"), "Some CPU");
  EXPECT_FALSE(FindKeyedLine(text, "Mem"));
  EXPECT_FALSE(FindKeyedLine(text, "MemFree"));
}

TEST(SysFileTest, JoinPathNeverDoublesSeparators) {
  EXPECT_EQ(JoinPath("/sys/fs/cgroup", "/docker/abc"), "/sys/fs/cgroup/docker/abc");
  EXPECT_EQ(JoinPath("/sys/fs/cgroup/", "cpu.max"), "/sys/fs/cgroup/cpu.max");
  EXPECT_EQ(JoinPath("/sys/fs/cgroup", "/"), "/sys/fs/cgroup");
  EXPECT_EQ(JoinPath("/", "proc"), "/proc");
  EXPECT_EQ(Trim(" \tx y\n"), "x y");
}

TEST(SysFileTest, ReadSmallFileIsEmptyForMissingFiles) {
  EXPECT_FALSE(ReadSmallFile("/nonexistent/stoker/file"));
}

}  // namespace
}  // namespace stoker::hw
