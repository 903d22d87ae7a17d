#pragma once

// Worker processes for Python datasets (stoker.DataLoader): the parent's half
// of the protocol (worker_protocol.h) spoken with python/stoker/_workers.py.
//
// The engine schedules the user's batches as its items (batch_size 1);
// ProcessKind runs each one in a worker process forked by a zygote, which
// writes the collated batch into a shared-memory segment (a memfd) that the
// loader owns and recycles.
//
// Plain C++ (library stoker_pyworkers, tested with a fake zygote in
// process_workers_test.cc); its bindings are process_workers_bindings.cc.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_annotations.h"
#include "core/unique_fd.h"
#include "engine/host_registration.h"
#include "epoch_batches.h"
#include "stoker/status.h"
#include "stoker/worker_kind.h"
#include "worker_message.h"
#include "worker_protocol.h"

namespace stoker::python {

/// How often an engine thread waiting for a sharded stream's item asks
/// whether it may leave the pool (ItemOutcome::may_leave), processes and threads.
inline constexpr std::chrono::milliseconds kYieldPoll{20};
/// How long a worker process may take to answer DROP (it stops at its next
/// sample) before it is killed and replaced: one stalled in a read that never
/// ends must not hold the next epoch back.
inline constexpr std::chrono::milliseconds kDropGrace{1000};

/// A delivered item as the engine carries it: protocol::ProcessDescriptor.
inline constexpr int kDescriptorWords = protocol::ProcessDescriptor::kCount;

/// A read-write shared mapping of a segment, unmapped when the last owner
/// (the pool or a consumer's view) lets go; page-locked for CUDA once, when
/// the loader pins (pin_memory), and unregistered before it is unmapped.
struct Mapping {
  Mapping(void* addr, size_t size) : addr(addr), size(size) {}
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  /// Registers the mapping with `cuda` (cudaHostRegister) unless it is
  /// already; true when this call registered it.
  Result<bool> Pin(const std::shared_ptr<const CudaRuntime>& cuda) EXCLUDES(pin_mu_);
  void* const addr;
  const size_t size;

 private:
  Mutex pin_mu_;
  std::unique_ptr<HostRegistration> pinned_ GUARDED_BY(pin_mu_);  // set once registered
};

/// A segment handed to one task, as copied when it was acquired: which
/// segment, its descriptor's number (to send to a worker; valid while the
/// ProcessWorkers lives) and which use of it.
struct SegmentLease {
  int segment_id = -1;
  int fd = -1;
  uint64_t ticket = 0;
};

/// What a consumer needs to read a delivered batch.
struct SegmentView {
  std::shared_ptr<Mapping> map;
};

/// One worker process as its engine thread holds it.
struct WorkerProcess {
  int pid = -1;
  int id = -1;  // torch's worker id: the smallest free one when it started
  UniqueFd conn;
  std::vector<int> known_segments;   // segment ids whose fd it has
  std::optional<int64_t> base_seed;  // what INIT gave it; none before INIT
};

/// The loader's worker processes and segments: the zygote's control socket,
/// the epochs' batch lists, the segment pool. Shared by the transform, its
/// scratches and the Python object. Thread-safe.
class ProcessWorkers {
 public:
  /// Takes ownership of `zygote_fd` (the parent's end of the zygote's socket).
  /// `persistent`: a worker process lives across epochs (torch's
  /// persistent_workers); else each ends at its epoch's end.
  ProcessWorkers(int zygote_fd, int zygote_pid, std::shared_ptr<EpochBatches> batches,
                 bool persistent);
  ~ProcessWorkers();

  EpochBatches& batches() { return *batches_; }
  bool persistent() const { return persistent_; }

  /// Forks a worker through the zygote and waits for its greeting. Errors
  /// name the cause (the zygote died, its threads were refused).
  Result<WorkerProcess> Spawn() EXCLUDES(mu_, zygote_mu_);
  /// Tells a greeted worker its epoch's base seed (INIT) and waits while it
  /// runs worker_init_fn under it. An error (init raised, hung or died)
  /// names the cause; the worker is then collected.
  Status Init(WorkerProcess& worker, int64_t base_seed) EXCLUDES(mu_, zygote_mu_);
  /// How a worker process ended: "exited with code 1", "was killed by
  /// signal 9 (SIGKILL)…"; `killed`: by SIGKILL (the OOM killer, or a kill).
  struct Ending {
    std::string how;
    bool killed = false;
  };
  /// Asks the zygote to collect `pid` and says how it ended; frees its worker id.
  Ending Reap(const WorkerProcess& worker) EXCLUDES(mu_, zygote_mu_);

