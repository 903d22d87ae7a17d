#include "engine/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

namespace stoker {
namespace {

// A body that waits for a wake-up and leaves when the pool says so.
struct Harness {
  std::mutex mu;
  std::condition_variable cv;
  std::set<int> alive;
  std::unique_ptr<WorkerPool> pool;

  Harness() {
    pool = std::make_unique<WorkerPool>([this](int id) {
      std::unique_lock<std::mutex> lock(mu);
      alive.insert(id);
      cv.notify_all();
      while (!pool->TryLeave()) cv.wait_for(lock, std::chrono::milliseconds(5));
      alive.erase(id);
      cv.notify_all();
    });
  }
  ~Harness() {
    pool->Stop();
    cv.notify_all();
    pool->Join();
  }
  void Resize(int n) {
    std::lock_guard<std::mutex> lock(mu);
    pool->Resize(n);
    cv.notify_all();
  }
  // Settled: n bodies running and none started or leaving. (A thread that
  // was started counts in running() before its body shows up in `alive`.)
  void WaitAlive(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    while (alive.size() != n || pool->running() != static_cast<int>(n)) {
      cv.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
};

TEST(WorkerPoolTest, GrowsAndShrinksToTarget) {
  Harness h;
  h.Resize(4);
  h.WaitAlive(4);
  EXPECT_EQ(h.pool->running(), 4);
  h.Resize(1);
  h.WaitAlive(1);
  EXPECT_EQ(h.pool->running(), 1);
  h.Resize(3);
  h.WaitAlive(3);
  EXPECT_EQ(h.pool->started(), 6);
  h.Resize(0);
  h.WaitAlive(0);
}

TEST(WorkerPoolTest, ManyRacingResizesSettle) {
  Harness h;
  std::thread a([&] {
    for (int i = 0; i < 200; ++i) h.Resize(i % 7);
  });
  std::thread b([&] {
    for (int i = 0; i < 200; ++i) h.Resize((i * 3) % 5);
  });
  a.join();
  b.join();
  h.Resize(2);
  h.WaitAlive(2);
  EXPECT_EQ(h.pool->running(), 2);
}

TEST(WorkerPoolTest, StopJoinsEverything) {
  Harness h;
  h.Resize(5);
  h.WaitAlive(5);
  h.pool->Stop();
  h.Resize(3);  // ignored after Stop
  h.WaitAlive(0);
  EXPECT_EQ(h.pool->running(), 0);
}

}  // namespace
}  // namespace stoker
