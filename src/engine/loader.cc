#include "stoker/loader.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/clock.h"
#include "core/number_text.h"
#include "core/thread_annotations.h"
#include "core/worker_pool.h"
#include "engine/batch_pool.h"
#include "engine/consumer_window.h"
#include "engine/controller.h"
#include "engine/cuda_runtime.h"
#include "engine/device_stage.h"
#include "engine/engine_loader.h"
#include "engine/epoch_scheduler.h"
#include "engine/sample_kind.h"
#include "engine/worker_stats.h"
#include "plan/epoch_plan.h"
#include "stoker/defaults.h"

namespace stoker {
namespace {

// How long a refusal caps the pool before it tries to grow again, at first
// and at most (the wait doubles with each refusal).
constexpr std::chrono::nanoseconds kRefusalRetryFirst = std::chrono::seconds(5);
constexpr std::chrono::nanoseconds kRefusalRetryMax = std::chrono::minutes(5);

// The system refused what a kind's worker runs on (a process, memory).
bool IsRefusal(const Status& st) {
  return st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kResourceExhausted;
}

// What one thread (a worker, or the consumer when it does the work) keeps
// between items: its kind's worker and its figures. A worker whose
// trimmable memory passed the per-sample cap (docs/engine.md, "Memory
// budget") is replaced by a fresh one between tasks.
struct WorkerContext {
  WorkerContext(int id, WorkerPlace place, const WorkerKind& kind, const SampleCap& cap)
      : stats(id, place == WorkerPlace::kWorkerThread), place_(place), cap_(cap) {
    Make(kind);
  }

  size_t footprint() const { return worker->cost().bytes; }

  void Trim(const WorkerKind& kind) {
    if (cap_.Allows(worker->cost().trimmable_bytes)) return;
    worker.reset();  // a worker process ends before its replacement starts
    Make(kind);
  }

  // Makes item `item` of `epoch` into `out`: the engine's own samples are
  // called directly (final, inline: no indirect call per sample), other
  // kinds' items through the interface.
  // `abandoned`: the flag that says the item's epoch was abandoned.
  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out,
             const std::atomic<bool>* abandoned) {
    outcome.label = 0;
    outcome.samples = 1;
    outcome.remote = false;
    outcome.yielded = false;
    outcome.interrupted = false;
    outcome.abandoned = abandoned;
    outcome.dropped = false;
    if (!outcome.failures.empty()) outcome.failures.clear();
    return sample_worker_ != nullptr ? sample_worker_->Run(epoch, item, out, &outcome)
                                     : worker->Run(epoch, item, out, &outcome);
  }

  WorkerStats stats;
  std::unique_ptr<KindWorker> worker;
  ItemOutcome outcome;  // of the last Run
  // A worker thread's outcome.may_leave, and whether it said yes: the thread
  // has left the pool (mid-item; it returns once that item ends or yields).
  std::function<bool()> may_leave;
  std::function<bool(const std::string&)> may_shed;  // outcome.may_shed, tuned loaders only
  bool left = false;
  bool handing_over = false;  // said yes, and that item has not ended (EndHandOver)

 private:
  void Make(const WorkerKind& kind) {
    worker = kind.NewWorker(place_, cap_);
    sample_worker_ = dynamic_cast<SampleWorker*>(worker.get());
  }

  SampleWorker* sample_worker_ = nullptr;  // `worker`, when it is the engine's own

 private:
  WorkerPlace place_;
  SampleCap cap_;
};

// The kind's Recycle, for pools whose outputs refer to something else.
BatchPool::Recycle RecycleOf(const std::shared_ptr<const WorkerKind>& kind) {
  if (!kind->recycles()) return {};
  return [kind](std::span<std::byte> sample) { kind->Recycle(sample); };
}

// The kind the options name: theirs, or the engine's own over source and transform.
std::shared_ptr<const WorkerKind> KindOf(const LoaderOptions& o) {
  if (o.kind != nullptr) return o.kind;
  return std::make_shared<SampleKind>(o.source, o.transform, o.seed);
}

// Bumped in the child of every fork(). A loader remembers the value it was
// made at: a different one means this is a forked child, where its worker
// threads do not exist and its locks may be held forever by threads that are
// not there.
std::atomic<uint64_t> g_fork_generation{0};

uint64_t ForkGeneration() {
  [[maybe_unused]] static const bool registered = [] {
    return pthread_atfork(nullptr, nullptr,
                          [] { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }) == 0;
  }();
  assert(registered);
  return g_fork_generation.load(std::memory_order_relaxed);
}

// A source names the sample's key at the start of its errors (Source::Read's
// contract); the report names the sample itself, so the cause keeps what
// follows the key.
Status CauseOf(const Status& st, const std::string& key) {
  const std::string& m = st.message();
  if (m.size() > key.size() + 2 && m.starts_with(key) && m.compare(key.size(), 2, ": ") == 0) {
    return st.WithMessage(m.substr(key.size() + 2));
  }
  return st;
}

}  // namespace

// The concurrent shell around an EpochScheduler: one mutex over the
// scheduler, workers that claim tasks under it and run them outside, and a
// consumer that takes batches. Plans are built and tasks run without the lock.
class Loader::Impl {
 public:
  Impl(LoaderOptions options, PlanOptions plan_options, SampleCap cap,
       std::shared_ptr<const CudaRuntime> pin, std::shared_ptr<DeviceStage> device)
      : options_(std::move(options)),
        cap_(cap),
        kind_(KindOf(options_)),
        spec_(kind_->spec()),
        pool_(std::make_shared<BatchPool>(spec_, options_.batch_size, RecycleOf(kind_),
                                          std::move(pin))),
        device_(std::move(device)),
        sched_(
            {
                .plan = plan_options,
                .ordered = options_.ordered,
                .start_epoch = options_.start_epoch,
                .prefetch_batches = options_.prefetch_batches,
                .prefetch_bytes = options_.prefetch_bytes,
                .look_ahead_bytes = cap_.budget_bytes / 2,
            },
            pool_.get()),
        consumer_ctx_(-1, WorkerPlace::kConsumer, *kind_, cap_),
        workers_([this](int id) { WorkerMain(id); }) {
    MutexLock lock(mu_);
    pool_->set_max_free(static_cast<size_t>(sched_.depth()) + 2);
  }

  ~Impl() { Stop(); }

  // Starts the workers; an error when the system refuses a thread, or
  // refuses to page-lock a batch buffer (tried once here, to fail early).
  Status Start() EXCLUDES(mu_) {
    if (options_.pin_memory || device_ != nullptr) {
      try {
        pool_->Release(pool_->Acquire());
      } catch (const SlotRefused& refused) {
        return refused.status;
      } catch (const std::bad_alloc&) {
        return OutOfMemoryForABatch();
      }
    }
    Status st = Resize(options_.workers);
    return st.ok() ? st : st.WithContext("option 'workers' = " + std::to_string(options_.workers));
  }

