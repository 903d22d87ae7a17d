#include "engine/epoch_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace stoker {
namespace {

using Step = EpochScheduler::Step;
using Work = EpochScheduler::Work;

// A sample's byte and label, as a fake worker writes them: a function of
// (epoch, index) only, so any mix-up of positions, batches or epochs shows.
std::byte ByteOf(int64_t epoch, int64_t index) {
  return static_cast<std::byte>((index * 31 + epoch * 7) & 0xff);
}
int64_t LabelOf(int64_t epoch, int64_t index) { return index * 1000 + epoch; }

// Drives an EpochScheduler the way the loader's shell does, with workers,
// plan builders and the consumer interleaved at random, and checks after
// every operation what the loader promises: each epoch delivers every batch
// exactly once (in order when ordered) with the right samples, whatever the
// interleaving, resizes of the prefetch bound, epoch changes and restores;
// the prefetch bound holds; nothing gets stuck; no slot is leaked. Half the
// runs change the item count between epochs too (a kind's data set that
// grows or shrinks, empty epochs included), as the loader's shell does.
class SchedulerSim {
 public:
  explicit SchedulerSim(uint64_t seed) : rng_(seed) {
    plan_.num_samples = Uniform(1, 120);
    plan_.batch_size = Uniform(1, 13);
    plan_.shuffle = Coin();
    plan_.seed = rng_();
    plan_.world_size = static_cast<int>(Uniform(1, 3));
    plan_.rank = static_cast<int>(Uniform(0, plan_.world_size - 1));
    plan_.pad_shards = Coin() || plan_.num_samples < plan_.world_size;
    plan_.drop_last = Coin();
    if (!ValidatePlanOptions(plan_).ok() || PlanShape::Of(plan_).num_batches == 0) {
      plan_.drop_last = false;
    }
    vary_items_ = Coin();
    pool_ = std::make_unique<BatchPool>(SampleSpec{{1}, DType::kUInt8}, plan_.batch_size);
    Open(Uniform(0, 3));
  }

  void RandomOp() {
    const int64_t r = Uniform(0, 99);
    if (r < 25) {
      Claim();
    } else if (r < 50) {
      RunOneTask();
    } else if (r < 58) {
      FinishOneBuild();
    } else if (r < 82) {
      ConsumerStep();
    } else if (r < 85) {
      SetPrefetch();
    } else if (r < 87) {
      if (vary_items_ && Coin()) {
        SetEpochItems(Uniform(0, 4), Uniform(0, 120), Coin());
      } else {
        SetEpoch(Uniform(0, 4));
      }
    } else if (r < 92) {
      SaveState();
    } else if (r < 95) {
      RestoreSaved(/*fresh=*/false);
    } else if (r < 96) {
      RestoreSaved(/*fresh=*/true);
    } else if (r < 97) {
      RestoreGarbage();
    } else {
      CancelOneBuild();
    }
  }

  // Runs everything to the end of the current epoch; fails if nothing can move.
  void DrainEpoch() {
    const int64_t epoch = epoch_;
    int idle = 0;  // rounds in a row where nothing moved (an Advance that starts the epoch is one)
    for (int round = 0; epoch_ == epoch; ++round) {
      ASSERT_LT(round, 100000) << "no end";
      bool moved = false;
      while (!tasks_.empty()) moved |= RunOneTask();
      while (!builds_.empty()) moved |= FinishOneBuild();
      moved |= Claim();
      moved |= ConsumerStep();
      idle = moved || !tasks_.empty() || !builds_.empty() ? 0 : idle + 1;
      if (idle == 2) {
        FAIL() << "stuck in epoch " << epoch_ << " with " << sched_->open_batches() << " open, "
               << sched_->ready_batches() << " ready, depth " << sched_->depth() << ", ordered "
               << ordered_ << ", delivered " << delivered_.size() << " of " << Shape().num_batches;
      }
    }
  }

  // Abandons everything, finishes every task still out, and checks that every
  // slot went back.
  void CheckNoSlotKept() {
    builds_.clear();
    sched_->SetEpoch(1000);
    draining_ = true;
    for (bool returned = true; returned;) {
      while (!tasks_.empty()) RunOneTask();
      // A returned position is claimed before anything, its epoch abandoned or not.
      BatchTask task;
      returned = sched_->ClaimTask(1, &task).work == Work::kTask;
      if (returned) tasks_.push_back({task, 0});
    }
    EXPECT_EQ(sched_->open_batches(), 0);
    EXPECT_EQ(sched_->ready_batches(), 0);
  }

