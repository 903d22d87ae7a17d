#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/sample_cap.h"
#include "stoker/sample_spec.h"
#include "stoker/status.h"

namespace stoker {

/// Where a kind's worker runs: on an engine worker thread of its own, or on
/// the consumer's thread inside Next() (workers == 0).
enum class WorkerPlace { kWorkerThread, kConsumer };

/// What a worker's items cost where the engine's thread clocks cannot see it
/// (a worker process, a remote machine, another thread of this process).
/// CPU and run-queue times are cumulative over the worker's life; bytes are now.
struct WorkerCost {
  int64_t cpu_ns = 0;         // CPU time spent elsewhere (another process) for this worker
  int64_t thread_cpu_ns = 0;  // CPU time of this process's other threads running its items
  int64_t queue_ns = 0;       // of the wall time, waiting for a CPU elsewhere or on those threads
  int64_t setup_ns = 0;       // of the wall time, its process starting or ending: no item's
  /// Memory the worker holds for the loader (the memory budget counts it).
  size_t bytes = 0;
  /// Of `bytes`, what a fresh worker would not hold: past the per-sample cap,
  /// the engine replaces the worker with a fresh one between items.
  size_t trimmable_bytes = 0;
};

/// Which sample a failure is, on the Status the engine raises for it
/// (Status::detail()): bindings name it on the exception (index, key).
struct SampleDetail : StatusDetail {
  /// The index of a failure that is no sample's (a user batch's collate_fn).
  static constexpr int64_t kNoSample = -1;
  int64_t index = 0;
  std::string key;  // the sample's key; empty where it has none
};

/// A sample inside an item that failed while the item itself was made (a
/// user batch one of whose samples raised): the engine's error policy
/// reports it (raise) or records it (skip) as it does a failed item.
struct SampleFailure {
  int64_t index = 0;  // the sample's index in the user's data set
  std::string key;    // its key (a file), or empty where unknown
  Status status;      // the cause, without index or key
  /// What failed, for people, where it is known by a name and not as sample
  /// `index` (a stream's shard: "shard 'a.tar'"); empty: "sample <index>".
  std::string name;
};

/// What one Run made, besides the bytes written to `out`.
struct ItemOutcome {
  int64_t label = 0;    // the engine's label for the item
  int64_t samples = 1;  // user samples the item holds (0: all failed, or none planned)
  /// Failed samples of the item; the item is still delivered.
  std::vector<SampleFailure> failures;
  /// Made by a remote slot (on another machine, or on the slot's thread when
  /// the cluster gave it back): its time is no local worker's, so the
  /// tuner's local figures leave it out (LoaderMetrics::remote_*).
  bool remote = false;
  /// Set by the engine on a worker thread: asks whether the thread may leave
  /// now (the pool is over its target). True commits it to leave: the kind
  /// then stops the item where another worker can continue it, and says so
  /// with `yielded`. A kind that cannot continue an item never asks.
  const std::function<bool()>* may_leave = nullptr;
  /// Set by the engine on a worker thread of a tuned loader (workers =
  /// auto): asks whether this worker may give up an item it cannot make
  /// within its share of the memory budget at the current worker count, for
  /// a pool of one worker fewer. True commits the thread to leave (the
  /// tuner records `why`): the kind then says so with `yielded`, having
  /// kept nothing of the item, which the engine runs again whole on another
  /// worker. False (the last local worker): the kind reports its error.
  const std::function<bool(const std::string& why)>* may_shed = nullptr;
  /// The item is not made: the engine runs it again on another worker, where
  /// the kind continues it from where this Run stopped; this thread leaves.
  bool yielded = false;
  /// The item is not made because the user stopped it on the consumer's
  /// thread (Ctrl-C in their code): it is given back, whole, and Next()
  /// returns kCancelled "interrupted"; a later Next() makes it again.
  bool interrupted = false;
  /// Set by the engine for every Run: true once the item's epoch was
  /// abandoned (Loader::SetEpoch, Restore), so that nobody will take it. A
  /// kind that can stop an item midway (a sharded stream's shard, which may
  /// never end) stops it at its next boundary, lets go of what it holds for
  /// it (a continuation of a yielded item, its segment) and says so with
  /// `dropped`; a kind that cannot just makes it. Any thread may set it; the
  /// kind only reads it, while Run runs.
  const std::atomic<bool>* abandoned = nullptr;
  /// The item is not made, and never will be: its epoch was abandoned
  /// (`abandoned` said so). The engine counts its position done, unmade
  /// (its output never written, so zero bytes), and runs it nowhere again.
  bool dropped = false;
  /// Whether `abandoned` says the item's epoch was abandoned, now.
  bool Abandoned() const {
    return abandoned != nullptr && abandoned->load(std::memory_order_relaxed);
  }
};

/// One worker of a kind: runs items one at a time, always on one thread
/// (its engine thread, or the consumer's). Made by WorkerKind::NewWorker.
class KindWorker {
 public:
  virtual ~KindWorker() = default;
  /// Makes item `item` of `epoch` into `out` (spec().bytes() long) and says
  /// what it made in `outcome` (reset by the engine before each call). An
  /// error fails the whole item; it names the cause, the engine adds the item.
  virtual Status Run(int64_t epoch, int64_t item, std::span<std::byte> out,
                     ItemOutcome* outcome) = 0;
  /// Its cost elsewhere so far; read by the engine between items, from the
  /// worker's own thread, and by the tuner from any thread (so thread-safe).
  virtual WorkerCost cost() const { return {}; }
  /// Readies what the worker runs on (a process), on its own thread, before
  /// it takes its first item. kUnavailable or kResourceExhausted: the system
  /// refused it (a pids limit, memory); the engine's thread then leaves
  /// without taking work, and the pool grows no further than it has.
  /// Other errors are left for the items to report.
  virtual Status Ready() { return Status::Ok(); }