  // Called once, by MakeEngineLoader before the loader is handed out; the
  // pointer never changes after, so controller() may be read from any thread.
  void SetController(std::unique_ptr<Controller> c) {
    tuned_.store(c != nullptr, std::memory_order_relaxed);
    controller_ = std::move(c);
    next_tick_ns_ = 0;
  }
  Controller* controller() const { return controller_.get(); }
  void set_pin_skipped(std::string why) { pin_skipped_ = std::move(why); }
  const std::string& pin_skipped() const { return pin_skipped_; }
  void set_owner(Loader* owner) { owner_ = owner; }

  Result<std::optional<Batch>> Next() EXCLUDES(mu_) {
    const int64_t enter = ConsumerEnters();
    auto result = NextImpl();
    ConsumerLeaves(enter);
    next_calls_.fetch_add(1, std::memory_order_relaxed);
    return result;
  }

  // Loader::SetInterrupt's check, asked by RunTask on the consumer's thread.
  void SetInterrupt(std::function<bool()> interrupted) { interrupt_ = std::move(interrupted); }

  // Counts as consumer wait like Next(), ticks the controller meanwhile, and
  // starts the next epoch if none is running, so that a consumer may wait in
  // slices (to handle signals) without hiding its waiting from the tuner.
  bool WaitReady(std::chrono::nanoseconds timeout) EXCLUDES(mu_) {
    const int64_t enter = ConsumerEnters();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool ready = false;
    {
      MutexLock lock(mu_);
      while (true) {
        MaybeTick();
        if (stopped_ || !fatal_.ok()) {
          ready = true;
          break;
        }
        const auto next = sched_.Advance();
        if (next.step == EpochScheduler::Step::kBuild) {
          Build(next.epoch);
          continue;
        }
        // A batch whose every sample was skipped is passed over here, as
        // Next() would pass it over before waiting: "ready" would send the
        // consumer into that wait, deaf to its stop until a batch comes.
        if (next.step == EpochScheduler::Step::kDeliver && sched_.Peek()->count() == 0 &&
            !sched_.Peek()->failed()) {
          Deliver();  // nothing of it is left to hand out
          continue;
        }
        ready = next.step != EpochScheduler::Step::kWait || workers_.target() == 0;
        if (ready || std::chrono::steady_clock::now() >= deadline) break;
        AwaitBatch(deadline);
      }
    }
    ConsumerLeaves(enter);
    return ready;
  }

