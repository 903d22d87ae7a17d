#include "core/worker_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include "testing/sanitizers.h"

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
    EXPECT_TRUE(pool->Resize(n).ok());
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

// In a child process whose address space is capped so that only a few thread
// stacks fit: asking for 1000 threads is an error naming the one refused, and
// the pool keeps (and reports as its target) those it could start.
TEST(WorkerPoolTest, AThreadTheSystemRefusesIsAnErrorNotACrash) {
#ifdef STOKER_SANITIZED
  GTEST_SKIP() << "sanitizers reserve the address space this test caps";
#else
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    long pages = 0;
    if (f == nullptr || std::fscanf(f, "%ld", &pages) != 1) _exit(2);
    std::fclose(f);
    const rlim_t cap = static_cast<rlim_t>(pages) * 4096 + (64 << 20);
    rlimit limit{cap, cap};
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(2);
    std::atomic<bool> leave{false};
    WorkerPool pool([&leave](int) {
      while (!leave.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    Status st = pool.Resize(1000);
    const bool ok = !st.ok() && st.code() == StatusCode::kUnavailable &&
                    st.message().find("cannot start thread") != std::string::npos &&
                    pool.running() < 1000 && pool.target() == pool.running();
    if (!ok) std::fprintf(stderr, "%s, running %d\n", st.ToString().c_str(), pool.running());
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

}  // namespace
}  // namespace stoker