  /// Whether the worker wants each task's items named before it runs them
  /// (Expect): the engine then takes the whole task for it, and no other
  /// worker helps with it.
  virtual bool expects() const { return false; }
  /// The items (all of `epoch`) that Run is asked for next, in this order:
  /// a worker that makes many at once (a remote slot) sends them together.
  /// Called only when expects(), on the worker's own thread.
  virtual void Expect(int64_t epoch, std::span<const int64_t> items) {
    (void)epoch;
    (void)items;
  }
};

/// How the engine's items are made, when they are not samples of a Source
/// put through a Transform: whole user batches run in worker processes, on
/// Python threads, or on a remote cluster. The engine schedules the items
/// (order, prefetch, delivery, checkpoints, error policy, the tuner's pool
/// size) exactly as it does samples; a kind only runs "item I of epoch E
/// into this output".
///
/// Immutable after construction and shared by every worker: its const
/// methods are safe from many threads at once.
class WorkerKind {
 public:
  virtual ~WorkerKind() = default;

  /// The shape of every item's output (a descriptor of where the item is).
  virtual SampleSpec spec() const = 0;
  /// Items per epoch: of the first one, where the count changes between
  /// epochs (Loader::SetEpoch with an item count says so for the others).
  virtual int64_t items() const = 0;
  /// A human-readable key for item `item` ("batch 3"), for errors.
  virtual std::string Key(int64_t item) const = 0;
  /// What one item is, in one word, for people: the tuner's reasons and its
  /// figures' unit ("12.5 ms CPU per batch", TunerDecision::unit). "batch"
  /// for a kind whose items are whole user batches, "sample" for single
  /// samples; a kind that does not say is counted in "item"s.
  virtual std::string item_name() const { return "item"; }
  /// Whether each item is one sample of the user's data set (its index the
  /// item's): its failure then names the sample, and on_error="skip" may
  /// leave it out. False for items that hold many (whole user batches).
  virtual bool items_are_samples() const { return false; }

  /// A worker for `place`, holding at most `cap` for one item where it can
  /// tell. A kind may start what the worker needs here (a process), on the
  /// worker's own thread. Errors are reported by the items that need it.
  virtual std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const = 0;

  /// The engine's worker count is now `workers` (0: the consumer's thread
  /// does the work), as its target: some may still be starting. Of those,
  /// `remote` are remote slots: their items go to the kind's cluster, the
  /// rest run here (a kind without one is never given any). Any thread;
  /// must not block.
  virtual void Resized(int workers, int remote) const {
    (void)workers;
    (void)remote;
  }
  /// Remote slots the kind's cluster offers now (0: it has none). Any thread;
  /// must not block.
  virtual int remote_capacity() const { return 0; }
  /// Bytes one remote slot's task brings back, as measured lately (0:
  /// unknown): what each remote slot holds, for the memory budget. Any
  /// thread; must not block.
  virtual size_t remote_task_bytes() const { return 0; }
  /// Bytes one item's output holds outside the engine's batch buffer (a
  /// worker process's batch segment), as measured lately (0: none, or not
  /// yet known): the look-ahead keeps within half the memory budget of
  /// them. Any thread; must not block.
  virtual size_t output_bytes() const { return 0; }
  /// Workers starting now (a process forking, greeting, or running the
  /// user's worker_init_fn): they make no item yet, so the tuner reads no
  /// window of a pool not yet up. Any thread; must not block.
  virtual int starting() const { return 0; }
  /// Each worker is a process of its own: past the count whose CPU share
  /// fills the cores, more cost CPU (switches, memory) and the rate falls,
  /// so the tuner gives I/O-bound pools of them little headroom above it.
  virtual bool workers_are_processes() const { return false; }

  /// The engine is stopping for good: wake whatever its workers wait on for
  /// the kind (a process's greeting, a batch list), so that they can leave.
  /// Any thread; idempotent.
  virtual void Cancel() const {}

  /// Whether Recycle does anything: the engine then hands it every output
  /// and zeroes the output after (a cost per batch, so only when needed).
  virtual bool recycles() const { return false; }
  /// Called once for every output the engine is done with: delivered and
  /// released by the consumer, or dropped unused (its epoch abandoned, its
  /// item failed). Outputs never written arrive as zero bytes. Any thread;
  /// must not block.
  virtual void Recycle(std::span<std::byte> out) const { (void)out; }
};

}  // namespace stoker
