#include "epoch_batches.h"

#include <algorithm>

namespace stoker::python {

Status EpochBatches::Set(int64_t epoch, std::vector<int64_t> flat, std::vector<int64_t> offsets) {
  if (static_cast<int64_t>(offsets.size()) != batches_per_epoch_ + 1) {
    return InvalidArgument("epoch " + std::to_string(epoch) + " has " +
                           std::to_string(static_cast<int64_t>(offsets.size()) - 1) +
                           " batches; the loader was made for " +
                           std::to_string(batches_per_epoch_) + " (len(batch_sampler) changed)");
  }
  {
    MutexLock lock(mu_);
    epochs_[epoch] = {std::move(flat), std::move(offsets), ++clock_};
    while (epochs_.size() > 3) {  // the current epoch, the next, one spare
      epochs_.erase(std::min_element(epochs_.begin(), epochs_.end(), [](auto& a, auto& b) {
        return a.second.used < b.second.used;
      }));
    }
  }
  cv_.NotifyAll();
  return Status::Ok();
}

Result<std::vector<int64_t>> EpochBatches::Indices(int64_t epoch, int64_t batch) {
  MutexLock lock(mu_);
  while (!shutdown_ && epochs_.count(epoch) == 0) cv_.Wait(mu_);
  if (shutdown_) return Cancelled("the loader was closed");
  const auto& [flat, offsets, used] = epochs_[epoch];
  const auto b = static_cast<size_t>(batch);
  return std::vector<int64_t>(flat.begin() + offsets[b], flat.begin() + offsets[b + 1]);
}

bool EpochBatches::Has(int64_t epoch) {
  MutexLock lock(mu_);
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return false;
  it->second.used = ++clock_;
  return true;
}

void EpochBatches::Shutdown() {
  {
    MutexLock lock(mu_);
    shutdown_ = true;
  }
  cv_.NotifyAll();
}

}  // namespace stoker::python
