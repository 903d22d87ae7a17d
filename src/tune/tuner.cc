#include "tune/tuner.h"

#include <time.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/thread_annotations.h"
#include "stoker/json_text.h"
#include "stoker/tuner.h"
#include "tune/node_share.h"
#include "tune/remote_policy.h"
#include "tune/tuner_core.h"

namespace stoker {
namespace {

constexpr double kReprobeS = 2.0;  // re-read the machine's budgets this often
constexpr size_t kThreadOverhead = 256 * 1024;
constexpr size_t kAssumedWorkerBytes = 16u << 20;  // until a worker has reported

// The node's CPU budget as the probe reads it (affinity and quota), which
// the loaders on the machine split among themselves (NodeShare).
double NodeBudget(const MachineFacts& f) {
  return f.cpu.budget_cores.value_or(f.cpu.logical.value_or(1));
}

// Cores the workers of this loader may use before its first tick: the
// budget shared among the local ranks.
double CpuBudget(const MachineFacts& f) {
  int local = f.ranks.local_world_size.value_or(1);
  return std::max(NodeBudget(f) / std::max(local, 1), 0.5);
}

NodeShare MakeNodeShare(const MachineFacts& f, bool tuned = true) {
  Result<std::unique_ptr<NodeRegistry>> registry = NodeRegistry::OpenDefault();
  // A rank only under a launcher: a lone script is not "rank 0" beside a job's ranks.
  const std::optional<int> local_rank =
      f.ranks.launcher != "none" ? f.ranks.local_rank : std::nullopt;
  return NodeShare(
      registry.ok() ? std::move(*registry) : nullptr,
      registry.ok() ? "" : registry.status().message(), local_rank, f.ranks.local_world_size,
      [](bool* busy) { return NodeRegistry::OpenDefault(busy); }, tuned);
}

}  // namespace

namespace {

nlohmann::json GpuUsageToJson(const std::vector<GpuUsage>& gpus) {
  nlohmann::json out = nlohmann::json::array();
  for (const GpuUsage& g : gpus) {
    out.push_back({{"index", g.index},
                   {"utilization_percent", g.utilization_percent},
                   {"memory_used_bytes", g.memory_used_bytes},
                   {"memory_total_bytes", g.memory_total_bytes}});
  }
  return out;
}

}  // namespace

nlohmann::json TunerDecisionToJson(const TunerDecision& d) {
  return {{"t_s", d.t_s},
          {"workers_before", d.workers_before},
          {"workers_after", d.workers_after},
          {"prefetch_before", d.prefetch_before},
          {"prefetch_after", d.prefetch_after},
          {"reason", d.reason},
          {"unit", d.unit},
          {"samples_per_s", d.samples_per_s},
          {"stall_fraction", d.stall_fraction},
          {"cpu_per_sample_ms", d.cpu_per_sample_ms},
          {"wall_per_sample_ms", d.wall_per_sample_ms},
          {"demand_per_s", d.demand_per_s},
          {"cpu_budget_cores", d.cpu_budget_cores},
          {"node_loaders", d.node_loaders},
          {"remote_before", d.remote_before},
          {"remote_after", d.remote_after},
          {"gpus", GpuUsageToJson(d.gpus)}};
}

namespace {

// The loader's controller: turns metric deltas into Observations for the
// TunerCore and applies its decisions. Tick runs on the consumer's thread;
// View and Trace may be read from any thread. The trace file (if any) is
// written by its TraceWriter's thread, never the consumer's.
class Tuner final : public Controller {
 public:
  Tuner(TunerOptions options, const Advice& advice, double cpu_budget, NodeShare node,
        size_t batch_bytes, int64_t batch_items, std::string item, const TunerParams& params,
        std::unique_ptr<TraceWriter> trace_writer, std::unique_ptr<GpuSampler> gpus)
      : options_(std::move(options)),
        core_(advice.workers, advice.prefetch_batches, params, std::move(item)),
        node_(std::move(node)),
        start_(std::chrono::steady_clock::now()),
        trace_writer_(std::move(trace_writer)),
        gpus_(std::move(gpus)) {
    prefetch_set_ = advice.prefetch_batches;
    budgets_.cpu_cores = cpu_budget;
    budgets_.max_workers =
        std::min(options_.max_workers > 0 ? options_.max_workers : kMaxWorkers, advice.max_workers);
    budgets_.memory_bytes = options_.memory_budget_bytes > 0 ? options_.memory_budget_bytes
                                                             : advice.memory_budget_bytes;
    budgets_.batch_bytes = batch_bytes;
    budgets_.batch_items = batch_items;
    budgets_.worker_bytes = kAssumedWorkerBytes;
    MutexLock lock(mu_);
    view_.workers = advice.workers;
    view_.prefetch_batches = advice.prefetch_batches;
    view_.memory_budget_bytes = budgets_.memory_bytes;
    view_.max_workers = budgets_.max_workers;
    view_.phase = core_.phase();
    view_.unit = core_.item();
    view_.node = node_.view();
  }

