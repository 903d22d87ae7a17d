#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stoker/defaults.h"
#include "stoker/sample_spec.h"
#include "stoker/source.h"
#include "stoker/status.h"
#include "stoker/transform.h"
#include "stoker/tuning.h"
#include "stoker/worker_kind.h"

namespace stoker {

class BatchSlot;
class BatchPool;
class Controller;  // src/engine/controller.h, which the engine exports to tune

/// What happens to a sample that cannot be read or transformed.
enum class ErrorPolicy {
  kRaise,  // its batch reaches the consumer as an error naming the sample
  kSkip,   // it is left out of its batch and recorded in Loader::Skipped()
};

/// What the user sets. Resolved and checked once by Loader::Make.
struct LoaderOptions {
  /// The samples: a source and a transform, or a kind.
  std::shared_ptr<const Source> source;
  std::shared_ptr<const Transform> transform;
  /// Instead of source and transform: items made by a worker kind (whole
  /// user batches in worker processes, on Python threads, remotely); the
  /// plan orders kind->items() items as it would samples (SetEpoch with an
  /// item count changes it for later epochs).
  std::shared_ptr<const WorkerKind> kind;
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  /// Distributed sharding: this process's rank among world_size.
  int rank = 0;
  int world_size = 1;
  bool pad_shards = true;  // see PlanOptions::pad_shards
  /// Worker threads, at most kMaxWorkers; 0 = the consumer's thread does
  /// the work in Next(); kAutoWorkers = a tuner picks the count and prefetch
  /// bound and keeps adjusting them (see `tuner`).
  int workers = 2;
  /// Prefetch bound: at most this many batches started and not yet delivered,
  /// and at most prefetch_bytes of their buffers (at least one batch always).
  /// Make lowers prefetch_bytes to at most half the memory budget (see
  /// tuner.memory_budget_bytes) when it would take more.
  int prefetch_batches = 4;
  size_t prefetch_bytes = size_t{1} << 30;
  ErrorPolicy on_error = ErrorPolicy::kRaise;
  /// true: batches arrive in plan order; false: as soon as each is ready.
  bool ordered = true;
  /// Workers run under Linux's SCHED_BATCH policy: the same CPU share, but a
  /// waking worker does not preempt the consumer's thread (docs/engine.md).
  /// Where the kernel refuses, workers keep the default policy.
  bool batch_scheduling = true;
  /// Epoch the first Next() starts.
  int64_t start_epoch = 0;
  /// Page-locks each recycled batch buffer once, with cudaHostRegister when
  /// it is made (unregistered when freed), so that copies to a GPU are
  /// asynchronous. Needs the CUDA runtime (loaded at run time) and a device; where
  /// none can be used, nothing is pinned (Loader::pin_skipped says why).
  bool pin_memory = false;
  /// kNoDevice: batches stay in host memory. Otherwise a CUDA device index:
  /// each batch is also copied, on the loader's own stream, into a device
  /// buffer (Batch::device_data); implies pin_memory. docs/engine.md,
  /// "Device path".
  static constexpr int kNoDevice = -1;
  int device = kNoDevice;
  /// Bytes of device buffers copied ahead of delivery (the device prefetch
  /// bound, in whole batches; less than a batch: copies happen in Next());
  /// 0 = a quarter of the device's free memory when the loader is made.
  size_t device_prefetch_bytes = 0;
  /// How the tuner acts when workers == kAutoWorkers; otherwise unused (but
  /// still checked).
  TunerOptions tuner;
};

/// An item a worker is making now.
struct ItemInProgress {
  int worker = 0;
  int64_t item = 0;
  std::string name;  // "sample 13 (<its key>)", or the kind's item_name() and number
};

/// One sample left out under ErrorPolicy::kSkip.
struct SkipRecord {
  int64_t epoch = 0;
  int64_t index = 0;  // the sample's index in the source
  std::string key;    // the source's key for it (a path)
  std::string reason;
};

/// A delivered batch: `size()` samples, contiguous, each `spec().bytes()`
/// long, in a buffer aligned to 4096 bytes. Move-only; its buffer goes back to
/// the loader's pool when the Batch is destroyed, and stays valid until then,
/// even after the loader has moved on or been destroyed. In a child forked
/// after it was delivered it may still be read; destroying it there leaks its
/// buffer (the pool's lock may be held by a parent thread the child lacks).
/// Not thread-safe; may be moved to and read from any thread.
class Batch {
 public:
  Batch();
  Batch(Batch&& other) noexcept;
  Batch& operator=(Batch&& other) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  bool valid() const { return slot_ != nullptr; }
  int64_t epoch() const;
  /// Batch number within its epoch.
  int64_t index() const;
  /// Samples delivered (short for the last batch or after skips).
  int64_t size() const;
  const SampleSpec& spec() const;
  /// size() * spec().bytes() bytes of sample data.
  std::span<const std::byte> data() const;
  std::span<std::byte> mutable_data();
  std::span<const int64_t> labels() const;
  /// Source index of each delivered sample.
  std::span<const int64_t> sample_indices() const;

