#include "engine/worker_stats.h"

#include <algorithm>

#include "core/clock.h"

namespace stoker {
namespace {

constexpr int64_t kRunDelayTaskNs = 200'000;  // tasks this long read the run-queue delay
constexpr int64_t kPublishNs = 1'000'000;     // publish about this often

}  // namespace

WorkerStats::WorkerStats(int id, bool sample_run_delay) : id_(id) {
  if (!sample_run_delay) return;
  run_delay_ = std::make_unique<RunDelayClock>();
  run_delay_ns_ = run_delay_->ReadNanos();
  if (run_delay_ns_ < 0) run_delay_.reset();
}

WorkerStats::~WorkerStats() = default;

WorkerMetrics WorkerStats::Snapshot() const {
  return {id_,
          samples_.load(std::memory_order_relaxed),
          busy_ns_.load(std::memory_order_relaxed),
          cpu_ns_.load(std::memory_order_relaxed),
          queue_ns_.load(std::memory_order_relaxed),
          elsewhere_ns_.load(std::memory_order_relaxed),
          remote_samples_.load(std::memory_order_relaxed),
          remote_busy_ns_.load(std::memory_order_relaxed)};
}

TaskTimer::TaskTimer(WorkerStats& stats, int64_t samples, const KindWorker* worker)
    : stats_(stats),
      worker_(worker),
      start_ns_(SteadyNanos()),
      timed_(stats.run_delay_ != nullptr && stats.sample_ns_ * samples >= kRunDelayTaskNs),
      wall0_(start_ns_),
      cpu0_(CpuNow()),
      queue0_(worker != nullptr ? worker->cost().queue_ns : 0),
      elsewhere0_(worker != nullptr ? worker->cost().cpu_ns : 0),
      setup0_(worker != nullptr ? worker->cost().setup_ns : 0) {
  if (timed_) {
    // From here: a wait for a CPU between tasks is no sample's.
    const int64_t d = stats_.run_delay_->ReadNanos();
    if (d >= 0) stats_.run_delay_ns_ = d;
  }
}

int64_t TaskTimer::CpuNow() const {
  if (worker_ == nullptr) return ThreadCpuNanos();
  const WorkerCost cost = worker_->cost();
  return ThreadCpuNanos() + cost.cpu_ns + cost.thread_cpu_ns;
}

void TaskTimer::Publish() {
  // The delay first: a wait for a CPU after it falls into the next interval,
  // so that queueing never exceeds the wall time it is in.
  const int64_t delay = timed_ ? stats_.run_delay_->ReadNanos() : -1;
  const int64_t wall1 = SteadyNanos();
  const int64_t cpu1 = CpuNow();
  if (remote_) {
    // Made elsewhere: the wait is no local work, and this thread's CPU for it
    // (receiving the batch) is left to the process's, as the trainer's is.
    stats_.remote_samples_.fetch_add(pending_, std::memory_order_relaxed);
    stats_.remote_busy_ns_.fetch_add(wall1 - wall0_, std::memory_order_relaxed);
    if (timed_ && delay >= 0) stats_.run_delay_ns_ = delay;
    wall0_ = wall1;
    cpu0_ = cpu1;
    pending_ = 0;
    return;
  }
  // A worker started meanwhile (a process forked and set up): that wait is
  // no item's, and more workers would not shorten it.
  const int64_t setup1 = worker_ != nullptr ? worker_->cost().setup_ns : 0;
  stats_.samples_.fetch_add(pending_, std::memory_order_relaxed);
  stats_.busy_ns_.fetch_add(std::max<int64_t>(0, wall1 - wall0_ - (setup1 - setup0_)),
                            std::memory_order_relaxed);
  setup0_ = setup1;
  stats_.cpu_ns_.fetch_add(cpu1 - cpu0_, std::memory_order_relaxed);
  if (timed_ && delay >= stats_.run_delay_ns_) {
    stats_.queue_ns_.fetch_add(delay - stats_.run_delay_ns_, std::memory_order_relaxed);
    stats_.run_delay_ns_ = delay;
  }
  if (worker_ != nullptr) {
    const WorkerCost cost = worker_->cost();
    const int64_t queue1 = cost.queue_ns;
    stats_.queue_ns_.fetch_add(queue1 - queue0_, std::memory_order_relaxed);
    queue0_ = queue1;
    const int64_t elsewhere1 = cost.cpu_ns;
    stats_.elsewhere_ns_.fetch_add(elsewhere1 - elsewhere0_, std::memory_order_relaxed);
    elsewhere0_ = elsewhere1;
  }
  wall0_ = wall1;
  cpu0_ = cpu1;
  pending_ = 0;
}

void TaskTimer::Finish() {
  if (pending_ > 0) Publish();
  if (done_ == 0) return;
  const int64_t per_sample = (wall0_ - start_ns_) / done_;
  stats_.sample_ns_ = per_sample;
  stats_.publish_every_ =
      std::clamp<int64_t>(kPublishNs / std::max<int64_t>(per_sample, 1), 1, 1 << 20);
}

void WorkerStatsBoard::Join(const WorkerStats* stats) {
  MutexLock lock(mu_);
  live_.push_back(stats);
}

void WorkerStatsBoard::Leave(const WorkerStats* stats) {
  const WorkerMetrics w = stats->Snapshot();
  MutexLock lock(mu_);
  std::erase(live_, stats);
  retired_.samples += w.samples;
  retired_.busy_ns += w.busy_ns;
  retired_.cpu_ns += w.cpu_ns;
  retired_.queue_ns += w.queue_ns;
  retired_.cpu_elsewhere_ns += w.cpu_elsewhere_ns;
  retired_.remote_samples += w.remote_samples;
  retired_.remote_busy_ns += w.remote_busy_ns;
}

void WorkerStatsBoard::AddTo(const WorkerStats& consumer, LoaderMetrics* m) const {
  auto add = [m](const WorkerMetrics& w) {
    m->samples_produced += w.samples;
    m->busy_ns += w.busy_ns;
    m->cpu_ns += w.cpu_ns;
    m->queue_ns += w.queue_ns;
    m->cpu_elsewhere_ns += w.cpu_elsewhere_ns;
    m->remote_samples_produced += w.remote_samples;
    m->remote_busy_ns += w.remote_busy_ns;
  };
  MutexLock lock(mu_);
  add(retired_);
  for (const WorkerStats* s : live_) {
    m->workers.push_back(s->Snapshot());
    add(m->workers.back());
    m->worker_bytes += s->footprint();
  }
  add(consumer.Snapshot());
}

std::vector<std::pair<int, int64_t>> WorkerStatsBoard::Items() const {
  std::vector<std::pair<int, int64_t>> items;
  MutexLock lock(mu_);
  for (const WorkerStats* s : live_) {
    if (const int64_t item = s->item(); item >= 0) items.emplace_back(s->id(), item);
  }
  return items;
}

}  // namespace stoker