  std::chrono::nanoseconds interval() const override {
    return std::chrono::nanoseconds(static_cast<int64_t>(options_.interval_s * 1e9));
  }

  void Tick(Loader& loader) override {
    Snapshot now = Take(loader);
    if (now.metrics.workers_shed > shed_seen_) UpdateView(Shed(now, loader));
    if (!last_) {
      last_ = std::move(now);
      return;
    }
    const Observation o = Between(*last_, now);
    RefreshBudgets(*last_, now, o);
    last_ = std::move(now);
    const int remote = loader.remote();
    std::optional<TunerDecision> d = core_.Observe(o, budgets_);
    if (d) {
      d->remote_before = d->remote_after = remote;
      Apply(*d, loader);
    }
    UpdateView(std::move(d));
    std::optional<TunerDecision> r = DecideRemote(o, last_->metrics, remote);
    if (r) {
      Apply(*r, loader);
    } else if (remote > 0) {
      // The remote slots' round trip changed: the window follows (up at
      // once, down by two, so that noise does not move it every tick).
      const int want = RemotePrefetch(core_.prefetch(), remote);
      if (want > prefetch_set_ || want + 1 < prefetch_set_) SetPrefetch(loader, want);
    }
    UpdateView(std::move(r));
  }

  std::optional<TunerView> View() const override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return view_;
  }

  std::vector<TunerDecision> Trace() const override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return trace_;
  }
  Status FlushTrace() override {
    return trace_writer_ != nullptr ? trace_writer_->Flush() : Status::Ok();
  }

 private:
  // What the counters said at one tick.
  struct Snapshot {
    LoaderMetrics metrics;
    double t_s = 0;       // seconds since the tuner started
    double proc_cpu = 0;  // this process's CPU time, seconds
    double tree_cpu = 0;  // its descendants' (worker processes), seconds
    std::optional<CpuTimes> machine;
  };

  Snapshot Take(Loader& loader) const {
    Snapshot s;
    s.metrics = loader.Metrics();
    s.t_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    s.proc_cpu = ProcessCpuSeconds();
    // Worker processes' CPU is ours, not other processes': without it the
    // tuner would read its own workers as other processes' load and shrink
    // the pool for them. Read live:
    // what they report comes only with each finished batch.
    if (s.metrics.cpu_elsewhere_ns > 0) s.tree_cpu = DescendantsCpuSeconds();
    s.machine = ReadCpuTimes();
    return s;
  }

  // The window between two snapshots, as the TunerCore reads it.
  static Observation Between(const Snapshot& last, const Snapshot& now) {
    const LoaderMetrics& l = last.metrics;
    const LoaderMetrics& m = now.metrics;
    auto seconds = [](int64_t ns) { return static_cast<double>(ns) * 1e-9; };
    Observation o;
    o.t_s = now.t_s;
    o.window_s = seconds(m.time_ns - l.time_ns);
    o.workers = m.workers_target;
    o.prefetch = m.prefetch_batches;
    o.batches = m.batches_delivered - l.batches_delivered;
    o.samples = m.samples_delivered - l.samples_delivered;
    o.wait_s = seconds(m.consumer_wait_ns - l.consumer_wait_ns);
    o.step_s = seconds(m.consumer_step_ns - l.consumer_step_ns);
    o.produced = m.samples_produced - l.samples_produced;
    o.busy_s = seconds(m.busy_ns - l.busy_ns);
    o.cpu_s = seconds(m.cpu_ns - l.cpu_ns);
    o.queue_s = seconds(m.queue_ns - l.queue_ns);
    o.starting = m.workers_starting;
    if (now.machine && last.machine && now.machine->cpus == last.machine->cpus) {
      // Our CPUs' busy time less this process's is other processes' (the
      // hypervisor's steal is neither: ReadCpuTimes keeps it apart).
      o.others_s = std::max(0.0, now.machine->busy_s - last.machine->busy_s -
                                     (now.proc_cpu - last.proc_cpu) -
                                     std::max(0.0, now.tree_cpu - last.tree_cpu));
      o.idle_s = std::max(0.0, now.machine->idle_s - last.machine->idle_s);
    }
    return o;
  }

