#include "stoker/loader.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <mutex>
#include <string>

#include "core/clock.h"
#include "engine/batch_pool.h"
#include "engine/controller.h"
#include "engine/engine_loader.h"
#include "engine/run_delay.h"
#include "engine/worker_pool.h"
#include "plan/epoch_plan.h"

namespace stoker {
namespace {

constexpr int64_t kRunDelayTaskNs = 200'000;  // tasks this long read the run-queue delay

// What one thread (a worker, or the consumer when it does the work) keeps
// between tasks, so that producing a sample allocates nothing once warm.
struct WorkerContext {
  int id = -1;
  ReadBuffer read;
  std::unique_ptr<TransformScratch> scratch;
  std::atomic<int64_t> samples{0};
  std::atomic<int64_t> busy_ns{0};
  std::atomic<int64_t> cpu_ns{0};
  // Of busy_ns, the time spent runnable but waiting for a CPU; kept only on
  // worker threads (the consumer's thread may change between calls).
  std::atomic<int64_t> queue_ns{0};
  std::unique_ptr<RunDelayClock> run_delay;
  int64_t run_delay_ns = 0;          // its last reading
  int64_t sample_ns = 0;             // wall time per sample in the last task
  std::atomic<size_t> footprint{0};  // bytes of `read` and `scratch`, after each task
  // Counters are published every this many samples: about a millisecond's
  // worth, so that slow samples show progress within a long task while
  // trivial ones do not pay a clock read each. Owner thread only.
  int64_t publish_every = 1;
};

// A claimed run of consecutive positions of one batch.
struct Task {
  std::shared_ptr<const EpochPlan> plan;
  BatchSlot* slot = nullptr;
  int64_t offset = 0;
  int64_t length = 0;
};

// One epoch being produced: its plan and where claiming and delivery stand.
// The loader keeps the epoch being delivered and, once that one is fully
// claimed, the next one, so that workers never idle at an epoch boundary.
struct EpochRun {
  EpochRun(std::shared_ptr<const EpochPlan> p, int64_t g)
      : plan(std::move(p)),
        generation(g),
        delivered(static_cast<size_t>(plan->num_batches()), 0),
        open(static_cast<size_t>(plan->num_batches())) {}

  int64_t epoch() const { return plan->epoch(); }
  int64_t num_batches() const { return plan->num_batches(); }
  bool fully_claimed() const { return claim_batch >= num_batches(); }
  bool finished() const { return delivered_count == num_batches(); }

  std::shared_ptr<const EpochPlan> plan;
  int64_t generation;
  std::vector<uint8_t> delivered;                // by batch
  std::vector<std::unique_ptr<BatchSlot>> open;  // by batch; started, not delivered
  std::vector<int64_t> ready_fifo;               // unordered delivery
  size_t ready_head = 0;
  int64_t delivered_count = 0;
  int64_t claim_batch = 0;
  int64_t claim_offset = 0;
  int64_t deliver_pos = 0;
};

}  // namespace

class Loader::Impl {
 public:
  Impl(LoaderOptions options, PlanOptions plan_options)
      : options_(std::move(options)),
        plan_options_(plan_options),
        spec_(options_.transform->spec()),
        pool_(std::make_shared<BatchPool>(spec_, options_.batch_size)),
        num_batches_(EpochPlan(plan_options_, 0).num_batches()),
        samples_per_epoch_(EpochPlan(plan_options_, 0).num_samples()),
        next_epoch_(options_.start_epoch),
        prefetch_batches_(options_.prefetch_batches),
        prefetch_bytes_(options_.prefetch_bytes),
        workers_([this](int id) { WorkerMain(id); }) {
    consumer_ctx_.scratch = options_.transform->NewScratch();
    pool_->set_max_free(static_cast<size_t>(prefetch_batches_) + 2);
    std::lock_guard<std::mutex> lock(mu_);
    workers_.Resize(options_.workers);
  }

  ~Impl() { Stop(); }

  // Called once, by MakeEngineLoader before the loader is handed out; the
  // pointer never changes after, so controller() may be read from any thread.
  void SetController(std::unique_ptr<Controller> c) {
    controller_ = std::move(c);
    next_tick_ns_ = 0;
  }
  Controller* controller() const { return controller_.get(); }
  void set_owner(Loader* owner) { owner_ = owner; }

