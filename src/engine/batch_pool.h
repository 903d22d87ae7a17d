#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/thread_annotations.h"
#include "engine/cuda_runtime.h"
#include "engine/device_stage.h"
#include "engine/host_registration.h"
#include "stoker/loader.h"
#include "stoker/sample_spec.h"
#include "stoker/status.h"
#include "stoker/worker_kind.h"

namespace stoker {

/// "sample 13 (<key>)", or "sample 13" without a key: how errors name a sample.
std::string SampleName(int64_t index, const std::string& key);

/// One batch's storage, recycled through a BatchPool: a 4096-aligned data
/// buffer for batch_size samples plus per-sample labels, source indices and
/// outcomes, all allocated once when the slot is made.
///
/// A slot goes through four phases, each with its own accessors below:
/// opened (by the scheduler, under the loader's lock), filled (each position
/// by exactly one worker, without a lock), finished (by the thread whose
/// Done() completed it: acquire/release on the countdown orders the writes)
/// and delivered (read-only, to the consumer).
class BatchSlot {
 public:
  /// `zeroed`: the buffer starts as zero bytes (for pools that recycle).
  BatchSlot(const SampleSpec* spec, int64_t batch_size, bool zeroed = false);
  ~BatchSlot();
  BatchSlot(const BatchSlot&) = delete;
  BatchSlot& operator=(const BatchSlot&) = delete;

  // -- Opened: batch `batch` of `epoch`, `length` positions to fill.
  void Open(int64_t epoch, int64_t batch, int64_t length);
  int64_t epoch() const { return epoch_; }
  int64_t batch() const { return batch_; }
  int64_t length() const { return length_; }
  /// Its epoch was abandoned while it was being written (the scheduler says
  /// so, under the loader's lock): nobody will take it, and workers may stop
  /// its items (ItemOutcome::abandoned points here). Cleared by Open.
  void Abandon() { abandoned_.store(true, std::memory_order_relaxed); }
  bool abandoned() const { return abandoned_.load(std::memory_order_relaxed); }
  const std::atomic<bool>* abandoned_flag() const { return &abandoned_; }

  // -- Filled: the worker that claimed `position` writes its sample bytes,
  // then records its outcome once.
  std::span<std::byte> sample(int64_t position) {
    return {data_ + position * static_cast<int64_t>(sample_bytes_), sample_bytes_};
  }
  /// `samples`: the user samples its output holds (1 for a sample; an item
  /// of a WorkerKind may hold many, or none).
  void Put(int64_t position, int64_t index, int64_t label, int64_t samples = 1);
  /// Failed samples inside the item at `position` (already Put): the item is
  /// kept, the failures are reported or skipped like failed positions.
  void Note(int64_t position, std::vector<SampleFailure> failures);
  /// The sample at `position` (source index `index`, source key `key`)
  /// failed; `cause` says why without naming the sample (the report adds
  /// index and key).
  void Fail(int64_t position, int64_t index, std::string key, Status cause);
  /// Counts `n` more positions done (or given up); true for exactly the call
  /// that completes the batch, whose thread then finishes it.
  bool Done(int64_t n) { return remaining_.fetch_sub(n, std::memory_order_acq_rel) == n; }

  // -- Finished (and, for a batch with failures, on the consumer's thread).
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  struct Failure {
    int64_t index = 0;  // the sample's index in the source; -1: a kind's item, no sample
    std::string key;    // the source's key for it (the kind's, for an item)
    Status status;      // the cause, without index or key
    std::string name;   // SampleFailure::name: what failed, where it is no sample
    /// The cause with the sample named: "sample <index> (<key>): <cause>"
    /// ("sample <index>: " without a key; "<key>: " for an item; "<name>: "
    /// for what a kind names). A cause that starts with "<key>: " (a
    /// source's own error) has the key said once, in the sample's name.
    Status Named() const;
  };
  /// The failed samples among the count() kept, in order (each position's
  /// own failure, or its item's noted failures).
  std::vector<Failure> Failures() const;
  /// Leaves out the failed samples `drop(index, cause)` says yes to (index
  /// -1: a kind's item): the rest (succeeded,
  /// or failed and kept) move to the front in order; count() is their number.
  /// A noted failure is dropped alone, its item stays.
  template <typename Pred>
  void DropFailures(Pred drop);
  /// Under the skip policy, the samples left out, travelling with the batch.
  std::vector<SkipRecord>& skips() { return skips_; }
  /// Whether the consumer was already told of this batch's failures.
  bool failures_reported() const { return failures_reported_; }
  /// The user samples left once every failed one is dropped.
  int64_t good_samples() const;
  void set_failures_reported() { failures_reported_ = true; }

  // -- Delivered: count() samples at the front.
  int64_t count() const { return count_; }
  std::span<const std::byte> data() const {
    return {data_, static_cast<size_t>(count_) * sample_bytes_};
  }
  std::span<std::byte> mutable_data() {
    return {data_, static_cast<size_t>(count_) * sample_bytes_};
  }
  std::span<const int64_t> labels() const { return {labels_.data(), static_cast<size_t>(count_)}; }
  std::span<const int64_t> indices() const {
    return {indices_.data(), static_cast<size_t>(count_)};
  }
  /// User samples in the count() positions delivered.
  int64_t samples() const;