  // The CPU budget less a busy trainer's share, the workers' measured
  // footprint, and the machine's budget re-read every kReprobeS.
  void RefreshBudgets(const Snapshot& last, const Snapshot& now, const Observation& o) {
    // The trainer's CPU: the process's CPU time less the workers'. When it is
    // busy (a CPU-side training step), its share comes off the workers' budget.
    // (Worker processes' CPU, counted in o.cpu_s, is not in this process's.)
    const double elsewhere_s =
        static_cast<double>(now.metrics.cpu_elsewhere_ns - last.metrics.cpu_elsewhere_ns) * 1e-9;
    const double trainer_cores =
        o.window_s > 0
            ? std::max(0.0, (now.proc_cpu - last.proc_cpu - (o.cpu_s - elsewhere_s)) / o.window_s)
            : 0;
    trainer_cores_ = 0.8 * trainer_cores_ + 0.2 * trainer_cores;
    const LoaderMetrics& m = now.metrics;
    if (m.workers_running > 0 && m.worker_bytes > 0) {
      budgets_.worker_bytes =
          m.worker_bytes / static_cast<size_t>(m.workers_running) + kThreadOverhead;
    }
    if (now.t_s - last_probe_s_ >= kReprobeS || node_cores_ == 0) {
      last_probe_s_ = now.t_s;
      ProbeOptions po;
      po.skip_gpus = true;
      node_cores_ = NodeBudget(ProbeMachine(po));
    }
    // This loader's share of the node, re-split by need every tick.
    const double share = std::max(
        0.5, node_.Update(o.window_s, o.wait_s, o.cpu_s, now.metrics.workers_target, node_cores_,
                          now.metrics.user_samples_delivered - last.metrics.user_samples_delivered,
                          now.metrics.prefetch_batches));
    budgets_.cpu_cores = std::max(0.5, share - (trainer_cores_ > 0.25 ? trainer_cores_ : 0));
    // Our CPUs beyond this rank's budget belong to others (other ranks,
    // other tenants under a quota): their use there is no contention.
    if (now.machine) budgets_.others_room = std::max(0.0, now.machine->cpus - share);
  }

  // Remote slots (a kind with a cluster): the policy's, at least
  // options_.remote_min, at most what the cluster offers.
  std::optional<TunerDecision> DecideRemote(const Observation& o, const LoaderMetrics& m,
                                            int remote) {
    const int capacity = m.remote_capacity;
    if (capacity == 0 && remote == 0) return std::nullopt;  // no cluster, or none to offer
    RemoteContext c;
    c.local_workers = core_.workers();
    // Local workers at a hard cap (max_workers, the CPU budget) cannot grow
    // whatever the model says; below them, only a knee found says so.
    const bool measuring = std::string_view(core_.phase()) == "measuring";
    c.local_spent = core_.workers() >= budgets_.max_workers ||
                    core_.workers() >= static_cast<int>(budgets_.cpu_cores + 0.05) ||
                    (!measuring && ((core_.cpu_cap() > 0 && core_.workers() >= core_.cpu_cap()) ||
                                    std::string_view(core_.phase()) == "steady"));
    c.capacity = capacity;
    c.remote = remote;
    if (budgets_.memory_bytes > 0 && m.remote_task_bytes > 0) {
      // Each slot holds what its task brings back and a batch open in the
      // window, beside the local pool's workers and prefetch.
      const size_t local = static_cast<size_t>(core_.workers()) * budgets_.worker_bytes +
                           static_cast<size_t>(core_.prefetch()) * budgets_.batch_bytes;
      const size_t room = budgets_.memory_bytes > local ? budgets_.memory_bytes - local : 0;
      c.memory_cap = static_cast<int>(std::min<size_t>(
          room / (m.remote_task_bytes + budgets_.batch_bytes), static_cast<size_t>(kMaxWorkers)));
    }
    const int64_t made = m.remote_samples_produced - remote_made_;
    remote_made_ = m.remote_samples_produced;
    const int64_t busy_ns = m.remote_busy_ns - remote_busy_seen_;
    remote_busy_seen_ = m.remote_busy_ns;
    if (made > 0 && o.batches > 0 && o.window_s > 0) {
      // Local batches made during one remote batch's round trip.
      const double per_batch = std::max(1.0, static_cast<double>(o.samples) / o.batches);
      const double round_trip_s = static_cast<double>(busy_ns) * 1e-9 / (made / per_batch);
      const double lag = static_cast<double>(o.produced) / per_batch / o.window_s * round_trip_s;
      remote_lag_ = remote_lag_ > 0 ? 0.7 * remote_lag_ + 0.3 * lag : lag;
    }
    std::optional<RemoteDecision> r =
        remote_policy_.Observe({o.window_s, o.batches, o.wait_s, o.step_s, made}, c);
    const int floor = std::min(options_.remote_min,
                               c.memory_cap >= 0 ? std::min(capacity, c.memory_cap) : capacity);
    int after = r ? r->remote_after : remote;
    std::string reason = r ? r->reason : "";
    if (after < floor) {
      after = floor;
      reason = (reason.empty() ? "" : reason + "; ") + "remote_min keeps " + std::to_string(floor) +
               " remote slots";
    }
    if (after == remote) return std::nullopt;
    TunerDecision d;
    d.t_s = o.t_s;
    d.workers_before = d.workers_after = core_.workers();
    d.prefetch_before = d.prefetch_after = core_.prefetch();
    d.remote_before = remote;
    d.remote_after = after;
    d.unit = core_.item();
    d.reason = std::move(reason);
    d.samples_per_s = core_.samples_per_s();
    d.stall_fraction = StallFraction(o.wait_s, o.window_s);
    return d;
  }