  /// With LoaderOptions::device: the batch's data() on the device (same
  /// size), written by an asynchronous copy that is complete once
  /// ready_event() is; null without a device.
  void* device_data() const;
  /// The copy's cudaEvent_t (recorded after it on the loader's stream), or
  /// null without a device. Valid while the Batch lives.
  void* ready_event() const;
  /// Makes `stream` (a cudaStream_t of the batch's device) wait for the copy
  /// without blocking the host (cudaStreamWaitEvent). When the Batch is then
  /// released, an event is recorded on that stream and the device buffer is
  /// written again only after it: work queued on `stream` before the release
  /// may still read device_data(); `stream` must outlive the Batch. Without
  /// WaitOn, the consumer must have
  /// finished using device_data() when it releases the Batch.
  /// kFailedPrecondition without a device.
  Status WaitOn(void* stream);

 private:
  friend class Loader;
  Batch(std::unique_ptr<BatchSlot> slot, std::shared_ptr<BatchPool> pool);
  void Release();

  std::unique_ptr<BatchSlot> slot_;
  std::shared_ptr<BatchPool> pool_;
  uint64_t fork_generation_ = 0;  // see Loader::CheckProcess
};

/// Where an epoch stands, to resume it later with any worker count. It also
/// carries every setting that decides the epoch's plan, so that Restore can
/// refuse a checkpoint of another plan (whose positions would name other
/// samples) instead of delivering some samples twice and others never.
struct LoaderState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  /// Batches delivered in this epoch: all of [0, position), plus `beyond`
  /// (only in unordered delivery, batches past the prefix already delivered).
  int64_t position = 0;
  std::vector<int64_t> beyond;
  // The plan (LoaderOptions' fields of the same names; num_samples is the
  // source's size, or the kind's items in that epoch).
  int64_t num_samples = 0;
  int64_t batch_size = 0;
  bool shuffle = true;
  bool drop_last = false;
  int rank = 0;
  int world_size = 1;
  bool pad_shards = true;
};

/// {"seed", "epoch", "position", "beyond": [...], "num_samples",
/// "batch_size", "shuffle", "drop_last", "rank", "world_size", "pad_shards"}:
/// a checkpoint, with the plan it belongs to.
nlohmann::json LoaderStateToJson(const LoaderState& state);

/// Reads LoaderStateToJson's form back; "beyond" may be left out (none).
/// Errors (InvalidArgument) name the field that is missing, is not an integer
/// in its type's range (a list of them for "beyond") or, for shuffle,
/// drop_last and pad_shards, not a boolean; or say that `json` is not an
/// object.
Result<LoaderState> LoaderStateFromJson(const nlohmann::json& json);

/// Counters for the tuner and for people. Cumulative since the loader was
/// made (LoaderMetrics::recent aside); rates come from the difference of two
/// snapshots.
struct WorkerMetrics {
  int id = 0;
  int64_t samples = 0;
  int64_t busy_ns = 0;           // wall time spent on tasks
  int64_t cpu_ns = 0;            // thread CPU time spent on tasks
  int64_t queue_ns = 0;          // of busy_ns, runnable but waiting for a CPU
  int64_t cpu_elsewhere_ns = 0;  // of cpu_ns, spent in a worker process
  // Items made on remote slots (ItemOutcome::remote), and the wall time this
  // thread waited for them: in none of the figures above.
  int64_t remote_samples = 0;
  int64_t remote_busy_ns = 0;
};

/// What the consumer took and how its time went, cumulative or over a span
/// of its time (LoaderMetrics::recent). Its time is the wait inside Next()
/// plus the step between a Next()'s return and the next call: from its
/// first Next() on, every nanosecond is one or the other.
struct ConsumerCounters {
  int64_t batches_delivered = 0;
  int64_t samples_delivered = 0;       // the engine's items (see LoaderMetrics)
  int64_t user_samples_delivered = 0;  // the user's samples those held
  int64_t consumer_wait_ns = 0;        // inside Next()
  int64_t consumer_step_ns = 0;        // between a Next() return and the next call
};