  // `items`: the count of `epoch` and the epochs after it (a kind's), or
  // unchanged.
  void SetEpoch(int64_t epoch, std::optional<int64_t> items, bool keep_ahead,
                bool keep_restore = false) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (items) sched_.SetItems(*items);
    sched_.SetEpoch(epoch, keep_ahead, keep_restore);
    StartTally(/*whole=*/true);
    work_cv_.NotifyAll();
  }

  int64_t epoch() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return sched_.epoch();
  }

  int64_t batches_per_epoch() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return sched_.shape().num_batches;
  }
  int64_t samples_per_epoch() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return sched_.shape().num_samples;
  }
  const SampleSpec& spec() const { return spec_; }
  // A kind of user batches: their count comes from the sampler each epoch
  // (a kind of samples has its source's size).
  bool items_vary() const { return options_.kind != nullptr && !kind_->items_are_samples(); }

  LoaderState State() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return sched_.State();
  }

  Status Restore(const LoaderState& state) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    // A kind's item count may change between epochs: the checkpoint's epoch has its own.
    Status st = sched_.Restore(state, items_vary());
    if (st.ok()) StartTally(/*whole=*/state.position == 0 && state.beyond.empty());
    work_cv_.NotifyAll();
    return st;
  }

  // Ok in the process that made the loader; see Loader::CheckProcess.
  Status CheckProcess() const {
    if (ForkGeneration() == fork_generation_) return Status::Ok();
    return FailedPrecondition("this stoker loader was made in process " +
                              std::to_string(made_in_pid_) +
                              " and cannot be used in a forked child (pid " +
                              std::to_string(getpid()) + "); make a new loader in the child");
  }

  Status Resize(int workers) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    local_ = workers;
    return ApplyTarget();
  }

  Status SetRemote(int slots) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    remote_ = slots;
    return ApplyTarget();
  }

  // Local workers and remote slots, as the pool has them now.
  int workers() const { return std::max(0, workers_.target() - remote()); }
  int remote() const {
    return std::min(remote_target_.load(std::memory_order_relaxed), workers_.target());
  }

  void SetPrefetch(int batches, size_t bytes) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    sched_.SetPrefetch(batches, bytes);
    pool_->set_max_free(static_cast<size_t>(sched_.depth()) + 2);
    work_cv_.NotifyAll();
  }

  LoaderMetrics Metrics() const EXCLUDES(mu_) {
    LoaderMetrics m;
    m.time_ns = SteadyNanos();
    const ConsumerCounters now = ConsumerNow();
    m.batches_delivered = now.batches_delivered;
    m.samples_delivered = now.samples_delivered;
    m.user_samples_delivered = now.user_samples_delivered;
    m.consumer_wait_ns = now.consumer_wait_ns;
    m.consumer_step_ns = now.consumer_step_ns;
    m.recent = recent_.Recent(now);
    m.next_calls = next_calls_.load(std::memory_order_relaxed);
    m.batch_bytes = pool_->batch_bytes();
    m.workers_target = workers();
    m.workers_remote = remote();
    m.workers_running = workers_.running();
    m.remote_capacity = kind_->remote_capacity();
    m.remote_task_bytes = kind_->remote_task_bytes();
    {
      MutexLock lock(mu_);
      m.prefetch_batches = sched_.prefetch_batches();
      m.prefetch_bytes = sched_.prefetch_bytes();
      m.ready_batches = sched_.ready_batches();
      m.samples_skipped = skipped_total_;
      m.open_batches = sched_.open_batches();
      if (!refusal_.ok()) m.workers_refused = refusal_.message();
      m.workers_shed = workers_shed_;
      m.workers_shed_reason = workers_shed_reason_;
    }
    m.bytes_in_flight = static_cast<size_t>(m.open_batches) * pool_->batch_bytes();
    if (options_.pin_memory || device_ != nullptr) m.pinned_buffers = pool_->slots_made();
    if (device_ != nullptr) {
      const DeviceStageMetrics d = device_->Metrics();
      m.device_copies = d.copies;
      m.device_copies_at_delivery = d.copies_at_delivery;
      m.device_prefetched = d.prefetched;
      m.device_prefetch_batches = d.max_prefetched;
    }
    stats_board_.AddTo(consumer_ctx_.stats, &m);
    // The live list holds the workers past Ready; the kind counts its own starts.
    m.workers_starting =
        std::max(m.workers_running - static_cast<int>(m.workers.size()), kind_->starting());
    return m;
  }

  std::optional<AwaitedBatch> Awaited() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (!consumer_asleep_) return std::nullopt;
    std::optional<AwaitedBatch> head = sched_.Head(/*with_items=*/true);
    if (!head || head->epoch != awaited_.epoch || head->batch != awaited_.batch)
      return std::nullopt;
    head->waited_ns = SteadyNanos() - awaited_.since_ns;
    return head;
  }

  std::vector<SkipRecord> Skipped() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return skipped_;
  }

  void Stop() EXCLUDES(mu_) {
    Halt();
    workers_.Join();
  }

  bool StopWithin(std::chrono::nanoseconds patience) EXCLUDES(mu_) {
    Halt();
    return workers_.JoinFor(patience);
  }

  std::vector<ItemInProgress> InProgress() const {
    std::vector<ItemInProgress> out;
    for (const auto& [worker, item] : stats_board_.Items()) {
      std::string name = kind_->items_are_samples()
                             ? SampleName(item, kind_->Key(item))
                             : kind_->item_name() + " " + std::to_string(item);
      out.push_back({worker, item, std::move(name)});
    }
    return out;
  }

 private:
  // Stops the loader without waiting: waiting calls return, workers leave.
  void Halt() EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      stopped_ = true;
      stop_flag_.store(true, std::memory_order_release);
      workers_.Stop();
      work_cv_.NotifyAll();
      ready_cv_.NotifyAll();
    }
    kind_->Cancel();  // a worker may wait on the kind (a process starting) rather than on us
  }

  int64_t ConsumerEnters() {
    const int64_t enter = SteadyNanos();
    if (last_return_ns_ != 0) {
      consumer_step_ns_.fetch_add(enter - last_return_ns_, std::memory_order_relaxed);
    }
    return enter;
  }

  void ConsumerLeaves(int64_t enter) {
    last_return_ns_ = SteadyNanos();
    consumer_wait_ns_.fetch_add(last_return_ns_ - enter, std::memory_order_relaxed);
    recent_.Record(ConsumerNow());
  }

  // The consumer's cumulative counters now.
  ConsumerCounters ConsumerNow() const {
    return {batches_delivered_.load(std::memory_order_relaxed),
            samples_delivered_.load(std::memory_order_relaxed),
            user_samples_delivered_.load(std::memory_order_relaxed),
            consumer_wait_ns_.load(std::memory_order_relaxed),
            consumer_step_ns_.load(std::memory_order_relaxed)};
  }

  // Builds epoch `epoch`'s plan with the lock released (O(samples)), then
  // offers it; a plan no longer wanted is destroyed outside the lock too.
  void Build(int64_t epoch) REQUIRES(mu_) {
    std::unique_ptr<EpochRun> run;
    const PlanOptions plan = sched_.plan();
    try {
      MutexUnlock unlock(mu_);
      run = EpochScheduler::Prepare(plan, epoch);
    } catch (const std::bad_alloc&) {
      sched_.CancelBuild(epoch);
      Fail(Unavailable("out of memory building the order of epoch " + std::to_string(epoch) + " (" +
                       std::to_string(plan.num_samples) + " samples)"));
      return;
    }
    auto unwanted = sched_.Offer(std::move(run));
    work_cv_.NotifyAll();
    ready_cv_.NotifyAll();
    if (unwanted != nullptr) {
      MutexUnlock unlock(mu_);
      unwanted.reset();
    }
  }

  // Claims and runs one task, or builds a plan asked for; false when there
  // is nothing to do. The lock is released while working.
  bool Work(WorkerContext& ctx, int threads) REQUIRES(mu_) {
    if (!fatal_.ok()) return false;
    BatchTask task;
    EpochScheduler::Claim claim;
    sched_.SetItemBytes(kind_->output_bytes());
    try {
      claim = sched_.ClaimTask(threads, &task, ctx.worker->expects());
    } catch (const std::bad_alloc&) {  // a batch buffer or a task; the scheduler is unchanged
      Fail(OutOfMemoryForABatch());
      return false;
    } catch (SlotRefused& refused) {  // cudaHostRegister of a new one
      Fail(std::move(refused.status));
      return false;
    }
    if (claim.work == EpochScheduler::Work::kBuild) {
      Build(claim.epoch);
      return true;
    }
    // Nothing new to start: help the earliest task that has positions left.
    // A worker that makes its tasks at once (a remote slot) helps none: it
    // would take the rest of a batch a local worker is making.
    if (claim.work == EpochScheduler::Work::kWait &&
        (ctx.worker->expects() || !sched_.ClaimHelp(&task))) {
      return false;
    }
    MutexUnlock unlock(mu_);
    RunTask(ctx, task);
    task = {};  // perhaps the last reference to an epoch's plan
    return true;
  }

  Status OutOfMemoryForABatch() const {
    return Unavailable("out of memory for a batch buffer of " +
                       std::to_string(pool_->batch_bytes()) + " bytes");
  }

  // Sizes the pool to the local workers and remote slots asked for.
  Status ApplyTarget() REQUIRES(mu_) {
    if (stopped_) return Status::Ok();
    // Past a count the system refused a kind's worker at, the pool does not grow
    // (until RetryRefused lifts the cap).
    const int cap = refused_at_.load(std::memory_order_relaxed);
    const int wanted = std::min({local_ + remote_, kMaxWorkers, cap});
    remote_target_.store(remote_, std::memory_order_relaxed);
    // The kind learns the split before new threads start and ask it.
    kind_->Resized(wanted, std::min(remote_, wanted));
    Status st = workers_.Resize(wanted);
    if (workers_.target() != wanted) kind_->Resized(workers_.target(), remote());
    work_cv_.NotifyAll();
    ready_cv_.NotifyAll();
    return st;
  }

  // The loader cannot go on (memory for a batch or a plan): Next() says so.
  void Fail(Status st) REQUIRES(mu_) {
    if (fatal_.ok()) fatal_ = std::move(st);
    ready_cv_.NotifyAll();
  }

  // Produces the task's positions as its cursor hands them out (helpers
  // may take some), then counts those it produced, and those dropped.
  void RunTask(WorkerContext& ctx, const BatchTask& task) {
    BatchSlot* slot = task.slot;
    TaskTimer timer(ctx.stats, task.length, ctx.worker.get());
    int64_t dropped = 0;  // positions of an abandoned epoch left unmade
    if (ctx.worker->expects()) {
      if (!RunExpected(ctx, task, timer)) return;
    } else {
      for (int64_t p; (p = task.cursor->Take()) < task.cursor->end();) {
        if (stop_flag_.load(std::memory_order_relaxed)) return;  // nobody waits for it any more
        const bool made = Produce(ctx, *task.plan, slot, p);
        if (!made && ctx.outcome.dropped) {
          // Its epoch was abandoned: the item, and the rest of the task, are
          // of no use to anyone. Counted done unmade, never handed on.
          if (ctx.handing_over) EndHandOver(ctx, nullptr, p);
          dropped = 1;
          while (task.cursor->Take() < task.cursor->end()) ++dropped;
          break;
        }
        if (ctx.handing_over || !made) EndHandOver(ctx, made ? nullptr : &task, p);
        const bool consumer = &ctx == &consumer_ctx_;
        if (made) timer.SampleDone(ctx.outcome.remote);
        if (made && ctx.left) break;  // what is left of the task goes to helpers
        if (consumer && (made ? interrupt_ && interrupt_() : ctx.outcome.interrupted)) {
          ReturnRest(task);  // claimed before any other by the next Next()
          interrupted_ = true;
          break;
        }
        if (!made) break;
      }
    }
    timer.Finish();
    const int64_t produced = timer.samples();
    if (produced + dropped == 0) return;  // helpers took them all: the slot may be gone already
    ctx.Trim(*kind_);
    ctx.stats.set_footprint(ctx.footprint());
    if (slot->Done(produced + dropped)) FinishBatch(slot);
  }

  // A worker that expects its items: takes every position the task has left,
  // names their items to it, then produces them. False when stopped.
  bool RunExpected(WorkerContext& ctx, const BatchTask& task, TaskTimer& timer) {
    std::vector<int64_t> positions;
    std::vector<int64_t> items;
    const EpochPlan& plan = *task.plan;
    const int64_t begin = plan.batch_begin(task.slot->batch());
    for (int64_t p; (p = task.cursor->Take()) < task.cursor->end();) {
      positions.push_back(p);
      items.push_back(plan.sample(begin + p));
    }
    if (positions.empty()) return true;
    ctx.worker->Expect(plan.epoch(), items);
    for (const int64_t p : positions) {
      if (stop_flag_.load(std::memory_order_relaxed)) return false;
      Produce(ctx, plan, task.slot, p);
      if (ctx.handing_over) EndHandOver(ctx, nullptr, p);  // such a kind never yields
      timer.SampleDone(ctx.outcome.remote);
    }
    return true;
  }

  // The positions of `task` no one took yet, claimable again before any
  // other, in order.
  void ReturnRest(const BatchTask& task) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    for (int64_t p; (p = task.cursor->Take()) < task.cursor->end();) sched_.Return(task, p);
  }

  // The item of a worker that committed to leave through may_leave ended:
  // made, or, with `yielded` (that task), yielded at position `p` for another
  // worker to continue. Look-ahead claims may go on.
  void EndHandOver(WorkerContext& ctx, const BatchTask* yielded, int64_t p) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (yielded != nullptr) sched_.Return(*yielded, p);
    if (std::exchange(ctx.handing_over, false)) sched_.HandOverEnds();
    work_cv_.NotifyAll();
  }

  // Makes the item at position `p` of `slot`; a failure, or an exception
  // from the kind's worker, becomes its outcome. False when the kind's
  // worker yielded it instead (ItemOutcome::yielded), or dropped it, its epoch
  // abandoned (ItemOutcome::dropped): the position is unmade.
  bool Produce(WorkerContext& ctx, const EpochPlan& plan, BatchSlot* slot, int64_t p) {
    const int64_t index = plan.sample(plan.batch_begin(slot->batch()) + p);
    const ItemOutcome& outcome = ctx.outcome;
    Status st;
    ctx.stats.set_item(index);
    try {
      st = ctx.Run(plan.epoch(), index, slot->sample(p), slot->abandoned_flag());
    } catch (const std::bad_alloc&) {
      st = Unavailable("out of memory");
    } catch (const std::exception& e) {
      st = Internal(std::string("the source or transform threw: ") + e.what());
    }
    ctx.stats.set_item(-1);
    if (st.ok() && (outcome.yielded || outcome.interrupted || outcome.dropped)) return false;
    if (st.ok()) {
      slot->Put(p, index, outcome.label, outcome.samples);
      if (!outcome.failures.empty()) slot->Note(p, std::move(ctx.outcome.failures));
      return true;
    }
    std::string key = kind_->Key(index);
    Status cause = CauseOf(st, key);
    // An item that is no sample (a user batch) is named by its key alone.
    slot->Fail(p, kind_->items_are_samples() ? index : -1, std::move(key), std::move(cause));
    return true;
  }

  // Runs on the thread that completed the batch's last position.
  void FinishBatch(BatchSlot* slot) EXCLUDES(mu_) {
    if (slot->failed() && options_.on_error == ErrorPolicy::kSkip) {
      // What is not the sample's fault, or a kind's whole item (no sample to
      // name), is reported as an error, never skipped.
      const auto skippable = [](int64_t index, const Status& st) {
        return index >= 0 && IsSampleError(st);
      };
      for (const auto& f : slot->Failures()) {
        if (!skippable(f.index, f.status)) continue;
        // The record has the index and key: its reason is the cause alone.
        slot->skips().push_back({slot->epoch(), f.index, f.key, f.status.ToString()});
      }
      slot->DropFailures(skippable);
    }
    // The copy starts now, ahead of delivery, so that the consumer finds it
    // done; a batch with failures left changes before delivery, so it waits.
    if (device_ != nullptr && !slot->failed() && !slot->abandoned() && slot->count() > 0) {
      device_->Prefetch(*slot);
    }
    MutexLock lock(mu_);
    switch (sched_.Complete(slot)) {
      case EpochScheduler::Completed::kDeliverable:
        ready_cv_.NotifyAll();
        break;
      case EpochScheduler::Completed::kReleased:  // room under the prefetch bound
        if (idle_workers_ > 0) work_cv_.NotifyAll();
        break;
      case EpochScheduler::Completed::kAhead:
        break;
    }
  }

  // Runs the controller if its interval has passed, with the lock released
  // around its Tick. Consumer thread only.
  void MaybeTick() REQUIRES(mu_) {
    RetryRefused();
    if (controller_ == nullptr) return;
    const int64_t now = SteadyNanos();
    // A worker that left the pool over its memory share is the tuner's to
    // say at once: a short run may end before the next tick.
    if (now < next_tick_ns_ && workers_shed_ == shed_ticked_) return;
    shed_ticked_ = workers_shed_;
    next_tick_ns_ = now + controller_->interval().count();
    MutexUnlock unlock(mu_);
    controller_->Tick(*owner_);
  }

  // A refusal caps the pool for a while, not for good: the limit it met (a
  // pids limit, memory) may have room again once other processes end. After
  // the wait, the pool grows to what is asked if it can; each refusal doubles
  // the wait, up to kRefusalRetryMax.
  void RetryRefused() REQUIRES(mu_) {
    const int cap = refused_at_.load(std::memory_order_relaxed);
    if (cap >= kMaxWorkers || SteadyNanos() < refusal_retry_ns_) return;
    refused_at_.store(kMaxWorkers, std::memory_order_relaxed);
    if (local_ + remote_ > cap) (void)ApplyTarget();
  }

  // Waits until woken, the controller's next tick, or `deadline`.
  void WaitForBatch(std::chrono::steady_clock::time_point deadline) REQUIRES(mu_) {
    if (controller_ != nullptr) {
      deadline = std::min(
          deadline, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(next_tick_ns_)));
    }
    ready_cv_.WaitUntil(mu_, deadline);
  }

  // The consumer sleeps until its batch is ready (WaitForBatch), named
  // meanwhile by Awaited(); its wait counts from the first sleep on that batch.
  void AwaitBatch(std::chrono::steady_clock::time_point deadline) REQUIRES(mu_) {
    if (std::optional<AwaitedBatch> head = sched_.Head(/*with_items=*/false)) {
      if (head->epoch != awaited_.epoch || head->batch != awaited_.batch || awaited_.since_ns == 0)
        awaited_ = {head->epoch, head->batch, SteadyNanos()};
      consumer_asleep_ = true;
    }
    WaitForBatch(deadline);
    consumer_asleep_ = false;
  }

  Result<std::optional<Batch>> NextImpl() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (true) {
      MaybeTick();
      if (stopped_) return Cancelled("the loader was stopped");
      if (!fatal_.ok()) return fatal_;
      const auto next = sched_.Advance();
      switch (next.step) {
        case EpochScheduler::Step::kDeliver:
          if (auto delivered = Deliver()) return std::move(*delivered);
          continue;
        case EpochScheduler::Step::kEndOfEpoch: {
          Status nothing = EpochDeliveredNothing();
          sched_.EndEpoch();
          StartTally(/*whole=*/true);
          work_cv_.NotifyAll();  // workers may now prefetch the next epoch
          if (!nothing.ok()) return nothing;
          return std::optional<Batch>();
        }
        case EpochScheduler::Step::kBuild:
          Build(next.epoch);
          continue;
        case EpochScheduler::Step::kWait:
          break;
      }
      if (workers_.target() == 0 && Work(consumer_ctx_, 1)) {
        if (std::exchange(interrupted_, false)) return Cancelled("interrupted");
        continue;
      }
      AwaitBatch(std::chrono::steady_clock::time_point::max());
    }
  }

  // Hands out the next batch. One with failed samples left in it (all of
  // them under kRaise; under kSkip those that are not the sample's fault)
  // first comes back as an error naming each of them, and stays; the next
  // call hands out its good samples. nullopt: nothing of it was left.
  std::optional<Result<std::optional<Batch>>> Deliver() REQUIRES(mu_) {
    BatchSlot* next = sched_.Peek();
    if (next->failed() && !next->failures_reported()) {
      next->set_failures_reported();
      return Result<std::optional<Batch>>(FailureError(*next));
    }
    std::unique_ptr<BatchSlot> slot = sched_.Deliver();
    if (idle_workers_ > 0) work_cv_.NotifyAll();
    if (tally_.skipped == 0 && !slot->skips().empty()) tally_.first_skip = slot->skips().front();
    tally_.skipped += static_cast<int64_t>(slot->skips().size());
    skipped_total_ += static_cast<int64_t>(slot->skips().size());
    for (auto& skip : slot->skips()) {
      if (skipped_.size() >= kSkipRecordsKept) break;
      skipped_.push_back(std::move(skip));
    }
    MutexUnlock unlock(mu_);
    batches_delivered_.fetch_add(1, std::memory_order_relaxed);
    if (slot->failed())
      slot->DropFailures([](int64_t, const Status&) { return true; });  // reported
    if (slot->count() == 0) {
      pool_->Release(std::move(slot));
      return std::nullopt;
    }
    if (device_ != nullptr) {
      if (Status st = device_->Deliver(*slot); !st.ok()) {
        pool_->Release(std::move(slot));
        MutexLock relock(mu_);
        Fail(st);  // the batch is gone: the loader cannot go on
        return Result<std::optional<Batch>>(std::move(st));
      }
    }
    samples_delivered_.fetch_add(slot->count(), std::memory_order_relaxed);
    user_samples_delivered_.fetch_add(slot->samples(), std::memory_order_relaxed);
    return Result<std::optional<Batch>>(std::optional<Batch>(Batch(std::move(slot), pool_)));
  }

  // Starts counting what the epoch now due delivers and skips; `whole` is
  // false when it resumes mid-epoch (batches before were delivered elsewhere).
  void StartTally(bool whole) REQUIRES(mu_) {
    tally_ = {.start_samples = user_samples_delivered_.load(std::memory_order_relaxed),
              .whole = whole};
  }

  // An epoch that had samples planned and ended having delivered none while
  // skipping some (every sample bad under kSkip) is an error: ending it
  // quietly would let a consumer spin through empty epochs for ever.
  Status EpochDeliveredNothing() const REQUIRES(mu_) {
    const int64_t delivered =
        user_samples_delivered_.load(std::memory_order_relaxed) - tally_.start_samples;
    const int64_t planned = sched_.shape().num_samples;
    if (!tally_.whole || delivered > 0 || tally_.skipped == 0 || planned == 0) return Status::Ok();
    const std::string skipped = std::to_string(tally_.skipped);
    // Items that are no samples (user batches): how many samples they held is the kind's.
    const std::string what = !kind_->items_are_samples() ? skipped + " samples were skipped"
                             : tally_.skipped == planned
                                 ? "all " + skipped + " samples were skipped"
                                 : skipped + " of its " + std::to_string(planned) +
                                       " samples were skipped and the others failed";
    const SkipRecord& first = tally_.first_skip;
    const std::string name =
        first.key.empty() ? "sample " + std::to_string(first.index) : first.key;
    return DataError("epoch " + std::to_string(sched_.epoch()) + " delivered nothing: " + what +
                     " (first: " + name + ": " + first.reason + ")");
  }

  // What a batch's error says of its good samples: the next call hands them
  // out, a batch short of its size (a named item's failures are the kind's).
  static std::string RestOf(const BatchSlot& slot, bool named) {
    const int64_t rest = slot.good_samples();
    if (named || rest == 0) return "";
    return rest == 1 ? " (its other sample comes as the next batch)"
                     : " (its " + std::to_string(rest) + " other samples come as the next batch)";
  }

  // One error for every failed sample left in `slot`, with the code and
  // detail of the first that is not the sample's fault (else of the first);
  // a detail saying which sample that is where its kind gave none.
  static Status FailureError(const BatchSlot& slot) {
    const auto failures = slot.Failures();
    // What a kind names (a stream's shard) is known by that name, not by its
    // place among the epoch's items.
    const bool named = std::ranges::all_of(failures, [](const auto& f) { return !f.name.empty(); });
    const std::string where = (named ? "" : "batch " + std::to_string(slot.batch()) + " of ") +
                              "epoch " + std::to_string(slot.epoch()) + RestOf(slot, named);
    size_t lead = 0;
    std::string message = where + ", " + std::to_string(failures.size()) + " samples failed: ";
    for (size_t i = 0; i < failures.size(); ++i) {
      const Status& st = failures[i].status;
      if (!IsSampleError(st) && IsSampleError(failures[lead].status)) lead = i;
      message += (i > 0 ? "; " : "") + failures[i].Named().ToString();
    }
    const BatchSlot::Failure& first = failures[lead];
    std::shared_ptr<const StatusDetail> detail = first.status.detail();
    if (detail == nullptr && first.index >= 0) {
      auto sample = std::make_shared<SampleDetail>();
      sample->index = first.index;
      sample->key = first.key;
      detail = std::move(sample);
    }
    if (failures.size() == 1) return first.Named().WithContext(where).WithDetail(detail);
    return first.status.WithMessage(message).WithDetail(detail);
  }

  void WorkerMain(int id) EXCLUDES(mu_) {
    if (options_.batch_scheduling) {
      sched_param param{};
      pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);  // a refusal is harmless
    }
    WorkerContext ctx(id, WorkerPlace::kWorkerThread, *kind_, cap_);
    if (Status st = ctx.worker->Ready(); IsRefusal(st)) {
      // Refused before taking work: no item is lost, the pool stays smaller.
      MutexLock lock(mu_);
      const int left = workers_.Retire();
      refused_at_.store(left, std::memory_order_relaxed);
      refusal_retry_ns_ = SteadyNanos() + refusal_wait_ns_;
      refusal_wait_ns_ = std::min(2 * refusal_wait_ns_, kRefusalRetryMax.count());
      kind_->Resized(workers_.target(), remote());
      refusal_ = std::move(st);
      return;
    }
    stats_board_.Join(&ctx.stats);
    ctx.may_leave = [this, &ctx] {
      if (stop_flag_.load(std::memory_order_relaxed) || ctx.left) return false;
      // Workers making the next epoch's items may wait for it to start: the
      // item handed over could then find none free, and the epoch end wait
      // for it for ever. The item is finished here instead, and once this
      // worker commits, none starts one until its item ends (HandOverEnds).
      MutexLock lock(mu_);
      if (sched_.AheadInProgress() || !workers_.TryLeave()) return false;
      sched_.HandOverBegins();
      ctx.left = ctx.handing_over = true;
      return true;
    };
    ctx.outcome.may_leave = &ctx.may_leave;
    // A worker over its share of the memory budget: with the tuner sizing
    // the pool, one worker fewer gives each a larger share, so it leaves and
    // its item runs again elsewhere (the last local worker cannot).
    ctx.may_shed = [this, &ctx](const std::string& why) {
      if (!tuned_.load(std::memory_order_relaxed) || stop_flag_.load(std::memory_order_relaxed) ||
          ctx.left) {
        return false;
      }
      MutexLock lock(mu_);
      if (sched_.AheadInProgress() || workers_.running() - remote_ <= 1) return false;
      sched_.HandOverBegins();
      local_ = std::max(1, workers_.Retire() - remote_);
      kind_->Resized(workers_.target(), remote());
      ++workers_shed_;
      workers_shed_reason_ = why;
      ctx.left = ctx.handing_over = true;
      return true;
    };
    ctx.outcome.may_shed = &ctx.may_shed;
    {
      MutexLock lock(mu_);
      while (!stopped_ && !ctx.left && !workers_.TryLeave()) {
        bool worked = false;
        try {
          worked = Work(ctx, workers_.running());
        } catch (const std::bad_alloc&) {
          // An allocation outside a kind's Run (naming a failure, noting it):
          // the loader stops with an error instead of the process aborting.
          Fail(std::exchange(out_of_memory_, Status()));
        }
        if (worked) continue;
        ++idle_workers_;
        work_cv_.Wait(mu_);
        --idle_workers_;
      }
    }
    stats_board_.Leave(&ctx.stats);
  }

  const LoaderOptions options_;
  const SampleCap cap_;  // each worker's, from the memory budget
  const std::shared_ptr<const WorkerKind> kind_;
  const SampleSpec spec_;
  const std::shared_ptr<BatchPool> pool_;
  const std::shared_ptr<DeviceStage> device_;  // null without a device

  mutable Mutex mu_;
  CondVar work_cv_;   // workers: work, room, a plan, resize or stop
  CondVar ready_cv_;  // consumer: a batch, a plan, resize or stop
  EpochScheduler sched_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
  Status fatal_ GUARDED_BY(mu_);  // what stops the loader from going on
  // Made ahead: when an allocation failed, making the error could fail too.
  Status out_of_memory_ GUARDED_BY(mu_) =
      Unavailable("out of memory on a worker thread (the system refused an allocation)");
  std::atomic<bool> stop_flag_{false};  // read per sample without the lock
  int idle_workers_ GUARDED_BY(mu_) = 0;
  // The worker count at which the system refused a kind's worker (the pool
  // stays under it), and why.
  std::atomic<int> refused_at_{kMaxWorkers};
  int64_t refusal_retry_ns_ GUARDED_BY(mu_) = 0;  // when the cap is lifted
  int64_t refusal_wait_ns_ GUARDED_BY(mu_) = kRefusalRetryFirst.count();
  int local_ GUARDED_BY(mu_) = 0;      // local workers asked for (Resize)
  int remote_ GUARDED_BY(mu_) = 0;     // remote slots asked for (SetRemote)
  std::atomic<int> remote_target_{0};  // remote_, for readers without the lock
  Status refusal_ GUARDED_BY(mu_);
  std::atomic<bool> tuned_{false};  // a controller sizes the pool
  int64_t workers_shed_ GUARDED_BY(mu_) = 0;
  std::string workers_shed_reason_ GUARDED_BY(mu_);
  std::vector<SkipRecord> skipped_ GUARDED_BY(mu_);  // the first kSkipRecordsKept
  int64_t skipped_total_ GUARDED_BY(mu_) = 0;
  // What the epoch being delivered has delivered and skipped so far.
  struct EpochTally {
    int64_t start_samples = 0;  // user_samples_delivered_ when it started
    int64_t skipped = 0;
    SkipRecord first_skip;  // its first, when skipped > 0
    bool whole = true;      // delivered from its start by this loader
  };
  EpochTally tally_ GUARDED_BY(mu_);
  const uint64_t fork_generation_ = ForkGeneration();
  const pid_t made_in_pid_ = getpid();

  WorkerStatsBoard stats_board_;
  WorkerContext consumer_ctx_;               // consumer thread only
  std::function<bool()> interrupt_;          // consumer thread only (SetInterrupt)
  bool interrupted_ = false;                 // consumer thread only: interrupt_ said yes
  Loader* owner_ = nullptr;                  // for the controller's Tick
  std::unique_ptr<Controller> controller_;   // consumer thread only
  std::string pin_skipped_;                  // set once, before the loader is handed out
  int64_t next_tick_ns_ = 0;                 // consumer thread only
  int64_t shed_ticked_ GUARDED_BY(mu_) = 0;  // workers_shed_ at the last tick
  int64_t last_return_ns_ = 0;               // consumer thread only
  // The batch the consumer last slept on (AwaitBatch) and since when.
  struct {
    int64_t epoch = -1, batch = -1, since_ns = 0;
  } awaited_ GUARDED_BY(mu_);
  bool consumer_asleep_ GUARDED_BY(mu_) = false;
  std::atomic<int64_t> consumer_wait_ns_{0};
  std::atomic<int64_t> consumer_step_ns_{0};
  std::atomic<int64_t> next_calls_{0};
  std::atomic<int64_t> batches_delivered_{0};
  std::atomic<int64_t> samples_delivered_{0};
  std::atomic<int64_t> user_samples_delivered_{0};
  // The counters above over the consumer's last kRecentWindowS, a point
  // every quarter second of its time.
  ConsumerWindow recent_{static_cast<int64_t>(kRecentWindowS * 1e9), 250'000'000};

  WorkerPool workers_;  // last: its threads use everything above
};

