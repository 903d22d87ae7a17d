#pragma once

// Thread workers for Python datasets whose work releases the GIL
// (stoker.DataLoader(worker_kind="threads")): each engine worker thread hands
// whole batches to a Python thread of its own, which runs them through a
// Python function; the batch stays a Python object, handed to the consumer by
// ticket.

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/thread_annotations.h"
#include "epoch_batches.h"
#include "stoker/worker_kind.h"
#include "worker_protocol.h"

namespace stoker::python {

/// The engine's item for the thread kind: protocol::ThreadDescriptor.
inline constexpr int kThreadDescriptorWords = protocol::ThreadDescriptor::kCount;

/// The batches made and not yet taken, and the Python threads that make them:
/// one per engine worker id, started at its first batch
/// (serve_thread_worker in stoker/_workers.py). They are daemon threads,
/// never joined: a batch that never ends holds up neither Cancel (the engine
/// thread leaves at once; the batch stops at its next sample, or is dropped
/// when done) nor the interpreter's exit. Must be owned by a shared_ptr.
/// Thread-safe; the GIL is taken before (never while holding) its own lock.
class ThreadWorkers : public std::enable_shared_from_this<ThreadWorkers> {
 public:
  /// `run_batch(epoch, batch, indices, seed)` returns what the consumer takes,
  /// or None to give the batch back (a remote slot that could not make it).
  /// `magic` marks its descriptors: kThreadMagic, or kRemoteMagic for the
  /// remote slots' batches.
  ThreadWorkers(pybind11::object run_batch, std::shared_ptr<EpochBatches> batches,
                int64_t magic = protocol::kThreadMagic);
  /// Drops the batches never taken and ends the Python threads once idle
  /// (with the GIL).
  ~ThreadWorkers();

  /// On an engine worker thread (`worker` its id from AcquireWorkerId):
  /// hands the batch to that worker's Python thread and waits, without the
  /// GIL, for it to be made or for Cancel (then kCancelled). On the
  /// consumer's thread (`worker` -1): runs the batch itself, with the GIL.
  /// The batch's ticket goes into `out`, its failed samples into `outcome`.
  /// collate_fn raising fails the batch (kDataError, with the traceback); an
  /// exception from run_batch itself becomes kInternal with its text.
  /// run_batch giving None sets `*gave_back` (when not null) and returns
  /// kUnavailable, with nothing made.
  Status Run(int64_t epoch, int64_t batch, int worker, int64_t out[kThreadDescriptorWords],
             ItemOutcome* outcome, bool* gave_back = nullptr) EXCLUDES(mu_);
  /// Whether the engine thread waiting for `worker`'s batch number `sent`
  /// leaves the pool: a sharded stream's item then stops at its next part
  /// (run_batch gives YIELDED) for another worker to continue. Any thread.
  bool yield_asked(int worker, uint64_t sent) const EXCLUDES(mu_);
  /// Whether the batch `worker` was handed as number `sent` is of an
  /// abandoned epoch (ItemOutcome::abandoned): a sharded stream's item then
  /// stops at its next sample and keeps nothing (run_batch gives DROPPED).
  /// Any thread.
  bool drop_asked(int worker, uint64_t sent) const EXCLUDES(mu_);
  /// A Python thread's answer to the batch it was handed as number `sent`:
  /// run_batch's `result`, or the text of what it raised as `error` (else
  /// None). Dropped when its engine thread left (Cancel). REQUIRES: the GIL.
  void Finish(int worker, uint64_t sent, pybind11::object result, pybind11::object error)
      EXCLUDES(mu_);
  int64_t magic() const { return magic_; }
  /// The exception of failure `failure` of the batch of `ticket`
  /// (SampleErrorDetail), while the batch is not taken; else None.
  /// REQUIRES: the GIL.
  pybind11::object FailureCause(uint64_t ticket, int64_t failure) EXCLUDES(mu_);
  /// The smallest worker id not in use, for an engine thread's worker;
  /// given back with ReleaseWorkerId when the worker ends.
  int AcquireWorkerId() EXCLUDES(mu_);
  void ReleaseWorkerId(int id) EXCLUDES(mu_);
  /// The engine is done with a ticket's batch without handing it out (its
  /// epoch abandoned): dropped at the next Take. Any thread, GIL or not.
  void Recycle(uint64_t ticket) EXCLUDES(mu_);
  /// The batch of `ticket`, once. REQUIRES: the GIL.
  pybind11::object Take(uint64_t ticket) EXCLUDES(mu_);
  int64_t first_batches() const { return batches_->first_batches(); }
  const std::string& item_name() const { return batches_->item_name(); }
  const EpochBatches& batches() const { return *batches_; }
  /// What `worker`'s Python thread has cost so far (WorkerCost::thread_cpu_ns
  /// and queue_ns), as of its last batch. Any thread.
  WorkerCost Cost(int worker) const EXCLUDES(mu_);
  /// Wakes and refuses every wait for a batch list or for a batch on a
  /// Python thread (the loader is closing for good): Run returns kCancelled
  /// at once. Any thread, GIL or not; idempotent.
  void Cancel() EXCLUDES(mu_);
  /// Whether Cancel was called. Any thread.
  bool cancelled() const EXCLUDES(mu_);
  /// Cancel, then ends each Python thread once its batch (if any) stops.
  /// REQUIRES: the GIL, and no Run in progress or to come.
  void Close() EXCLUDES(mu_);