/// The batch the consumer is waiting for inside Next() (or WaitReady), in
/// order: a worker making one of its items may hand it over (a remote slot
/// whose task lags makes it locally instead).
struct AwaitedBatch {
  int64_t epoch = 0;
  int64_t batch = 0;           // its index in the epoch's plan
  std::vector<int64_t> items;  // the items it holds
  int64_t waited_ns = 0;       // how long the consumer has waited for it so far
};

struct LoaderMetrics {
  int64_t time_ns = 0;      // steady clock when taken
  int workers_target = 0;   // local workers (Resize), remote slots aside
  int workers_running = 0;  // threads running, remote slots' included
  int workers_remote = 0;   // remote slots (SetRemote), as the engine keeps them
  // Of those running, workers not yet up: before KindWorker::Ready returned,
  // or starting as their kind says (WorkerKind::starting).
  int workers_starting = 0;
  int remote_capacity = 0;       // remote slots the kind's cluster offers now
  size_t remote_task_bytes = 0;  // what one remote slot's task brings back (0: unknown)
  int prefetch_batches = 0;
  size_t prefetch_bytes = 0;
  int64_t batches_delivered = 0;
  // The engine's samples (a kind's items), the unit of samples_produced and
  // of the tuner's rates; and the user's samples those held (the same
  // without a kind; with one, what its items held less those that failed).
  int64_t samples_delivered = 0;
  int64_t user_samples_delivered = 0;
  int64_t samples_produced = 0;  // by workers and the consumer's thread
  int64_t busy_ns = 0;           // all workers' task wall time
  int64_t cpu_ns = 0;            // all workers' task CPU time
  // Of busy_ns, the time workers were runnable but waiting for a CPU (the
  // kernel's run-queue delay; 0 where it keeps none).
  int64_t queue_ns = 0;
  // Of cpu_ns, spent in worker processes (not in this process's CPU time).
  int64_t cpu_elsewhere_ns = 0;
  // Of samples delivered, those made on remote slots, and the wall time the
  // threads of remote slots waited for them (neither in the figures above).
  int64_t remote_samples_produced = 0;
  int64_t remote_busy_ns = 0;
  int64_t consumer_wait_ns = 0;  // time spent inside Next()
  int64_t consumer_step_ns = 0;  // time between a Next() return and the next call
  /// The consumer's counters over its recent time only: the last
  /// kRecentWindowS seconds of it up to its latest Next() (or WaitReady)
  /// return, as differences. Less while the consumer is younger than that;
  /// more (one Next() to the next) when its calls are further apart. Rates
  /// from these follow what the loader does now, where the cumulative
  /// counters above average since the first Next().
  ConsumerCounters recent;
  int64_t next_calls = 0;
  int64_t samples_skipped = 0;  // under ErrorPolicy::kSkip, all (Skipped() lists the first)
  int ready_batches = 0;        // finished, not yet delivered
  int open_batches = 0;         // started, not yet delivered
  size_t bytes_in_flight = 0;   // buffers of open batches
  size_t batch_bytes = 0;       // one batch buffer
  size_t worker_bytes = 0;      // read buffers and transform scratch of running workers
  // With a device (LoaderOptions::device), else 0.
  int64_t device_copies = 0;              // host-to-device batch copies
  int64_t device_copies_at_delivery = 0;  // of those, made in Next(): none were ahead
  int device_prefetched = 0;              // copied ahead, not yet delivered
  int device_prefetch_batches = 0;        // the bound of device_prefetched
  int64_t pinned_buffers = 0;             // batch buffers page-locked so far
  // Why the system refused a worker (a pids limit, memory): the pool grows
  // no further than it was then. Empty: never refused.
  std::string workers_refused;
  // Workers that left a tuned pool because one did not fit its share of the
  // memory budget (ItemOutcome::may_shed), and the last one's reason.
  int64_t workers_shed = 0;
  std::string workers_shed_reason;
  std::vector<WorkerMetrics> workers;  // threads running now
};