namespace {

int64_t ItemCount(const LoaderOptions& o) {
  return o.kind != nullptr ? o.kind->items() : o.source->size();
}

PlanOptions PlanOptionsOf(const LoaderOptions& o) {
  return {ItemCount(o), o.batch_size, o.shuffle,    o.seed,
          o.drop_last,  o.rank,       o.world_size, o.pad_shards};
}

// Splits the budget (docs/engine.md, "Memory budget"): batch buffers first,
// the consumer's and the prefetch bound's, which is lowered to at most half
// the budget (but always one batch being written); the workers share the
// rest evenly as their per-sample cap.
// REQUIRES: CheckBatchFits(o, budget) is ok and o.workers >= 0.
SampleCap SplitBudget(LoaderOptions& o, size_t budget) {
  const size_t batch = *BatchBytes(o);
  const size_t room = std::max(budget / 2, 2 * batch) - batch;
  size_t prefetch = std::max(o.prefetch_bytes, batch);  // the engine's bound in bytes
  if (static_cast<size_t>(o.prefetch_batches) <= prefetch / batch) {
    prefetch = static_cast<size_t>(o.prefetch_batches) * batch;
  }
  if (prefetch > room) {
    prefetch = room;
    o.prefetch_bytes = room;
  }
  SampleCap cap;
  cap.budget_bytes = budget;
  cap.workers = std::max(o.workers, 1);
  cap.bytes = (budget - batch - prefetch) / static_cast<size_t>(cap.workers);
  return cap;
}

}  // namespace

