#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/batch_pool.h"
#include "plan/epoch_plan.h"
#include "stoker/loader.h"
#include "stoker/status.h"

namespace stoker {

/// Where a claimed run of positions stands. Its positions are taken one at a
/// time, by the worker that claimed it and by idle workers that help it, so
/// that one slow run (a worker descheduled, reads queued at a saturated
/// store) cannot hold up its batch while others have nothing to do.
class TaskCursor {
 public:
  TaskCursor(int64_t begin, int64_t end) : next_(begin), end_(end) {}
  /// The next position to produce, each one to exactly one caller;
  /// >= end() once the run is exhausted.
  int64_t Take() { return next_.fetch_add(1, std::memory_order_relaxed); }
  int64_t end() const { return end_; }
  int64_t left() const {
    return std::max<int64_t>(0, end_ - next_.load(std::memory_order_relaxed));
  }

 private:
  std::atomic<int64_t> next_;
  const int64_t end_;
};

/// A claimed run of consecutive positions of one batch, [offset, offset +
/// length), or a share in another worker's (ClaimHelp). Positions are taken
/// from `cursor`; whoever takes some counts them Done on the slot.
struct BatchTask {
  std::shared_ptr<const EpochPlan> plan;
  BatchSlot* slot = nullptr;
  std::shared_ptr<TaskCursor> cursor;
  int64_t offset = 0;
  int64_t length = 0;
};

/// One epoch being produced: its plan and where claiming and delivery stand.
/// Made by EpochScheduler::Prepare (O(samples), outside any lock), then owned
/// by the scheduler.
class EpochRun {
 public:
  explicit EpochRun(std::shared_ptr<const EpochPlan> plan);

  int64_t epoch() const { return plan_->epoch(); }
  int64_t num_batches() const { return plan_->num_batches(); }
  /// PlanOptions::num_samples of the plan it was built from.
  int64_t items() const { return items_; }

 private:
  friend class EpochScheduler;
  struct OpenBatch {
    int64_t batch = 0;
    std::unique_ptr<BatchSlot> slot;
    bool ready = false;
  };

  bool fully_claimed() const { return claim_batch_ >= num_batches(); }
  bool finished() const { return delivered_count_ == num_batches(); }
  bool delivered(int64_t b) const { return delivered_[static_cast<size_t>(b)] != 0; }
  void SkipDeliveredClaims();
  OpenBatch* Find(const BatchSlot* slot);

  std::shared_ptr<const EpochPlan> plan_;
  int64_t items_ = 0;
  std::vector<uint8_t> delivered_;  // by batch
  std::vector<OpenBatch> open_;     // started, not delivered; in batch order
  std::deque<int64_t> ready_;       // unordered delivery: batches as they finished
  int64_t delivered_count_ = 0;
  int64_t prefix_ = 0;  // batches [0, prefix_) all delivered
  int64_t claim_batch_ = 0;
  int64_t claim_offset_ = 0;
};

/// Where the epochs stand, as a pure single-threaded state machine (no
/// clocks, no threads, no waiting): which positions a worker claims next,
/// which batch the consumer may take, the prefetch bound, epoch changes and
/// checkpoints. The loader's shell calls it under its mutex and does all
/// waiting, building and running of tasks outside.
///
/// It keeps the epoch being delivered and, once that one is fully claimed,
/// the next one (look-ahead), so workers never idle at an epoch boundary.
/// Building an epoch's order is O(samples): the scheduler asks for it
/// (kBuild), the asking thread builds it with Prepare() without the lock and
/// hands it back with Offer(). Not thread-safe.
/// InvalidArgument naming `what` unless 0 <= epoch <= kMaxEpoch: the rule
/// for a start_epoch, a SetEpoch and a checkpoint's epoch alike.
Status CheckEpoch(const std::string& what, int64_t epoch);

class EpochScheduler {
 public:
  struct Options {
    PlanOptions plan;  // REQUIRES: ValidatePlanOptions(plan).ok()
    bool ordered = true;
    int64_t start_epoch = 0;
    int prefetch_batches = 4;
    size_t prefetch_bytes = size_t{1} << 30;
    /// Bytes the look-ahead's item outputs may hold outside the pool's
    /// buffers (WorkerKind::output_bytes; 0: no bound): half the budget.
    size_t look_ahead_bytes = 0;
  };
  /// `pool` supplies and takes back batch slots; it must outlive the scheduler.
  EpochScheduler(const Options& options, BatchPool* pool);
  /// Gives every slot it still holds back to the pool. REQUIRES: no worker
  /// writes to one any more.
  ~EpochScheduler();
  EpochScheduler(const EpochScheduler&) = delete;
  EpochScheduler& operator=(const EpochScheduler&) = delete;