  int64_t epochs_done() const { return epochs_done_; }

 private:
  bool draining_ = false;  // CheckNoSlotKept: no position is returned any more
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Coin() { return Uniform(0, 1) == 1; }

  void Open(int64_t start_epoch) {
    EpochScheduler::Options o;
    o.plan = plan_;
    o.ordered = Coin();
    o.start_epoch = start_epoch;
    o.prefetch_batches = static_cast<int>(Uniform(1, 6));
    o.prefetch_bytes = static_cast<size_t>(Uniform(1, 8 * plan_.batch_size));
    tasks_.clear();
    builds_.clear();
    sched_.reset();  // slots still out die with their scheduler
    sched_ = std::make_unique<EpochScheduler>(o, pool_.get());
    ordered_ = o.ordered;
    epoch_ = start_epoch;
    items_ = plan_.num_samples;
    delivered_.clear();
  }

  // The plan with `items` items.
  PlanOptions PlanWith(int64_t items) const {
    PlanOptions plan = plan_;
    plan.num_samples = items;
    return plan;
  }
  // Of the epoch being delivered.
  PlanShape Shape() const { return PlanShape::Of(PlanWith(items_)); }

  const EpochPlan& PlanOf(int64_t epoch) {
    auto it = plans_.find({epoch, items_});
    if (it == plans_.end()) {
      it = plans_.emplace(std::pair{epoch, items_}, EpochPlan(PlanWith(items_), epoch)).first;
    }
    return it->second;
  }

  bool Claim() {
    BatchTask task;
    const int threads = static_cast<int>(Uniform(1, 8));
    const int open_before = sched_->open_batches();
    const auto claim = sched_->ClaimTask(threads, &task);
    if (claim.work == Work::kBuild) builds_.push_back({claim.epoch, sched_->plan().num_samples});
    if (claim.work == Work::kWait && Coin() && sched_->ClaimHelp(&task)) {
      // A worker with nothing to claim helps a running task.
      EXPECT_GE(task.cursor->end() - task.offset, task.length);
      tasks_.push_back({task, 0});
      return true;
    }
    if (claim.work != Work::kTask) return claim.work == Work::kBuild;
    EXPECT_GE(task.length, 1);
    EXPECT_LE(task.offset + task.length, task.slot->length());
    EXPECT_EQ(task.cursor->end(), task.offset + task.length);
    if (sched_->open_batches() > open_before) {  // it opened a batch: under the bound
      EXPECT_LE(sched_->open_batches(), sched_->depth());
    }
    tasks_.push_back({task, 0});
    return true;
  }

  // A worker (owner or helper) takes a few of its task's positions, and
  // counts its own once the cursor is exhausted.
  bool RunOneTask() {
    if (tasks_.empty()) return false;
    const size_t i = static_cast<size_t>(Uniform(0, static_cast<int64_t>(tasks_.size()) - 1));
    auto& [task, produced] = tasks_[i];
    BatchSlot* slot = task.slot;
    const EpochPlan& plan = *task.plan;
    bool exhausted = false;
    for (int64_t n = Uniform(1, 3); n > 0; --n) {
      const int64_t p = task.cursor->Take();
      if (p >= task.cursor->end()) {
        exhausted = true;
        break;
      }
      EXPECT_GE(p, task.offset);
      if (slot->abandoned() && Coin()) {
        // Its epoch was abandoned: the worker stops the item unmade
        // (ItemOutcome::dropped), and the loader counts it and the rest of
        // the task done, never handing them on.
        ++produced;
        while (task.cursor->Take() < task.cursor->end()) ++produced;
        exhausted = true;
        break;
      }
      if (!draining_ && task.cursor->left() == 0 && Uniform(0, 9) == 0) {
        // Its worker leaves mid-item (ItemOutcome::yielded): the position
        // goes back, to be claimed again before anything else.
        sched_->Return(task, p);
        exhausted = true;
        break;
      }
      const int64_t index = plan.sample(plan.batch_begin(slot->batch()) + p);
      slot->sample(p)[0] = ByteOf(plan.epoch(), index);
      slot->Put(p, index, LabelOf(plan.epoch(), index));
      ++produced;
    }
    if (!exhausted) return true;
    if (produced > 0 && slot->Done(produced)) sched_->Complete(slot);
    tasks_.erase(tasks_.begin() + static_cast<ptrdiff_t>(i));
    return true;
  }

