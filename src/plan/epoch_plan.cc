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

namespace {

// This rank's share of an epoch, padded or trimmed so that every rank gets as many.
int64_t PerRank(const PlanOptions& o) {
  const int64_t w = o.world_size;
  const int64_t total = o.pad_shards ? (o.num_samples + w - 1) / w * w : o.num_samples / w * w;
  return total / w;
}

}  // namespace

PlanShape PlanShape::Of(const PlanOptions& o) {
  const int64_t per_rank = PerRank(o);
  PlanShape s;
  s.batch_size = o.batch_size;
  s.num_batches =
      o.drop_last ? per_rank / o.batch_size : (per_rank + o.batch_size - 1) / o.batch_size;
  s.num_samples = o.drop_last ? s.num_batches * o.batch_size : per_rank;
  return s;
}

int64_t PlanShape::batch_length(int64_t b) const {
  const int64_t begin = b * batch_size;
  return std::min(begin + batch_size, num_samples) - begin;
}

EpochPlan::EpochPlan(const PlanOptions& o, int64_t epoch)
    : epoch_(epoch), shape_(PlanShape::Of(o)) {
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
  const int64_t per_rank = PerRank(o);
  order_.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = 0; k < per_rank; ++k) {
    // Padding repeats the epoch's order from its start, wrapping as often as needed.
    int64_t global_pos = k * w + o.rank;
    order_.push_back(global[static_cast<size_t>(global_pos % n)]);
  }
}

}  // namespace stoker