  /// A free segment of at least `bytes`, grown (and its pages reserved) as
  /// needed, with a new ticket. kUnavailable when memory is refused.
  Result<SegmentLease> Acquire(size_t bytes) EXCLUDES(mu_);
  /// Notes the segment's size after a worker grew it, and that its batch
  /// takes `used` bytes of it (the most noted for this use counts).
  void SetSize(const SegmentLease& lease, size_t size, size_t used) EXCLUDES(mu_);
  /// The size of the segment the latest batch was published in (0: none yet).
  size_t output_bytes() const { return output_bytes_.load(std::memory_order_relaxed); }
  /// Workers in Spawn or Init now: forked and not yet through worker_init_fn.
  int starting() const { return starting_.load(std::memory_order_relaxed); }
  /// Gives the segment back if `ticket` is its current use; else nothing.
  void Release(int segment_id, uint64_t ticket) EXCLUDES(mu_);
  /// The parent's mapping of a leased segment (mapped or remapped to its
  /// current size, page-locked when pinning); kInvalidArgument for a stale
  /// descriptor.
  Result<SegmentView> View(int segment_id, uint64_t ticket) EXCLUDES(mu_);
  /// From now on, segments are page-locked for CUDA once each, when first
  /// viewed (pin_memory=True: batches copy to a GPU asynchronously, with no
  /// pinned copy). kUnavailable when the CUDA runtime does not load.
  Status Pin() EXCLUDES(mu_);
  /// Mappings registered so far.
  int64_t pinned_mappings() const { return pinned_.load(std::memory_order_relaxed); }
  /// A mapping of at least `bytes` of a leased segment, for the parent's writes.
  Result<std::shared_ptr<Mapping>> MapForWrite(const SegmentLease& lease, size_t bytes)
      EXCLUDES(mu_);

  /// Parts of items still being made (a sharded stream's batches, each as
  /// soon as it is collated, protocol PART), so that the consumer can hand
  /// out the batches of the item it waits for before the item is done.
  /// Publish adds part `part` of (epoch, item) in `lease`'s segment, which is
  /// `size` long now; Unpublish drops the item's parts (its attempt ended or
  /// starts again) and says whether it had any.
  void Publish(int64_t epoch, int64_t item, int64_t part, const SegmentLease& lease, size_t size,
               int64_t meta_off, int64_t meta_len) EXCLUDES(mu_, parts_mu_);
  bool Unpublish(int64_t epoch, int64_t item) EXCLUDES(parts_mu_);
  /// A published part's ProcessDescriptor words.
  using Descriptor = std::array<int64_t, kDescriptorWords>;
  std::optional<Descriptor> PartOf(int64_t epoch, int64_t item, int64_t part) const
      EXCLUDES(parts_mu_);
  /// Every part published of (epoch, item), in order.
  std::vector<Descriptor> PartsOf(int64_t epoch, int64_t item) const EXCLUDES(parts_mu_);
  /// A sharded stream's item whose worker yielded it (YIELDED) to leave the
  /// pool: its segment, still leased (the consumer may hold its parts, which
  /// stay published), and where the worker that continues it starts.
  struct Continuation {
    SegmentLease lease;
    int64_t resume_offset = 0, resume_length = 0;  // its resume (worker_protocol.h)
    int64_t data_end = 0;                          // where new data may start
  };
  void Yielded(int64_t epoch, int64_t item, const Continuation& c) EXCLUDES(parts_mu_);
  /// Items handed over so far (Yielded).
  int64_t handed_over() const { return handed_over_.load(std::memory_order_relaxed); }
  /// Shards whose worker process died, gone on after their parts by a fresh one.
  int64_t shard_deaths() const { return shard_deaths_.load(std::memory_order_relaxed); }
  void CountShardDeath() { shard_deaths_.fetch_add(1, std::memory_order_relaxed); }
  /// The continuation of (epoch, item), taken: the next Run of it continues there.
  std::optional<Continuation> Continue(int64_t epoch, int64_t item) EXCLUDES(parts_mu_);
  /// Lets go of a yielded item's continuation and parts, if it has one: the
  /// item was made elsewhere from its start (a remote slot). Whether it had one.
  bool Forgo(int64_t epoch, int64_t item) EXCLUDES(mu_, parts_mu_);
  /// Lets go of continuation `c` of (epoch, item), taken (Continue): its parts
  /// and, at the consumer's last Unhold, its segment.
  void LetGo(int64_t epoch, int64_t item, const Continuation& c) EXCLUDES(mu_, parts_mu_);
  /// Keeps a leased segment from going back to the pool until Unhold, while
  /// the consumer holds a part of it: Release then takes effect at the last
  /// Unhold. kInvalidArgument for a stale descriptor (the segment went back).
  Status Hold(int segment_id, uint64_t ticket) EXCLUDES(mu_);
  void Unhold(int segment_id, uint64_t ticket) EXCLUDES(mu_);

