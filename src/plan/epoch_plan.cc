#include "plan/epoch_plan.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "stoker/rng.h"

namespace stoker {

Status ValidatePlanOptions(const PlanOptions& o) {
  if (o.num_samples <= 0) {
    return InvalidArgument("the source has no samples (size " + std::to_string(o.num_samples) +
                           ")");
  }
  if (o.batch_size <= 0) {
    return InvalidArgument("batch_size must be at least 1, got " + std::to_string(o.batch_size));
  }
  if (o.world_size <= 0) {
    return InvalidArgument("world_size must be at least 1, got " + std::to_string(o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgument("rank must be in [0, world_size=" + std::to_string(o.world_size) +
                           "), got " + std::to_string(o.rank));
  }
  if (!o.pad_shards && o.num_samples < o.world_size) {
    return InvalidArgument("the source has " + std::to_string(o.num_samples) +
                           " samples, fewer than world_size=" + std::to_string(o.world_size) +
                           ": without padding some ranks would get none");
  }
  return Status::Ok();
}

EpochPlan::EpochPlan(const PlanOptions& o, int64_t epoch)
    : epoch_(epoch), batch_size_(o.batch_size) {
  const int64_t n = o.num_samples;
  std::vector<int64_t> global(static_cast<size_t>(n));
  std::iota(global.begin(), global.end(), int64_t{0});
  if (o.shuffle) {
    SampleRng rng = EpochRng(o.seed, static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i + 1)));
      std::swap(global[static_cast<size_t>(i)], global[static_cast<size_t>(j)]);
    }
  }
  const int64_t w = o.world_size;
  const int64_t total = o.pad_shards ? (n + w - 1) / w * w : n / w * w;
  const int64_t per_rank = total / w;
  order_.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = 0; k < per_rank; ++k) {
    // Padding repeats the epoch's order from its start, wrapping as often as needed.
    int64_t global_pos = k * w + o.rank;
    order_.push_back(global[static_cast<size_t>(global_pos % n)]);
  }
  num_batches_ = o.drop_last ? per_rank / batch_size_ : (per_rank + batch_size_ - 1) / batch_size_;
  num_samples_ = o.drop_last ? num_batches_ * batch_size_ : per_rank;
}

int64_t EpochPlan::batch_length(int64_t b) const {
  int64_t begin = batch_begin(b);
  int64_t end = std::min(begin + batch_size_, num_samples_);
  return end - begin;
}

}  // namespace stoker