  // The prefetch bound with `remote` slots: the local pool's, one batch a
  // slot holds open while it waits, and what the local pool makes during a
  // remote round trip (else local workers idle behind a remote batch);
  // within half the memory budget.
  int RemotePrefetch(int core, int remote) const {
    if (remote == 0) return core;
    int prefetch = core + remote + static_cast<int>(std::ceil(remote_lag_));
    if (budgets_.memory_bytes > 0 && budgets_.batch_bytes > 0) {
      const auto fits = static_cast<int64_t>(budgets_.memory_bytes / 2 / budgets_.batch_bytes);
      prefetch =
          static_cast<int>(std::min<int64_t>(prefetch, std::max<int64_t>(fits, core + remote)));
    }
    return prefetch;
  }

  void SetPrefetch(Loader& loader, int prefetch) {
    [[maybe_unused]] Status st =
        loader.SetPrefetch(prefetch, static_cast<size_t>(prefetch) * budgets_.batch_bytes);
    assert(st.ok());
    prefetch_set_ = prefetch;
  }

  // Workers that left because one did not fit its share of the memory
  // budget (ItemOutcome::may_shed): the pool is smaller already; the
  // decision says why, and the tuner grows it no more past that.
  TunerDecision Shed(const Snapshot& now, Loader& loader) {
    const LoaderMetrics& m = now.metrics;
    const int64_t shed = m.workers_shed - shed_seen_;
    shed_seen_ = m.workers_shed;
    const int after = std::max(1, m.workers_target);
    budgets_.max_workers = std::min(budgets_.max_workers, after);
    TunerDecision d;
    d.t_s = now.t_s;
    d.workers_before = after + static_cast<int>(shed);
    d.workers_after = after;
    d.prefetch_before = d.prefetch_after = core_.prefetch();
    d.remote_before = d.remote_after = loader.remote();
    d.unit = core_.item();
    d.reason = "memory: " + m.workers_shed_reason + "; " + std::to_string(after) +
               (after == 1 ? " worker" : " workers") + " from now on";
    d.samples_per_s = core_.samples_per_s();
    Apply(d, loader);
    MutexLock lock(mu_);
    view_.max_workers = budgets_.max_workers;
    return d;
  }

  // Sets the loader's knobs to the decision and queues it for the trace file.
  void Apply(TunerDecision& d, Loader& loader) {
    d.cpu_budget_cores = budgets_.cpu_cores;
    d.node_loaders = node_.view().loaders;
    // Utilisation goes in the record, after the decision: shown, not driven on.
    if (gpus_) d.gpus = gpus_->Sample(/*pcie=*/false);
    if (d.workers_after != d.workers_before && !loader.Resize(d.workers_after).ok()) {
      // The system refused threads: never ask for more than it gave.
      budgets_.max_workers = std::max(1, loader.workers());
    }
    // Refused only in a forked child, where Next() never reaches the tuner.
    if (d.remote_after != d.remote_before) [[maybe_unused]]
      Status st = loader.SetRemote(d.remote_after);
    const int prefetch = RemotePrefetch(d.prefetch_after, d.remote_after);
    if (prefetch != prefetch_set_) SetPrefetch(loader, prefetch);
    if (trace_writer_) trace_writer_->Append(DumpJson(TunerDecisionToJson(d)));
  }

