#include "core/clock.h"

#include <gtest/gtest.h>

#include <thread>

namespace stoker {
namespace {

// Spins until `clock` has moved past its value at the call; false if it never
// does within a generous number of rounds (it must, on any machine).
template <typename Clock>
bool Advances(Clock clock) {
  const auto start = clock();
  volatile uint64_t sink = 0;
  for (int round = 0; round < 1'000'000'000; ++round) {
    sink = sink + static_cast<uint64_t>(round);
    if (clock() > start) return true;
  }
  return false;
}

TEST(ClockTest, SteadyNanosNeverGoesBack) {
  int64_t last = SteadyNanos();
  for (int i = 0; i < 1000; ++i) {
    const int64_t now = SteadyNanos();
    EXPECT_GE(now, last);
    last = now;
  }
  EXPECT_TRUE(Advances(SteadyNanos));
}

TEST(ClockTest, ThreadCpuAdvancesWithTheThreadsWork) { EXPECT_TRUE(Advances(ThreadCpuNanos)); }

TEST(ClockTest, ProcessCpuCountsOtherThreads) {
  const int64_t process = ProcessCpuNanos();
  int64_t other_used = 0;
  std::thread other([&] {
    const int64_t start = ThreadCpuNanos();
    ASSERT_TRUE(Advances(ThreadCpuNanos));
    other_used = ThreadCpuNanos() - start;
  });
  other.join();
  ASSERT_GT(other_used, 0);
  // The window encloses the other thread's whole life.
  EXPECT_GE(ProcessCpuNanos() - process, other_used);
}

TEST(ClockTest, ProcessCpuIncludesTheCallingThread) {
  const int64_t thread = ThreadCpuNanos();
  EXPECT_GE(ProcessCpuNanos(), thread);
}

TEST(ClockTest, ProcessCpuSecondsIsTheNanosInSeconds) {
  const int64_t before = ProcessCpuNanos();
  const double seconds = ProcessCpuSeconds();
  const int64_t after = ProcessCpuNanos();
  EXPECT_GE(seconds, static_cast<double>(before) * 1e-9 - 1e-9);
  EXPECT_LE(seconds, static_cast<double>(after) * 1e-9 + 1e-9);
}

}  // namespace
}  // namespace stoker