SampleSpec ItemSpec(const LoaderOptions& o) {
  return o.kind != nullptr ? o.kind->spec() : o.transform->spec();
}

std::optional<size_t> BatchBytes(const LoaderOptions& o) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(ItemSpec(o).bytes(), static_cast<size_t>(o.batch_size), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

// The smallest working loader holds two batch buffers, one the consumer has,
// one being written, and a worker's room for one sample more (its share of
// the rest: at 0 bytes every sample would be refused). Past the budget, the
// engine's allocation fails or the kernel kills the process, with no word on
// which option asked for too much.
Status CheckBatchFits(const LoaderOptions& o, size_t budget) {
  const std::optional<size_t> batch = BatchBytes(o);
  if (batch && *batch <= budget / 2 && budget - 2 * *batch >= ItemSpec(o).bytes()) {
    return Status::Ok();
  }
  const std::string& name = o.tuner.memory_budget_name;
  const std::string budget_option =
      o.tuner.memory_budget_bytes == 0
          ? std::to_string(static_cast<int>(kMemoryBudgetShare * 100 + 0.5)) +
                " % of available memory, the default of " + name
          : name + " = " + std::to_string(o.tuner.memory_budget_bytes);
  if (o.kind != nullptr && o.batch_size == 1) {
    // The kind's item is what a worker makes whole (a batch of the native
    // path): its size is the kind's, not batch_size's.
    const std::string item = o.kind->item_name();
    return InvalidArgument("one " + item + " takes " + FormatBytes(ItemSpec(o).bytes()) +
                           "; a loader needs room for three (one delivered, one being written, " +
                           "one a worker makes), more than the memory budget of " +
                           FormatBytes(budget) + " (" + budget_option + ")");
  }
  return InvalidArgument("option 'batch_size' = " + std::to_string(o.batch_size) +
                         " makes one batch " +
                         (batch ? FormatBytes(*batch) : std::string("too large to count")) +
                         " (of the transform's samples, " + FormatBytes(ItemSpec(o).bytes()) +
                         " each); a loader needs room for two (one delivered, one being written) "
                         "and a sample more, more than the memory budget of " +
                         FormatBytes(budget) + " (" + budget_option + ")");
}

Status ValidateEngineOptions(const LoaderOptions& o) {
  if (o.kind != nullptr) {
    if (o.source != nullptr || o.transform != nullptr) {
      return InvalidArgument("options 'kind' and 'source'/'transform' exclude each other");
    }
  } else {
    if (o.source == nullptr) return InvalidArgument("option 'source' is required");
    if (o.transform == nullptr) return InvalidArgument("option 'transform' is required");
  }
  if ((o.workers < 0 && o.workers != kAutoWorkers) || o.workers > kMaxWorkers) {
    return InvalidArgument("option 'workers' must be in [0, " + std::to_string(kMaxWorkers) +
                           "] or kAutoWorkers (" + std::to_string(kAutoWorkers) + "), got " +
                           std::to_string(o.workers));
  }
  if (o.prefetch_batches < 1) {
    return InvalidArgument("option 'prefetch_batches' must be >= 1, got " +
                           std::to_string(o.prefetch_batches));
  }
  if (o.prefetch_bytes < 1) return InvalidArgument("option 'prefetch_bytes' must be >= 1");
  if (o.device < LoaderOptions::kNoDevice) {
    return InvalidArgument(
        "option 'device' must be a CUDA device index >= 0 or kNoDevice (-1), got " +
        std::to_string(o.device));
  }
  STOKER_RETURN_IF_ERROR(CheckEpoch("option 'start_epoch'", o.start_epoch));
  if (ItemSpec(o).bytes() == 0) return InvalidArgument("the sample spec has zero bytes");
  const PlanOptions plan = PlanOptionsOf(o);
  STOKER_RETURN_IF_ERROR(ValidatePlanOptions(plan));
  if (PlanShape::Of(plan).num_batches == 0) {
    return InvalidArgument("drop_last leaves no batch: " + std::to_string(ItemCount(o)) +
                           " samples over world_size " + std::to_string(o.world_size) +
                           " is less than batch_size " + std::to_string(o.batch_size));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Loader>> MakeEngineLoader(LoaderOptions o, size_t budget_bytes,
                                                 std::unique_ptr<Controller> controller) {
  STOKER_RETURN_IF_ERROR(ValidateEngineOptions(o));
  assert(o.workers >= 0 && "kAutoWorkers is the factory's to resolve");
  STOKER_RETURN_IF_ERROR(CheckBatchFits(o, budget_bytes));
  const SampleCap cap = SplitBudget(o, budget_bytes);
  const PlanOptions plan = PlanOptionsOf(o);
  std::shared_ptr<const CudaRuntime> cuda;
  std::shared_ptr<DeviceStage> device;
  // pin_memory without a device where no CUDA device can be used: nothing
  // would copy the batches to one, so none is page-locked (as torch's
  // DataLoader does then); pin_skipped() says why.
  std::string pin_skipped;
  if (o.pin_memory && o.device == LoaderOptions::kNoDevice) {
    auto loaded = CudaRuntime::Load();
    Result<int> devices = loaded.ok() ? (*loaded)->Devices() : Result<int>(loaded.status());
    if (!devices.ok() || *devices == 0) {
      pin_skipped =
          devices.ok() ? "no CUDA device (" + (*loaded)->path() + ")" : devices.status().message();
      o.pin_memory = false;
    } else {
      cuda = std::move(loaded).value();  // loaded once
    }
  }
  if (cuda == nullptr && (o.pin_memory || o.device != LoaderOptions::kNoDevice)) {
    const std::string option = o.device != LoaderOptions::kNoDevice
                                   ? "option 'device' = " + std::to_string(o.device)
                                   : std::string("option 'pin_memory'");
    auto loaded = CudaRuntime::Load();
    if (!loaded.ok()) return loaded.status().WithContext(option);
    cuda = std::move(loaded).value();
  }
  if (o.device != LoaderOptions::kNoDevice) {
    auto made = DeviceStage::Make(cuda, o.device, o.device_prefetch_bytes, *BatchBytes(o));
    if (!made.ok()) return made.status();
    device = std::move(made).value();
  }
  auto impl =
      std::make_unique<Loader::Impl>(std::move(o), plan, cap, std::move(cuda), std::move(device));
  impl->SetController(std::move(controller));
  impl->set_pin_skipped(std::move(pin_skipped));
  std::unique_ptr<Loader> loader(new Loader(std::move(impl)));
  STOKER_RETURN_IF_ERROR(loader->impl_->Start());
  return loader;
}

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->set_owner(this); }
Loader::~Loader() {
  // In a forked child the workers are the parent's: there is nothing to join,
  // and stopping would wait on locks and condition variables they may hold.
  if (!impl_->CheckProcess().ok()) static_cast<void>(impl_.release());
}
Status Loader::CheckProcess() const { return impl_->CheckProcess(); }
Result<std::optional<Batch>> Loader::Next() {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  return impl_->Next();
}
void Loader::SetInterrupt(std::function<bool()> interrupted) {
  impl_->SetInterrupt(std::move(interrupted));
}
bool Loader::WaitReady(std::chrono::nanoseconds timeout) {
  return !impl_->CheckProcess().ok() || impl_->WaitReady(timeout);
}
Status Loader::SetEpoch(int64_t epoch) {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  STOKER_RETURN_IF_ERROR(CheckEpoch("epoch", epoch));
  impl_->SetEpoch(epoch, std::nullopt, /*keep_ahead=*/true, /*keep_restore=*/true);
  return Status::Ok();
}
Status Loader::SetEpoch(int64_t epoch, int64_t items, bool keep_ahead) {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  STOKER_RETURN_IF_ERROR(CheckEpoch("epoch", epoch));
  if (!impl_->items_vary()) {
    return InvalidArgument(
        "SetEpoch with an item count needs option 'kind' of items that are not samples (a "
        "source's size is fixed)");
  }
  if (items < 0) {
    return InvalidArgument("SetEpoch's item count must be >= 0, got " + std::to_string(items));
  }
  impl_->SetEpoch(epoch, items, keep_ahead);
  return Status::Ok();
}
int64_t Loader::epoch() const { return impl_->epoch(); }
int64_t Loader::batches_per_epoch() const { return impl_->batches_per_epoch(); }
const std::string& Loader::pin_skipped() const { return impl_->pin_skipped(); }
int64_t Loader::samples_per_epoch() const { return impl_->samples_per_epoch(); }
const SampleSpec& Loader::spec() const { return impl_->spec(); }
Result<LoaderState> Loader::State() const {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  return impl_->State();
}
Status Loader::Restore(const LoaderState& state) {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  return impl_->Restore(state);
}
Status Loader::Resize(int workers) {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  return impl_->Resize(workers);
}
int Loader::workers() const { return impl_->workers(); }
Status Loader::SetRemote(int slots) {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  return impl_->SetRemote(slots);
}
int Loader::remote() const { return impl_->remote(); }
Status Loader::SetPrefetch(int batches, size_t bytes) {
  STOKER_RETURN_IF_ERROR(impl_->CheckProcess());
  impl_->SetPrefetch(batches, bytes);
  return Status::Ok();
}
LoaderMetrics Loader::Metrics() const { return impl_->Metrics(); }
std::optional<AwaitedBatch> Loader::Awaited() const { return impl_->Awaited(); }
std::vector<SkipRecord> Loader::Skipped() const { return impl_->Skipped(); }
void Loader::Stop() {
  if (impl_->CheckProcess().ok()) impl_->Stop();
}
bool Loader::StopWithin(std::chrono::nanoseconds patience) {
  return !impl_->CheckProcess().ok() || impl_->StopWithin(patience);
}
std::vector<ItemInProgress> Loader::InProgress() const { return impl_->InProgress(); }
std::optional<TunerView> Loader::tuner_view() const {
  const Controller* c = impl_->controller();
  return c != nullptr ? c->View() : std::nullopt;
}
std::vector<TunerDecision> Loader::tuner_trace() const {
  const Controller* c = impl_->controller();
  return c != nullptr ? c->Trace() : std::vector<TunerDecision>{};
}
Status Loader::FlushTrace() const {
  // In a forked child the writer thread is not there to wait for.
  if (Status st = impl_->CheckProcess(); !st.ok()) return st;
  Controller* c = impl_->controller();
  return c != nullptr ? c->FlushTrace() : Status::Ok();
}

// Batch

Batch::Batch() = default;
Batch::Batch(std::unique_ptr<BatchSlot> slot, std::shared_ptr<BatchPool> pool)
    : slot_(std::move(slot)), pool_(std::move(pool)), fork_generation_(ForkGeneration()) {}
Batch::Batch(Batch&& other) noexcept = default;
Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    Release();
    slot_ = std::move(other.slot_);
    pool_ = std::move(other.pool_);
    fork_generation_ = other.fork_generation_;
  }
  return *this;
}
Batch::~Batch() { Release(); }
void Batch::Release() {
  if (slot_ != nullptr) {
    if (ForkGeneration() == fork_generation_) {
      pool_->Release(std::move(slot_));
    } else {
      // A forked child: a parent thread may have held the pool's lock at the
      // fork. (Dropping the reference below is only an atomic decrement while
      // the loader lives; once it is gone, no thread can hold that lock.)
      static_cast<void>(slot_.release());
    }
  }
  pool_.reset();
}
int64_t Batch::epoch() const { return slot_->epoch(); }
int64_t Batch::index() const { return slot_->batch(); }
int64_t Batch::size() const { return slot_->count(); }
const SampleSpec& Batch::spec() const { return slot_->spec(); }
std::span<const std::byte> Batch::data() const { return slot_->data(); }
std::span<std::byte> Batch::mutable_data() { return slot_->mutable_data(); }
std::span<const int64_t> Batch::labels() const { return slot_->labels(); }
std::span<const int64_t> Batch::sample_indices() const { return slot_->indices(); }
void* Batch::device_data() const {
  const DeviceCopy* copy = slot_->device_copy();
  return copy != nullptr ? copy->data() : nullptr;
}
void* Batch::ready_event() const {
  const DeviceCopy* copy = slot_->device_copy();
  return copy != nullptr ? static_cast<void*>(copy->ready_event()) : nullptr;
}
Status Batch::WaitOn(void* stream) {
  DeviceCopy* copy = slot_->device_copy();
  if (copy == nullptr)
    return FailedPrecondition("this batch has no device copy (option 'device' unset)");
  return copy->WaitOn(static_cast<CudaStream>(stream));
}

}  // namespace stoker