  Result<std::optional<Batch>> Next() {
    const int64_t enter = SteadyNanos();
    if (last_return_ns_ != 0) {
      consumer_step_ns_.fetch_add(enter - last_return_ns_, std::memory_order_relaxed);
    }
    auto result = NextImpl();
    last_return_ns_ = SteadyNanos();
    consumer_wait_ns_.fetch_add(last_return_ns_ - enter, std::memory_order_relaxed);
    next_calls_.fetch_add(1, std::memory_order_relaxed);
    return result;
  }

  // Counts as consumer wait like Next(), ticks the controller meanwhile, and
  // starts the next epoch if none is running, so that a consumer may wait in
  // slices (to handle signals) without hiding its waiting from the tuner.
  bool WaitReady(std::chrono::nanoseconds timeout) {
    const int64_t enter = SteadyNanos();
    if (last_return_ns_ != 0) {
      consumer_step_ns_.fetch_add(enter - last_return_ns_, std::memory_order_relaxed);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool ready = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (true) {
        MaybeTickLocked(lock);
        if (!stopped_ && cur_ == nullptr) StartEpochLocked();
        ready = stopped_ || cur_->finished() || workers_.target() == 0 ||
                DeliverableLocked() != nullptr;
        if (ready || std::chrono::steady_clock::now() >= deadline) break;
        auto until = deadline;
        if (controller_ != nullptr) {
          until = std::min(until, std::chrono::steady_clock::time_point(
                                      std::chrono::nanoseconds(next_tick_ns_)));
        }
        ready_cv_.wait_until(lock, until);
      }
    }
    last_return_ns_ = SteadyNanos();
    consumer_wait_ns_.fetch_add(last_return_ns_ - enter, std::memory_order_relaxed);
    return ready;
  }

  void SetEpoch(int64_t epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    Abandon(cur_);
    // The epoch prefetched ahead is kept when it is the one asked for: the
    // usual `set_epoch(e)` before each epoch costs nothing.
    if (ahead_ != nullptr && ahead_->epoch() != epoch) Abandon(ahead_);
    next_epoch_ = epoch;
    pending_restore_.reset();
  }

  int64_t epoch() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cur_ ? cur_->epoch() : next_epoch_;
  }

  int64_t batches_per_epoch() const { return num_batches_; }
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  const SampleSpec& spec() const { return spec_; }

  LoaderState State() const {
    std::lock_guard<std::mutex> lock(mu_);
    LoaderState state;
    state.seed = options_.seed;
    if (pending_restore_) return *pending_restore_;
    if (cur_ == nullptr) {
      state.epoch = next_epoch_;
      return state;
    }
    if (cur_->finished()) {
      state.epoch = cur_->epoch() + 1;
      return state;
    }
    state.epoch = cur_->epoch();
    int64_t prefix = 0;
    while (prefix < num_batches_ && cur_->delivered[static_cast<size_t>(prefix)]) ++prefix;
    state.position = prefix;
    for (int64_t b = prefix; b < num_batches_; ++b) {
      if (cur_->delivered[static_cast<size_t>(b)]) state.beyond.push_back(b);
    }
    return state;
  }

