#include "engine/epoch_scheduler.h"

#include <algorithm>
#include <cassert>
#include <concepts>
#include <string>

#include "stoker/defaults.h"

namespace stoker {

Status CheckEpoch(const std::string& what, int64_t epoch) {
  if (epoch >= 0 && epoch <= kMaxEpoch) return Status::Ok();
  return InvalidArgument(what + " must be in [0, " + std::to_string(kMaxEpoch) + "], got " +
                         std::to_string(epoch));
}

EpochRun::EpochRun(std::shared_ptr<const EpochPlan> plan)
    : plan_(std::move(plan)), delivered_(static_cast<size_t>(plan_->num_batches()), 0) {}

void EpochRun::SkipDeliveredClaims() {
  while (claim_batch_ < num_batches() && claim_offset_ == 0 && delivered(claim_batch_)) {
    ++claim_batch_;
  }
}

EpochRun::OpenBatch* EpochRun::Find(const BatchSlot* slot) {
  for (auto& o : open_) {
    if (o.slot.get() == slot) return &o;
  }
  return nullptr;
}

EpochScheduler::EpochScheduler(const Options& options, BatchPool* pool)
    : plan_(options.plan),
      shape_(PlanShape::Of(options.plan)),
      ordered_(options.ordered),
      pool_(pool),
      prefetch_batches_(std::max(options.prefetch_batches, 1)),
      prefetch_bytes_(std::max<size_t>(options.prefetch_bytes, 1)),
      look_ahead_bytes_(options.look_ahead_bytes),
      next_epoch_(options.start_epoch) {}

EpochScheduler::~EpochScheduler() {
  // Through the pool, which hands the kind every output made (a worker
  // process's segment is leased until then), never dropped with the slot.
  for (EpochRun* run : {cur_.get(), ahead_.get()}) {
    if (run == nullptr) continue;
    for (EpochRun::OpenBatch& o : run->open_) {
      if (o.slot != nullptr) pool_->Release(std::move(o.slot));
    }
  }
  for (std::unique_ptr<BatchSlot>& slot : stale_) pool_->Release(std::move(slot));
}

int EpochScheduler::depth() const {
  size_t by_bytes = prefetch_bytes_ / std::max<size_t>(pool_->batch_bytes(), 1);
  // Outputs that live outside the pool's buffers (a worker process's batch
  // segment) are memory too: 2 batches a worker must not pass the budget.
  if (look_ahead_bytes_ > 0 && item_bytes_ > 0) {
    const size_t batch = item_bytes_ * static_cast<size_t>(std::max<int64_t>(shape_.batch_size, 1));
    by_bytes = std::min(by_bytes, look_ahead_bytes_ / batch);
  }
  return static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(prefetch_batches_), by_bytes)));
}

void EpochScheduler::SetPrefetch(int batches, size_t bytes) {
  prefetch_batches_ = std::max(batches, 1);
  prefetch_bytes_ = std::max<size_t>(bytes, 1);
}

std::unique_ptr<EpochRun> EpochScheduler::Prepare(const PlanOptions& plan, int64_t epoch) {
  auto run = std::make_unique<EpochRun>(std::make_shared<const EpochPlan>(plan, epoch));
  run->items_ = plan.num_samples;
  return run;
}

bool EpochScheduler::Building(int64_t epoch) const {
  return std::find(building_.begin(), building_.end(), epoch) != building_.end();
}

void EpochScheduler::CancelBuild(int64_t epoch) { std::erase(building_, epoch); }

// The epoch workers may produce ahead of the consumer: the one after the
// epoch being delivered, or, between epochs, the next one once an epoch has
// ended. None while a restore is pending (its run must start untouched).
std::optional<int64_t> EpochScheduler::LookAheadEpoch() const {
  if (pending_restore_) return std::nullopt;
  if (cur_ != nullptr) return cur_->epoch() + 1;
  if (look_ahead_ || ahead_ != nullptr) return next_epoch_;
  return std::nullopt;
}

