#include <nlohmann/json.hpp>

#include "stoker/report.h"

namespace stoker {

nlohmann::json LoaderMetricsToJson(const LoaderMetrics& m) {
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerMetrics& w : m.workers) {
    workers.push_back({{"id", w.id},
                       {"samples", w.samples},
                       {"busy_ns", w.busy_ns},
                       {"cpu_ns", w.cpu_ns},
                       {"queue_ns", w.queue_ns},
                       {"cpu_elsewhere_ns", w.cpu_elsewhere_ns},
                       {"remote_samples", w.remote_samples},
                       {"remote_busy_ns", w.remote_busy_ns}});
  }
  return {{"time_ns", m.time_ns},
          {"workers_target", m.workers_target},
          {"workers_running", m.workers_running},
          {"workers_remote", m.workers_remote},
          {"remote_capacity", m.remote_capacity},
          {"remote_task_bytes", m.remote_task_bytes},
          {"remote_samples_produced", m.remote_samples_produced},
          {"remote_busy_ns", m.remote_busy_ns},
          {"prefetch_batches", m.prefetch_batches},
          {"prefetch_bytes", m.prefetch_bytes},
          {"batches_delivered", m.batches_delivered},
          {"samples_delivered", m.samples_delivered},
          {"user_samples_delivered", m.user_samples_delivered},
          {"samples_produced", m.samples_produced},
          {"busy_ns", m.busy_ns},
          {"cpu_ns", m.cpu_ns},
          {"queue_ns", m.queue_ns},
          {"cpu_elsewhere_ns", m.cpu_elsewhere_ns},
          {"consumer_wait_ns", m.consumer_wait_ns},
          {"consumer_step_ns", m.consumer_step_ns},
          {"recent",
           {{"batches_delivered", m.recent.batches_delivered},
            {"samples_delivered", m.recent.samples_delivered},
            {"user_samples_delivered", m.recent.user_samples_delivered},
            {"consumer_wait_ns", m.recent.consumer_wait_ns},
            {"consumer_step_ns", m.recent.consumer_step_ns}}},
          {"next_calls", m.next_calls},
          {"samples_skipped", m.samples_skipped},
          {"ready_batches", m.ready_batches},
          {"open_batches", m.open_batches},
          {"bytes_in_flight", m.bytes_in_flight},
          {"batch_bytes", m.batch_bytes},
          {"worker_bytes", m.worker_bytes},
          {"pinned_buffers", m.pinned_buffers},
          {"device_copies", m.device_copies},
          {"device_copies_at_delivery", m.device_copies_at_delivery},
          {"device_prefetched", m.device_prefetched},
          {"device_prefetch_batches", m.device_prefetch_batches},
          {"workers_refused", m.workers_refused},
          {"workers", workers}};
}

nlohmann::json SkipRecordToJson(const SkipRecord& r) {
  return {{"epoch", r.epoch}, {"index", r.index}, {"key", r.key}, {"reason", r.reason}};
}

nlohmann::json NodeViewToJson(const NodeView& v) {
  return {{"registry", v.registry.empty() ? nlohmann::json(nullptr) : nlohmann::json(v.registry)},
          {"note", v.note},
          {"share_cores", v.share_cores},
          {"budget_cores", v.budget_cores},
          {"loaders", v.loaders},
          {"workers", v.workers},
          {"cpu_cores", v.cpu_cores}};
}

nlohmann::json TunerViewToJson(const TunerView& v) {
  return {{"workers", v.workers},
          {"prefetch_batches", v.prefetch_batches},
          {"cpu_budget_workers", v.cpu_budget_workers},
          {"max_workers", v.max_workers},
          {"remote_slots", v.remote_slots},
          {"memory_budget_bytes", v.memory_budget_bytes},
          {"unit", v.unit},
          {"samples_per_s", v.samples_per_s},
          {"stall_fraction", v.stall_fraction},
          {"phase", v.phase},
          {"last_decision",
           v.last_decision ? TunerDecisionToJson(*v.last_decision) : nlohmann::json(nullptr)},
          {"decisions", v.decisions},
          {"node", NodeViewToJson(v.node)}};
}

}  // namespace stoker