 private:
  // What a run of run_batch made, read with the GIL.
  struct Made {
    Status status;
    ItemOutcome outcome;      // its samples and failures
    bool gave_back = false;   // run_batch gave None
    bool yielded = false;     // run_batch gave YIELDED: the item stopped at a part
    bool dropped = false;     // run_batch gave DROPPED: its epoch abandoned, nothing kept
    pybind11::object result;  // what the consumer takes, when `status` is ok
  };
  // An engine worker id's Python thread and the last batch handed to it.
  struct Lane {
    pybind11::object inbox;  // its queue.SimpleQueue of (sent, run_batch's arguments)
    uint64_t sent = 0;       // batches handed to it
    uint64_t done = 0;       // of them, answered; `made` holds the last until taken
    uint64_t ticket = 0;     // the last one's
    uint64_t yield = 0;      // the batch (by `sent`) asked to stop at its next part
    uint64_t drop = 0;       // the batch (by `sent`) asked to stop at its next sample
    Made made;
    // The thread's CPU and run-queue time, as of its last answer.
    int64_t cpu_ns = 0;
    int64_t queue_ns = 0;
  };

  // Reads run_batch's `result` for the batch of `ticket`. REQUIRES: the GIL.
  static Made Read(pybind11::object result, uint64_t ticket, int worker);
  // `made` as the engine's outcome; its result kept under `ticket`.
  Status Deliver(Made made, uint64_t ticket, int64_t epoch, int64_t batch,
                 int64_t out[kThreadDescriptorWords], ItemOutcome* outcome, bool* gave_back)
      REQUIRES(mu_);
  // Hands the batch to `worker`'s Python thread (started first if need be);
  // the number it was sent as. Takes the GIL.
  Result<uint64_t> Send(int worker, uint64_t ticket, int64_t epoch, int64_t batch,
                        const EpochBatches::Batch& got) EXCLUDES(mu_);
  // `worker`'s inbox, its thread started at the first call; null once
  // cancelled. REQUIRES: the GIL.
  pybind11::object Inbox(int worker) EXCLUDES(mu_);

  pybind11::object run_batch_;
  const std::shared_ptr<EpochBatches> batches_;
  const int64_t magic_;
  mutable Mutex mu_;
  CondVar answered_;  // a lane's batch answered, or Cancel
  bool cancelled_ GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Lane>> lanes_ GUARDED_BY(mu_);  // by worker id
  std::unordered_map<uint64_t, pybind11::object> ready_ GUARDED_BY(mu_);
  std::vector<pybind11::object> dead_ GUARDED_BY(mu_);  // dropped by Take, which holds the GIL
  std::vector<bool> ids_in_use_ GUARDED_BY(mu_);
};

/// The user's batches as the engine's items, each run by the Python thread of
/// its engine thread (or on the consumer's thread, with no workers).
class ThreadKind : public WorkerKind {
 public:
  explicit ThreadKind(std::shared_ptr<ThreadWorkers> workers) : workers_(std::move(workers)) {}
  const std::shared_ptr<ThreadWorkers>& workers() const { return workers_; }
  SampleSpec spec() const override { return {{kThreadDescriptorWords}, DType::kInt64}; }
  int64_t items() const override;
  /// Empty: the engine names the batch itself.
  std::string Key(int64_t) const override { return ""; }
  /// Each item is what its plan's items are (EpochBatches::item_name).
  std::string item_name() const override { return workers_->item_name(); }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;
  bool recycles() const override { return true; }
  void Recycle(std::span<std::byte> out) const override;
  /// Wakes workers waiting for a batch list or for their Python thread.
  void Cancel() const override;

 private:
  std::shared_ptr<ThreadWorkers> workers_;
};

}  // namespace stoker::python