  /// Stops for good: waiting calls return kCancelled, every worker process
  /// is killed (their tasks fail at once), the zygote is told to exit.
  void Shutdown() EXCLUDES(mu_);
  /// Shutdown, then tells the zygote to exit and closes its socket: it kills
  /// what is left and exits.
  void Close() EXCLUDES(mu_, zygote_mu_);
  bool shut_down() const EXCLUDES(mu_);
  /// The engine's worker count.
  int64_t running() const { return running_.load(std::memory_order_relaxed); }
  /// get_worker_info().num_workers: the count running, or more where a shrink
  /// left a worker of a higher id (the first to reach a task leaves, not the
  /// highest id): ids stay below it, as under torch.
  int64_t NumWorkersSeen() const EXCLUDES(mu_);
  void set_running(int workers) { running_.store(workers, std::memory_order_relaxed); }
  /// The loader's memory budget (0: none): free segments keep their memory
  /// within half of it.
  void set_budget(size_t bytes) { budget_bytes_.store(bytes, std::memory_order_relaxed); }
  /// Pids of the worker processes alive now.
  std::vector<int> pids() const EXCLUDES(mu_);
  /// Bytes of segments now: all, and those in use.
  std::pair<size_t, size_t> segment_bytes() const EXCLUDES(mu_);
  /// All segments' bytes over the live worker processes (each counts its share).
  size_t segment_share() const EXCLUDES(mu_);

 private:
  /// One shared-memory segment and its use; reached only through segments_,
  /// under mu_ (a task holds a SegmentLease, a copy of what it needs).
  struct Segment {
    int id = 0;
    UniqueFd fd;
    size_t size = 0;      // the file's size as last known
    size_t used = 0;      // bytes the current use's batch takes (0: unknown)
    uint64_t ticket = 0;  // which use of the segment a descriptor names
    bool busy = false;
    int holds = 0;                 // parts of it the consumer holds (Hold)
    bool released = false;         // Release came while held: it takes effect at the last Unhold
    std::shared_ptr<Mapping> map;  // the parent's mapping, of map->size bytes
  };
  /// Gives `s` back to the pool (its current use ends); after Close, its
  /// memory and descriptor go.
  void FreeLocked(Segment& s) REQUIRES(mu_);
  /// Lets go of `s`'s memory and descriptor (the loader is closed).
  void DropLocked(Segment& s) REQUIRES(mu_);
  /// Lets go of free segment `s`'s memory, keeping its descriptor: a worker
  /// grows it again when it next holds a batch.
  void EmptyLocked(Segment& s) REQUIRES(mu_);
  /// How many free segments keep their memory: kFreeKept while worker
  /// processes live or persist; none between epochs without persistent
  /// workers, where nothing writes them before the next iter(): their
  /// descriptors go too (no live process knows them), and Acquire makes new.
  int FreeKeptLocked() const REQUIRES(mu_);

  /// The segment `id`, or nullptr for an id never handed out.
  Segment* FindLocked(int id) REQUIRES(mu_);
  /// The segment of `lease` while `lease.ticket` is its current use, else nullptr.
  Segment* LeasedLocked(const SegmentLease& lease) REQUIRES(mu_);
  Result<std::shared_ptr<Mapping>> MapLocked(Segment& s, size_t bytes) REQUIRES(mu_);

  // In a forked child (a worker, another loader's zygote) this object is a
  // copy of the parent's: its descriptors' numbers may name the child's own
  // files, and its pids are the parent's workers. It then touches nothing.
  bool ForeignProcess() const;
  /// Sends the zygote `tag` and waits (at most a minute; stopped by Shutdown
  /// when `cancellable`) for its answer. A zygote that does not answer in
  /// time is killed: its later replies could not be matched to requests.
  Result<Message> AskZygote(protocol::Tag::Index tag, std::span<const int64_t> words,
                            bool cancellable) EXCLUDES(zygote_mu_);

  const std::shared_ptr<EpochBatches> batches_;
  const bool persistent_;
  const int zygote_pid_;
  const int owner_pid_;

  Mutex zygote_mu_;  // one request to the zygote at a time
  UniqueFd zygote_ GUARDED_BY(zygote_mu_);
  int unanswered_ GUARDED_BY(zygote_mu_) = 0;  // requests whose wait close() cut short

