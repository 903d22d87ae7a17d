#include "core/worker_pool.h"

#include <algorithm>
#include <exception>
#include <string>

namespace stoker {
namespace {

constexpr std::chrono::milliseconds kJoinPoll{1};  // JoinFor's look at the threads left

}  // namespace

WorkerPool::WorkerPool(Body body) : body_(std::move(body)) {}

WorkerPool::~WorkerPool() {
  Stop();
  Join();
}

Status WorkerPool::Resize(int target) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_.load(std::memory_order_acquire)) return Status::Ok();
  target = std::max(target, 0);
  target_.store(target, std::memory_order_release);
  ReapLocked();
  int running = running_.load(std::memory_order_acquire);
  for (; running < target; ++running) {
    running_.fetch_add(1, std::memory_order_acq_rel);
    try {
      auto t = std::make_unique<Thread>();
      Thread* raw = t.get();
      const int id = next_id_.load(std::memory_order_relaxed);
      raw->thread = std::thread([this, raw, id] {
        body_(id);
        raw->done.store(true, std::memory_order_release);
      });
      next_id_.fetch_add(1, std::memory_order_relaxed);
      threads_.push_back(std::move(t));
    } catch (const std::exception& e) {  // std::system_error (EAGAIN), std::bad_alloc
      // The pool stays as large as it could grow.
      running_.fetch_sub(1, std::memory_order_acq_rel);
      target_.store(running, std::memory_order_release);
      return Unavailable("cannot start thread " + std::to_string(running + 1) + " of " +
                         std::to_string(target) + ": " + e.what() +
                         " (a limit on threads or processes: ulimit -u, a pids cgroup?)");
    }
  }
  return Status::Ok();
}

bool WorkerPool::TryLeave() {
  int running = running_.load(std::memory_order_acquire);
  while (running > target_.load(std::memory_order_acquire)) {
    if (running_.compare_exchange_weak(running, running - 1, std::memory_order_acq_rel)) {
      return true;
    }
  }
  return false;
}

int WorkerPool::Retire() {
  std::lock_guard<std::mutex> lock(mu_);
  const int left = running_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  if (target_.load(std::memory_order_acquire) > left)
    target_.store(left, std::memory_order_release);
  return left;
}

void WorkerPool::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_.store(true, std::memory_order_release);
  target_.store(0, std::memory_order_release);
}

void WorkerPool::Join() {
  std::vector<std::unique_ptr<Thread>> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) {
    if (t->thread.joinable()) t->thread.join();
  }
}

bool WorkerPool::JoinFor(std::chrono::nanoseconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ReapLocked();
      if (threads_.empty()) return true;
    }
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return false;
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(left, kJoinPoll));
  }
}

void WorkerPool::ReapLocked() {
  auto it = std::remove_if(threads_.begin(), threads_.end(), [](std::unique_ptr<Thread>& t) {
    if (!t->done.load(std::memory_order_acquire)) return false;
    t->thread.join();
    return true;
  });
  threads_.erase(it, threads_.end());
}

}  // namespace stoker