  bool FinishOneBuild() {
    if (builds_.empty()) return false;
    const size_t i = static_cast<size_t>(Uniform(0, static_cast<int64_t>(builds_.size()) - 1));
    // Built from the count when it was asked for, which may have changed since.
    const auto [epoch, items] = builds_[i];
    builds_.erase(builds_.begin() + static_cast<ptrdiff_t>(i));
    auto unwanted = sched_->Offer(EpochScheduler::Prepare(PlanWith(items), epoch));
    return true;
  }

  void CancelOneBuild() {
    if (builds_.empty()) return;
    sched_->CancelBuild(builds_.back().first);
    builds_.pop_back();
  }

  bool ConsumerStep() {
    const auto next = sched_->Advance();
    switch (next.step) {
      case Step::kBuild:
        EXPECT_EQ(next.epoch, epoch_);
        builds_.push_back({next.epoch, sched_->plan().num_samples});
        return true;
      case Step::kWait:
        return false;
      case Step::kEndOfEpoch:
        EXPECT_EQ(static_cast<int64_t>(delivered_.size()), Shape().num_batches)
            << "epoch " << epoch_ << " ended early";
        sched_->EndEpoch();
        ++epoch_;
        items_ = plan_.num_samples;
        ++epochs_done_;
        delivered_.clear();
        EXPECT_EQ(sched_->epoch(), epoch_);
        return true;
      case Step::kDeliver:
        CheckDelivered(sched_->Deliver());
        return true;
    }
    return false;
  }

  void CheckDelivered(std::unique_ptr<BatchSlot> slot) {
    const int64_t b = slot->batch();
    EXPECT_FALSE(slot->abandoned()) << "batch " << b << " of epoch " << epoch_;
    EXPECT_EQ(slot->epoch(), epoch_);
    EXPECT_EQ(sched_->epoch(), epoch_);
    EXPECT_TRUE(delivered_.insert(b).second) << "batch " << b << " of epoch " << epoch_ << " twice";
    if (ordered_) {
      int64_t first_missing = 0;
      while (delivered_.count(first_missing) != 0 && first_missing != b) ++first_missing;
      EXPECT_EQ(first_missing, b) << "out of order";
    }
    const EpochPlan& plan = PlanOf(epoch_);
    ASSERT_EQ(slot->count(), plan.batch_length(b));
    for (int64_t p = 0; p < slot->count(); ++p) {
      const int64_t index = plan.sample(plan.batch_begin(b) + p);
      ASSERT_EQ(slot->indices()[static_cast<size_t>(p)], index);
      ASSERT_EQ(slot->labels()[static_cast<size_t>(p)], LabelOf(epoch_, index));
      ASSERT_EQ(slot->data()[static_cast<size_t>(p)], ByteOf(epoch_, index));
    }
    pool_->Release(std::move(slot));
  }

  void SetPrefetch() {
    sched_->SetPrefetch(static_cast<int>(Uniform(1, 6)),
                        static_cast<size_t>(Uniform(1, 8 * plan_.batch_size)));
    EXPECT_GE(sched_->depth(), 1);
  }

  void SetEpoch(int64_t epoch) {
    sched_->SetEpoch(epoch);
    epoch_ = epoch;
    items_ = plan_.num_samples;
    delivered_.clear();
    EXPECT_EQ(sched_->epoch(), epoch);
  }

  // As the loader's SetEpoch with an item count: what was made ahead for
  // `epoch` from another count (or, without `keep_ahead`, at all) is dropped.
  void SetEpochItems(int64_t epoch, int64_t items, bool keep_ahead) {
    sched_->SetItems(items);
    sched_->SetEpoch(epoch, keep_ahead);
    plan_.num_samples = items_ = items;
    epoch_ = epoch;
    delivered_.clear();
    EXPECT_EQ(sched_->epoch(), epoch);
    EXPECT_EQ(sched_->shape().num_batches, Shape().num_batches);
  }

  // The checkpoint must say exactly which batches of which epoch were delivered.
  void SaveState() {
    LoaderState s = sched_->State();
    std::set<int64_t> described;
    for (int64_t b = 0; b < s.position; ++b) described.insert(b);
    described.insert(s.beyond.begin(), s.beyond.end());
    // An epoch whose end was asked for checkpoints as the next one's start;
    // one all delivered but not yet ended (or empty, not yet started), as itself.
    const int64_t batches = Shape().num_batches;
    if (static_cast<int64_t>(delivered_.size()) == batches && s.epoch != epoch_) {
      EXPECT_EQ(s.epoch, epoch_ + 1);
      EXPECT_TRUE(described.empty());
      EXPECT_EQ(s.num_samples, plan_.num_samples);  // the next one's count
      saved_ = {s, {}};
    } else {
      EXPECT_EQ(s.epoch, epoch_);
      EXPECT_EQ(described, delivered_);
      EXPECT_EQ(s.num_samples, items_);  // the epoch's own count
      saved_ = {s, delivered_};
    }
    EXPECT_EQ(s.seed, plan_.seed);
    EXPECT_EQ(s.batch_size, plan_.batch_size);
    EXPECT_EQ(s.shuffle, plan_.shuffle);
    EXPECT_EQ(s.drop_last, plan_.drop_last);
    EXPECT_EQ(s.rank, plan_.rank);
    EXPECT_EQ(s.world_size, plan_.world_size);
    EXPECT_EQ(s.pad_shards, plan_.pad_shards);
  }