  Status Restore(const LoaderState& state) {
    if (state.seed != options_.seed) {
      return InvalidArgument("checkpoint seed " + std::to_string(state.seed) +
                             " differs from the loader's seed " + std::to_string(options_.seed));
    }
    if (state.epoch < 0) {
      return InvalidArgument("checkpoint epoch must be >= 0, got " + std::to_string(state.epoch));
    }
    if (state.position < 0 || state.position > num_batches_) {
      return InvalidArgument("checkpoint position " + std::to_string(state.position) +
                             " is outside [0, " + std::to_string(num_batches_) + "]");
    }
    for (int64_t b : state.beyond) {
      if (b <= state.position || b >= num_batches_) {
        return InvalidArgument("checkpoint batch " + std::to_string(b) +
                               " in 'beyond' is outside (position, " +
                               std::to_string(num_batches_) + ")");
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    Abandon(cur_);
    Abandon(ahead_);
    next_epoch_ = state.epoch;
    pending_restore_ = state;
    return Status::Ok();
  }

  void Resize(int workers) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    workers_.Resize(workers);
    work_cv_.notify_all();
    ready_cv_.notify_all();
  }

  int workers() const { return workers_.target(); }

  void SetPrefetch(int batches, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    prefetch_batches_ = std::max(batches, 1);
    prefetch_bytes_ = std::max<size_t>(bytes, 1);
    pool_->set_max_free(static_cast<size_t>(DepthLocked()) + 2);
    work_cv_.notify_all();
  }

  LoaderMetrics Metrics() const {
    LoaderMetrics m;
    m.time_ns = SteadyNanos();
    m.batches_delivered = batches_delivered_.load(std::memory_order_relaxed);
    m.samples_delivered = samples_delivered_.load(std::memory_order_relaxed);
    m.consumer_wait_ns = consumer_wait_ns_.load(std::memory_order_relaxed);
    m.consumer_step_ns = consumer_step_ns_.load(std::memory_order_relaxed);
    m.next_calls = next_calls_.load(std::memory_order_relaxed);
    m.batch_bytes = pool_->batch_bytes();
    std::lock_guard<std::mutex> lock(mu_);
    m.workers_target = workers_.target();
    m.workers_running = workers_.running();
    m.prefetch_batches = prefetch_batches_;
    m.prefetch_bytes = prefetch_bytes_;
    m.ready_batches = ready_count_;
    m.open_batches = open_count_;
    m.bytes_in_flight = static_cast<size_t>(open_count_) * pool_->batch_bytes();
    m.samples_produced = retired_samples_;
    m.busy_ns = retired_busy_ns_;
    m.cpu_ns = retired_cpu_ns_;
    m.queue_ns = retired_queue_ns_;
    auto add = [&m](const WorkerContext& c) {
      WorkerMetrics w{c.id, c.samples.load(std::memory_order_relaxed),
                      c.busy_ns.load(std::memory_order_relaxed),
                      c.cpu_ns.load(std::memory_order_relaxed),
                      c.queue_ns.load(std::memory_order_relaxed)};
      m.samples_produced += w.samples;
      m.busy_ns += w.busy_ns;
      m.cpu_ns += w.cpu_ns;
      m.queue_ns += w.queue_ns;
      return w;
    };
    for (const WorkerContext* c : live_workers_) {
      m.workers.push_back(add(*c));
      m.worker_bytes += c->footprint.load(std::memory_order_relaxed);
    }
    add(consumer_ctx_);
    return m;
  }

  std::vector<SkipRecord> Skipped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return skipped_;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      stop_flag_.store(true, std::memory_order_release);
      workers_.Stop();
      work_cv_.notify_all();
      ready_cv_.notify_all();
    }
    workers_.Join();
  }

 private:
  // Batches that may be started and not yet delivered.
  int DepthLocked() const {
    size_t by_bytes = prefetch_bytes_ / std::max<size_t>(pool_->batch_bytes(), 1);
    return static_cast<int>(
        std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(prefetch_batches_), by_bytes)));
  }

  // Makes next_epoch_ the epoch being delivered: the one prefetched ahead
  // when it is that epoch, else a fresh one (applying a pending restore).
  void StartEpochLocked() {
    if (ahead_ != nullptr && ahead_->epoch() == next_epoch_ && !pending_restore_) {
      cur_ = std::move(ahead_);
      return;
    }
    Abandon(ahead_);
    cur_ = NewRun(next_epoch_);
    if (pending_restore_) {
      for (int64_t b = 0; b < pending_restore_->position; ++b) {
        cur_->delivered[static_cast<size_t>(b)] = 1;
      }
      for (int64_t b : pending_restore_->beyond) cur_->delivered[static_cast<size_t>(b)] = 1;
      cur_->delivered_count = static_cast<int64_t>(
          std::count(cur_->delivered.begin(), cur_->delivered.end(), uint8_t{1}));
      pending_restore_.reset();
    }
    work_cv_.notify_all();
  }

  // Drops `run` (may be null). Slots still being written by workers move to
  // stale_, and whoever finishes them last returns them to the pool.
  void Abandon(std::unique_ptr<EpochRun>& run) {
    if (run == nullptr) return;
    for (int64_t b = 0; b < run->num_batches(); ++b) {
      auto& slot = run->open[static_cast<size_t>(b)];
      if (slot == nullptr) continue;
      --open_count_;
      if (slot->ready) --ready_count_;
      bool release_now = slot->ready;
      if (!release_now && b == run->claim_batch && run->claim_offset > 0) {
        // Nobody will claim the rest of this batch: count it done ourselves.
        int64_t unclaimed = slot->length - run->claim_offset;
        release_now = slot->remaining.fetch_sub(unclaimed, std::memory_order_acq_rel) == unclaimed;
      }
      if (release_now) {
        pool_->Release(std::move(slot));
      } else {
        stale_.push_back(std::move(slot));
      }
    }
    run.reset();
    work_cv_.notify_all();
  }

  // Claims the next run of positions: from the epoch being delivered, or,
  // once that is fully claimed, from the next one (prefetch across the epoch
  // boundary). Opening a batch needs room under the prefetch bound. Chunks
  // shrink when many workers share a small window, so that every worker
  // finds work; with few workers a task is a whole batch.
  bool ClaimLocked(Task* task) {
    if (stopped_) return false;
    EpochRun* run = cur_.get();
    if (run != nullptr) SkipDelivered(*run);
    if (run == nullptr || run->fully_claimed()) {
      // Look ahead, but only at the epoch the next Next() will start, and
      // not before the first epoch or while a restore is pending.
      if (pending_restore_ || (cur_ == nullptr && ahead_ == nullptr)) return false;
      if (ahead_ == nullptr) ahead_ = NewRun(cur_->epoch() + 1);
      if (cur_ == nullptr && ahead_->epoch() != next_epoch_) return false;
      run = ahead_.get();
      SkipDelivered(*run);
      if (run->fully_claimed()) return false;
    }
    auto& slot = run->open[static_cast<size_t>(run->claim_batch)];
    const int64_t length = run->plan->batch_length(run->claim_batch);
    if (run->claim_offset == 0) {
      if (open_count_ >= DepthLocked()) return false;
      slot = pool_->Acquire();
      slot->Reset(run->epoch(), run->claim_batch, run->generation, length);
      ++open_count_;
    }
    const int64_t threads = std::max(1, workers_.running());
    const int64_t window = static_cast<int64_t>(DepthLocked()) * options_.batch_size;
    const int64_t chunk =
        std::clamp<int64_t>(window / (2 * threads), 1, length - run->claim_offset);
    task->plan = run->plan;
    task->slot = slot.get();
    task->offset = run->claim_offset;
    task->length = chunk;
    run->claim_offset += chunk;
    if (run->claim_offset == length) {
      ++run->claim_batch;
      run->claim_offset = 0;
    }
    return true;
  }

  std::unique_ptr<EpochRun> NewRun(int64_t epoch) {
    auto run = std::make_unique<EpochRun>(std::make_shared<const EpochPlan>(plan_options_, epoch),
                                          ++generation_);
    if (!options_.ordered) run->ready_fifo.reserve(static_cast<size_t>(num_batches_));
    return run;
  }

  static void SkipDelivered(EpochRun& run) {
    while (run.claim_batch < run.num_batches() && run.claim_offset == 0 &&
           run.delivered[static_cast<size_t>(run.claim_batch)]) {
      ++run.claim_batch;
    }
  }

  void RunTask(WorkerContext& ctx, const Task& task) {
    int64_t wall0 = SteadyNanos();
    int64_t cpu0 = ThreadCpuNanos();
    BatchSlot* slot = task.slot;
    const EpochPlan& plan = *task.plan;
    const int64_t begin = plan.batch_begin(slot->batch);
    const auto epoch = static_cast<uint64_t>(plan.epoch());
    const int64_t task_wall0 = wall0;
    // The run-queue delay is read where the task starts and where counters
    // are published (a read costs about a microsecond: only for tasks long
    // enough not to notice, judged by the last task's samples).
    const bool timed = ctx.run_delay != nullptr && ctx.sample_ns * task.length >= kRunDelayTaskNs;
    if (timed) {
      // From here: a wait for a CPU between tasks is no sample's.
      const int64_t d = ctx.run_delay->ReadNanos();
      if (d >= 0) ctx.run_delay_ns = d;
    }
    int64_t pending = 0;  // samples not yet published
    auto publish = [&] {
      // The delay first: a wait for a CPU after it falls into the next
      // interval, so that queueing never exceeds the wall time it is in.
      const int64_t delay = timed ? ctx.run_delay->ReadNanos() : -1;
      const int64_t wall1 = SteadyNanos();
      const int64_t cpu1 = ThreadCpuNanos();
      ctx.samples.fetch_add(pending, std::memory_order_relaxed);
      ctx.busy_ns.fetch_add(wall1 - wall0, std::memory_order_relaxed);
      ctx.cpu_ns.fetch_add(cpu1 - cpu0, std::memory_order_relaxed);
      if (timed && delay >= ctx.run_delay_ns) {
        ctx.queue_ns.fetch_add(delay - ctx.run_delay_ns, std::memory_order_relaxed);
        ctx.run_delay_ns = delay;
      }
      wall0 = wall1;
      cpu0 = cpu1;
      pending = 0;
    };
    for (int64_t p = task.offset; p < task.offset + task.length; ++p) {
      if (stop_flag_.load(std::memory_order_relaxed)) return;  // nobody waits for it any more
      const auto up = static_cast<size_t>(p);
      const int64_t index = plan.sample(begin + p);
      slot->indices[up] = index;
      SampleRng rng(options_.seed, epoch, static_cast<uint64_t>(index));
      Record record;
      Status st = options_.source->Read(index, ctx.read, &record);
      if (st.ok()) {
        st = options_.transform->Apply(record, rng, {slot->sample(p), slot->sample_bytes()},
                                       ctx.scratch.get());
      }
      if (st.ok()) {
        slot->labels[up] = record.label;
      } else {
        slot->outcomes[up] = st.WithContext("sample " + std::to_string(index) + " (" +
                                            options_.source->Key(index) + ")");
        slot->failed.store(true, std::memory_order_relaxed);
      }
      if (++pending >= ctx.publish_every) publish();
    }
    if (pending > 0) publish();
    const int64_t per_sample = (wall0 - task_wall0) / std::max<int64_t>(task.length, 1);
    ctx.sample_ns = per_sample;
    ctx.publish_every =
        std::clamp<int64_t>(1'000'000 / std::max<int64_t>(per_sample, 1), 1, 1 << 20);
    ctx.footprint.store(ctx.read.bytes.capacity() + (ctx.scratch ? ctx.scratch->bytes() : 0),
                        std::memory_order_relaxed);
    if (slot->remaining.fetch_sub(task.length, std::memory_order_acq_rel) == task.length) {
      FinishBatch(slot);
    }
  }

  // Runs on the thread that completed the batch's last position.
  void FinishBatch(BatchSlot* slot) {
    if (slot->failed.load(std::memory_order_relaxed) && options_.on_error == ErrorPolicy::kSkip) {
      for (int64_t p = 0; p < slot->length; ++p) {
        const Status& outcome = slot->outcomes[static_cast<size_t>(p)];
        if (outcome.ok()) continue;
        int64_t index = slot->indices[static_cast<size_t>(p)];
        slot->skips.push_back(
            {slot->epoch, index, options_.source->Key(index), outcome.ToString()});
      }
      slot->CompactFailures();
    }
    std::lock_guard<std::mutex> lock(mu_);
    EpochRun* run = nullptr;
    if (cur_ != nullptr && cur_->generation == slot->generation) run = cur_.get();
    if (ahead_ != nullptr && ahead_->generation == slot->generation) run = ahead_.get();
    if (run == nullptr) {  // its epoch was abandoned meanwhile
      auto it = std::find_if(stale_.begin(), stale_.end(),
                             [slot](const auto& s) { return s.get() == slot; });
      pool_->Release(std::move(*it));
      stale_.erase(it);
      return;
    }
    slot->ready = true;
    ++ready_count_;
    if (!options_.ordered) run->ready_fifo.push_back(slot->batch);
    if (run == cur_.get()) ready_cv_.notify_all();
  }

  BatchSlot* DeliverableLocked() {
    if (cur_ == nullptr) return nullptr;
    EpochRun& run = *cur_;
    if (options_.ordered) {
      while (run.deliver_pos < num_batches_ &&
             run.delivered[static_cast<size_t>(run.deliver_pos)]) {
        ++run.deliver_pos;
      }
      if (run.deliver_pos >= num_batches_) return nullptr;
      BatchSlot* s = run.open[static_cast<size_t>(run.deliver_pos)].get();
      return (s != nullptr && s->ready) ? s : nullptr;
    }
    if (run.ready_head < run.ready_fifo.size()) {
      return run.open[static_cast<size_t>(run.ready_fifo[run.ready_head])].get();
    }
    return nullptr;
  }

  // Runs the controller if its interval has passed. Consumer thread only;
  // REQUIRES: `lock` held; it is released around the controller's Tick.
  void MaybeTickLocked(std::unique_lock<std::mutex>& lock) {
    if (controller_ == nullptr) return;
    const int64_t now = SteadyNanos();
    if (now < next_tick_ns_) return;
    next_tick_ns_ = now + controller_->interval().count();
    lock.unlock();
    controller_->Tick(*owner_);
    lock.lock();
  }

  Result<std::optional<Batch>> NextImpl() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      MaybeTickLocked(lock);
      if (stopped_) return Cancelled("the loader was stopped");
      if (cur_ == nullptr) StartEpochLocked();
      if (cur_->finished()) {
        next_epoch_ = cur_->epoch() + 1;
        // Workers may not have looked ahead yet (all busy on the last
        // batches): start the next epoch's prefetch here, or nobody will.
        if (ahead_ == nullptr && !pending_restore_) ahead_ = NewRun(next_epoch_);
        cur_.reset();
        work_cv_.notify_all();
        return std::optional<Batch>();
      }
      if (BatchSlot* s = DeliverableLocked()) return DeliverLocked(s);
      if (workers_.target() == 0) {
        Task task;
        if (ClaimLocked(&task)) {
          lock.unlock();
          RunTask(consumer_ctx_, task);
          lock.lock();
          continue;
        }
      }
      if (controller_ != nullptr) {
        ready_cv_.wait_until(
            lock, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(next_tick_ns_)));
      } else {
        ready_cv_.wait(lock);
      }
    }
  }

  Result<std::optional<Batch>> DeliverLocked(BatchSlot* s) {
    const auto b = static_cast<size_t>(s->batch);
    EpochRun& run = *cur_;
    if (!options_.ordered) ++run.ready_head;
    std::unique_ptr<BatchSlot> slot = std::move(run.open[b]);
    run.delivered[b] = 1;
    ++run.delivered_count;
    --open_count_;
    --ready_count_;
    if (idle_workers_ > 0) work_cv_.notify_all();
    batches_delivered_.fetch_add(1, std::memory_order_relaxed);
    if (slot->failed.load(std::memory_order_relaxed) && options_.on_error == ErrorPolicy::kRaise) {
      Status first;
      for (int64_t p = 0; p < slot->length && first.ok(); ++p)
        first = slot->outcomes[static_cast<size_t>(p)];
      pool_->Release(std::move(slot));
      return first.WithContext("batch " + std::to_string(b) + " of epoch " +
                               std::to_string(run.epoch()));
    }
    for (auto& skip : slot->skips) skipped_.push_back(std::move(skip));
    samples_delivered_.fetch_add(slot->count, std::memory_order_relaxed);
    return std::optional<Batch>(Batch(std::move(slot), pool_));
  }

  void WorkerMain(int id) {
    if (options_.batch_scheduling) {
      sched_param param{};
      pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);  // a refusal is harmless
    }
    WorkerContext ctx;
    ctx.id = id;
    ctx.scratch = options_.transform->NewScratch();
    ctx.run_delay = std::make_unique<RunDelayClock>();
    ctx.run_delay_ns = ctx.run_delay->ReadNanos();
    if (ctx.run_delay_ns < 0) ctx.run_delay.reset();
    std::unique_lock<std::mutex> lock(mu_);
    live_workers_.push_back(&ctx);
    while (!workers_.TryLeave()) {
      Task task;
      if (ClaimLocked(&task)) {
        lock.unlock();
        RunTask(ctx, task);
        task.plan.reset();
        lock.lock();
        continue;
      }
      ++idle_workers_;
      work_cv_.wait(lock);
      --idle_workers_;
    }
    std::erase(live_workers_, &ctx);
    retired_samples_ += ctx.samples.load(std::memory_order_relaxed);
    retired_busy_ns_ += ctx.busy_ns.load(std::memory_order_relaxed);
    retired_cpu_ns_ += ctx.cpu_ns.load(std::memory_order_relaxed);
    retired_queue_ns_ += ctx.queue_ns.load(std::memory_order_relaxed);
  }

  const LoaderOptions options_;
  const PlanOptions plan_options_;
  const SampleSpec spec_;
  const std::shared_ptr<BatchPool> pool_;
  const int64_t num_batches_;
  const int64_t samples_per_epoch_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // workers: work, resize or stop
  std::condition_variable ready_cv_;  // consumer: a batch is ready, resize or stop
  bool stopped_ = false;
  std::atomic<bool> stop_flag_{false};  // read per sample without the lock
  std::unique_ptr<EpochRun> cur_;       // being delivered; null between epochs
  std::unique_ptr<EpochRun> ahead_;     // the next epoch, prefetched
  int64_t generation_ = 0;              // of the newest EpochRun
  int64_t next_epoch_;
  std::optional<LoaderState> pending_restore_;
  std::vector<std::unique_ptr<BatchSlot>> stale_;  // abandoned, still being written
  int open_count_ = 0;
  int ready_count_ = 0;
  int idle_workers_ = 0;
  int prefetch_batches_;
  size_t prefetch_bytes_;
  std::vector<SkipRecord> skipped_;
  std::vector<const WorkerContext*> live_workers_;
  int64_t retired_samples_ = 0;
  int64_t retired_busy_ns_ = 0;
  int64_t retired_cpu_ns_ = 0;
  int64_t retired_queue_ns_ = 0;

  WorkerContext consumer_ctx_;
  Loader* owner_ = nullptr;                 // for the controller's Tick
  std::unique_ptr<Controller> controller_;  // consumer thread only
  int64_t next_tick_ns_ = 0;                // consumer thread only
  int64_t last_return_ns_ = 0;              // consumer thread only
  std::atomic<int64_t> consumer_wait_ns_{0};
  std::atomic<int64_t> consumer_step_ns_{0};
  std::atomic<int64_t> next_calls_{0};
  std::atomic<int64_t> batches_delivered_{0};
  std::atomic<int64_t> samples_delivered_{0};

  WorkerPool workers_;  // last: its threads use everything above
};

