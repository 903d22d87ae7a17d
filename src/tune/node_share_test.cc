// The split of a node's CPU budget among its loaders (a pure rule), and
// NodeShare, which feeds it from the registry each tick.

#include "tune/node_share.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "testing/source_test_util.h"

namespace stoker {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The rule's invariants, for any input: the shares sum to the budget, and
// each is at least min(kMinShareCores, budget / n).
void ExpectSound(double budget, const std::vector<double>& shares) {
  ASSERT_FALSE(shares.empty());
  EXPECT_NEAR(std::accumulate(shares.begin(), shares.end(), 0.0), budget, 1e-9);
  const double least = std::min(kMinShareCores, budget / static_cast<double>(shares.size()));
  for (double s : shares) EXPECT_GE(s, least - 1e-12);
}

std::vector<double> Split(double budget, const std::vector<double>& wants) {
  std::vector<double> shares = SplitNodeBudget(budget, wants);
  EXPECT_EQ(shares.size(), wants.size());
  ExpectSound(budget, shares);
  return shares;
}

TEST(SplitNodeBudgetTest, ALoaderAloneGetsTheWholeBudget) {
  EXPECT_EQ(Split(8, {kInf}), std::vector<double>{8});
  EXPECT_EQ(Split(8, {0.3}), std::vector<double>{8});  // needing little changes nothing alone
  EXPECT_TRUE(SplitNodeBudget(8, {}).empty());
}

TEST(SplitNodeBudgetTest, EqualNeedsSplitEqually) {
  for (double s : Split(2, {kInf, kInf})) EXPECT_DOUBLE_EQ(s, 1);
  for (double s : Split(8, {kInf, kInf, kInf, kInf})) EXPECT_DOUBLE_EQ(s, 2);
  // Equal small needs: met, and the rest split equally too.
  for (double s : Split(8, {1, 1, 1, 1})) EXPECT_DOUBLE_EQ(s, 2);
}

// The compute-bound rank (its consumer never waits; its workers use 0.3
// cores) keeps what it uses; the data-bound ones take the rest.
TEST(SplitNodeBudgetTest, AComputeBoundLoaderLeavesItsShareToTheDataBound) {
  const std::vector<double> two = Split(2, {0.3, kInf});
  EXPECT_DOUBLE_EQ(two[0], 0.3);
  EXPECT_DOUBLE_EQ(two[1], 1.7);
  const std::vector<double> four = Split(8, {kInf, 0.3, kInf, kInf});
  EXPECT_DOUBLE_EQ(four[1], 0.3);
  for (size_t i : {0, 2, 3}) EXPECT_DOUBLE_EQ(four[i], 7.7 / 3);
  // A need above an equal part of what is left is not met in full.
  const std::vector<double> mixed = Split(6, {1, 3, kInf});
  EXPECT_DOUBLE_EQ(mixed[0], 1);
  EXPECT_DOUBLE_EQ(mixed[1], 2.5);
  EXPECT_DOUBLE_EQ(mixed[2], 2.5);
}

// However little a loader needs, it keeps a worker's worth: kMinShareCores,
// or an equal part when the budget is smaller than that per loader.
TEST(SplitNodeBudgetTest, EveryLoaderKeepsAMinimumShare) {
  const std::vector<double> idle = Split(2, {0.0, kInf, kInf, kInf});
  EXPECT_DOUBLE_EQ(idle[0], kMinShareCores);
  for (size_t i : {1, 2, 3}) EXPECT_DOUBLE_EQ(idle[i], (2 - kMinShareCores) / 3);
  for (double s : Split(0.5, {0.0, 0.0, kInf, kInf})) EXPECT_DOUBLE_EQ(s, 0.125);
  // A need that cannot be read counts as the least.
  const std::vector<double> unknown = Split(2, {std::nan(""), kInf});
  EXPECT_DOUBLE_EQ(unknown[0], kMinShareCores);
}

// A loader that leaves (or crashes, and the registry frees its entry) is
// simply not among the needs of the next split: its share returns.
TEST(SplitNodeBudgetTest, ALeavingLoadersShareReturnsToTheOthers) {
  const std::vector<double> before = Split(6, {kInf, kInf, kInf});
  const std::vector<double> after = Split(6, {kInf, kInf});
  EXPECT_DOUBLE_EQ(before[0], 2);
  EXPECT_DOUBLE_EQ(after[0], 3);
  EXPECT_DOUBLE_EQ(after[1], 3);
}

TEST(CoresWantedTest, AStallingConsumerIsDataBound) {
  EXPECT_TRUE(std::isinf(CoresWanted(0.5, 1.0, false)));
  EXPECT_TRUE(std::isinf(CoresWanted(0.02, 0.1, false)));
  EXPECT_DOUBLE_EQ(CoresWanted(0.0, 0.5, false), 0.6);  // its use, with the tuner's 20 % headroom
  EXPECT_DOUBLE_EQ(CoresWanted(0.0, -1, false), 0.0);
  // Between the tuner's stall_low (0.3 %) and stall_high (1 %) it stays what
  // it was: a need near the bar does not flap.
  EXPECT_DOUBLE_EQ(CoresWanted(0.005, 0.5, false), 0.6);
  EXPECT_TRUE(std::isinf(CoresWanted(0.005, 0.5, true)));
  EXPECT_DOUBLE_EQ(CoresWanted(0.002, 0.5, true), 0.6);
}

TEST(NodeShareTest, WithoutARegistryTheBudgetIsSplitByLocalRanks) {
  NodeShare share(nullptr, "node registry turned off ($STOKER_NODE_REGISTRY=off)", 1, 4);
  EXPECT_DOUBLE_EQ(share.Update(0.2, 0.2, 0.2, 2, 8), 2);
  EXPECT_TRUE(share.view().registry.empty());
  EXPECT_NE(share.view().note.find("turned off"), std::string::npos);
  EXPECT_EQ(share.view().loaders, 0);
  EXPECT_DOUBLE_EQ(share.view().budget_cores, 8);
}

// Two loaders of one process on a shared registry: the one whose consumer
// waits gets what the one whose consumer is fed does not use; when both
// wait they split evenly; when one goes, the other has it all.
TEST(NodeShareTest, SharesFollowNeedsThroughTheRegistry) {
  testing::TempDir dir;
  auto open = [&] {
    auto r = NodeRegistry::Open(dir / "reg");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  };
  NodeShare data_bound(open(), "", 0, 2);
  auto fed = std::make_unique<NodeShare>(open(), "", 1, 2);
  ASSERT_FALSE(data_bound.view().registry.empty());
  // Windows of 0.2 s: one consumer waits all of it with its workers on 1.8
  // cores, the other never waits and its workers use 0.1 cores.
  for (int tick = 0; tick < 3; ++tick) {
    data_bound.Update(0.2, 0.2, 0.36, 3, 2);
    fed->Update(0.2, 0.0, 0.02, 1, 2);
  }
  const double big = data_bound.Update(0.2, 0.2, 0.36, 3, 2);
  const double small = fed->Update(0.2, 0.0, 0.02, 1, 2);
  EXPECT_DOUBLE_EQ(small, kMinShareCores);
  EXPECT_DOUBLE_EQ(big, 2 - kMinShareCores);
  EXPECT_EQ(fed->view().loaders, 2);
  EXPECT_EQ(fed->view().workers, 4);
  EXPECT_DOUBLE_EQ(fed->view().share_cores, small);
  // The fed consumer starts to wait: its share grows back to half within a
  // few ticks (the needs are judged on the last second).
  double now_fed = small;
  for (int tick = 0; tick < 20 && now_fed < 1; ++tick) {
    data_bound.Update(0.2, 0.2, 0.36, 3, 2);
    now_fed = fed->Update(0.2, 0.2, 0.3, 2, 2);
  }
  EXPECT_DOUBLE_EQ(now_fed, 1);
  // It leaves: the other has the whole budget at its next tick.
  fed.reset();
  EXPECT_DOUBLE_EQ(data_bound.Update(0.2, 0.2, 0.36, 3, 2), 2);
  EXPECT_EQ(data_bound.view().loaders, 1);
}

// A registry file removed under running loaders (a clean-up of /dev/shm):
// a loader made since registers in a new file at the path, and the running
// one joins it there, so that neither counts the whole budget as its own.
// One that could not open it (its lock busy a moment) joins a tick later.
TEST(NodeShareTest, ALoaderRejoinsARegistryRemovedUnderItOrBusyWhenItOpened) {
  testing::TempDir dir;
  const std::string path = dir / "reg";
  auto reopen = [path](bool* busy) { return NodeRegistry::Open(path, {}, busy); };
  auto first = reopen(nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  NodeShare old(std::move(*first), "", 0, 2, reopen);
  old.Update(0.2, 0.2, 0.3, 2, 2);
  ASSERT_EQ(::unlink(path.c_str()), 0);
  NodeShare late(nullptr, "node registry " + path + ": lock busy while opening", 1, 2, reopen);
  std::this_thread::sleep_for(std::chrono::duration<double>(NodeShare::kReopenS + 0.1));
  late.Update(0.2, 0.2, 0.3, 2, 2);  // opens the new file: alone there
  old.Update(0.2, 0.2, 0.3, 2, 2);   // sees its file gone and joins the new one
  late.Update(0.2, 0.2, 0.3, 2, 2);
  EXPECT_EQ(late.view().registry, path);
  EXPECT_EQ(old.view().loaders, 2);
  EXPECT_EQ(late.view().loaders, 2);
  EXPECT_DOUBLE_EQ(old.view().share_cores + late.view().share_cores, 2);
  EXPECT_EQ(late.view().note, "");
}

// An entry no loader writes (forged, damaged) is left out of the split and
// the node's figures: not NaN cores, nor a worker count that wraps the sum.
TEST(NodeShareTest, AnImplausibleEntryIsLeftOut) {
  testing::TempDir dir;
  auto forged = NodeRegistry::Open(dir / "reg");
  auto mine = NodeRegistry::Open(dir / "reg");
  ASSERT_TRUE(forged.ok() && mine.ok());
  NodeLoaderRecord bad;
  bad.workers = 1 << 30;
  bad.cpu_cores = std::numeric_limits<double>::quiet_NaN();
  bad.want_cores = std::numeric_limits<double>::quiet_NaN();
  NodeShare share(std::move(*mine), "", 0, 1);
  share.Update(0.2, 0.2, 0.3, 2, 2);
  // In this loader's CPU domain (read from its entry), where it would count.
  auto live = (*forged)->Publish(bad);
  ASSERT_TRUE(live.ok());
  for (const NodeLoader& l : *live) {
    if (!l.self) bad.domain = l.record.domain;
  }
  ASSERT_TRUE((*forged)->Publish(bad).ok());
  const double got = share.Update(0.2, 0.2, 0.3, 2, 2);
  EXPECT_EQ(share.view().loaders, 1);
  EXPECT_EQ(share.view().workers, 2);
  EXPECT_TRUE(std::isfinite(share.view().cpu_cores));
  EXPECT_DOUBLE_EQ(got, 2);
}

}  // namespace
// A loader with a fixed worker count is listed (for the monitor, with its
// rate and prefetch) but takes no share: the tuned loader beside it keeps
// the whole budget and counts only itself.
TEST(NodeShareTest, AFixedCountLoaderIsListedButNotSplitWith) {
  testing::TempDir dir;
  auto open = [&] {
    auto r = NodeRegistry::Open(dir / "reg");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  };
  NodeShare tuned(open(), "", 0, 1);
  NodeShare fixed(open(), "", 1, 1, {}, /*tuned=*/false);
  for (int tick = 0; tick < 3; ++tick) {
    fixed.Update(0.5, 0.25, 0.5, 4, 0, /*samples=*/500, /*prefetch=*/6);
    tuned.Update(0.5, 0.5, 0.5, 2, 2, 100, 3);
  }
  EXPECT_DOUBLE_EQ(tuned.Update(0.5, 0.5, 0.5, 2, 2, 100, 3), 2);
  EXPECT_EQ(tuned.view().loaders, 1);
  EXPECT_EQ(tuned.view().workers, 2);
  auto listed = NodeRegistry::Read(dir / "reg");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  for (const NodeLoader& l : *listed) {
    EXPECT_FALSE(l.self);
    if (l.record.tuned == 0) {
      EXPECT_EQ(l.record.local_rank, 1);
      EXPECT_EQ(l.record.workers, 4);
      EXPECT_EQ(l.record.prefetch_batches, 6);
      EXPECT_DOUBLE_EQ(l.record.samples_per_s, 1000);  // 500 per 0.5 s window
      EXPECT_DOUBLE_EQ(l.record.stall, 0.5);
    } else {
      EXPECT_EQ(l.record.prefetch_batches, 3);
      EXPECT_DOUBLE_EQ(l.record.samples_per_s, 200);
      EXPECT_DOUBLE_EQ(l.record.share_cores, 2);  // its share at the tick before
    }
  }
}

// A registry file truncated or overwritten under running loaders: they
// opened it again at their next tick (an emptied file is made anew and they
// meet there again), or, refused, fall back to the split by local ranks
// without a registry named; before, they kept a stale share for good.
TEST(NodeShareTest, ALoaderReopensARegistryDamagedUnderIt) {
  testing::TempDir dir;
  const std::string path = dir / "reg";
  auto reopen = [path](bool* busy) { return NodeRegistry::Open(path, {}, busy); };
  auto a_reg = reopen(nullptr);
  auto b_reg = reopen(nullptr);
  ASSERT_TRUE(a_reg.ok() && b_reg.ok());
  NodeShare a(std::move(*a_reg), "", 0, 2, reopen);
  NodeShare b(std::move(*b_reg), "", 1, 2, reopen);
  a.Update(0.2, 0.2, 0.3, 2, 2);
  b.Update(0.2, 0.2, 0.3, 2, 2);
  ASSERT_EQ(b.view().loaders, 2);
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  a.Update(0.2, 0.2, 0.3, 2, 2);  // makes the table anew, alone there
  b.Update(0.2, 0.2, 0.3, 2, 2);  // joins it
  a.Update(0.2, 0.2, 0.3, 2, 2);
  EXPECT_EQ(a.view().loaders, 2);
  EXPECT_EQ(b.view().loaders, 2);
  EXPECT_EQ(a.view().note, "");
  EXPECT_DOUBLE_EQ(a.view().share_cores + b.view().share_cores, 2);
  ASSERT_TRUE(testing::WriteFile(path, std::string(100, 'x')));  // another file's bytes
  const double share = a.Update(0.2, 0.2, 0.3, 2, 2);
  EXPECT_DOUBLE_EQ(share, 1);  // budget / LOCAL_WORLD_SIZE
  EXPECT_EQ(a.view().registry, "");
  EXPECT_NE(a.view().note.find(path), std::string::npos) << a.view().note;
}

}  // namespace stoker
