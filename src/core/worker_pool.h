#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "stoker/status.h"

namespace stoker {

/// Threads whose number can change at any moment. The only place in stoker
/// that creates threads (so in core, below every module that needs one: the
/// engine's workers, the tuner's trace writer); its destructor joins every one.
///
/// Each thread runs `body(worker_id)`. A body pulls work from its owner and,
/// between tasks, calls TryLeave(): when the pool is larger than its target,
/// exactly (running - target) callers get true and must return promptly.
/// Shrinking therefore never interrupts a task (a body may call TryLeave
/// mid-task where the task can be handed over: the engine's may_leave).
///
/// Resize, TryLeave and the accessors are safe from any thread. The owner
/// must wake bodies that are waiting for work after Resize or Stop, so that
/// they reach TryLeave.
class WorkerPool {
 public:
  using Body = std::function<void(int worker_id)>;

  explicit WorkerPool(Body body);
  /// Stops (target 0) and joins every thread. The owner must make waiting
  /// bodies return first (see Stop).
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Sets the target; starts threads when below it. Threads that already left
  /// are joined here. Ignored after Stop. When the system refuses a thread,
  /// the target becomes the threads running and the error says so.
  [[nodiscard]] Status Resize(int target);

  /// True (at most running - target times) when the caller must leave.
  bool TryLeave();
  /// The calling worker leaves now, whatever the target, which drops to the
  /// workers left (the system refused what this one needed). Returns them.
  int Retire();

  /// Target 0 for good; later Resize calls are ignored. Does not join.
  void Stop();
  /// Joins every thread. REQUIRES: Stop() was called and bodies were woken.
  void Join();
  /// Joins the threads that leave within `patience`; true once none is left.
  /// REQUIRES: as Join's. A thread left (its body still running) is joined
  /// by a later call, Join or the destructor.
  bool JoinFor(std::chrono::nanoseconds patience);

  int target() const { return target_.load(std::memory_order_acquire); }
  /// Threads that have not yet decided to leave.
  int running() const { return running_.load(std::memory_order_acquire); }
  /// Threads started since the pool was made.
  int started() const { return next_id_.load(std::memory_order_relaxed); }

 private:
  struct Thread {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void ReapLocked();

  Body body_;
  std::atomic<int> target_{0};
  std::atomic<int> running_{0};
  std::atomic<int> next_id_{0};
  std::atomic<bool> stopped_{false};
  std::mutex mu_;                                 // guards threads_
  std::vector<std::unique_ptr<Thread>> threads_;  // guarded by mu_
};

}  // namespace stoker
