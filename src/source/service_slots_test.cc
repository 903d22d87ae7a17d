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

TEST(ServiceSlotsTest, AnOverloadedStoreSlowsDownAsItsQueueGrows) {
  // Two slots, 10 ms of service, each read's service 50 % longer per read
  // queued ahead of it when it arrives: the third read waits behind none,
  // the fourth behind one (15 ms), the fifth behind two (20 ms).
  StoreShape shape;
  shape.overload = 0.5;
  ServiceSlots store(2, shape);
  std::vector<int64_t> done;
  for (int i = 0; i < 5; ++i) done.push_back(store.Reserve(0, 10 * kMs));
  EXPECT_EQ(done, (std::vector<int64_t>{10 * kMs, 10 * kMs, 20 * kMs, 25 * kMs, 40 * kMs}));
  // Once the queue has drained, a read takes its plain service time.
  EXPECT_EQ(store.Reserve(100 * kMs, 10 * kMs), 110 * kMs);
}

TEST(ServiceSlotsTest, ServiceDriftsOverItsPeriod) {
  StoreShape shape;
  shape.drift = 2;
  shape.drift_period_s = 60;
  const int64_t s = 10 * kMs;
  EXPECT_EQ(ServiceSlots::Shaped(shape, s, 0, 0, 1, 0), s);
  EXPECT_EQ(ServiceSlots::Shaped(shape, s, 15'000 * kMs, 0, 1, 0), 15 * kMs);
  EXPECT_EQ(ServiceSlots::Shaped(shape, s, 30'000 * kMs, 0, 1, 0), 2 * s);
  EXPECT_EQ(ServiceSlots::Shaped(shape, s, 60'000 * kMs, 0, 1, 0), s);
  // The drift's clock starts at the store's first read.
  ServiceSlots store(0, shape);
  EXPECT_EQ(store.Reserve(7 * kMs, s), 17 * kMs);
  EXPECT_EQ(store.Reserve(7 * kMs + 30'000 * kMs, s), 7 * kMs + 30'000 * kMs + 2 * s);
}

TEST(ServiceSlotsTest, AFewReadsAreTenToFiftyTimesSlower) {
  StoreShape shape;
  shape.jitter = 0.01;
  shape.seed = 7;
  auto slow_reads = [&] {
    ServiceSlots store(0, shape);
    std::vector<int64_t> slow;
    for (int i = 0; i < 4000; ++i) {
      const int64_t took = store.Reserve(0, kMs);
      EXPECT_TRUE(took == kMs || (took >= 10 * kMs && took <= 50 * kMs)) << took;
      if (took > kMs) slow.push_back(took);
    }
    return slow;
  };
  const std::vector<int64_t> slow = slow_reads();
  EXPECT_GE(slow.size(), 20u);  // 40 expected
  EXPECT_LE(slow.size(), 70u);
  EXPECT_EQ(slow_reads(), slow) << "the same seed, the same slow reads";
  EXPECT_EQ(ServiceSlots::Shaped(shape, kMs, 0, 0, 0.005, 0), 10 * kMs);
  EXPECT_EQ(ServiceSlots::Shaped(shape, kMs, 0, 0, 0.005, 1), 50 * kMs);
  EXPECT_TRUE(shape.Valid());
  shape.drift = 0.5;
  EXPECT_FALSE(shape.Valid());
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
