#pragma once

// worker_kind="auto" (stoker.DataLoader): one engine transform that runs each
// batch either in a worker process or on the engine's thread with the GIL, as
// the DataLoader's trial decides (python/stoker/_dataloader.py, _KindTrial).
// The descriptor's magic tells the consumer which kind made a batch.

#include <atomic>
#include <memory>
#include <string>

#include "core/thread_annotations.h"
#include "process_workers.h"
#include "stoker/worker_kind.h"
#include "thread_workers.h"

namespace stoker::python {

enum class KindChoice : int { kProcesses = 0, kThreads = 1 };

/// Both kinds' workers and the kind new batches go to. Thread-safe.
class WorkerKinds {
 public:
  /// `remake_failed`: a batch that fails on threads while the trial runs is
  /// made again on processes (not for a stream's shards, whose batches the
  /// consumer may already have taken).
  WorkerKinds(std::shared_ptr<ProcessWorkers> processes, std::shared_ptr<ThreadWorkers> threads,
              bool remake_failed)
      : processes_(std::move(processes)),
        threads_(std::move(threads)),
        remake_failed_(remake_failed) {}

  /// Batches started from now on run as `kind`. `final`: the choice is made,
  /// so with threads each engine thread ends its worker process at its next task.
  void Set(KindChoice kind, bool final) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (kind == KindChoice::kThreads && !threads_failed_.empty()) return;  // processes for good
    SetLocked(kind, final);
  }
  KindChoice kind() const { return static_cast<KindChoice>(kind_.load(std::memory_order_acquire)); }
  bool retire_processes() const { return retire_processes_.load(std::memory_order_relaxed); }
  bool remake_failed() const { return remake_failed_; }

  /// A batch failed on threads before the choice: processes for good, and
  /// `why` (its first failure) kept for the trial to say. The first one counts.
  void ThreadsFailed(const std::string& why) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (threads_failed_.empty()) threads_failed_ = why.empty() ? "a batch failed" : why;
    SetLocked(KindChoice::kProcesses, true);
  }
  /// What failed on threads before the choice; empty if nothing did.
  std::string threads_failed() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return threads_failed_;
  }

  const std::shared_ptr<ProcessWorkers>& processes() const { return processes_; }
  const std::shared_ptr<ThreadWorkers>& threads() const { return threads_; }

 private:
  const std::shared_ptr<ProcessWorkers> processes_;
  const std::shared_ptr<ThreadWorkers> threads_;
  void SetLocked(KindChoice kind, bool final) REQUIRES(mu_) {
    retire_processes_.store(final && kind == KindChoice::kThreads, std::memory_order_relaxed);
    kind_.store(static_cast<int>(kind), std::memory_order_release);
  }

  const bool remake_failed_;
  std::atomic<int> kind_{static_cast<int>(KindChoice::kProcesses)};
  std::atomic<bool> retire_processes_{false};
  mutable Mutex mu_;
  std::string threads_failed_ GUARDED_BY(mu_);
};

/// Runs each batch as WorkerKinds says when it starts; its output is the
/// process kind's descriptor (kDescriptorWords), or the thread kind's in its
/// first kThreadDescriptorWords words, the rest zero.
class EitherKind : public WorkerKind {
 public:
  explicit EitherKind(std::shared_ptr<WorkerKinds> kinds);
  SampleSpec spec() const override { return process_.spec(); }
  int64_t items() const override { return process_.items(); }
  std::string Key(int64_t item) const override { return process_.Key(item); }
  std::string item_name() const override { return process_.item_name(); }
  size_t output_bytes() const override { return process_.output_bytes(); }
  int starting() const override { return process_.starting(); }
  bool workers_are_processes() const override { return true; }  // it starts on processes
  /// A worker whose process is forked as the process kind's are, until
  /// threads are chosen for good.
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;
  bool recycles() const override { return true; }
  void Recycle(std::span<std::byte> out) const override;
  void Resized(int workers, int remote) const override;
  void Cancel() const override;

 private:
  std::shared_ptr<WorkerKinds> kinds_;
  ProcessKind process_;
  ThreadKind thread_;
};

}  // namespace stoker::python