  void RestoreSaved(bool fresh) {
    if (!saved_) return;
    if (fresh) Open(Uniform(0, 5));
    ASSERT_TRUE(sched_->Restore(saved_->first, vary_items_).ok());
    plan_.num_samples = items_ = saved_->first.num_samples;
    epoch_ = saved_->first.epoch;
    delivered_ = saved_->second;
    EXPECT_EQ(sched_->epoch(), epoch_);
    LoaderState again = sched_->State();  // a checkpoint of a pending restore is that restore
    EXPECT_EQ(again.epoch, saved_->first.epoch);
    EXPECT_EQ(again.position, saved_->first.position);
  }

  // A foreign or corrupt checkpoint is refused and changes nothing; one of
  // another plan is refused naming the field that differs.
  void RestoreGarbage() {
    LoaderState before = sched_->State();
    LoaderState bad = before;
    const int64_t batches = PlanShape::Of(PlanWith(before.num_samples)).num_batches;
    std::string field;
    switch (Uniform(0, 11)) {
      case 0:
        bad.seed ^= 1;
        field = "seed";
        break;
      case 1:
        bad.epoch = -1;
        break;
      case 2:
        bad.position = batches + 1;
        break;
      case 3:  // a batch outside the epoch, or one listed twice
        bad.beyond.push_back(!bad.beyond.empty() && Uniform(0, 1) ? bad.beyond.front() : batches);
        break;
      case 4:
        if (vary_items_) {  // a checkpoint's num_samples is its epoch's own: any is taken
          bad.seed ^= 2;
          field = "seed";
          break;
        }
        bad.num_samples += Uniform(1, 3);
        field = "num_samples";
        break;
      case 5:
        bad.batch_size += Uniform(1, 3);
        field = "batch_size";
        break;
      case 6:
        bad.shuffle = !bad.shuffle;
        field = "shuffle";
        break;
      case 7:
        bad.drop_last = !bad.drop_last;
        field = "drop_last";
        break;
      case 8:
        bad.rank = (bad.rank + 1) % (bad.world_size + 1);
        field = "rank";
        break;
      case 9:
        bad.world_size += 1;
        field = "world_size";
        break;
      case 10:
        bad.pad_shards = !bad.pad_shards;
        field = "pad_shards";
        break;
      default:  // several fields at once: the first is named
        bad.batch_size += 1;
        bad.world_size += 1;
        field = "batch_size";
        break;
    }
    const Status st = sched_->Restore(bad, vary_items_);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    if (!field.empty()) {
      EXPECT_NE(st.message().find("checkpoint's " + field + " "), std::string::npos)
          << st.message();
    }
    LoaderState after = sched_->State();
    EXPECT_EQ(after.epoch, before.epoch);
    EXPECT_EQ(after.position, before.position);
    EXPECT_EQ(after.beyond, before.beyond);
  }