  /// The plan of the epochs started from now on (SetItems changes its count).
  const PlanOptions& plan() const { return plan_; }
  /// The shape of the epoch in progress, else of the next one.
  const PlanShape& shape() const { return cur_ != nullptr ? cur_->plan_->shape() : shape_; }

  /// What a worker (or the consumer, when there are no workers) does next.
  enum class Work {
    kTask,   // run the claimed task, then Done() its positions
    kBuild,  // build epoch `epoch` with Prepare(), then Offer() it
    kWait,   // nothing claimable now
  };
  struct Claim {
    Work work = Work::kWait;
    int64_t epoch = 0;  // for kBuild
  };
  /// Claims the next run of positions: from the epoch being delivered, or
  /// once that is fully claimed from the next one. Opening a batch needs room
  /// under the prefetch bound. Chunks shrink when many of `threads` share a
  /// small window, so that every worker finds work; with few a task is a
  /// whole batch. A running task more than twice as long as a chunk now
  /// (claimed while the pool was smaller) is shared first. `whole`: the
  /// claimer makes its tasks at once (a remote slot): it gets the rest of a
  /// batch, never a chunk or a share.
  Claim ClaimTask(int threads, BatchTask* task, bool whole = false);
  /// For a worker that found nothing to claim: a share in the running task
  /// of the earliest batch that has positions left (the batch delivery
  /// waits for first); false when none has. The positions it takes are its
  /// own, like a claimed task's.
  bool ClaimHelp(BatchTask* task);
  /// Position `position` of `task`, which its worker took but left unmade
  /// (it yielded the item to leave the pool: ItemOutcome::yielded), is
  /// claimable again, before any other, as a task of its own; an abandoned
  /// epoch's too (its slot goes back to the pool once that task ends).
  void Return(const BatchTask& task, int64_t position);
  /// Whether items of the look-ahead epoch are being made: their workers may
  /// wait for that epoch to start (a kind's batch list), so a position
  /// returned now might find no worker free to claim it.
  bool AheadInProgress() const;
  /// A worker committed to leave mid-item (it may yield it): until it ends
  /// (HandOverEnds, after Return if it yielded), no look-ahead item is
  /// claimed, so a worker stays free to continue the item handed over.
  void HandOverBegins() { ++handing_over_; }
  void HandOverEnds() { --handing_over_; }

  /// Builds epoch `epoch`'s run. Pure; call it without any lock.
  static std::unique_ptr<EpochRun> Prepare(const PlanOptions& plan, int64_t epoch);
  /// Takes a run asked for with kBuild; returns it back (to be destroyed
  /// outside the lock) when its epoch is no longer wanted, or was built from
  /// another item count than plan()'s.
  std::unique_ptr<EpochRun> Offer(std::unique_ptr<EpochRun> run);
  /// The build of `epoch` failed: a later call asks for it again.
  void CancelBuild(int64_t epoch);

  /// `slot` is complete (its Done() returned true). A slot of an abandoned
  /// epoch goes back to the pool, which makes room under the prefetch bound.
  enum class Completed {
    kDeliverable,  // a batch of the epoch being delivered is ready
    kAhead,        // a batch of the next epoch is ready
    kReleased,     // an abandoned batch went back to the pool
  };
  Completed Complete(BatchSlot* slot);

  /// What the consumer does next.
  enum class Step {
    kDeliver,     // call Deliver()
    kEndOfEpoch,  // every batch was delivered: EndEpoch() moves on
    kBuild,       // build epoch `epoch`, then Offer() it
    kWait,        // wait for a batch (or run tasks, without workers)
  };
  struct Next {
    Step step = Step::kWait;
    int64_t epoch = 0;  // for kBuild
  };
  /// Starts the epoch due when none is in progress, then says what to do.
  Next Advance();
  /// The batch Deliver() would hand out, left in place (the consumer may
  /// report its failures first). REQUIRES: Advance() just returned kDeliver.
  BatchSlot* Peek() { return Deliverable()->slot.get(); }
  /// The next batch to hand out. REQUIRES: Advance() just returned kDeliver.
  std::unique_ptr<BatchSlot> Deliver();
  /// In order, the batch delivery waits for next (the epoch in progress's
  /// first undelivered one), with its items; nullopt out of order or
  /// between epochs. Its items only `with_items`.
  std::optional<AwaitedBatch> Head(bool with_items) const;
  /// Ends the epoch; the next Advance() starts the following one, which
  /// workers may now prefetch. REQUIRES: Advance() just returned kEndOfEpoch.
  void EndEpoch();