  std::atomic<int64_t> pinned_{0};
  std::atomic<int64_t> handed_over_{0};
  std::atomic<int64_t> shard_deaths_{0};
  std::atomic<int64_t> running_{0};
  std::atomic<size_t> budget_bytes_{0};
  std::atomic<size_t> output_bytes_{0};
  std::atomic<int> starting_{0};  // in Spawn or Init

  mutable Mutex mu_;
  std::shared_ptr<const CudaRuntime> cuda_ GUARDED_BY(mu_);  // set once by Pin()
  bool shutdown_ GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Segment>> segments_ GUARDED_BY(mu_);  // indexed by id
  std::vector<int> live_pids_ GUARDED_BY(mu_);
  std::vector<bool> ids_in_use_ GUARDED_BY(mu_);

  mutable Mutex parts_mu_;
  // (epoch, item) -> its parts' descriptors, by part number.
  std::map<std::pair<int64_t, int64_t>, std::vector<Descriptor>> parts_ GUARDED_BY(parts_mu_);
  // (epoch, item) -> where a yielded item continues.
  std::map<std::pair<int64_t, int64_t>, Continuation> continuations_ GUARDED_BY(parts_mu_);
};

/// One engine thread's worker process, forked when the thread starts (or at
/// its first item) and ended with it; runs the user's batches in it.
class ProcessWorker : public KindWorker {
 public:
  /// `cap.budget_bytes`: the loader's memory budget, which the processes
  /// share (0: none).
  ProcessWorker(std::shared_ptr<ProcessWorkers> workers, const SampleCap& cap);
  ~ProcessWorker() override;
  /// Runs batch `item` of `epoch` in the process, into a leased segment;
  /// `out` gets the batch's descriptor (protocol::ProcessDescriptor). A
  /// sample that raised, or whose process died, is a failure in `outcome`
  /// (a fresh process runs the rest of the batch).
  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override;
  /// CPU and run-queue time in the process; its unique memory plus its share
  /// of the segments; what it grew by since its first batch (trimmable).
  WorkerCost cost() const override;
  /// Forks its process if it has none. Its own thread only.
  Status Start();
  /// Start, and worker_init_fn run under `base_seed` (the epoch's): a
  /// process that ran it under another seed (another epoch's draw, as torch
  /// forks anew each epoch without persistent workers) is ended first.
  Status Serve(int64_t base_seed);
  /// Start, before the first item: a refused fork (a pids limit) keeps the
  /// engine's thread from taking work.
  Status Ready() override { return Start(); }
  /// Ends its process, if any (EXIT; `kill`: SIGKILL, for one stalled in a
  /// sample); a later item forks a fresh one. Its own thread only.
  void Stop(bool kill = false);

 private:
  struct Reply {
    int64_t samples = 0, size = 0, meta_off = 0, meta_len = 0;
    int64_t over_samples = 0, over_bytes = 0;             // OVER: the batch was left there
    std::optional<ProcessWorkers::Continuation> yielded;  // YIELDED: where it stopped
    bool dropped = false;  // DROPPED: stopped, its epoch abandoned (or it need not go on)
    bool shed = false;     // over its share, it left the pool (ItemOutcome::may_shed)
    int64_t workers = 0;   // the pool's size its share was of (TASK's num_workers)
  };
  // The unique memory this process may reach (TASK's memory_limit); 0: no budget.
  size_t MemoryShare() const;
  // How a batch took a fresh process past its share, for people.
  std::string OverShareReason(int64_t epoch, int64_t batch, size_t samples,
                              const Reply& reply) const;
  // A batch that took a fresh process past its share: kResourceExhausted.
  // `tuned`: the worker count is the tuner's, not the user's to lower.
  Status OverShare(int64_t epoch, int64_t batch, size_t samples, const Reply& reply,
                   bool tuned) const;
  // One attempt; kCancelled when the process died (the caller asks the zygote how).
  // `resume`: a yielded item's continuation, else null. When the engine
  // lets this thread leave, a sharded stream's item is asked to YIELD.
  Status Attempt(int64_t epoch, int64_t batch, const std::vector<int64_t>& indices,
                 const std::string& keys, int64_t seed, int64_t base_seed,
                 const SegmentLease& lease, const ProcessWorkers::Continuation* resume,
                 Reply* reply, ItemOutcome* outcome);
  // Attempts until the batch is made, blaming the sample a dead process was
  // on; `lease` is replaced (by one of `header` bytes) where an attempt's
  // parts may be held. `resume` applies to the first attempt: a later one
  // starts the item over, but for a shard whose process died after new
  // parts, which a fresh process continues after them (ResumeAfterParts).
  Status RunInSegment(int64_t epoch, int64_t batch, std::vector<int64_t> indices,
                      const std::string& keys, int64_t seed, int64_t base_seed, SegmentLease* lease,
                      size_t header, const ProcessWorkers::Continuation* resume, Reply* reply,
                      ItemOutcome* outcome);

