#pragma once

// worker_kind="auto" (stoker.DataLoader): one engine transform that runs each
// batch either in a worker process or on the engine's thread with the GIL, as
// the DataLoader's trial decides (python/stoker/_dataloader.py, _KindTrial).
// The descriptor's magic tells the consumer which kind made a batch.

#include <atomic>
#include <memory>

#include "process_workers.h"
#include "stoker/transform.h"
#include "thread_workers.h"

namespace stoker::python {

enum class WorkerKind : int { kProcesses = 0, kThreads = 1 };

/// Both kinds' workers and the kind new batches go to. Thread-safe.
class WorkerKinds {
 public:
  WorkerKinds(std::shared_ptr<ProcessWorkers> processes, std::shared_ptr<ThreadWorkers> threads)
      : processes_(std::move(processes)), threads_(std::move(threads)) {}

  /// Batches started from now on run as `kind`. `final`: the choice is made,
  /// so with threads each engine thread ends its worker process at its next task.
  void Set(WorkerKind kind, bool final) {
    retire_processes_.store(final && kind == WorkerKind::kThreads, std::memory_order_relaxed);
    kind_.store(static_cast<int>(kind), std::memory_order_release);
  }
  WorkerKind kind() const { return static_cast<WorkerKind>(kind_.load(std::memory_order_acquire)); }
  bool retire_processes() const { return retire_processes_.load(std::memory_order_relaxed); }

  const std::shared_ptr<ProcessWorkers>& processes() const { return processes_; }
  const std::shared_ptr<ThreadWorkers>& threads() const { return threads_; }

 private:
  const std::shared_ptr<ProcessWorkers> processes_;
  const std::shared_ptr<ThreadWorkers> threads_;
  std::atomic<int> kind_{static_cast<int>(WorkerKind::kProcesses)};
  std::atomic<bool> retire_processes_{false};
};

/// Runs each batch as WorkerKinds says when it starts; its output is the
/// process kind's descriptor (kDescriptorWords), or the thread kind's in its
/// first kThreadDescriptorWords words, the rest zero.
class EitherKindTransform : public Transform {
 public:
  explicit EitherKindTransform(std::shared_ptr<WorkerKinds> kinds);
  SampleSpec spec() const override { return process_.spec(); }
  std::unique_ptr<TransformScratch> NewScratch() const override;
  std::unique_ptr<TransformScratch> NewWorkerScratch() const override;
  Status Apply(const Record& record, SampleRng& rng, std::span<std::byte> out,
               TransformScratch* scratch) const override;
  bool recycles() const override { return true; }
  void Recycle(std::span<std::byte> out) const override;

 private:
  std::shared_ptr<WorkerKinds> kinds_;
  ProcessTransform process_;
  ThreadTransform thread_;
};

}  // namespace stoker::python
