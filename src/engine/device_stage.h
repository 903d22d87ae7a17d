#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_annotations.h"
#include "engine/cuda_runtime.h"
#include "stoker/status.h"

namespace stoker {

class BatchSlot;
class DeviceStage;

/// One device buffer with its two events: `copied`, recorded on the loader's
/// stream after the host-to-device copy into it, and `released`, recorded on
/// the consumer's stream when the consumer let go of it.
struct DeviceBuffer {
  void* data = nullptr;
  CudaEvent copied = nullptr;
  CudaEvent released = nullptr;
  bool release_recorded = false;  // `released` was recorded since the last copy
};

/// A batch's copy on the device, attached to its BatchSlot. Destroying it
/// (when the slot returns to its pool) waits for the copy's event, so that
/// the host buffer is never rewritten while the copy may still read it, and
/// hands the device buffer back to the stage.
class DeviceCopy {
 public:
  DeviceCopy(std::shared_ptr<DeviceStage> stage, std::unique_ptr<DeviceBuffer> buffer,
             bool prefetched);
  ~DeviceCopy();
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  void* data() const { return buffer_->data; }
  CudaEvent ready_event() const { return buffer_->copied; }
  /// Makes `stream` wait for the copy (cudaStreamWaitEvent; no host wait) and
  /// remembers it: at release an event is recorded on it, and the buffer is
  /// written again only after that event (see docs/engine.md, "Device path").
  Status WaitOn(CudaStream stream);
  /// Marks the copy as handed to the consumer: it no longer counts against
  /// the device prefetch budget.
  void MarkDelivered();

 private:
  std::shared_ptr<DeviceStage> stage_;
  std::unique_ptr<DeviceBuffer> buffer_;
  bool prefetched_;  // counts against the stage's prefetch budget
  CudaStream consumer_ = nullptr;
  bool waited_ = false;
};

/// Figures of the device path, cumulative since the loader was made.
struct DeviceStageMetrics {
  int64_t copies = 0;              // host-to-device copies made
  int64_t copies_at_delivery = 0;  // of those, made at Next() (no prefetch room)
  int64_t buffers_made = 0;        // cudaMalloc calls that succeeded
  int prefetched = 0;              // copies made ahead, not yet delivered
  int prefetched_peak = 0;
  int max_prefetched = 0;  // the budget in batches
  size_t budget_bytes = 0;
};

/// The loader's device side: its own non-blocking stream on one device, and
/// a recycled pool of device buffers of one batch each. Copies made ahead of
/// delivery are bounded by the budget (budget_bytes / batch_bytes batches);
/// a copy at delivery is always made (that batch is the consumer's, as host
/// batches it holds are). Safe for concurrent use from many threads.
class DeviceStage : public std::enable_shared_from_this<DeviceStage> {
 public:
  /// `device`: an index among cudaGetDeviceCount's. `budget_bytes` 0: a
  /// quarter of the device's free memory (cudaMemGetInfo). Errors name the
  /// option ('device' or 'device_prefetch_bytes') and the cause.
  static Result<std::shared_ptr<DeviceStage>> Make(std::shared_ptr<const CudaRuntime> cuda,
                                                   int device, size_t budget_bytes,
                                                   size_t batch_bytes);
  ~DeviceStage();

  /// Worker thread, before the batch is offered for delivery: copies the
  /// slot's count() samples to a device buffer when the budget has room;
  /// otherwise (or when the device refuses memory) leaves it to Deliver.
  void Prefetch(BatchSlot& slot) EXCLUDES(mu_);
  /// Consumer thread, once the slot's data is final: makes sure it has a
  /// copy (made now when there was none) and takes it off the budget.
  /// Errors name option 'device' and the cause (out of device memory...).
  Status Deliver(BatchSlot& slot) EXCLUDES(mu_);

  DeviceStageMetrics Metrics() const EXCLUDES(mu_);
  int device() const { return device_; }
  const CudaRuntime& cuda() const { return *cuda_; }

 private:
  friend class DeviceCopy;
  DeviceStage(std::shared_ptr<const CudaRuntime> cuda, int device, size_t batch_bytes);
  // A free buffer or a new one; null with the cause in *status.
  std::unique_ptr<DeviceBuffer> TakeBuffer(Status* status) EXCLUDES(mu_);
  void ReturnBuffer(std::unique_ptr<DeviceBuffer> buffer, bool prefetched) EXCLUDES(mu_);
  void FreeBuffer(DeviceBuffer& buffer);
  // Enqueues the copy of `slot` into `buffer` on the stream and records
  // buffer.copied after it.
  Status Copy(DeviceBuffer& buffer, const BatchSlot& slot);
  std::string Where() const;

  const std::shared_ptr<const CudaRuntime> cuda_;
  const int device_;
  const size_t batch_bytes_;
  CudaStream stream_ = nullptr;
  int max_prefetched_ = 0;
  size_t budget_bytes_ = 0;

  mutable Mutex mu_;
  std::vector<std::unique_ptr<DeviceBuffer>> free_ GUARDED_BY(mu_);
  int prefetched_ GUARDED_BY(mu_) = 0;
  // Of prefetched_, room taken for a copy not yet made: Metrics leaves them
  // out, so that copies and prefetched agree at every moment.
  int reserving_ GUARDED_BY(mu_) = 0;
  int prefetched_peak_ GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> copies_{0};
  std::atomic<int64_t> copies_at_delivery_{0};
  std::atomic<int64_t> buffers_made_{0};
};

}  // namespace stoker