namespace {

PlanOptions PlanOptionsOf(const LoaderOptions& o) {
  return {o.source->size(), o.batch_size, o.shuffle,    o.seed,
          o.drop_last,      o.rank,       o.world_size, o.pad_shards};
}

}  // namespace

Status ValidateEngineOptions(const LoaderOptions& o) {
  if (o.source == nullptr) return InvalidArgument("option 'source' is required");
  if (o.transform == nullptr) return InvalidArgument("option 'transform' is required");
  if (o.workers < 0 && o.workers != kAutoWorkers) {
    return InvalidArgument("option 'workers' must be >= 0 or kAutoWorkers (" +
                           std::to_string(kAutoWorkers) + "), got " + std::to_string(o.workers));
  }
  if (o.prefetch_batches < 1) {
    return InvalidArgument("option 'prefetch_batches' must be >= 1, got " +
                           std::to_string(o.prefetch_batches));
  }
  if (o.prefetch_bytes < 1) return InvalidArgument("option 'prefetch_bytes' must be >= 1");
  if (o.start_epoch < 0) {
    return InvalidArgument("option 'start_epoch' must be >= 0, got " +
                           std::to_string(o.start_epoch));
  }
  if (o.transform->spec().bytes() == 0) {
    return InvalidArgument("the transform's sample spec has zero bytes");
  }
  const PlanOptions plan = PlanOptionsOf(o);
  STOKER_RETURN_IF_ERROR(ValidatePlanOptions(plan));
  if (EpochPlan(plan, 0).num_batches() == 0) {
    return InvalidArgument("drop_last leaves no batch: " + std::to_string(o.source->size()) +
                           " samples over world_size " + std::to_string(o.world_size) +
                           " is less than batch_size " + std::to_string(o.batch_size));
  }
  return Status::Ok();
}