std::unique_ptr<EpochRun> EpochScheduler::Offer(std::unique_ptr<EpochRun> run) {
  CancelBuild(run->epoch());
  // A build begun before SetItems changed the count is of no use.
  const bool wanted = ahead_ == nullptr && run->items() == plan_.num_samples &&
                      (cur_ == nullptr ? run->epoch() == next_epoch_
                                       : run->epoch() == cur_->epoch() + 1 && !pending_restore_);
  if (!wanted) return run;
  ahead_ = std::move(run);
  return nullptr;
}

EpochRun* EpochScheduler::ClaimableRun(Claim* claim) {
  if (cur_ != nullptr) {
    cur_->SkipDeliveredClaims();
    if (!cur_->fully_claimed()) return cur_.get();
  }
  if (handing_over_ > 0) return nullptr;  // a worker must stay free for the item handed over
  const std::optional<int64_t> next = LookAheadEpoch();
  if (!next) return nullptr;
  if (ahead_ == nullptr) {
    if (!Building(*next)) {
      building_.push_back(*next);
      *claim = {Work::kBuild, *next};
    }
    return nullptr;
  }
  assert(ahead_->epoch() == *next);
  ahead_->SkipDeliveredClaims();
  return ahead_->fully_claimed() ? nullptr : ahead_.get();
}

namespace {

// Room for one more element, grown geometrically, so that the push_back
// after it cannot throw.
template <typename T>
void ReserveOneMore(std::vector<T>& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(8, 2 * v.size()));
}

}  // namespace

EpochScheduler::Claim EpochScheduler::ClaimTask(int threads, BatchTask* task, bool whole) {
  // A task claimed while the pool was smaller may be far longer than a
  // worker's share of the window now: new workers split it before opening
  // more, or its batch (perhaps the one delivery waits for) ends last.
  const int64_t share =
      std::max<int64_t>(1, depth() * shape_.batch_size / (2 * std::max(1, threads)));
  if (!returned_.empty()) {
    Returned& r = returned_.front();
    auto cursor = std::make_shared<TaskCursor>(r.position, r.position + 1);
    DropExhausted();
    ReserveOneMore(running_);
    *task = {std::move(r.plan), r.slot, std::move(cursor), r.position, 1};
    returned_.pop_front();
    running_.push_back({task->plan, task->slot, task->cursor});
    return {Work::kTask, 0};
  }
  if (!whole && Join([&](const TaskCursor& c) { return c.left() > 2 * share; }, task)) {
    return {Work::kTask, 0};
  }
  Claim claim;
  EpochRun* run = ClaimableRun(&claim);
  if (run == nullptr) return claim;
  const int64_t batch = run->claim_batch_;
  const int64_t length = run->plan_->batch_length(batch);
  const bool opens = run->claim_offset_ == 0;
  if (opens && open_count_ >= depth()) return claim;
  const int64_t chunk =
      whole ? length - run->claim_offset_ : std::min(share, length - run->claim_offset_);
  // Whatever may throw (std::bad_alloc, a refused buffer) comes before any
  // change: the loader reports it, and the scheduler is as it was.
  auto cursor = std::make_shared<TaskCursor>(run->claim_offset_, run->claim_offset_ + chunk);
  DropExhausted();
  ReserveOneMore(running_);
  if (opens) {
    ReserveOneMore(run->open_);
    auto slot = pool_->Acquire();
    slot->Open(run->epoch(), batch, length);
    run->open_.push_back({batch, std::move(slot), false});
    ++open_count_;
  }
  task->plan = run->plan_;
  task->slot = run->open_.back().slot.get();
  task->offset = run->claim_offset_;
  task->length = chunk;
  task->cursor = std::move(cursor);
  running_.push_back({task->plan, task->slot, task->cursor});
  run->claim_offset_ += chunk;
  if (run->claim_offset_ == length) {
    ++run->claim_batch_;
    run->claim_offset_ = 0;
  }
  return {Work::kTask, 0};
}

