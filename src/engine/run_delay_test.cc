#include "engine/run_delay.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace stoker {
namespace {

TEST(RunDelayTest, ParsesTheSecondField) {
  EXPECT_EQ(ParseRunDelay("123456 7890 12\n"), 7890);
  EXPECT_EQ(ParseRunDelay("0 0 0"), 0);
  EXPECT_EQ(ParseRunDelay(""), -1);
  EXPECT_EQ(ParseRunDelay("12 abc 3"), -1);
  EXPECT_EQ(ParseRunDelay("12 34"), -1);
  EXPECT_EQ(ParseRunDelay("-1 -2 -3"), -1);
}

bool PinToFirstAllowedCpu(pthread_t thread) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    return pthread_setaffinity_np(thread, sizeof one, &one) == 0;
  }
  return false;
}

// Two threads that never sleep, pinned to one CPU: each waits on the run
// queue about half of the time, and the clock must see that. (Both are new
// threads: the test's own thread keeps its CPUs.)
TEST(RunDelayTest, SeesTimeSpentQueueingForACpu) {
  if (RunDelayClock().ReadNanos() < 0) GTEST_SKIP() << "this kernel keeps no run-queue delay";
  std::atomic<bool> stop{false};
  std::atomic<int> pinned{0};
  auto spin = [&] {
    if (PinToFirstAllowedCpu(pthread_self())) pinned.fetch_add(1);
    while (!stop.load(std::memory_order_relaxed)) {
    }
  };
  int64_t delay = -1;
  std::thread measured([&] {
    RunDelayClock clock;
    if (PinToFirstAllowedCpu(pthread_self())) pinned.fetch_add(1);
    const int64_t d0 = clock.ReadNanos();
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < end) {
    }
    delay = clock.ReadNanos() - d0;
    stop = true;
  });
  std::thread rival(spin);
  measured.join();
  rival.join();
  ASSERT_EQ(pinned.load(), 2);
  // Half of 300 ms in theory; any scheduler gives the rival far more than 30.
  EXPECT_GT(delay, 30'000'000) << "run-queue delay " << delay << " ns";
}

TEST(RunDelayTest, AThreadThatSleepsDoesNotQueue) {
  RunDelayClock clock;
  const int64_t d0 = clock.ReadNanos();
  if (d0 < 0) GTEST_SKIP() << "this kernel keeps no per-thread run-queue delay";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int64_t d1 = clock.ReadNanos();
  EXPECT_GE(d1, d0);
  // Sleeping is not queueing: at most the wake-ups' short waits.
  EXPECT_LT(d1 - d0, 100'000'000);
}

}  // namespace
}  // namespace stoker