  const SampleSpec& spec() const { return *spec_; }
  size_t sample_bytes() const { return sample_bytes_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  const std::byte* buffer() const { return data_; }

  // -- Device side (docs/engine.md, "Device path").
  /// Page-locks the buffer with cudaHostRegister, once; the destructor
  /// unregisters it. Errors name option 'pin_memory' and the cause.
  Status Pin(std::shared_ptr<const CudaRuntime> cuda);
  bool pinned() const { return pinned_ != nullptr; }
  /// The batch's copy on the device, or null.
  DeviceCopy* device_copy() const { return device_copy_.get(); }
  void set_device_copy(std::unique_ptr<DeviceCopy> copy) { device_copy_ = std::move(copy); }
  /// Waits for the device copy to have read the buffer and gives the device
  /// buffer back; before the host buffer may be written again.
  void DropDeviceCopy() { device_copy_.reset(); }

 private:
  int64_t epoch_ = 0;
  int64_t batch_ = 0;
  int64_t length_ = 0;  // planned samples
  int64_t count_ = 0;   // delivered samples
  std::vector<int64_t> labels_;
  std::vector<int64_t> indices_;
  std::vector<Status> outcomes_;                   // per position; written by its worker only
  std::vector<std::string> keys_;                  // per position, of failed samples only
  std::vector<std::vector<SampleFailure>> notes_;  // per position, its item's failed samples
  std::vector<SkipRecord> skips_;
  bool failures_reported_ = false;
  std::atomic<int64_t> remaining_{0};
  // User samples beyond one per kept position (a kind's items hold many):
  // touched only for those, so that positions written side by side by two
  // workers share no more cache lines than labels and indices do.
  std::atomic<int64_t> extra_samples_{0};
  std::atomic<bool> failed_{false};
  std::atomic<bool> abandoned_{false};
  const SampleSpec* spec_;
  size_t sample_bytes_;
  size_t buffer_bytes_;
  std::byte* data_;
  std::unique_ptr<HostRegistration> pinned_;  // null: pageable
  std::unique_ptr<DeviceCopy> device_copy_;
};

template <typename Pred>
void BatchSlot::DropFailures(Pred drop) {
  int64_t kept = 0;
  bool failed = false;
  for (int64_t p = 0; p < count_; ++p) {
    const auto up = static_cast<size_t>(p);
    if (!outcomes_[up].ok() && drop(indices_[up], outcomes_[up])) {
      notes_[up].clear();
      continue;
    }
    std::erase_if(notes_[up], [&](const SampleFailure& f) { return drop(f.index, f.status); });
    if (kept != p) {
      const auto uk = static_cast<size_t>(kept);
      std::memmove(sample(kept).data(), sample(p).data(), sample_bytes_);
      labels_[uk] = labels_[up];
      indices_[uk] = indices_[up];
      keys_[uk] = std::move(keys_[up]);
      outcomes_[uk] = std::move(outcomes_[up]);
      outcomes_[up] = Status::Ok();
      notes_[uk] = std::move(notes_[up]);
      notes_[up].clear();
    }
    const auto uk = static_cast<size_t>(kept);
    failed = failed || !outcomes_[uk].ok() || !notes_[uk].empty();
    ++kept;
  }
  for (int64_t p = kept; p < count_; ++p) outcomes_[static_cast<size_t>(p)] = Status::Ok();
  count_ = kept;
  failed_.store(failed, std::memory_order_relaxed);
}

/// Thrown by BatchPool::Acquire when a new slot cannot be page-locked; the
/// scheduler's state is unchanged, as for std::bad_alloc.
struct SlotRefused {
  Status status;
};

/// A free list of BatchSlots of one shape. Acquire reuses a free slot or
/// makes a new one; Release keeps up to max_free() slots for reuse and frees
/// the rest. Safe for concurrent use from many threads.
///
/// With a `recycle` function, every position of a released slot is handed to
/// it (the transform's Recycle) and then zeroed, so that positions never
/// written read as zeros; new slots start zeroed.
class BatchPool {
 public:
  using Recycle = std::function<void(std::span<std::byte> sample)>;
  /// `pin`: page-lock every slot once, when it is made (pin_memory).
  BatchPool(SampleSpec spec, int64_t batch_size, Recycle recycle = {},
            std::shared_ptr<const CudaRuntime> pin = nullptr);

  /// A free slot or a new one. Throws std::bad_alloc, or SlotRefused when a
  /// new slot cannot be page-locked.
  std::unique_ptr<BatchSlot> Acquire() EXCLUDES(mu_);
  /// Drops the slot's device copy first (waiting for it to have read the
  /// buffer), then recycles the buffer.
  void Release(std::unique_ptr<BatchSlot> slot) EXCLUDES(mu_);

  void set_max_free(size_t n) EXCLUDES(mu_);
  const SampleSpec& spec() const { return spec_; }
  int64_t batch_size() const { return batch_size_; }
  size_t batch_bytes() const { return spec_.bytes() * static_cast<size_t>(batch_size_); }
  /// Slots made so far (a growing count means the steady state allocates).
  int64_t slots_made() const { return slots_made_.load(std::memory_order_relaxed); }

 private:
  const SampleSpec spec_;
  const int64_t batch_size_;
  const Recycle recycle_;
  const std::shared_ptr<const CudaRuntime> pin_;
  std::atomic<int64_t> slots_made_{0};
  Mutex mu_;
  size_t max_free_ GUARDED_BY(mu_) = 8;
  std::vector<std::unique_ptr<BatchSlot>> free_ GUARDED_BY(mu_);
};

}  // namespace stoker