  std::mt19937_64 rng_;
  PlanOptions plan_;  // as the scheduler's plan(): num_samples is the next epochs' count
  bool vary_items_ = false;
  int64_t items_ = 0;  // the count of the epoch being delivered
  std::unique_ptr<BatchPool> pool_;
  std::unique_ptr<EpochScheduler> sched_;
  bool ordered_ = true;
  std::map<std::pair<int64_t, int64_t>, EpochPlan> plans_;  // by epoch and count
  // Claimed or joined, not yet finished, with the positions each produced.
  std::vector<std::pair<BatchTask, int64_t>> tasks_;
  // Plans asked for, not yet offered: epoch, and the count then.
  std::vector<std::pair<int64_t, int64_t>> builds_;
  int64_t epoch_ = 0;            // the epoch being delivered
  std::set<int64_t> delivered_;  // its batches delivered so far
  int64_t epochs_done_ = 0;
  std::optional<std::pair<LoaderState, std::set<int64_t>>> saved_;
};

TEST(EpochSchedulerTest, RandomInterleavingsKeepEveryPromise) {
  int64_t epochs = 0;
  for (uint64_t seed = 1; seed <= 1000; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    SchedulerSim sim(seed);
    for (int op = 0; op < 3000 && !::testing::Test::HasFatalFailure(); ++op) sim.RandomOp();
    sim.DrainEpoch();
    sim.DrainEpoch();  // and the next one, from its look-ahead
    sim.CheckNoSlotKept();
    epochs += sim.epochs_done();
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(epochs, 2000);  // the random operations finished epochs, not only the drains
}

PlanOptions SmallPlan() { return {.num_samples = 10, .batch_size = 4, .shuffle = false}; }

TEST(EpochSchedulerTest, AsksForEachPlanOnceAndNotBeforeTheFirstEpoch) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan()}, &pool);
  BatchTask task;
  // Workers do not start before the consumer does.
  EXPECT_EQ(s.ClaimTask(2, &task).work, Work::kWait);
  auto next = s.Advance();
  ASSERT_EQ(next.step, Step::kBuild);
  EXPECT_EQ(next.epoch, 0);
  EXPECT_EQ(s.Advance().step, Step::kWait);  // being built: not asked twice
  EXPECT_EQ(s.ClaimTask(2, &task).work, Work::kWait);
  EXPECT_EQ(s.Offer(EpochScheduler::Prepare(SmallPlan(), 0)), nullptr);
  EXPECT_EQ(s.ClaimTask(2, &task).work, Work::kTask);
}

TEST(EpochSchedulerTest, PlanForAnEpochNoLongerWantedIsHandedBack) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan()}, &pool);
  ASSERT_EQ(s.Advance().step, Step::kBuild);
  s.SetEpoch(5);
  EXPECT_NE(s.Offer(EpochScheduler::Prepare(SmallPlan(), 0)), nullptr);
  auto next = s.Advance();
  ASSERT_EQ(next.step, Step::kBuild);
  EXPECT_EQ(next.epoch, 5);
}

TEST(EpochSchedulerTest, LooksAheadOnceTheEpochIsFullyClaimed) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 8}, &pool);
  ASSERT_EQ(s.Advance().step, Step::kBuild);
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  ASSERT_EQ(s.Advance().step, Step::kWait);
  BatchTask task;
  for (int b = 0; b < 3; ++b) ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kTask);
  auto claim = s.ClaimTask(1, &task);
  ASSERT_EQ(claim.work, Work::kBuild);
  EXPECT_EQ(claim.epoch, 1);
  // Items of the look-ahead epoch in progress: their workers may wait for
  // it to start, so no position should be handed back to them now.
  EXPECT_FALSE(s.AheadInProgress());
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 1));
  ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kTask);
  EXPECT_EQ(task.slot->epoch(), 1);
  EXPECT_TRUE(s.AheadInProgress());
  while (task.cursor->Take() < task.cursor->end()) {
  }
  ASSERT_TRUE(task.slot->Done(task.length));
  EXPECT_EQ(s.Complete(task.slot), EpochScheduler::Completed::kAhead);
  EXPECT_FALSE(s.AheadInProgress());  // made: nobody waits on it
}

TEST(EpochSchedulerTest, PrefetchBoundCountsAbandonedBatchesStillBeingWritten) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 1}, &pool);
  s.Advance();
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  ASSERT_EQ(s.Advance().step, Step::kWait);
  BatchTask task;
  ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kTask);
  s.SetEpoch(0);  // abandoned while its task runs
  ASSERT_EQ(s.Advance().step, Step::kBuild);
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  BatchTask other;
  EXPECT_EQ(s.ClaimTask(1, &other).work, Work::kWait);  // its buffer is still in use
  EXPECT_EQ(s.open_batches(), 1);
  ASSERT_TRUE(task.slot->Done(task.length));
  EXPECT_EQ(s.Complete(task.slot), EpochScheduler::Completed::kReleased);
  EXPECT_EQ(s.ClaimTask(1, &other).work, Work::kTask);
}

TEST(EpochSchedulerTest, OutputsOutsideThePoolKeepTheLookAheadWithinItsBytes) {
  // A worker process's batch lies in a segment of its own, not the pool's
  // buffer: 2 batches a worker of 16 MiB each passed a 256 MiB budget.
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 8, .look_ahead_bytes = 100}, &pool);
  EXPECT_EQ(s.depth(), 8);  // nothing measured yet
  s.SetItemBytes(10);       // 40 bytes a batch of 4: two fit in 100
  EXPECT_EQ(s.depth(), 2);
  s.SetItemBytes(1000);  // one batch always
  EXPECT_EQ(s.depth(), 1);
  s.SetItemBytes(0);
  EXPECT_EQ(s.depth(), 8);
  EpochScheduler unbounded({.plan = SmallPlan(), .prefetch_batches = 8}, &pool);
  unbounded.SetItemBytes(1000);
  EXPECT_EQ(unbounded.depth(), 8);
}

