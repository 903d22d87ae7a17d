#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/thread_annotations.h"
#include "engine/run_delay.h"
#include "stoker/loader.h"
#include "stoker/worker_kind.h"

namespace stoker {

/// What one thread that produces samples (a worker, or the consumer when it
/// does the work) has done: samples, wall, CPU and run-queue time of its
/// tasks. Written by its owner thread only, through TaskTimer; read by any
/// thread through Snapshot().
class WorkerStats {
 public:
  /// `sample_run_delay`: read the kernel's run-queue delay (worker threads
  /// only: the consumer's thread may change between calls).
  WorkerStats(int id, bool sample_run_delay);
  ~WorkerStats();
  WorkerStats(const WorkerStats&) = delete;
  WorkerStats& operator=(const WorkerStats&) = delete;

  int id() const { return id_; }
  WorkerMetrics Snapshot() const;
  /// Bytes of the thread's read buffer and transform scratch.
  void set_footprint(size_t bytes) { footprint_.store(bytes, std::memory_order_relaxed); }
  size_t footprint() const { return footprint_.load(std::memory_order_relaxed); }
  /// The item the thread is making now (-1: none): who holds up close().
  void set_item(int64_t item) { item_.store(item, std::memory_order_relaxed); }
  int64_t item() const { return item_.load(std::memory_order_relaxed); }

 private:
  friend class TaskTimer;
  const int id_;
  std::atomic<int64_t> samples_{0};
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<int64_t> cpu_ns_{0};
  std::atomic<int64_t> queue_ns_{0};      // of busy_ns_, runnable but waiting for a CPU
  std::atomic<int64_t> elsewhere_ns_{0};  // of cpu_ns_, in a worker process
  std::atomic<int64_t> remote_samples_{0};
  std::atomic<int64_t> remote_busy_ns_{0};
  std::atomic<size_t> footprint_{0};
  std::atomic<int64_t> item_{-1};
  // Owner thread only:
  std::unique_ptr<RunDelayClock> run_delay_;  // null where the kernel keeps none
  int64_t run_delay_ns_ = 0;                  // its last reading
  int64_t sample_ns_ = 0;                     // wall time per sample in the last task
  int64_t publish_every_ = 1;                 // samples between publications
};

/// Times one task on its owner's thread and publishes the counters about
/// every millisecond of work: slow samples show progress within a long task,
/// trivial ones do not pay a clock read each. The run-queue delay (a read
/// costs about a microsecond) is read only for tasks long enough not to
/// notice, judged by the last task's samples.
class TaskTimer {
 public:
  /// `worker`: the kind's worker, whose work elsewhere (a worker process)
  /// counts as the task's; may be null.
  TaskTimer(WorkerStats& stats, int64_t samples, const KindWorker* worker = nullptr);
  /// After each sample; `remote`: it was made on a remote slot
  /// (ItemOutcome::remote), so its time goes to the remote figures.
  void SampleDone(bool remote = false) {
    if (remote != remote_ && pending_ > 0) Publish();
    remote_ = remote;
    ++done_;
    if (++pending_ >= stats_.publish_every_) Publish();
  }
  /// After the last sample: publishes and sets the cadence for the next task
  /// (kept when the task produced none).
  void Finish();
  /// Samples done in this task (helpers may take some of those planned).
  int64_t samples() const { return done_; }

 private:
  void Publish();

  int64_t CpuNow() const;

  WorkerStats& stats_;
  const KindWorker* worker_;
  const int64_t start_ns_;
  const bool timed_;
  int64_t wall0_;
  int64_t cpu0_;
  int64_t queue0_;       // the worker's queue time elsewhere at the last publication
  int64_t elsewhere0_;   // and its CPU time elsewhere
  int64_t setup0_;       // and its time starting (left out of the wall time)
  int64_t pending_ = 0;  // samples not yet published
  int64_t done_ = 0;     // samples done in this task
  bool remote_ = false;  // the pending samples were made remotely
};

/// The loader's workers' statistics: those running now, and the totals of
/// those that left. Safe from any thread.
class WorkerStatsBoard {
 public:
  void Join(const WorkerStats* stats) EXCLUDES(mu_);
  /// Folds `stats` into the totals; it may be destroyed afterwards.
  void Leave(const WorkerStats* stats) EXCLUDES(mu_);
  /// Adds every worker's counters (and `consumer`'s) into `m`.
  void AddTo(const WorkerStats& consumer, LoaderMetrics* m) const EXCLUDES(mu_);
  /// (worker id, item) of each worker making an item now.
  std::vector<std::pair<int, int64_t>> Items() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::vector<const WorkerStats*> live_ GUARDED_BY(mu_);
  WorkerMetrics retired_ GUARDED_BY(mu_);
};

}  // namespace stoker
