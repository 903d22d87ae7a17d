// A checkpoint (LoaderState) as JSON and back: the form of Python's
// state_dict() and load_state_dict().

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "stoker/json_text.h"
#include "stoker/loader.h"

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

}  // namespace stoker