TEST(EpochSchedulerTest, AnIdleWorkerHelpsTheEarliestRunningTaskAndEachPositionGoesOnce) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 2}, &pool);
  s.Advance();
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  ASSERT_EQ(s.Advance().step, Step::kWait);
  BatchTask owner, later;
  ASSERT_EQ(s.ClaimTask(1, &owner).work, Work::kTask);  // one worker: the whole batch
  ASSERT_EQ(owner.length, 4);
  ASSERT_EQ(s.ClaimTask(1, &later).work, Work::kTask);  // batch 1
  BatchTask helper;
  ASSERT_EQ(s.ClaimTask(2, &helper).work, Work::kWait);  // the prefetch bound: nothing new
  ASSERT_TRUE(s.ClaimHelp(&helper));  // batch 0's task: delivery waits for it first
  EXPECT_EQ(helper.slot, owner.slot);
  EXPECT_EQ(helper.cursor, owner.cursor);
  // The two take positions in turn; each is handed out once.
  std::set<int64_t> taken;
  int64_t by_owner = 0, by_helper = 0;
  for (int i = 0; i < 3; ++i) {
    for (auto [task, count] : {std::pair{&owner, &by_owner}, std::pair{&helper, &by_helper}}) {
      const int64_t p = task->cursor->Take();
      if (p >= task->cursor->end()) continue;
      EXPECT_TRUE(taken.insert(p).second) << p;
      task->slot->Put(p, p, p);
      ++*count;
    }
  }
  EXPECT_EQ(taken, (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(by_owner, 2);
  EXPECT_EQ(by_helper, 2);
  EXPECT_FALSE(owner.slot->Done(by_owner));
  ASSERT_TRUE(helper.slot->Done(by_helper));  // the batch completes once, on the last count
  EXPECT_EQ(s.Complete(helper.slot), EpochScheduler::Completed::kDeliverable);
  while (later.cursor->Take() < later.cursor->end()) {
  }
  BatchTask none;
  EXPECT_FALSE(s.ClaimHelp(&none));  // nothing left to help
}

TEST(EpochSchedulerTest, ATaskClaimedByASmallerPoolIsSharedBeforeMoreIsOpened) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 2}, &pool);
  s.Advance();
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  ASSERT_EQ(s.Advance().step, Step::kWait);
  BatchTask owner;
  ASSERT_EQ(s.ClaimTask(1, &owner).work, Work::kTask);  // alone: the whole batch
  ASSERT_EQ(owner.length, 4);
  // The pool grew to 4: a chunk is now 8 / (2 x 4) = 1 position, and the
  // owner's 4 left are over twice that.
  BatchTask joined;
  ASSERT_EQ(s.ClaimTask(4, &joined).work, Work::kTask);
  EXPECT_EQ(joined.cursor, owner.cursor);
  EXPECT_EQ(s.open_batches(), 1);
  EXPECT_EQ(owner.cursor->Take(), 0);
  EXPECT_EQ(joined.cursor->Take(), 1);
  // 2 left: no longer over twice a chunk, so the next claim opens batch 1.
  BatchTask fresh;
  ASSERT_EQ(s.ClaimTask(4, &fresh).work, Work::kTask);
  EXPECT_NE(fresh.cursor, owner.cursor);
  EXPECT_EQ(fresh.slot->batch(), 1);
  EXPECT_EQ(fresh.length, 1);
}

TEST(EpochSchedulerTest, AWholeClaimGetsTheRestOfABatchAndJoinsNoTask) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 2}, &pool);
  s.Advance();
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  ASSERT_EQ(s.Advance().step, Step::kWait);
  BatchTask owner;
  ASSERT_EQ(s.ClaimTask(1, &owner).work, Work::kTask);  // alone: the whole batch 0
  // With 4 threads a chunk is 1 and the owner's 4 left would be shared; a
  // whole claim opens batch 1 instead, all of it.
  BatchTask whole;
  ASSERT_EQ(s.ClaimTask(4, &whole, /*whole=*/true).work, Work::kTask);
  EXPECT_NE(whole.cursor, owner.cursor);
  EXPECT_EQ(whole.slot->batch(), 1);
  EXPECT_EQ(whole.length, 4);
}

