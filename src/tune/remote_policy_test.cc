#include "tune/remote_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace stoker {
namespace {

// A loader whose consumer wants `demand` batches/s and whose local pool
// makes `per_worker` batches/s a worker, each remote slot `per_slot`; fed
// to the policy in 0.25 s windows, its decisions applied at once.
struct Sim {
  double demand = 20;
  double per_worker = 10;
  double per_slot = 10;
  int local = 1;
  bool local_spent = true;
  int capacity = 8;
  int remote = 0;
  int decisions = 0;
  RemotePolicy policy;

  // Runs `seconds`; returns the last decision's reason.
  std::string Run(double seconds) {
    std::string last;
    for (double t = 0; t < seconds; t += 0.25) {
      const double made = per_worker * local + per_slot * std::min(remote, capacity);
      const double rate = std::min(made, demand);
      RemoteWindow w;
      w.window_s = 0.25;
      w.batches = static_cast<int64_t>(std::lround(rate * 0.25));
      // The consumer steps 1/demand a batch and waits for the rest.
      w.step_s = std::min(0.25, rate * 0.25 / demand);
      w.wait_s = 0.25 - w.step_s;
      if (auto d = policy.Observe(w, {local, local_spent, capacity, remote})) {
        remote = d->remote_after;
        last = d->reason;
        ++decisions;
      }
    }
    return last;
  }
};

TEST(RemotePolicyTest, BorrowsNothingWhileTheLocalPoolCanGrow) {
  Sim s;
  s.local_spent = false;
  s.Run(10);
  EXPECT_EQ(s.remote, 0);
  EXPECT_EQ(s.decisions, 0);
}

TEST(RemotePolicyTest, ConsumerBoundLoopTakesNone) {
  Sim s;
  s.demand = 2.5;  // a 400 ms step
  s.Run(20);
  EXPECT_EQ(s.remote, 0);
  EXPECT_EQ(s.decisions, 0);
}

TEST(RemotePolicyTest, FirstJumpIsLittlesLaw) {
  Sim s;
  s.demand = 40;  // 4x what one local worker makes: 3 slots feed it
  const std::string reason = s.Run(1.5);
  EXPECT_EQ(s.remote, 3) << reason;
  EXPECT_NE(reason.find("local CPU budget is spent"), std::string::npos) << reason;
}

TEST(RemotePolicyTest, SettlesOnTheFewestThatFeedTheConsumer) {
  Sim s;
  s.demand = 40;
  s.Run(30);
  // Three slots and the local worker make 40/s: the consumer never waits, and
  // one fewer starves it (a floor), so it stays.
  EXPECT_EQ(s.remote, 3);
  const int decisions = s.decisions;
  s.Run(30);
  EXPECT_EQ(s.decisions, decisions) << "no oscillation once settled";
}

TEST(RemotePolicyTest, StopsWhereMoreSlotsDoNotPay) {
  Sim s;
  s.demand = 1000;  // never fed
  s.per_slot = 10;
  s.capacity = 64;
  s.Run(5);
  const int reached = s.remote;
  EXPECT_GT(reached, 1);
  // Slots stop paying (the NIC, the scheduler): the next step is taken back.
  s.per_slot = 0;
  const std::string reason = s.Run(10);
  EXPECT_LT(s.remote, 64);
  EXPECT_NE(reason.find("do not pay"), std::string::npos) << reason;
}

TEST(RemotePolicyTest, GivesSlotsBackWhenTheConsumerSlowsDown) {
  Sim s;
  s.demand = 40;
  s.Run(10);
  ASSERT_EQ(s.remote, 3);
  s.demand = 9;  // the training step grew: the local worker alone keeps up
  s.Run(30);
  EXPECT_EQ(s.remote, 0);
}

TEST(RemotePolicyTest, NeverMoreThanTheClusterOffers) {
  Sim s;
  s.demand = 1000;
  s.capacity = 2;
  s.Run(10);
  EXPECT_EQ(s.remote, 2);
  s.capacity = 1;  // a worker left
  const std::string reason = s.Run(0.25);
  EXPECT_EQ(s.remote, 1);
  EXPECT_NE(reason.find("offers 1"), std::string::npos) << reason;
}

}  // namespace
}  // namespace stoker
