#include "source/service_slots.h"

#include <gtest/gtest.h>

#include <vector>

#include "source/synthetic_source.h"

namespace stoker {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(ServiceSlotsTest, AtMostSlotsReadsAtOnceFirstComeFirstServed) {
  // Five reads arrive together at a store with two slots and 10 ms of
  // service: two are served at once, the rest wait their turn.
  ServiceSlots store(2);
  std::vector<int64_t> done;
  for (int i = 0; i < 5; ++i) done.push_back(store.Reserve(0, 10 * kMs));
  EXPECT_EQ(done, (std::vector<int64_t>{10 * kMs, 10 * kMs, 20 * kMs, 20 * kMs, 30 * kMs}));
  // A read arriving after the queue has drained is served at once.
  EXPECT_EQ(store.Reserve(100 * kMs, 10 * kMs), 110 * kMs);
  // One arriving while both slots are busy waits for the first to free.
  EXPECT_EQ(store.Reserve(105 * kMs, 10 * kMs), 115 * kMs);
  EXPECT_EQ(store.Reserve(106 * kMs, 10 * kMs), 120 * kMs);
}

TEST(ServiceSlotsTest, NoSlotsServesEveryReadAtOnce) {
  ServiceSlots store(0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(store.Reserve(5 * kMs, 10 * kMs), 15 * kMs);
}

TEST(ServiceSlotsTest, ResizeKeepsTheSlotsThatFreeFirst) {
  ServiceSlots store(3);
  store.Reserve(0, 10 * kMs);
  store.Reserve(0, 20 * kMs);
  store.Reserve(0, 30 * kMs);
  store.Resize(2);  // the slots freeing at 10 and 20 ms stay
  EXPECT_EQ(store.slots(), 2);
  EXPECT_EQ(store.Reserve(0, 10 * kMs), 20 * kMs);
  EXPECT_EQ(store.Reserve(0, 10 * kMs), 30 * kMs);
  store.Resize(4);  // two more, free now
  EXPECT_EQ(store.Reserve(0, 10 * kMs), 10 * kMs);
  store.Resize(0);
  EXPECT_EQ(store.Reserve(0, 10 * kMs), 10 * kMs);
}

TEST(ServiceSlotsTest, SlowSourceWithSlotsReadsWhatItWraps) {
  SyntheticOptions o;
  o.size = 8;
  o.sample_bytes = 16;
  auto inner = MakeSyntheticSource(o);
  ASSERT_TRUE(inner.ok());
  SlowSource slow(*inner, std::chrono::microseconds(100), 2);
  ReadBuffer a, b;
  Record ra, rb;
  for (int64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(slow.Read(i, a, &ra).ok());
    ASSERT_TRUE((*inner)->Read(i, b, &rb).ok());
    EXPECT_TRUE(std::equal(ra.bytes.begin(), ra.bytes.end(), rb.bytes.begin(), rb.bytes.end()));
    EXPECT_EQ(ra.label, rb.label);
  }
  slow.set_slots(0);
  slow.set_latency(std::chrono::nanoseconds(0));
  EXPECT_TRUE(slow.Read(3, a, &ra).ok());
  EXPECT_EQ(slow.Key(3), "synthetic:3");
}

}  // namespace
}  // namespace stoker