TEST(EpochSchedulerTest, TasksOfAnAbandonedEpochGetNoHelp) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 1}, &pool);
  s.Advance();
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  ASSERT_EQ(s.Advance().step, Step::kWait);
  BatchTask owner;
  ASSERT_EQ(s.ClaimTask(1, &owner).work, Work::kTask);
  s.SetEpoch(3);
  BatchTask helper;
  EXPECT_FALSE(s.ClaimHelp(&helper));
}

TEST(EpochSchedulerTest, ACheckpointOfAnotherPlanIsRefusedNamingTheFieldAndBothValues) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  PlanOptions plan = SmallPlan();
  plan.batch_size = 64;
  plan.num_samples = 300;
  EpochScheduler s({.plan = plan}, &pool);
  LoaderState state = s.State();
  EXPECT_EQ(state.batch_size, 64);
  EXPECT_EQ(state.num_samples, 300);
  state.batch_size = 32;
  state.position = 1;
  Status st = s.Restore(state);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "checkpoint's batch_size 32 differs from this loader's 64");
  state = s.State();
  state.shuffle = !plan.shuffle;
  EXPECT_EQ(s.Restore(state).message(),
            std::string("checkpoint's shuffle ") + (plan.shuffle ? "false" : "true") +
                " differs from this loader's " + (plan.shuffle ? "true" : "false"));
  // Refused: nothing changed, the epoch starts from its beginning.
  EXPECT_EQ(s.State().position, 0);
  ASSERT_EQ(s.Advance().step, Step::kBuild);
}

// Delivers the epoch due with one worker, building its plans from plan();
// returns the batches it had.
int64_t DeliverEpoch(EpochScheduler& s, BatchPool& pool) {
  int64_t delivered = 0;
  while (true) {
    const auto next = s.Advance();
    if (next.step == Step::kBuild) {
      EXPECT_EQ(s.Offer(EpochScheduler::Prepare(s.plan(), next.epoch)), nullptr);
    } else if (next.step == Step::kDeliver) {
      pool.Release(s.Deliver());
      ++delivered;
    } else if (next.step == Step::kEndOfEpoch) {
      s.EndEpoch();
      return delivered;
    } else {
      BatchTask task;
      const auto claim = s.ClaimTask(1, &task);
      if (claim.work == Work::kBuild) {
        EXPECT_EQ(s.Offer(EpochScheduler::Prepare(s.plan(), claim.epoch)), nullptr);
        continue;
      }
      EXPECT_EQ(claim.work, Work::kTask);
      if (claim.work != Work::kTask) return -1;
      while (task.cursor->Take() < task.cursor->end()) {
      }
      if (task.slot->Done(task.length)) s.Complete(task.slot);
    }
  }
}

// SetEpoch marks the batches of the epoch it abandons that workers still
// write (their items may stop: ItemOutcome::abandoned), never those of the
// look-ahead epoch it keeps; a marked batch whose positions are dropped
// unmade goes back to the pool, and the kept epoch comes whole.
TEST(EpochSchedulerTest, SetEpochMarksTheAbandonedEpochsBatchesAndNotTheKeptLookAhead) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 8}, &pool);
  s.Advance();
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 0));
  ASSERT_EQ(s.Advance().step, Step::kWait);
  std::vector<BatchTask> old(3);
  for (BatchTask& task : old) ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kTask);
  BatchTask ahead;
  ASSERT_EQ(s.ClaimTask(1, &ahead).work, Work::kBuild);
  s.Offer(EpochScheduler::Prepare(SmallPlan(), 1));
  ASSERT_EQ(s.ClaimTask(1, &ahead).work, Work::kTask);
  ASSERT_EQ(ahead.slot->epoch(), 1);
  for (const BatchTask& task : old) EXPECT_FALSE(task.slot->abandoned());

  s.SetEpoch(1);  // epoch 0 abandoned, its look-ahead kept
  for (const BatchTask& task : old) EXPECT_TRUE(task.slot->abandoned());
  EXPECT_FALSE(ahead.slot->abandoned());
  for (BatchTask& task : old) {  // their workers drop them unmade
    while (task.cursor->Take() < task.cursor->end()) {
    }
    ASSERT_TRUE(task.slot->Done(task.length));
    EXPECT_EQ(s.Complete(task.slot), EpochScheduler::Completed::kReleased);
  }
  EXPECT_EQ(s.open_batches(), 1);  // the kept one
  while (ahead.cursor->Take() < ahead.cursor->end()) {
  }
  ASSERT_TRUE(ahead.slot->Done(ahead.length));
  EXPECT_EQ(s.Complete(ahead.slot), EpochScheduler::Completed::kAhead);
  EXPECT_EQ(DeliverEpoch(s, pool), 3);
  EXPECT_EQ(s.open_batches(), 0);
}

