#pragma once

// Thread workers for Python datasets whose work releases the GIL
// (stoker.DataLoader(worker_kind="threads")): each engine worker thread runs
// whole batches through a Python function, holding the GIL only while Python
// runs. The batch stays a Python object, handed to the consumer by ticket.

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

/// The batches made and not yet taken. Thread-safe; the GIL is taken after
/// (never while holding) its own lock.
class ThreadWorkers {
 public:
  /// `run_batch(epoch, batch, indices, seed)` returns what the consumer takes,
  /// or None to give the batch back (a remote slot that could not make it).
  /// `magic` marks its descriptors: kThreadMagic, or kRemoteMagic for the
  /// remote slots' batches.
  ThreadWorkers(pybind11::object run_batch, std::shared_ptr<EpochBatches> batches,
                int64_t magic = protocol::kThreadMagic);
  /// Drops the batches never taken (with the GIL).
  ~ThreadWorkers();

  /// On an engine worker thread (or the consumer's, `worker` -1): runs the
  /// batch with the GIL; its ticket goes into `out`, its failed samples into
  /// `outcome`. collate_fn raising fails the batch (kDataError, with the
  /// traceback); an exception from run_batch itself becomes kInternal with
  /// its text. run_batch giving None sets `*gave_back` (when not null) and
  /// returns kUnavailable, with nothing made.
  Status Run(int64_t epoch, int64_t batch, int worker, int64_t out[kThreadDescriptorWords],
             ItemOutcome* outcome, bool* gave_back = nullptr) EXCLUDES(mu_);
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
  /// Wakes and refuses every wait for a batch list (the loader is closing).
  void Cancel() { batches_->Shutdown(); }

 private:
  pybind11::object run_batch_;
  const std::shared_ptr<EpochBatches> batches_;
  const int64_t magic_;
  Mutex mu_;
  std::unordered_map<uint64_t, pybind11::object> ready_ GUARDED_BY(mu_);
  std::vector<pybind11::object> dead_ GUARDED_BY(mu_);  // dropped by Take, which holds the GIL
  std::vector<bool> ids_in_use_ GUARDED_BY(mu_);
};

/// The user's batches as the engine's items, each run by Python on the
/// engine's thread (or the consumer's, with no workers), holding the GIL only
/// while Python runs.
class ThreadKind : public WorkerKind {
 public:
  explicit ThreadKind(std::shared_ptr<ThreadWorkers> workers) : workers_(std::move(workers)) {}
  const std::shared_ptr<ThreadWorkers>& workers() const { return workers_; }
  SampleSpec spec() const override { return {{kThreadDescriptorWords}, DType::kInt64}; }
  int64_t items() const override;
  /// Empty: the engine names the batch itself.
  std::string Key(int64_t) const override { return ""; }
  /// Each item is one of the user's batches (what the DataLoader yields).
  std::string item_name() const override { return "batch"; }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;
  bool recycles() const override { return true; }
  void Recycle(std::span<std::byte> out) const override;
  /// Wakes workers waiting for a batch list.
  void Cancel() const override;

 private:
  std::shared_ptr<ThreadWorkers> workers_;
};

}  // namespace stoker::python
