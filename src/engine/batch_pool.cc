#include "engine/batch_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <string>
#include <utility>

namespace stoker {
namespace {

constexpr size_t kAlignment = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

BatchSlot::BatchSlot(const SampleSpec* spec, int64_t batch_size, bool zeroed)
    : labels_(static_cast<size_t>(batch_size)),
      indices_(static_cast<size_t>(batch_size)),
      outcomes_(static_cast<size_t>(batch_size)),
      keys_(static_cast<size_t>(batch_size)),
      notes_(static_cast<size_t>(batch_size)),
      spec_(spec),
      sample_bytes_(spec->bytes()),
      buffer_bytes_(RoundUp(std::max<size_t>(1, sample_bytes_ * static_cast<size_t>(batch_size)),
                            kAlignment)) {
  data_ = static_cast<std::byte*>(std::aligned_alloc(kAlignment, buffer_bytes_));
  if (data_ == nullptr) throw std::bad_alloc();
  if (zeroed) std::memset(data_, 0, buffer_bytes_);
}

BatchSlot::~BatchSlot() {
  device_copy_.reset();  // before the host buffer goes
  pinned_.reset();
  std::free(data_);
}

Status BatchSlot::Pin(std::shared_ptr<const CudaRuntime> cuda) {
  if (pinned_ != nullptr) return Status::Ok();
  STOKER_ASSIGN_OR_RETURN(
      pinned_, HostRegistration::Make(std::move(cuda), data_, buffer_bytes_, "a batch buffer"));
  return Status::Ok();
}

void BatchSlot::Open(int64_t epoch, int64_t batch, int64_t length) {
  epoch_ = epoch;
  batch_ = batch;
  length_ = length;
  count_ = length;
  skips_.clear();
  failures_reported_ = false;
  remaining_.store(length, std::memory_order_relaxed);
  abandoned_.store(false, std::memory_order_relaxed);
  extra_samples_.store(0, std::memory_order_relaxed);
  if (failed_.load(std::memory_order_relaxed)) {
    for (auto& o : outcomes_) o = Status::Ok();
    for (auto& n : notes_) n.clear();
    failed_.store(false, std::memory_order_relaxed);
  }
}

void BatchSlot::Put(int64_t position, int64_t index, int64_t label, int64_t samples) {
  const auto p = static_cast<size_t>(position);
  indices_[p] = index;
  labels_[p] = label;
  if (samples != 1) extra_samples_.fetch_add(samples - 1, std::memory_order_relaxed);
}

void BatchSlot::Note(int64_t position, std::vector<SampleFailure> failures) {
  if (failures.empty()) return;
  notes_[static_cast<size_t>(position)] = std::move(failures);
  failed_.store(true, std::memory_order_relaxed);
}

int64_t BatchSlot::samples() const {
  return count_ + extra_samples_.load(std::memory_order_relaxed);
}

int64_t BatchSlot::good_samples() const {
  // A failed position holds no sample; an item's noted failures are not in its count.
  const auto failed =
      std::ranges::count_if(std::span(outcomes_.data(), static_cast<size_t>(count_)),
                            [](const Status& st) { return !st.ok(); });
  return samples() - failed;
}

void BatchSlot::Fail(int64_t position, int64_t index, std::string key, Status cause) {
  const auto p = static_cast<size_t>(position);
  indices_[p] = index;
  labels_[p] = 0;
  keys_[p] = std::move(key);
  outcomes_[p] = std::move(cause);
  failed_.store(true, std::memory_order_relaxed);
}

std::vector<BatchSlot::Failure> BatchSlot::Failures() const {
  std::vector<Failure> out;
  if (!failed()) return out;
  for (int64_t p = 0; p < count_; ++p) {
    const auto up = static_cast<size_t>(p);
    if (!outcomes_[up].ok()) out.push_back({indices_[up], keys_[up], outcomes_[up]});
    for (const SampleFailure& f : notes_[up]) out.push_back({f.index, f.key, f.status, f.name});
  }
  return out;
}

Status BatchSlot::Failure::Named() const {
  if (!name.empty()) return status.WithContext(name);
  // A source's own error names its key already ("<key>: open: ..."): the key
  // is said once, in the sample's name.
  const bool says_key = !key.empty() && status.message().starts_with(key + ": ");
  if (index < 0) return key.empty() || says_key ? status : status.WithContext(key);
  const std::string where = SampleName(index, says_key ? "" : key);
  if (!says_key) return status.WithContext(where);
  return status.WithMessage(SampleName(index, key) + ": " +
                            status.message().substr(key.size() + 2));
}

std::string SampleName(int64_t index, const std::string& key) {
  std::string name = "sample " + std::to_string(index);
  return key.empty() ? name : name + " (" + key + ")";
}

BatchPool::BatchPool(SampleSpec spec, int64_t batch_size, Recycle recycle,
                     std::shared_ptr<const CudaRuntime> pin)
    : spec_(std::move(spec)),
      batch_size_(batch_size),
      recycle_(std::move(recycle)),
      pin_(std::move(pin)) {}

std::unique_ptr<BatchSlot> BatchPool::Acquire() {
  {
    MutexLock lock(mu_);
    if (!free_.empty()) {
      auto slot = std::move(free_.back());
      free_.pop_back();
      return slot;
    }
  }
  auto slot = std::make_unique<BatchSlot>(&spec_, batch_size_, /*zeroed=*/recycle_ != nullptr);
  if (pin_ != nullptr) {
    if (Status st = slot->Pin(pin_); !st.ok()) throw SlotRefused{std::move(st)};
  }
  slots_made_.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

void BatchPool::Release(std::unique_ptr<BatchSlot> slot) {
  slot->DropDeviceCopy();
  if (recycle_) {
    for (int64_t p = 0; p < slot->length(); ++p) {
      std::span<std::byte> sample = slot->sample(p);
      recycle_(sample);
      std::memset(sample.data(), 0, sample.size());
    }
  }
  MutexLock lock(mu_);
  if (free_.size() < max_free_) free_.push_back(std::move(slot));
  // else: `slot` frees its memory here, outside the hot path's steady state.
}

void BatchPool::set_max_free(size_t n) {
  MutexLock lock(mu_);
  max_free_ = n;
  if (free_.size() > n) free_.resize(n);
}

}  // namespace stoker