  // A continuation after `parts` (the shard's, published in `lease`): their
  // metas as a resume (protocol: "A shard's resume"), written after the last.
  Result<ProcessWorkers::Continuation> ResumeAfterParts(
      const std::vector<ProcessWorkers::Descriptor>& parts, const SegmentLease& lease);

  std::shared_ptr<ProcessWorkers> workers_;
  std::optional<WorkerProcess> proc_;
  // The epoch its process serves: the last it ran a batch of, else the one
  // listed when it started; -1: started before any list (it serves the first).
  int64_t proc_epoch_ = -1;
  int64_t proc_batches_ = 0;  // batches its process made
  const size_t budget_bytes_;
  std::atomic<size_t> private_{0};
  std::atomic<size_t> baseline_{0};  // its unique memory after its first batch
  std::atomic<int64_t> cpu_ns_{0};
  std::atomic<int64_t> queue_ns_{0};
  std::atomic<int64_t> setup_ns_{0};       // wall time its processes took to start and end
  int64_t cpu_seen_ = 0, queue_seen_ = 0;  // the process's own totals at its last reply
};

/// The user's batches as the engine's items, each run whole in a worker
/// process forked by the zygote: each engine worker thread owns one process
/// (its ProcessWorker), so resizing the engine's pool resizes the process
/// pool, under the same tuner and the same invariants.
class ProcessKind : public WorkerKind {
 public:
  explicit ProcessKind(std::shared_ptr<ProcessWorkers> workers);
  SampleSpec spec() const override;
  int64_t items() const override;
  /// Empty: the engine names the batch itself.
  std::string Key(int64_t) const override { return ""; }
  /// Each item is what its plan's items are (EpochBatches::item_name).
  std::string item_name() const override { return workers_->batches().item_name(); }
  /// The segment the latest batch grew.
  size_t output_bytes() const override { return workers_->output_bytes(); }
  int starting() const override { return workers_->starting(); }
  bool workers_are_processes() const override { return true; }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;
  /// Workers learn the local count with their next task (get_worker_info()).
  void Resized(int workers, int remote) const override;
  /// Shuts the workers and the batch lists down: waits on them end.
  void Cancel() const override;
  bool recycles() const override { return true; }
  /// Gives the descriptor's segment back to the pool.
  void Recycle(std::span<std::byte> out) const override;

 private:
  std::shared_ptr<ProcessWorkers> workers_;
};

/// What a failed sample of a Python dataset carries beyond its message (its
/// Status's detail), for the exception stoker.DataLoader raises: a
/// stoker.DataError of the sample's own exception type, chained to it, with
/// its index, key and worker (SetPythonError and python/stoker/_errors.py).
struct SampleErrorDetail : SampleDetail {
  int worker = -1;        // the worker's id; -1: the consumer's thread
  std::string traceback;  // the worker's
  /// From a worker process, or a batch's own failure from a thread: the
  /// pickled (exception type, exception or None); empty when it did not
  /// pickle, or the process died.
  std::string exception;
  /// From a worker thread (or the consumer's): the exception object lies in
  /// the outcome of the batch of this ThreadWorkers ticket, at this position
  /// of its failures, until the batch is taken; 0: none.
  uint64_t batch_ticket = 0;
  int64_t failure = -1;
};

/// The failure of a Python dataset's sample `detail->index`, raised with
/// `reason` ("ValueError: ..."), the worker's traceback after it: kDataError
/// carrying `detail`, or kUnavailable (never skipped, a plain
/// stoker.ResourceError) when it is not the sample's fault.
SampleFailure FailedSample(std::shared_ptr<SampleErrorDetail> detail, const std::string& reason,
                           bool not_the_samples_fault);
/// A batch that failed outside its samples (collate_fn raised, the batch
/// could not be written): `reason`, the worker's traceback after it;
/// kDataError carrying `detail` (its worker and exception; no sample), so
/// that it is raised as its own exception type, as torch re-raises it.
Status BatchFailureStatus(const std::string& reason, std::string trace,
                          std::shared_ptr<SampleErrorDetail> detail);

}  // namespace stoker::python