void EpochScheduler::Return(const BatchTask& task, int64_t position) {
  returned_.push_back({task.plan, task.slot, position});
}

bool EpochScheduler::AheadInProgress() const {
  return ahead_ != nullptr && std::any_of(ahead_->open_.begin(), ahead_->open_.end(),
                                          [](const EpochRun::OpenBatch& o) { return !o.ready; });
}

void EpochScheduler::DropExhausted() {
  std::erase_if(running_, [](const Running& r) { return r.cursor->left() == 0; });
}

bool EpochScheduler::ClaimHelp(BatchTask* task) {
  return Join([](const TaskCursor& c) { return c.left() > 0; }, task);
}

template <typename Pred>
bool EpochScheduler::Join(Pred wanted, BatchTask* task) {
  DropExhausted();
  for (const Running& r : running_) {
    if (!wanted(*r.cursor)) continue;
    // A task with positions left has a worker, who holds its plan (unless
    // the loader is stopping).
    std::shared_ptr<const EpochPlan> plan = r.plan.lock();
    if (plan == nullptr) continue;
    // The last positions may be taken before the helper gets to them: it
    // then takes none, and touches nothing.
    *task = {std::move(plan), r.slot, r.cursor, r.cursor->end() - r.cursor->left(),
             r.cursor->left()};
    return true;
  }
  return false;
}

EpochScheduler::Completed EpochScheduler::Complete(BatchSlot* slot) {
  for (EpochRun* run : {cur_.get(), ahead_.get()}) {
    if (run == nullptr) continue;
    if (EpochRun::OpenBatch* o = run->Find(slot)) {
      o->ready = true;
      ++ready_count_;
      if (!ordered_) run->ready_.push_back(o->batch);
      return run == cur_.get() ? Completed::kDeliverable : Completed::kAhead;
    }
  }
  auto it =
      std::find_if(stale_.begin(), stale_.end(), [slot](const auto& s) { return s.get() == slot; });
  assert(it != stale_.end());
  pool_->Release(std::move(*it));
  stale_.erase(it);
  --open_count_;
  return Completed::kReleased;
}

// Makes next_epoch_ the epoch being delivered, from the run prefetched or
// offered for it, applying a pending restore.
void EpochScheduler::StartEpoch() {
  cur_ = std::move(ahead_);
  look_ahead_ = false;
  if (!pending_restore_) return;
  EpochRun& run = *cur_;
  assert(run.open_.empty() && run.claim_batch_ == 0);  // untouched while the restore pended
  const auto position = static_cast<size_t>(pending_restore_->position);
  std::fill_n(run.delivered_.begin(), position, uint8_t{1});  // an empty epoch has no data()
  for (int64_t b : pending_restore_->beyond) run.delivered_[static_cast<size_t>(b)] = 1;
  run.delivered_count_ = static_cast<int64_t>(position);
  for (size_t b = position; b < run.delivered_.size(); ++b)
    run.delivered_count_ += run.delivered_[b];
  run.prefix_ = pending_restore_->position;
  while (run.prefix_ < run.num_batches() && run.delivered(run.prefix_)) ++run.prefix_;
  pending_restore_.reset();
}

EpochRun::OpenBatch* EpochScheduler::Deliverable() {
  EpochRun& run = *cur_;
  if (!ordered_)
    return run.ready_.empty() ? nullptr
                              : &*std::find_if(run.open_.begin(), run.open_.end(),
                                               [&run](const EpochRun::OpenBatch& o) {
                                                 return o.batch == run.ready_.front();
                                               });
  // In order: the first undelivered batch, which is the first one open.
  if (run.open_.empty()) return nullptr;
  EpochRun::OpenBatch& first = run.open_.front();
  return first.batch == run.prefix_ && first.ready ? &first : nullptr;
}

