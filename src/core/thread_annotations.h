#pragma once

// Clang's thread-safety analysis (-Wthread-safety): which mutex guards which
// field, which functions need it held. No-ops on other compilers. The "tsa"
// preset builds with clang and -Werror=thread-safety.

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define STOKER_TSA(x) __attribute__((x))
#else
#define STOKER_TSA(x)
#endif

#define CAPABILITY(x) STOKER_TSA(capability(x))
#define SCOPED_CAPABILITY STOKER_TSA(scoped_lockable)
#define GUARDED_BY(x) STOKER_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) STOKER_TSA(pt_guarded_by(x))
#define REQUIRES(...) STOKER_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) STOKER_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) STOKER_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) STOKER_TSA(release_capability(__VA_ARGS__))
#define RETURN_CAPABILITY(x) STOKER_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS STOKER_TSA(no_thread_safety_analysis)

namespace stoker {

/// A std::mutex the analysis knows about; held with MutexLock, released for
/// a scope with MutexUnlock, waited on with CondVar.
class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  /// Tells the analysis the mutex is held where it cannot see it.
  void AssertHeld() const STOKER_TSA(assert_capability(this)) {}
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

/// Holds a Mutex for a scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

/// Releases a held Mutex for a scope (around user code, a task, a plan
/// build) and takes it back at the scope's end.
class SCOPED_CAPABILITY MutexUnlock {
 public:
  explicit MutexUnlock(Mutex& mu) RELEASE(mu) : mu_(mu) { mu_.unlock(); }
  ~MutexUnlock() RELEASE() { mu_.lock(); }  // for the analysis: the scope ends (mu is held again)
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  Mutex& mu_;
};

/// A condition variable over a Mutex the caller holds: the waits release it
/// while blocked and hold it again on return (spurious wake-ups included).
class CondVar {
 public:
  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  template <typename Clock, typename Duration>
  void WaitUntil(Mutex& mu, std::chrono::time_point<Clock, Duration> deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    cv_.wait_until(lock, deadline);
    lock.release();
  }
  void NotifyAll() { cv_.notify_all(); }
  void NotifyOne() { cv_.notify_one(); }

 private:
  std::condition_variable cv_;
};

}  // namespace stoker
