#pragma once

// stoker.Loader(cluster=...): the engine's own samples (a source through a
// transform) beside remote slots. A remote slot's engine thread sends each
// task it claims (a run of samples of one batch) to the cluster at once,
// where the same source, transform and seed make the same bytes, and copies
// them into the batch as they come back; a task the cluster gives back is
// made locally by the same thread. The Python half is stoker/_remote.py.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "remote_slots.h"
#include "stoker/worker_kind.h"

namespace stoker::python {

class LocalFirstSampleKind : public WorkerKind {
 public:
  /// `local`: the engine's SampleKind. `send(epoch, items, cap_bytes)` makes
  /// the samples on the cluster (with the GIL; it waits without it) and
  /// returns (samples, labels, failures) as make_samples does, or None when
  /// the cluster could not.
  LocalFirstSampleKind(std::shared_ptr<const WorkerKind> local, pybind11::object send,
                       std::shared_ptr<RemoteSlots> slots);
  ~LocalFirstSampleKind() override;
  SampleSpec spec() const override { return local_->spec(); }
  int64_t items() const override { return local_->items(); }
  std::string Key(int64_t item) const override { return local_->Key(item); }
  std::string item_name() const override { return local_->item_name(); }
  bool items_are_samples() const override { return local_->items_are_samples(); }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;
  void Resized(int workers, int remote) const override;
  int remote_capacity() const override { return slots_->capacity(); }
  size_t remote_task_bytes() const override { return slots_->task_bytes(); }
  size_t output_bytes() const override { return local_->output_bytes(); }
  int starting() const override { return local_->starting(); }
  bool workers_are_processes() const override { return local_->workers_are_processes(); }

 private:
  std::shared_ptr<const WorkerKind> local_;
  std::shared_ptr<pybind11::object> send_;  // released with the GIL
  std::shared_ptr<RemoteSlots> slots_;
};

}  // namespace stoker::python