  void UpdateView(std::optional<TunerDecision> d) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    view_.workers = core_.workers();
    view_.prefetch_batches = core_.prefetch();
    view_.cpu_budget_workers = core_.cpu_cap();
    view_.samples_per_s = core_.samples_per_s();
    view_.stall_fraction = core_.stall_fraction();
    view_.phase = core_.phase();
    view_.node = node_.view();
    if (d) view_.remote_slots = d->remote_after;
    if (d) {
      view_.last_decision = *d;
      ++view_.decisions;
      trace_.push_back(std::move(*d));
    }
  }

  const TunerOptions options_;
  TunerCore core_;  // consumer thread only
  NodeShare node_;  // consumer thread only
  Budgets budgets_;
  const std::chrono::steady_clock::time_point start_;
  std::optional<Snapshot> last_;  // the previous tick's
  double trainer_cores_ = 0;
  double node_cores_ = 0;
  double last_probe_s_ = 0;
  RemotePolicy remote_policy_;    // consumer thread only
  int prefetch_set_ = 0;          // the prefetch bound last set on the loader
  int64_t shed_seen_ = 0;         // LoaderMetrics::workers_shed already decided on
  int64_t remote_made_ = 0;       // remote items produced at the last tick
  int64_t remote_busy_seen_ = 0;  // and the remote slots' busy time then
  double remote_lag_ = 0;         // local batches made during a remote round trip (smoothed)
  const std::unique_ptr<TraceWriter> trace_writer_;  // null: no trace file
  const std::unique_ptr<GpuSampler> gpus_;           // null: no NVML or no GPU

  mutable Mutex mu_;
  TunerView view_ GUARDED_BY(mu_);
  std::vector<TunerDecision> trace_ GUARDED_BY(mu_);
};

// A loader with a fixed worker count: listed in the node registry for
// `stoker monitor` (NodeShare with tuned false), nothing decided.
class NodeListing final : public Controller {
 public:
  explicit NodeListing(NodeShare node) : node_(std::move(node)) {}
  std::chrono::nanoseconds interval() const override { return std::chrono::milliseconds(500); }
  void Tick(Loader& loader) override {
    LoaderMetrics now = loader.Metrics();
    if (last_) {
      const LoaderMetrics& l = *last_;
      (void)node_.Update(static_cast<double>(now.time_ns - l.time_ns) * 1e-9,
                         static_cast<double>(now.consumer_wait_ns - l.consumer_wait_ns) * 1e-9,
                         static_cast<double>(now.cpu_ns - l.cpu_ns) * 1e-9, now.workers_target, 0,
                         now.user_samples_delivered - l.user_samples_delivered,
                         now.prefetch_batches);
    }
    last_ = std::move(now);
  }

 private:
  NodeShare node_;
  std::optional<LoaderMetrics> last_;
};

}  // namespace

std::unique_ptr<Controller> MakeNodeListing(const MachineFacts& facts) {
  return std::make_unique<NodeListing>(MakeNodeShare(facts, /*tuned=*/false));
}

std::unique_ptr<Controller> MakeTuner(TunerOptions options, const Advice& advice,
                                      const MachineFacts& facts, size_t batch_bytes,
                                      int64_t batch_items, std::string item, bool processes,
                                      std::unique_ptr<TraceWriter> trace_writer) {
  // NVML only where the probe saw a GPU through it (loading it costs time).
  std::unique_ptr<GpuSampler> gpus;
  if (!facts.gpus.empty()) {
    if (auto opened = GpuSampler::Open(); opened.ok()) gpus = std::move(*opened);
  }
  TunerParams params;
  if (processes) params.io_headroom = params.process_io_headroom;
  return std::make_unique<Tuner>(std::move(options), advice, CpuBudget(facts), MakeNodeShare(facts),
                                 batch_bytes, batch_items, std::move(item), params,
                                 std::move(trace_writer), std::move(gpus));
}

}  // namespace stoker
