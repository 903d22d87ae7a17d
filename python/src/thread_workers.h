#pragma once

// Thread workers for Python datasets whose work releases the GIL
// (stoker.DataLoader(worker_kind="threads")): each engine worker thread runs
// whole batches through a Python function, holding the GIL only while Python
// runs. The batch stays a Python object, handed to the consumer by ticket.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/thread_annotations.h"
#include "epoch_batches.h"
#include "stoker/transform.h"
#include "worker_protocol.h"

namespace stoker::python {

/// The engine's item for the thread kind: protocol::ThreadDescriptor.
inline constexpr int kThreadDescriptorWords = protocol::ThreadDescriptor::kCount;

/// The batches made and not yet taken. Thread-safe; the GIL is taken after
/// (never while holding) its own lock.
class ThreadWorkers {
 public:
  /// `run_batch(epoch, batch, indices, seed)` returns what the consumer takes.
  ThreadWorkers(pybind11::object run_batch, uint64_t seed, std::shared_ptr<EpochBatches> batches);
  /// Drops the batches never taken (with the GIL).
  ~ThreadWorkers();

  /// On an engine worker thread: runs the batch with the GIL; its ticket
  /// goes into `out`. An exception from Python becomes kInternal with its text.
  Status Run(int64_t epoch, int64_t batch, int64_t out[kThreadDescriptorWords]) EXCLUDES(mu_);
  /// The engine is done with a ticket's batch without handing it out (its
  /// epoch abandoned): dropped at the next Take. Any thread, GIL or not.
  void Recycle(uint64_t ticket) EXCLUDES(mu_);
  /// The batch of `ticket`, once. REQUIRES: the GIL.
  pybind11::object Take(uint64_t ticket) EXCLUDES(mu_);

 private:
  pybind11::object run_batch_;
  const uint64_t seed_;
  const std::shared_ptr<EpochBatches> batches_;
  Mutex mu_;
  uint64_t next_ticket_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, pybind11::object> ready_ GUARDED_BY(mu_);
  std::vector<pybind11::object> dead_ GUARDED_BY(mu_);  // dropped by Take, which holds the GIL
};

class ThreadTransform : public Transform {
 public:
  explicit ThreadTransform(std::shared_ptr<ThreadWorkers> workers) : workers_(std::move(workers)) {}
  SampleSpec spec() const override { return {{kThreadDescriptorWords}, DType::kInt64}; }
  Status Apply(const Record& record, SampleRng& rng, std::span<std::byte> out,
               TransformScratch* scratch) const override;
  bool recycles() const override { return true; }
  void Recycle(std::span<std::byte> out) const override;

 private:
  std::shared_ptr<ThreadWorkers> workers_;
};

}  // namespace stoker::python
