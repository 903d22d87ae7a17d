#include "engine/consumer_window.h"

#include <gtest/gtest.h>

namespace stoker {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1000 * kMs;

// A consumer that takes one batch of `samples` each `every_ns` of its time,
// waiting `wait_ns` of it inside Next().
struct Consumer {
  ConsumerCounters now;
  void Take(ConsumerWindow& w, int64_t samples, int64_t every_ns, int64_t wait_ns) {
    now.batches_delivered += 1;
    now.samples_delivered += samples;
    now.user_samples_delivered += samples;
    now.consumer_wait_ns += wait_ns;
    now.consumer_step_ns += every_ns - wait_ns;
    w.Record(now);
  }
  void For(ConsumerWindow& w, int64_t span_ns, int64_t samples, int64_t every_ns, int64_t wait_ns) {
    for (int64_t t = 0; t < span_ns; t += every_ns) Take(w, samples, every_ns, wait_ns);
  }
};

double Seconds(const ConsumerCounters& c) {
  return static_cast<double>(c.consumer_wait_ns + c.consumer_step_ns) / kS;
}

TEST(ConsumerWindowTest, AYoungConsumerHasAllOfItsTime) {
  ConsumerWindow w(5 * kS, 250 * kMs);
  Consumer c;
  EXPECT_EQ(w.Recent(c.now).samples_delivered, 0);
  c.For(w, 2 * kS, 64, 100 * kMs, 10 * kMs);
  const ConsumerCounters r = w.Recent(c.now);
  EXPECT_EQ(r.batches_delivered, c.now.batches_delivered);
  EXPECT_EQ(r.samples_delivered, c.now.samples_delivered);
  EXPECT_EQ(r.consumer_wait_ns, c.now.consumer_wait_ns);
  EXPECT_EQ(r.consumer_step_ns, c.now.consumer_step_ns);
}

// The point of it: a consumer that slowed down shows its rate now, where
// the cumulative counters still average in the fast start.
TEST(ConsumerWindowTest, RecentFiguresFollowAChangeTheCumulativeOnesAverageAway) {
  ConsumerWindow w(5 * kS, 250 * kMs);
  Consumer c;
  c.For(w, 20 * kS, 64, 10 * kMs, 0);          // 6,400 samples/s, never waiting
  c.For(w, 20 * kS, 64, 100 * kMs, 50 * kMs);  // 640 samples/s, waiting half the time
  const ConsumerCounters r = w.Recent(c.now);
  // Every third call is kept (0.3 s apart): the span is 5 s to 5.3 s.
  EXPECT_GE(Seconds(r), 5.0);
  EXPECT_LE(Seconds(r), 5.3 + 1e-9);
  EXPECT_NEAR(static_cast<double>(r.samples_delivered) / Seconds(r), 640, 1);
  EXPECT_NEAR(static_cast<double>(r.consumer_wait_ns) / kS / Seconds(r), 0.5, 1e-9);
  const double since_start = static_cast<double>(c.now.samples_delivered) / Seconds(c.now);
  EXPECT_NEAR(since_start, 3520, 1);
}

// Next() calls further apart than the window: the span is the last of them.
TEST(ConsumerWindowTest, SparseCallsSpanTheLastInterval) {
  ConsumerWindow w(5 * kS, 250 * kMs);
  Consumer c;
  c.For(w, 60 * kS, 64, 8 * kS, 1 * kS);
  const ConsumerCounters r = w.Recent(c.now);
  EXPECT_EQ(r.batches_delivered, 1);
  EXPECT_DOUBLE_EQ(Seconds(r), 8.0);
}

// Calls closer together than the spacing keep few points, and the figures
// still reach back about the window.
TEST(ConsumerWindowTest, DenseCallsKeepAPointPerSpacing) {
  ConsumerWindow w(5 * kS, 250 * kMs);
  Consumer c;
  c.For(w, 30 * kS, 1, 1 * kMs, 0);
  const ConsumerCounters r = w.Recent(c.now);
  EXPECT_GE(Seconds(r), 5.0);
  EXPECT_LE(Seconds(r), 5.25 + 1e-9);
}

}  // namespace
}  // namespace stoker
