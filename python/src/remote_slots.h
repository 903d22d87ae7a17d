#pragma once

// Which of a loader's engine threads send their next batch to the cluster
// (stoker.DataLoader(cluster=...)): the engine keeps `workers` threads of
// which `remote` are remote slots; each thread, before each batch, takes a
// local place or a remote one, keeping the one it had while it may, so that a
// thread's worker process is not forked for a thread that only sends.

#include <memory>

#include "core/thread_annotations.h"

namespace stoker::python {

/// The split of a loader's threads between local work and remote slots, and
/// what the cluster offers. Thread-safe.
class RemoteSlots {
 public:
  /// Slots the cluster offers now (its workers' threads); set by the loader
  /// as the cluster changes, read by the tuner.
  void set_capacity(int slots) EXCLUDES(mu_);
  int capacity() const EXCLUDES(mu_);
  /// Bytes one remote task brought back lately; set by the loader as tasks
  /// come, read by the tuner (the memory budget).
  void set_task_bytes(size_t bytes) EXCLUDES(mu_);
  size_t task_bytes() const EXCLUDES(mu_);

  /// The engine keeps `workers` threads, `remote` of them remote slots.
  void Resized(int workers, int remote) EXCLUDES(mu_);
  int remote_target() const EXCLUDES(mu_);

  /// Before a batch: true when it goes to the cluster. `was_remote`: the
  /// caller's last choice, kept while there is room for it; otherwise the
  /// local places fill first. Each Take is paired with a Done.
  bool Take(bool was_remote) EXCLUDES(mu_);
  void Done(bool remote) EXCLUDES(mu_);

  /// Whether a new thread should start its local worker (fork its process)
  /// before its first batch: while fewer threads than the local places did.
  /// Paired with ReleaseLocal when that thread ends.
  bool ClaimLocal() EXCLUDES(mu_);
  void ReleaseLocal() EXCLUDES(mu_);

  int remote_busy() const EXCLUDES(mu_);
  /// Most batches in flight on the cluster at once, in the loader's life.
  int peak() const EXCLUDES(mu_);

 private:
  int local_target() const REQUIRES(mu_) { return workers_ - remote_; }

  mutable Mutex mu_;
  int capacity_ GUARDED_BY(mu_) = 0;
  size_t task_bytes_ GUARDED_BY(mu_) = 0;
  int workers_ GUARDED_BY(mu_) = 0;
  int remote_ GUARDED_BY(mu_) = 0;
  int local_busy_ GUARDED_BY(mu_) = 0;
  int remote_busy_ GUARDED_BY(mu_) = 0;
  int local_claimed_ GUARDED_BY(mu_) = 0;
  int peak_ GUARDED_BY(mu_) = 0;
};

}  // namespace stoker::python
