#include "engine/worker_stats.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace stoker {
namespace {

TEST(WorkerStatsTest, ATaskPublishesEverySample) {
  WorkerStats stats(3, /*sample_run_delay=*/false);
  TaskTimer timer(stats, 5);
  for (int i = 0; i < 5; ++i) timer.SampleDone();
  timer.Finish();
  const WorkerMetrics m = stats.Snapshot();
  EXPECT_EQ(m.id, 3);
  EXPECT_EQ(m.samples, 5);
  EXPECT_GT(m.busy_ns, 0);
  EXPECT_GE(m.busy_ns, m.queue_ns);
}

// A worker whose work runs where this thread's clocks cannot see it and is
// reported back: in a worker process (`elsewhere`), or on another thread of
// this process (a thread worker's Python thread).
class ReportingWorker : public KindWorker {
 public:
  explicit ReportingWorker(bool elsewhere) : elsewhere_(elsewhere) {}
  Status Run(int64_t, int64_t, std::span<std::byte>, ItemOutcome*) override { return Status::Ok(); }
  WorkerCost cost() const override {
    return elsewhere_ ? WorkerCost{.cpu_ns = cpu, .queue_ns = queue}
                      : WorkerCost{.thread_cpu_ns = cpu, .queue_ns = queue};
  }
  int64_t cpu = 1'000'000'000, queue = 5'000'000'000;  // totals before the task count for nothing

 private:
  const bool elsewhere_;
};

TEST(WorkerStatsTest, WorkElsewhereOrOnAnotherThreadCountsAsTheTasks) {
  for (const bool elsewhere : {true, false}) {
    SCOPED_TRACE(elsewhere ? "in another process" : "on another thread");
    WorkerStats stats(0, /*sample_run_delay=*/false);
    ReportingWorker scratch(elsewhere);
    TaskTimer timer(stats, 1, &scratch);
    scratch.cpu += 7'000'000'000;  // far more than this thread could spend here
    scratch.queue += 2'000'000;
    timer.SampleDone();
    timer.Finish();
    const WorkerMetrics m = stats.Snapshot();
    EXPECT_GE(m.cpu_ns, 7'000'000'000);
    EXPECT_LT(m.cpu_ns, 8'000'000'000);
    EXPECT_EQ(m.queue_ns, 2'000'000);
    // Another thread's CPU time is in this process's, which the tuner reads.
    EXPECT_EQ(m.cpu_elsewhere_ns, elsewhere ? 7'000'000'000 : 0);
  }
}

// A worker process started within a task: the wait for it is no sample's.
class StartingWorker : public KindWorker {
 public:
  Status Run(int64_t, int64_t, std::span<std::byte>, ItemOutcome*) override { return Status::Ok(); }
  WorkerCost cost() const override { return {.setup_ns = setup}; }
  int64_t setup = 3'000'000'000;  // earlier starts count for nothing
};

TEST(WorkerStatsTest, TheTimeAWorkerTakesToStartIsLeftOutOfTheTasksWallTime) {
  WorkerStats stats(0, /*sample_run_delay=*/false);
  StartingWorker starting;
  const auto t0 = std::chrono::steady_clock::now();
  TaskTimer timer(stats, 2, &starting);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the process starting
  starting.setup += 30'000'000;
  timer.SampleDone();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sample itself
  timer.SampleDone();
  timer.Finish();
  const int64_t wall = std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0).count();
  const WorkerMetrics m = stats.Snapshot();
  EXPECT_GE(m.busy_ns, 20'000'000);
  EXPECT_LE(m.busy_ns, wall - 30'000'000);  // the start left out
}

TEST(WorkerStatsTest, SlowSamplesShowProgressWithinATask) {
  WorkerStats stats(0, /*sample_run_delay=*/true);
  {  // a first task of slow samples sets the cadence to one sample
    TaskTimer timer(stats, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    timer.SampleDone();
    timer.Finish();
  }
  TaskTimer timer(stats, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  timer.SampleDone();
  EXPECT_EQ(stats.Snapshot().samples, 2);  // published before the task ends
  timer.Finish();
}

TEST(WorkerStatsTest, BoardKeepsTheCountsOfWorkersThatLeft) {
  WorkerStatsBoard board;
  WorkerStats consumer(-1, false);
  {
    WorkerStats gone(1, false);
    board.Join(&gone);
    TaskTimer timer(gone, 4);
    for (int i = 0; i < 4; ++i) timer.SampleDone();
    timer.Finish();
    gone.set_footprint(100);
    LoaderMetrics live;
    board.AddTo(consumer, &live);
    ASSERT_EQ(live.workers.size(), 1u);
    EXPECT_EQ(live.worker_bytes, 100u);
    board.Leave(&gone);
  }
  LoaderMetrics m;
  board.AddTo(consumer, &m);
  EXPECT_TRUE(m.workers.empty());
  EXPECT_EQ(m.samples_produced, 4);
  EXPECT_EQ(m.worker_bytes, 0u);
}

}  // namespace
}  // namespace stoker
