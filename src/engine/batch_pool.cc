#include "engine/batch_pool.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace stoker {
namespace {

constexpr size_t kAlignment = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

BatchSlot::BatchSlot(const SampleSpec* spec, int64_t batch_size)
    : labels(static_cast<size_t>(batch_size)),
      indices(static_cast<size_t>(batch_size)),
      outcomes(static_cast<size_t>(batch_size)),
      spec_(spec),
      sample_bytes_(spec->bytes()),
      buffer_bytes_(RoundUp(std::max<size_t>(1, sample_bytes_ * static_cast<size_t>(batch_size)),
                            kAlignment)) {
  data_ = static_cast<std::byte*>(std::aligned_alloc(kAlignment, buffer_bytes_));
  if (data_ == nullptr) throw std::bad_alloc();
}

BatchSlot::~BatchSlot() { std::free(data_); }

void BatchSlot::Reset(int64_t e, int64_t b, int64_t g, int64_t len) {
  epoch = e;
  batch = b;
  generation = g;
  length = len;
  count = len;
  ready = false;
  skips.clear();
  remaining.store(len, std::memory_order_relaxed);
  if (failed.load(std::memory_order_relaxed)) {
    for (auto& o : outcomes) o = Status::Ok();
    failed.store(false, std::memory_order_relaxed);
  }
}

void BatchSlot::CompactFailures() {
  int64_t kept = 0;
  for (int64_t p = 0; p < length; ++p) {
    auto up = static_cast<size_t>(p);
    if (!outcomes[up].ok()) continue;
    if (kept != p) {
      std::memmove(sample(kept), sample(p), sample_bytes_);
      labels[static_cast<size_t>(kept)] = labels[up];
      indices[static_cast<size_t>(kept)] = indices[up];
    }
    ++kept;
  }
  count = kept;
}

BatchPool::BatchPool(SampleSpec spec, int64_t batch_size)
    : spec_(std::move(spec)), batch_size_(batch_size) {}

std::unique_ptr<BatchSlot> BatchPool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      auto slot = std::move(free_.back());
      free_.pop_back();
      return slot;
    }
  }
  slots_made_.fetch_add(1, std::memory_order_relaxed);
  return std::make_unique<BatchSlot>(&spec_, batch_size_);
}

void BatchPool::Release(std::unique_ptr<BatchSlot> slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < max_free_) free_.push_back(std::move(slot));
  // else: `slot` frees its memory here, outside the hot path's steady state.
}

void BatchPool::set_max_free(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  max_free_ = n;
  if (free_.size() > n) free_.resize(n);
}

}  // namespace stoker