EpochScheduler::Next EpochScheduler::Advance() {
  if (cur_ == nullptr) {
    if (ahead_ != nullptr && ahead_->epoch() != next_epoch_) Abandon(ahead_);
    if (ahead_ == nullptr) {
      if (Building(next_epoch_)) return {Step::kWait, 0};
      building_.push_back(next_epoch_);
      return {Step::kBuild, next_epoch_};
    }
    StartEpoch();
  }
  if (cur_->finished()) return {Step::kEndOfEpoch, 0};
  return {Deliverable() != nullptr ? Step::kDeliver : Step::kWait, 0};
}

void EpochScheduler::EndEpoch() {
  assert(cur_ != nullptr && cur_->finished());
  next_epoch_ = cur_->epoch() + 1;
  cur_.reset();
  look_ahead_ = true;
}

std::unique_ptr<BatchSlot> EpochScheduler::Deliver() {
  EpochRun& run = *cur_;
  EpochRun::OpenBatch* o = Deliverable();
  assert(o != nullptr);
  const int64_t b = o->batch;
  std::unique_ptr<BatchSlot> slot = std::move(o->slot);
  run.open_.erase(run.open_.begin() + (o - run.open_.data()));
  if (!ordered_) run.ready_.pop_front();
  run.delivered_[static_cast<size_t>(b)] = 1;
  ++run.delivered_count_;
  while (run.prefix_ < run.num_batches() && run.delivered(run.prefix_)) ++run.prefix_;
  --open_count_;
  --ready_count_;
  return slot;
}

// Drops `run` (may be null). Slots still being written by workers move to
// stale_, and Complete() returns them to the pool once their last task ends.
void EpochScheduler::Abandon(std::unique_ptr<EpochRun>& run) {
  if (run == nullptr) return;
  for (EpochRun::OpenBatch& o : run->open_) {
    // Nobody waits for its samples: its running tasks get no help.
    std::erase_if(running_, [&](const Running& r) { return r.slot == o.slot.get(); });
    ready_count_ -= o.ready ? 1 : 0;
    bool release_now = o.ready;
    if (!release_now && o.batch == run->claim_batch_ && run->claim_offset_ > 0) {
      // Nobody will claim the rest of this batch: count it done here.
      release_now = o.slot->Done(o.slot->length() - run->claim_offset_);
    }
    if (release_now) {
      pool_->Release(std::move(o.slot));
      --open_count_;
    } else {
      o.slot->Abandon();  // its workers may stop its items (ItemOutcome::abandoned)
      stale_.push_back(std::move(o.slot));
    }
  }
  run.reset();
}

void EpochScheduler::SetEpoch(int64_t epoch, bool keep_ahead, bool keep_restore) {
  if (keep_restore && pending_restore_ && pending_restore_->epoch == epoch) return;
  Abandon(cur_);
  if (ahead_ != nullptr && (ahead_->epoch() != epoch || !keep_ahead)) Abandon(ahead_);
  next_epoch_ = epoch;
  look_ahead_ = false;
  pending_restore_.reset();
}

void EpochScheduler::SetItems(int64_t items) {
  assert(items >= 0);
  if (items == plan_.num_samples) return;
  plan_.num_samples = items;
  shape_ = PlanShape::Of(plan_);
  Abandon(ahead_);  // built from the old count
}

std::optional<AwaitedBatch> EpochScheduler::Head(bool with_items) const {
  if (!ordered_ || cur_ == nullptr || cur_->finished()) return std::nullopt;
  const EpochPlan& plan = *cur_->plan_;
  AwaitedBatch head{cur_->epoch(), cur_->prefix_, {}, 0};
  const int64_t begin = plan.batch_begin(head.batch);
  for (int64_t p = begin; with_items && p < begin + plan.batch_length(head.batch); ++p)
    head.items.push_back(plan.sample(p));
  return head;
}

int64_t EpochScheduler::epoch() const { return cur_ != nullptr ? cur_->epoch() : next_epoch_; }

