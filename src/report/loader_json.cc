#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "stoker/json_text.h"
#include "stoker/report.h"

namespace stoker {
namespace {

// `json[name]` as a non-negative integer, or an error naming the field.
Status ReadCount(const nlohmann::json& json, const char* name, auto* out) {
  auto it = json.find(name);
  if (it == json.end()) return InvalidArgument(std::string("state has no '") + name + "'");
  using T = std::remove_pointer_t<decltype(out)>;
  const bool count =
      (it->is_number_unsigned() || (it->is_number_integer() && *it >= 0)) &&
      it->template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (!count) {
    return InvalidArgument(std::string("state's '") + name + "' must be an integer in [0, " +
                           std::to_string(std::numeric_limits<T>::max()) + "], got " +
                           DumpJson(*it));
  }
  *out = it->template get<T>();
  return Status::Ok();
}

// `json[name]` as a boolean, or an error naming the field.
Status ReadBool(const nlohmann::json& json, const char* name, bool* out) {
  auto it = json.find(name);
  if (it == json.end()) return InvalidArgument(std::string("state has no '") + name + "'");
  if (!it->is_boolean()) {
    return InvalidArgument(std::string("state's '") + name + "' must be true or false, got " +
                           DumpJson(*it));
  }
  *out = it->get<bool>();
  return Status::Ok();
}

}  // namespace

nlohmann::json LoaderMetricsToJson(const LoaderMetrics& m) {
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerMetrics& w : m.workers) {
    workers.push_back({{"id", w.id},
                       {"samples", w.samples},
                       {"busy_ns", w.busy_ns},
                       {"cpu_ns", w.cpu_ns},
                       {"queue_ns", w.queue_ns},
                       {"cpu_elsewhere_ns", w.cpu_elsewhere_ns}});
  }
  return {{"time_ns", m.time_ns},
          {"workers_target", m.workers_target},
          {"workers_running", m.workers_running},
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
          {"next_calls", m.next_calls},
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

nlohmann::json LoaderStateToJson(const LoaderState& s) {
  return {{"seed", s.seed},
          {"epoch", s.epoch},
          {"position", s.position},
          {"beyond", s.beyond},
          {"num_samples", s.num_samples},
          {"batch_size", s.batch_size},
          {"shuffle", s.shuffle},
          {"drop_last", s.drop_last},
          {"rank", s.rank},
          {"world_size", s.world_size},
          {"pad_shards", s.pad_shards}};
}

Result<LoaderState> LoaderStateFromJson(const nlohmann::json& json) {
  if (!json.is_object()) return InvalidArgument("state must be an object, got " + DumpJson(json));
  LoaderState s;
  STOKER_RETURN_IF_ERROR(ReadCount(json, "seed", &s.seed));
  STOKER_RETURN_IF_ERROR(ReadCount(json, "epoch", &s.epoch));
  STOKER_RETURN_IF_ERROR(ReadCount(json, "position", &s.position));
  // The plan the checkpoint belongs to: without it, Restore could not tell a
  // checkpoint of another plan from one of this loader's.
  STOKER_RETURN_IF_ERROR(ReadCount(json, "num_samples", &s.num_samples));
  STOKER_RETURN_IF_ERROR(ReadCount(json, "batch_size", &s.batch_size));
  STOKER_RETURN_IF_ERROR(ReadBool(json, "shuffle", &s.shuffle));
  STOKER_RETURN_IF_ERROR(ReadBool(json, "drop_last", &s.drop_last));
  STOKER_RETURN_IF_ERROR(ReadCount(json, "rank", &s.rank));
  STOKER_RETURN_IF_ERROR(ReadCount(json, "world_size", &s.world_size));
  STOKER_RETURN_IF_ERROR(ReadBool(json, "pad_shards", &s.pad_shards));
  auto beyond = json.find("beyond");
  if (beyond == json.end()) return s;
  if (!beyond->is_array()) {
    return InvalidArgument("state's 'beyond' must be a list of batch numbers, got " +
                           DumpJson(*beyond));
  }
  for (const nlohmann::json& batch : *beyond) {
    if (!batch.is_number_integer() || batch < 0) {
      return InvalidArgument("state's 'beyond' must be a list of batch numbers >= 0, got " +
                             DumpJson(batch) + " in it");
    }
    s.beyond.push_back(batch.get<int64_t>());
  }
  return s;
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
          {"memory_budget_bytes", v.memory_budget_bytes},
          {"samples_per_s", v.samples_per_s},
          {"stall_fraction", v.stall_fraction},
          {"phase", v.phase},
          {"last_decision",
           v.last_decision ? TunerDecisionToJson(*v.last_decision) : nlohmann::json(nullptr)},
          {"decisions", v.decisions},
          {"node", NodeViewToJson(v.node)}};
}

}  // namespace stoker