std::unique_ptr<Loader> MakeEngineLoader(LoaderOptions o, std::unique_ptr<Controller> controller) {
  assert(o.source != nullptr && o.transform != nullptr && o.workers >= 0);
  const PlanOptions plan = PlanOptionsOf(o);
  auto impl = std::make_unique<Loader::Impl>(std::move(o), plan);
  impl->SetController(std::move(controller));
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->set_owner(this); }
Loader::~Loader() = default;
Result<std::optional<Batch>> Loader::Next() { return impl_->Next(); }
bool Loader::WaitReady(std::chrono::nanoseconds timeout) { return impl_->WaitReady(timeout); }
void Loader::SetEpoch(int64_t epoch) { impl_->SetEpoch(epoch); }
int64_t Loader::epoch() const { return impl_->epoch(); }
int64_t Loader::batches_per_epoch() const { return impl_->batches_per_epoch(); }
int64_t Loader::samples_per_epoch() const { return impl_->samples_per_epoch(); }
const SampleSpec& Loader::spec() const { return impl_->spec(); }
LoaderState Loader::State() const { return impl_->State(); }
Status Loader::Restore(const LoaderState& state) { return impl_->Restore(state); }
void Loader::Resize(int workers) { impl_->Resize(workers); }
int Loader::workers() const { return impl_->workers(); }
void Loader::SetPrefetch(int batches, size_t bytes) { impl_->SetPrefetch(batches, bytes); }
LoaderMetrics Loader::Metrics() const { return impl_->Metrics(); }
std::vector<SkipRecord> Loader::Skipped() const { return impl_->Skipped(); }
void Loader::Stop() { impl_->Stop(); }
std::optional<TunerView> Loader::tuner_view() const {
  const Controller* c = impl_->controller();
  return c != nullptr ? c->View() : std::nullopt;
}
std::vector<TunerDecision> Loader::tuner_trace() const {
  const Controller* c = impl_->controller();
  return c != nullptr ? c->Trace() : std::vector<TunerDecision>{};
}

