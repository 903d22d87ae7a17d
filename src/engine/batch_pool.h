#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "stoker/loader.h"
#include "stoker/sample_spec.h"
#include "stoker/status.h"

namespace stoker {

/// One batch's storage, recycled through a BatchPool: a 4096-aligned data
/// buffer for batch_size samples plus per-sample labels, source indices and
/// outcomes, all allocated once when the slot is made.
///
/// While a batch is being produced, each sample position is written by exactly
/// one worker; `remaining` counts positions not yet done, and whoever brings
/// it to zero finishes the batch (acquire/release on it orders the writes).
class BatchSlot {
 public:
  BatchSlot(const SampleSpec* spec, int64_t batch_size);
  ~BatchSlot();
  BatchSlot(const BatchSlot&) = delete;
  BatchSlot& operator=(const BatchSlot&) = delete;

  /// Makes the slot ready to hold batch `batch` of `epoch` with `length` samples.
  void Reset(int64_t epoch, int64_t batch, int64_t generation, int64_t length);

  /// Moves the samples that succeeded to the front, in order, and sets
  /// `count` to their number.
  void CompactFailures();

  std::byte* sample(int64_t position) {
    return data_ + position * static_cast<int64_t>(sample_bytes_);
  }
  size_t sample_bytes() const { return sample_bytes_; }
  std::byte* data() { return data_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  const SampleSpec& spec() const { return *spec_; }

  int64_t epoch = 0;
  int64_t batch = 0;
  int64_t generation = 0;
  int64_t length = 0;  // planned samples
  int64_t count = 0;   // delivered samples
  bool ready = false;  // guarded by the loader's mutex
  std::vector<int64_t> labels;
  std::vector<int64_t> indices;
  std::vector<Status> outcomes;   // per position; written by its worker only
  std::vector<SkipRecord> skips;  // under kSkip, the samples left out
  std::atomic<int64_t> remaining{0};
  std::atomic<bool> failed{false};

 private:
  const SampleSpec* spec_;
  size_t sample_bytes_;
  size_t buffer_bytes_;
  std::byte* data_;
};

/// A free list of BatchSlots of one shape. Acquire reuses a free slot or
/// makes a new one; Release keeps up to max_free() slots for reuse and frees
/// the rest. Safe for concurrent use from many threads.
class BatchPool {
 public:
  BatchPool(SampleSpec spec, int64_t batch_size);

  std::unique_ptr<BatchSlot> Acquire();
  void Release(std::unique_ptr<BatchSlot> slot);

  void set_max_free(size_t n);
  const SampleSpec& spec() const { return spec_; }
  int64_t batch_size() const { return batch_size_; }
  size_t batch_bytes() const { return spec_.bytes() * static_cast<size_t>(batch_size_); }
  /// Slots made so far (a growing count means the steady state allocates).
  int64_t slots_made() const { return slots_made_.load(std::memory_order_relaxed); }

 private:
  const SampleSpec spec_;
  const int64_t batch_size_;
  std::atomic<int64_t> slots_made_{0};
  std::mutex mu_;
  size_t max_free_ = 8;                           // guarded by mu_
  std::vector<std::unique_ptr<BatchSlot>> free_;  // guarded by mu_
};

}  // namespace stoker