/// The data loader: a plan of batches, produced by a live-resizable pool of
/// workers into recycled buffers, delivered to one consumer.
///
/// Thread contract: Next, WaitReady, SetEpoch, State and Restore belong to
/// one consumer thread at a time. Resize, SetPrefetch, Metrics, Awaited, Skipped,
/// workers, tuner_view, tuner_trace, FlushTrace and Stop are safe from any thread,
/// concurrently with the consumer.
///
/// Fork: a loader belongs to the process that made it; its workers are
/// threads, which a fork() does not copy. In a forked child, Next, SetEpoch,
/// State, Restore, Resize and SetPrefetch return the kFailedPrecondition
/// error of CheckProcess() without touching the loader (whose locks a parent
/// thread may have held at the fork), WaitReady returns true at once (so that
/// Next reports it), FlushTrace returns that error too, Stop does nothing, and the destructor joins
/// nothing: it leaks the loader's memory instead, which belongs to the parent. Metrics, Skipped,
/// epoch, workers, tuner_view and tuner_trace may block there: REQUIRES CheckProcess().ok(). Make a
/// new loader in the child.
class Loader {
 public:
  /// The one way to make a loader. Checks every option (the tuner's too) and
  /// resolves them; the error names the option at fault. It resolves the
  /// memory budget (tuner.memory_budget_bytes, or the default share of
  /// available memory) for every loader: a batch_size whose two batch buffers
  /// exceed it is kInvalidArgument, and what the batch buffers leave becomes
  /// each worker's per-sample cap, past which a sample is refused before it
  /// is read or decoded (kResourceExhausted, a sample error; docs/engine.md,
  /// "Memory budget"). With workers ==
  /// kAutoWorkers it probes the machine, starts from the advisor's worker
  /// count and prefetch bound, and attaches a tuner that adjusts them from
  /// inside Next() and WaitReady() on the consumer's thread; tuner.trace_path,
  /// when set, is opened here (an unwritable path is an error naming it) and
  /// written by a background thread. Defined in the stoker_tune library.
  static Result<std::unique_ptr<Loader>> Make(LoaderOptions options);

  /// Stops and joins every worker; returns promptly mid-epoch. In a forked
  /// child it joins nothing and leaks the loader (see the class comment).
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// The next batch of the current epoch, or nullopt at its end (the call
  /// after that starts the next epoch). A batch with failed samples (any,
  /// under kRaise; under kSkip those that are not the sample's fault, such as
  /// a refused file descriptor or memory) first returns an error naming each
  /// of them (index, key, cause); the following call returns its other
  /// samples, then the batches after it. Blocks until a batch is ready;
  /// after Stop returns kCancelled; after a failure of the loader itself
  /// (memory for a batch or a plan) returns that error. An epoch that had
  /// samples planned, delivered none and skipped some (every sample bad under
  /// kSkip) ends with kDataError naming the epoch, the count skipped and the
  /// first skip, instead of nullopt: the call after it starts the next epoch.
  Result<std::optional<Batch>> Next();

  /// Optional (empty: none): asked on the consumer's thread after each
  /// sample that Next() makes itself (no workers). Once it returns true that
  /// Next() returns kCancelled at once, and the samples of the batch left
  /// unmade are made by the calls after it: the loader stays usable. It lets
  /// Ctrl-C end a long batch. Consumer's thread, between calls.
  void SetInterrupt(std::function<bool()> interrupted);

  /// Waits up to `timeout` until Next() would not block; true when it would.
  /// Starts the next epoch if none is running; passes over the batches whose
  /// every sample was skipped, as Next() does. Its time counts as consumer
  /// wait (like Next's) and the tuner ticks meanwhile, so a consumer may
  /// wait in short slices, e.g. to handle signals, without hiding its waiting.
  bool WaitReady(std::chrono::nanoseconds timeout);

  /// Makes `epoch` the one the next Next() starts; abandons an epoch in
  /// progress (its remaining batches are dropped). A checkpoint restored and
  /// not yet started is kept when `epoch` is its epoch (a resumed loop calls
  /// SetEpoch as it always does). Errors only in a forked child.
  Status SetEpoch(int64_t epoch);
  /// SetEpoch(epoch) for a kind whose item count changes between epochs (a
  /// user's data set that grows or shrinks): `epoch`, and each epoch after
  /// it until the next such call, has `items` items (0: an empty epoch).
  /// Items made ahead for `epoch` are kept only when its count is `items`
  /// and `keep_ahead` (false: what they were made from changed). Errors
  /// (kInvalidArgument) without options.kind (a source's size is fixed) or
  /// for items < 0; kFailedPrecondition in a forked child.
  Status SetEpoch(int64_t epoch, int64_t items, bool keep_ahead);