// Batch

Batch::Batch() = default;
Batch::Batch(std::unique_ptr<BatchSlot> slot, std::shared_ptr<BatchPool> pool)
    : slot_(std::move(slot)), pool_(std::move(pool)) {}
Batch::Batch(Batch&& other) noexcept = default;
Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    Release();
    slot_ = std::move(other.slot_);
    pool_ = std::move(other.pool_);
  }
  return *this;
}
Batch::~Batch() { Release(); }
void Batch::Release() {
  if (slot_ != nullptr) pool_->Release(std::move(slot_));
  pool_.reset();
}
int64_t Batch::epoch() const { return slot_->epoch; }
int64_t Batch::index() const { return slot_->batch; }
int64_t Batch::size() const { return slot_->count; }
const SampleSpec& Batch::spec() const { return slot_->spec(); }
std::span<const std::byte> Batch::data() const {
  return {slot_->data(), static_cast<size_t>(slot_->count) * slot_->sample_bytes()};
}
std::span<std::byte> Batch::mutable_data() {
  return {slot_->data(), static_cast<size_t>(slot_->count) * slot_->sample_bytes()};
}
std::span<const int64_t> Batch::labels() const {
  return {slot_->labels.data(), static_cast<size_t>(slot_->count)};
}
std::span<const int64_t> Batch::sample_indices() const {
  return {slot_->indices.data(), static_cast<size_t>(slot_->count)};
}

}  // namespace stoker