TEST(EpochSchedulerTest, TheItemCountChangesBetweenEpochsAndALookAheadOfTheOldOneIsDropped) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 8}, &pool);
  EXPECT_EQ(DeliverEpoch(s, pool), 3);  // 10 items in 4s
  // The workers start epoch 1 ahead with the old count.
  BatchTask task;
  auto claim = s.ClaimTask(1, &task);
  ASSERT_EQ(claim.work, Work::kBuild);
  ASSERT_EQ(s.Offer(EpochScheduler::Prepare(s.plan(), 1)), nullptr);
  ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kTask);
  s.SetItems(18);
  s.SetEpoch(1);
  EXPECT_EQ(s.shape().num_batches, 5);
  ASSERT_TRUE(task.slot->Done(task.length));
  EXPECT_EQ(s.Complete(task.slot), EpochScheduler::Completed::kReleased);
  EXPECT_EQ(DeliverEpoch(s, pool), 5);
  EXPECT_EQ(DeliverEpoch(s, pool), 5);  // and the epochs after it
  s.SetItems(3);
  s.SetEpoch(3);
  EXPECT_EQ(DeliverEpoch(s, pool), 1);
  s.SetItems(0);
  s.SetEpoch(4);
  EXPECT_EQ(DeliverEpoch(s, pool), 0);  // an empty epoch ends at once
  EXPECT_EQ(s.open_batches(), 0);
}

TEST(EpochSchedulerTest, APlanBuiltBeforeTheCountChangedIsHandedBack) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan()}, &pool);
  ASSERT_EQ(s.Advance().step, Step::kBuild);
  const PlanOptions old = s.plan();
  s.SetItems(20);
  EXPECT_NE(s.Offer(EpochScheduler::Prepare(old, 0)), nullptr);
  ASSERT_EQ(s.Advance().step, Step::kBuild);  // asked for again, with the new count
  EXPECT_EQ(s.Offer(EpochScheduler::Prepare(s.plan(), 0)), nullptr);
  EXPECT_EQ(DeliverEpoch(s, pool), 5);
}

TEST(EpochSchedulerTest, WithoutKeepAheadWhatWasMadeAheadForTheEpochIsDropped) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan(), .prefetch_batches = 8}, &pool);
  DeliverEpoch(s, pool);
  BatchTask task;
  ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kBuild);
  s.Offer(EpochScheduler::Prepare(s.plan(), 1));
  ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kTask);
  ASSERT_TRUE(task.slot->Done(task.length));
  EXPECT_EQ(s.Complete(task.slot), EpochScheduler::Completed::kAhead);
  s.SetEpoch(1, /*keep_ahead=*/false);  // same count, other lists
  EXPECT_EQ(s.open_batches(), 0);
  EXPECT_EQ(DeliverEpoch(s, pool), 3);
}

TEST(EpochSchedulerTest, ACheckpointCarriesItsEpochsCountWhichARestoreOfVaryingCountsTakes) {
  BatchPool pool({{1}, DType::kUInt8}, 4);
  EpochScheduler s({.plan = SmallPlan()}, &pool);
  ASSERT_EQ(s.Advance().step, Step::kBuild);
  s.Offer(EpochScheduler::Prepare(s.plan(), 0));
  BatchTask task;
  ASSERT_EQ(s.ClaimTask(1, &task).work, Work::kTask);
  ASSERT_TRUE(task.slot->Done(task.length));
  s.Complete(task.slot);
  ASSERT_EQ(s.Advance().step, Step::kDeliver);
  pool.Release(s.Deliver());
  s.SetItems(30);  // for the epochs after this one
  const LoaderState state = s.State();
  EXPECT_EQ(state.num_samples, 10);
  EXPECT_EQ(state.position, 1);

  PlanOptions other = SmallPlan();
  other.num_samples = 30;
  EpochScheduler fresh({.plan = other}, &pool);
  EXPECT_EQ(fresh.Restore(state).message(),
            "checkpoint's num_samples 10 differs from this loader's 30");
  ASSERT_TRUE(fresh.Restore(state, /*items_vary=*/true).ok());
  EXPECT_EQ(fresh.plan().num_samples, 10);
  EXPECT_EQ(DeliverEpoch(fresh, pool), 2);  // batches 1 and 2 of 3
}

}  // namespace
}  // namespace stoker