LoaderState EpochScheduler::State() const {
  if (pending_restore_) return *pending_restore_;
  LoaderState state;
  state.seed = plan_.seed;
  state.num_samples = plan_.num_samples;
  state.batch_size = plan_.batch_size;
  state.shuffle = plan_.shuffle;
  state.drop_last = plan_.drop_last;
  state.rank = plan_.rank;
  state.world_size = plan_.world_size;
  state.pad_shards = plan_.pad_shards;
  if (cur_ == nullptr) {
    state.epoch = next_epoch_;
    return state;
  }
  // An epoch whose last batch was delivered but whose end was not yet asked
  // for is that epoch, all delivered: a resumed loop that calls
  // set_epoch(that epoch) gets none of it again, not the whole.
  const EpochRun& run = *cur_;
  state.epoch = run.epoch();
  state.num_samples = run.items();  // SetItems may have changed the next epochs'
  state.position = run.prefix_;
  // Unordered delivery only: batches delivered past the prefix.
  int64_t beyond = run.delivered_count_ - run.prefix_;
  for (int64_t b = run.prefix_ + 1; beyond > 0; ++b) {
    if (run.delivered(b)) {
      state.beyond.push_back(b);
      --beyond;
    }
  }
  return state;
}

namespace {

std::string PlanValue(bool v) { return v ? "true" : "false"; }
std::string PlanValue(std::integral auto v) { return std::to_string(v); }

// An error naming `field` when the checkpoint's value differs from the plan's.
Status SamePlanField(const char* field, auto checkpoint, auto loader) {
  if (checkpoint == loader) return Status::Ok();
  return InvalidArgument(std::string("checkpoint's ") + field + " " + PlanValue(checkpoint) +
                         " differs from this loader's " + PlanValue(loader));
}

}  // namespace

Status EpochScheduler::Restore(const LoaderState& state, bool items_vary) {
  PlanOptions plan = plan_;
  if (items_vary) plan.num_samples = state.num_samples;
  const int64_t n = PlanShape::Of(plan).num_batches;
  // A checkpoint of another plan names other samples at the same positions.
  STOKER_RETURN_IF_ERROR(SamePlanField("seed", state.seed, plan_.seed));
  STOKER_RETURN_IF_ERROR(SamePlanField("num_samples", state.num_samples, plan.num_samples));
  STOKER_RETURN_IF_ERROR(SamePlanField("batch_size", state.batch_size, plan_.batch_size));
  STOKER_RETURN_IF_ERROR(SamePlanField("shuffle", state.shuffle, plan_.shuffle));
  STOKER_RETURN_IF_ERROR(SamePlanField("drop_last", state.drop_last, plan_.drop_last));
  STOKER_RETURN_IF_ERROR(SamePlanField("rank", state.rank, plan_.rank));
  STOKER_RETURN_IF_ERROR(SamePlanField("world_size", state.world_size, plan_.world_size));
  STOKER_RETURN_IF_ERROR(SamePlanField("pad_shards", state.pad_shards, plan_.pad_shards));
  STOKER_RETURN_IF_ERROR(CheckEpoch("checkpoint epoch", state.epoch));
  if (state.position < 0 || state.position > n) {
    return InvalidArgument("checkpoint position " + std::to_string(state.position) +
                           " is outside [0, " + std::to_string(n) + "]");
  }
  std::vector<int64_t> beyond = state.beyond;
  std::sort(beyond.begin(), beyond.end());
  for (size_t i = 0; i < beyond.size(); ++i) {
    const int64_t b = beyond[i];
    if (b <= state.position || b >= n) {
      return InvalidArgument("checkpoint batch " + std::to_string(b) +
                             " in 'beyond' is outside (position, " + std::to_string(n) + ")");
    }
    if (i > 0 && beyond[i - 1] == b) {  // a state no loader writes: altered or corrupt
      return InvalidArgument("checkpoint batch " + std::to_string(b) + " is in 'beyond' twice");
    }
  }
  Abandon(cur_);
  Abandon(ahead_);
  SetItems(plan.num_samples);
  next_epoch_ = state.epoch;
  look_ahead_ = false;
  pending_restore_ = state;
  return Status::Ok();
}

}  // namespace stoker