  /// The epoch in progress, or the one the next Next() starts.
  int64_t epoch() const;
  /// Of the epoch in progress, or of the one the next Next() starts.
  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const;
  const SampleSpec& spec() const;
  /// Why pin_memory (without a device) page-locks nothing: no CUDA device
  /// this process can use; empty where it pins, or was not asked to.
  const std::string& pin_skipped() const;

  /// Where the current epoch stands, with the plan it belongs to. After the
  /// last batch of an epoch was delivered, this is the start of the next one.
  /// Errors only in a forked child.
  Result<LoaderState> State() const;
  /// Resumes at `state`: the following Next() calls deliver exactly the
  /// batches of that epoch not yet delivered. Errors (kInvalidArgument) when
  /// a field of the plan (seed, num_samples, batch_size, shuffle, drop_last,
  /// rank, world_size, pad_shards) differs from this loader's, naming the
  /// field and both values, or when the position is out of range; a refused
  /// state changes nothing. With a kind, num_samples is that epoch's item
  /// count (see SetEpoch): it is taken, not compared.
  Status Restore(const LoaderState& state);

  /// Sets the worker count, at any moment; 0 makes the consumer's thread do
  /// the work. Growing starts threads; shrinking lets workers finish their
  /// current task and leave. Never loses or repeats a sample. When the system
  /// refuses a thread, the loader keeps those it has (workers() says how
  /// many) and returns kUnavailable naming the refusal.
  Status Resize(int workers);
  int workers() const;
  /// Sets the remote slots beside the workers, at any moment: each is a
  /// thread of the pool whose items the kind sends to its cluster
  /// (WorkerKind::Resized). Same guarantees as Resize.
  Status SetRemote(int slots);
  int remote() const;

  /// Sets the prefetch bound (batches >= 1; bytes >= 1). Errors only in a
  /// forked child.
  Status SetPrefetch(int batches, size_t bytes);

  LoaderMetrics Metrics() const;
  /// The batch the consumer waits for now; nullopt while it does not wait
  /// (or takes batches out of order).
  std::optional<AwaitedBatch> Awaited() const;
  /// The samples skipped so far under ErrorPolicy::kSkip, in delivery order:
  /// the first kSkipRecordsKept (LoaderMetrics::samples_skipped counts all).
  std::vector<SkipRecord> Skipped() const;

  /// The tuner's current picture; nullopt when the loader has no tuner
  /// (workers was not kAutoWorkers). Safe from any thread; returns a copy (the
  /// tuner's lock is held only while a tick publishes its figures, so this
  /// never waits for a whole tick).
  std::optional<TunerView> tuner_view() const;
  /// Every decision the tuner made so far, oldest first; empty without a
  /// tuner. Safe from any thread, like tuner_view().
  std::vector<TunerDecision> tuner_trace() const;
  /// Blocks until every decision so far is written to tuner.trace_path and
  /// returns the first error writing it (kIoError or kUnavailable, naming
  /// the path and the OS's reason: a full disk, a file size limit; the
  /// decisions after it were not written), or Ok (no tuner, no trace file).
  /// Safe from any thread, like tuner_trace(); in a forked child it returns
  /// the error of CheckProcess().
  Status FlushTrace() const;

  /// Stops the loader: waiting calls return kCancelled, workers leave after
  /// at most the sample they are on. Idempotent.
  void Stop();
  /// Stop(), waiting at most `patience` for the workers: true once every one
  /// has left. Those still on an item (a read that does not return) leave
  /// when it ends; a later call, Stop or the destructor, waits for them.
  bool StopWithin(std::chrono::nanoseconds patience);
  /// The items workers are making now.
  std::vector<ItemInProgress> InProgress() const;

  /// Ok in the process that made the loader. In a child forked since, where
  /// the workers do not exist, kFailedPrecondition: "this stoker loader was
  /// made in process P and cannot be used in a forked child (pid C); make a
  /// new loader in the child". Cheap (an atomic load); safe from any thread.
  Status CheckProcess() const;

 private:
  class Impl;
  friend Result<std::unique_ptr<Loader>> MakeEngineLoader(LoaderOptions options,
                                                          size_t budget_bytes,
                                                          std::unique_ptr<Controller> controller);
  explicit Loader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker
