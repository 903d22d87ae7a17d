#include "epoch_batches.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "stoker/rng.h"

namespace stoker::python {

// On streams apart from every sample's: a non-negative int64, so that every
// generator (Python's, numpy's, torch's) takes it. A batch always runs whole,
// in order, in one process, so one seed per batch gives the same data
// whichever worker runs it -- at a per-sample cost a trivial sample would
// notice (tens of us).
int64_t BatchSeed(uint64_t seed, int64_t epoch, int64_t batch) {
  constexpr uint64_t kBatchStreams = uint64_t{1} << 62;
  SampleRng rng(seed, static_cast<uint64_t>(epoch), kBatchStreams + static_cast<uint64_t>(batch));
  return static_cast<int64_t>(rng.NextU64() >> 1);
}

Status EpochBatches::Set(int64_t epoch, std::vector<int64_t> flat, std::vector<int64_t> offsets,
                         int64_t seed, std::vector<std::string> keys) {
  if (offsets.empty() || offsets.front() != 0 ||
      offsets.back() != static_cast<int64_t>(flat.size()) ||
      !std::is_sorted(offsets.begin(), offsets.end())) {
    return InvalidArgument("epoch " + std::to_string(epoch) +
                           ": batch offsets must rise from 0 to the " +
                           std::to_string(flat.size()) + " indices");
  }
  if (!keys.empty() && keys.size() + 1 != offsets.size()) {
    return InvalidArgument("epoch " + std::to_string(epoch) + ": " + std::to_string(keys.size()) +
                           " lists of keys for " + std::to_string(offsets.size() - 1) + " batches");
  }
  std::vector<int32_t> narrow;
  if (std::all_of(flat.begin(), flat.end(), [](int64_t i) {
        return i >= std::numeric_limits<int32_t>::min() && i <= std::numeric_limits<int32_t>::max();
      })) {
    narrow.assign(flat.begin(), flat.end());
    std::vector<int64_t>().swap(flat);
  }
  {
    MutexLock lock(mu_);
    epochs_[epoch] = {std::move(narrow), std::move(flat), std::move(offsets), seed,
                      std::move(keys),   ++clock_};
    if (first_set_ < 0) first_set_ = epoch;
    last_set_ = epoch;
    while (epochs_.size() > 3) {  // the current epoch, the next, one spare
      epochs_.erase(std::min_element(epochs_.begin(), epochs_.end(), [](auto& a, auto& b) {
        return a.second.used < b.second.used;
      }));
    }
  }
  cv_.NotifyAll();
  return Status::Ok();
}

void EpochBatches::NameShardFailures(std::vector<SampleFailure>* failures) const {
  if (!sharded()) return;
  for (SampleFailure& f : *failures) {
    if (f.index < 0 || f.index >= static_cast<int64_t>(shards_.size())) continue;
    f.name = "shard " + shards_[static_cast<size_t>(f.index)];
  }
}

int64_t EpochBatches::first_set() const {
  MutexLock lock(mu_);
  return first_set_;
}

int64_t EpochBatches::last_set() const {
  MutexLock lock(mu_);
  return last_set_;
}

Result<EpochBatches::Batch> EpochBatches::Get(int64_t epoch, int64_t batch) {
  MutexLock lock(mu_);
  const uint64_t generation = generation_;
  while (!shutdown_ && generation_ == generation && epochs_.count(epoch) == 0) cv_.Wait(mu_);
  if (shutdown_) return Cancelled("the loader was closed");
  if (epochs_.count(epoch) == 0) return Cancelled("epoch abandoned by a resume");
  const Epoch& e = epochs_[epoch];
  const std::vector<int64_t>& offsets = e.offsets;
  const auto b = static_cast<size_t>(batch);
  if (batch < 0 || b + 1 >= offsets.size()) {
    return Cancelled("epoch " + std::to_string(epoch) + " has " +
                     std::to_string(offsets.size() - 1) + " batches, no batch " +
                     std::to_string(batch) + " (planned before its count changed)");
  }
  const auto copy = [&](const auto& indices) {
    return std::vector<int64_t>(indices.begin() + offsets[b], indices.begin() + offsets[b + 1]);
  };
  return Batch{e.flat.empty() ? copy(e.narrow) : copy(e.flat),
               BatchSeed(static_cast<uint64_t>(e.seed), epoch, batch), e.seed,
               e.keys.empty() ? std::string() : e.keys[b]};
}

bool EpochBatches::Has(int64_t epoch) {
  MutexLock lock(mu_);
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return false;
  it->second.used = ++clock_;
  return true;
}

void EpochBatches::Restart() {
  {
    MutexLock lock(mu_);
    ++generation_;
    epochs_.clear();
  }
  cv_.NotifyAll();
}

void EpochBatches::Shutdown() {
  {
    MutexLock lock(mu_);
    shutdown_ = true;
  }
  cv_.NotifyAll();
}

}  // namespace stoker::python