  /// Makes `epoch` the one the next Advance() starts; abandons the epoch in
  /// progress. The look-ahead is kept when it is that epoch and `keep_ahead`
  /// (false: what its items were made from changed); a restored checkpoint
  /// not yet started, when it is that epoch and `keep_restore`.
  void SetEpoch(int64_t epoch, bool keep_ahead = true, bool keep_restore = false);
  /// The item count (PlanOptions::num_samples, >= 0) of the epochs started
  /// from now on, for a kind whose count changes between epochs; a
  /// look-ahead of another count is abandoned. The epoch in progress keeps
  /// its own.
  void SetItems(int64_t items);
  /// The epoch in progress, or the one the next Advance() starts.
  int64_t epoch() const;
  LoaderState State() const;
  /// Checks `state` against the plan, then makes the next Advance() resume it.
  /// With `items_vary` (a kind whose count changes between epochs), the
  /// checkpoint's num_samples is its epoch's own: it is not compared, and
  /// becomes the count (SetItems).
  Status Restore(const LoaderState& state, bool items_vary = false);

  /// Sets the prefetch bound (batches >= 1, bytes >= 1).
  void SetPrefetch(int batches, size_t bytes);
  int prefetch_batches() const { return prefetch_batches_; }
  size_t prefetch_bytes() const { return prefetch_bytes_; }
  /// What one item's output holds outside the pool's buffers, as measured.
  void SetItemBytes(size_t bytes) { item_bytes_ = bytes; }
  /// Batches that may be open at once: the tightest of the bounds, >= 1.
  int depth() const;

  /// Started and not yet delivered, including those of abandoned epochs
  /// that workers still write.
  int open_batches() const { return open_count_; }
  /// Finished, not yet delivered.
  int ready_batches() const { return ready_count_; }

 private:
  EpochRun* ClaimableRun(Claim* claim);
  std::optional<int64_t> LookAheadEpoch() const;
  bool Building(int64_t epoch) const;
  void StartEpoch();
  EpochRun::OpenBatch* Deliverable();
  void Abandon(std::unique_ptr<EpochRun>& run);

  PlanOptions plan_;
  PlanShape shape_;  // of plan_
  const bool ordered_;
  BatchPool* const pool_;
  int prefetch_batches_;
  size_t prefetch_bytes_;
  const size_t look_ahead_bytes_;
  size_t item_bytes_ = 0;
  std::unique_ptr<EpochRun> cur_;    // being delivered; null between epochs
  std::unique_ptr<EpochRun> ahead_;  // the next epoch, prefetched
  int64_t next_epoch_;
  // Workers may start next_epoch_ before the consumer asks for it (set when
  // an epoch ends, cleared when the user changes epoch or restores).
  bool look_ahead_ = false;
  int handing_over_ = 0;  // workers committed to leave mid-item (HandOverBegins)
  std::optional<LoaderState> pending_restore_;
  std::vector<int64_t> building_;                  // epochs asked for with kBuild, not yet offered
  std::vector<std::unique_ptr<BatchSlot>> stale_;  // abandoned, still being written
  int open_count_ = 0;
  int ready_count_ = 0;
  // Tasks claimed from the runs being produced, in claim order (delivery
  // order); exhausted ones are dropped at the next claim. The plan is held
  // by the tasks' workers: one freed here would be freed under the lock.
  struct Running {
    std::weak_ptr<const EpochPlan> plan;
    BatchSlot* slot = nullptr;
    std::shared_ptr<TaskCursor> cursor;
  };
  void DropExhausted();
  // Joins the earliest running task whose cursor `wanted` says yes to.
  template <typename Pred>
  bool Join(Pred wanted, BatchTask* task);
  std::vector<Running> running_;
  // Returned positions (Return), claimed first, in the order they came back.
  struct Returned {
    std::shared_ptr<const EpochPlan> plan;
    BatchSlot* slot = nullptr;
    int64_t position = 0;
  };
  std::deque<Returned> returned_;
};

}  // namespace stoker
