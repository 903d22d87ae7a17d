#pragma once

// Clang's thread-safety analysis (-Wthread-safety): which mutex guards which
// field, which functions need it held. No-ops on other compilers. The "tsa"
// preset builds with clang and -Werror=thread-safety.

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

/// A std::mutex the analysis knows about. Use with MutexLock, or with
/// std::unique_lock through native() where a condition variable waits.
class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  /// Tells the analysis the mutex is held (after a condition variable's
  /// wait re-acquired it behind the analysis's back).
  void AssertHeld() const STOKER_TSA(assert_capability(this)) {}
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

/// Holds a Mutex for a scope; may be released and re-taken inside it (around
/// user code) and handed to a condition variable's wait.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.native()) {}
  ~MutexLock() RELEASE() {}
  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }
  /// For std::condition_variable::wait*; the mutex is held again on return.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace stoker
