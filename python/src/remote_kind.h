#pragma once

// stoker.DataLoader(cluster=...): the loader's own kind (processes, threads or
// both) beside remote slots. Each engine thread runs a batch locally or sends
// it to the cluster as RemoteSlots splits them; a batch the cluster gives
// back (its scheduler gone, its retries spent) is made locally by the same
// thread. The consumer tells remote batches by their descriptor's magic.

#include <memory>

#include "remote_slots.h"
#include "stoker/worker_kind.h"
#include "thread_workers.h"

namespace stoker::python {

class LocalFirstKind : public WorkerKind {
 public:
  /// `remote`: the remote slots' ThreadWorkers (magic kRemoteMagic), whose
  /// run_batch sends a batch to the cluster and waits for it.
  LocalFirstKind(std::shared_ptr<const WorkerKind> local, std::shared_ptr<ThreadWorkers> remote,
                 std::shared_ptr<RemoteSlots> slots);
  /// The local kind's (at least a thread descriptor long).
  SampleSpec spec() const override { return local_->spec(); }
  int64_t items() const override { return local_->items(); }
  std::string Key(int64_t item) const override { return local_->Key(item); }
  std::string item_name() const override { return local_->item_name(); }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;
  /// The local kind is told of its local workers only.
  void Resized(int workers, int remote) const override;
  int remote_capacity() const override { return slots_->capacity(); }
  size_t remote_task_bytes() const override { return slots_->task_bytes(); }
  size_t output_bytes() const override { return local_->output_bytes(); }
  int starting() const override { return local_->starting(); }
  bool workers_are_processes() const override { return local_->workers_are_processes(); }
  void Cancel() const override;
  bool recycles() const override { return true; }
  void Recycle(std::span<std::byte> out) const override;

 private:
  std::shared_ptr<const WorkerKind> local_;
  ThreadKind remote_;
  std::shared_ptr<RemoteSlots> slots_;
};

}  // namespace stoker::python
