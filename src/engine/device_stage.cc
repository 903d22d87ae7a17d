#include "engine/device_stage.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/batch_pool.h"

namespace stoker {

DeviceCopy::DeviceCopy(std::shared_ptr<DeviceStage> stage, std::unique_ptr<DeviceBuffer> buffer,
                       bool prefetched)
    : stage_(std::move(stage)), buffer_(std::move(buffer)), prefetched_(prefetched) {}

DeviceCopy::~DeviceCopy() {
  const auto& api = stage_->cuda().api();
  // The host buffer goes back to its pool after this: the copy must be done
  // reading it. Normally it is, and this returns at once.
  api.cudaEventSynchronize(buffer_->copied);
  // The consumer's queued work on its stream may still read the device
  // buffer: the next copy into it waits for this event (on the device).
  if (waited_ && api.cudaEventRecord(buffer_->released, consumer_) == CudaRuntime::kSuccess) {
    buffer_->release_recorded = true;
  }
  stage_->ReturnBuffer(std::move(buffer_), prefetched_);
}

Status DeviceCopy::WaitOn(CudaStream stream) {
  const CudaRuntime& cuda = stage_->cuda();
  STOKER_RETURN_IF_ERROR(cuda.Check(cuda.api().cudaStreamWaitEvent(stream, buffer_->copied, 0),
                                    "cudaStreamWaitEvent"));
  consumer_ = stream;
  waited_ = true;
  return Status::Ok();
}

void DeviceCopy::MarkDelivered() {
  if (!prefetched_) return;
  prefetched_ = false;
  MutexLock lock(stage_->mu_);
  --stage_->prefetched_;
}

DeviceStage::DeviceStage(std::shared_ptr<const CudaRuntime> cuda, int device, size_t batch_bytes)
    : cuda_(std::move(cuda)), device_(device), batch_bytes_(batch_bytes) {}

Result<std::shared_ptr<DeviceStage>> DeviceStage::Make(std::shared_ptr<const CudaRuntime> cuda,
                                                       int device, size_t budget_bytes,
                                                       size_t batch_bytes) {
  const std::string option = "option 'device' = " + std::to_string(device);
  const auto& api = cuda->api();
  Result<int> devices = cuda->Devices();
  if (!devices.ok()) return devices.status().WithContext(option);
  const int count = *devices;
  if (count == 0) return Unavailable(option + ": no CUDA device (" + cuda->path() + ")");
  if (device < 0 || device >= count) {
    return InvalidArgument(option + " is out of range: this machine has " + std::to_string(count) +
                           " CUDA device(s), 0 to " + std::to_string(count - 1));
  }
  std::shared_ptr<DeviceStage> stage(new DeviceStage(std::move(cuda), device, batch_bytes));
  const CudaRuntime& c = *stage->cuda_;
  CudaDeviceGuard guard(c, device);
  STOKER_RETURN_IF_ERROR(guard.status().WithContext(option));
  STOKER_RETURN_IF_ERROR(
      c.Check(api.cudaStreamCreateWithFlags(&stage->stream_, CudaRuntime::kStreamNonBlocking),
              "cudaStreamCreateWithFlags")
          .WithContext(option));
  if (budget_bytes == 0) {
    size_t free = 0;
    size_t total = 0;
    STOKER_RETURN_IF_ERROR(
        c.Check(api.cudaMemGetInfo(&free, &total), "cudaMemGetInfo").WithContext(option));
    budget_bytes = free / 4;
  }
  stage->budget_bytes_ = budget_bytes;
  stage->max_prefetched_ =
      static_cast<int>(std::min<size_t>(budget_bytes / std::max<size_t>(batch_bytes, 1), 1 << 20));
  return stage;
}

DeviceStage::~DeviceStage() {
  const auto& api = cuda_->api();
  CudaDeviceGuard guard(*cuda_, device_);
  if (stream_ != nullptr) api.cudaStreamSynchronize(stream_);
  MutexLock lock(mu_);
  for (auto& b : free_) FreeBuffer(*b);
  if (stream_ != nullptr) api.cudaStreamDestroy(stream_);
}

std::string DeviceStage::Where() const { return "option 'device' = " + std::to_string(device_); }

void DeviceStage::Prefetch(BatchSlot& slot) {
  {
    MutexLock lock(mu_);
    if (prefetched_ >= max_prefetched_) return;  // no room: the copy waits for delivery
    ++prefetched_;
    ++reserving_;
    prefetched_peak_ = std::max(prefetched_peak_, prefetched_);
  }
  CudaDeviceGuard guard(*cuda_, device_);
  Status st = guard.status();
  std::unique_ptr<DeviceBuffer> buffer = st.ok() ? TakeBuffer(&st) : nullptr;
  if (buffer != nullptr) st = Copy(*buffer, slot);
  {
    MutexLock lock(mu_);
    --reserving_;
    if (st.ok()) copies_.fetch_add(1, std::memory_order_relaxed);
  }
  if (!st.ok()) {  // Deliver tries again, and reports what it meets then
    if (buffer != nullptr) {
      ReturnBuffer(std::move(buffer), /*prefetched=*/true);
    } else {
      MutexLock lock(mu_);
      --prefetched_;
    }
    return;
  }
  slot.set_device_copy(
      std::make_unique<DeviceCopy>(shared_from_this(), std::move(buffer), /*prefetched=*/true));
}

Status DeviceStage::Deliver(BatchSlot& slot) {
  if (DeviceCopy* copy = slot.device_copy(); copy != nullptr) {
    copy->MarkDelivered();
    return Status::Ok();
  }
  CudaDeviceGuard guard(*cuda_, device_);
  STOKER_RETURN_IF_ERROR(guard.status().WithContext(Where()));
  Status st;
  std::unique_ptr<DeviceBuffer> buffer = TakeBuffer(&st);
  if (buffer == nullptr) return st;
  if (st = Copy(*buffer, slot); !st.ok()) {
    ReturnBuffer(std::move(buffer), /*prefetched=*/false);
    return st.WithContext(Where());
  }
  copies_.fetch_add(1, std::memory_order_relaxed);
  copies_at_delivery_.fetch_add(1, std::memory_order_relaxed);
  slot.set_device_copy(
      std::make_unique<DeviceCopy>(shared_from_this(), std::move(buffer), /*prefetched=*/false));
  return Status::Ok();
}

std::unique_ptr<DeviceBuffer> DeviceStage::TakeBuffer(Status* status) {
  {
    MutexLock lock(mu_);
    if (!free_.empty()) {
      auto buffer = std::move(free_.back());
      free_.pop_back();
      return buffer;
    }
  }
  const auto& api = cuda_->api();
  auto buffer = std::make_unique<DeviceBuffer>();
  Status st = cuda_->Check(api.cudaMalloc(&buffer->data, batch_bytes_), "cudaMalloc");
  if (!st.ok()) {
    *status = st.WithContext(Where() + ": out of device memory for a batch of " +
                             std::to_string(batch_bytes_) + " bytes");
    return nullptr;
  }
  st = cuda_->Check(api.cudaEventCreateWithFlags(&buffer->copied, CudaRuntime::kEventDisableTiming),
                    "cudaEventCreateWithFlags");
  if (st.ok()) {
    st = cuda_->Check(
        api.cudaEventCreateWithFlags(&buffer->released, CudaRuntime::kEventDisableTiming),
        "cudaEventCreateWithFlags");
  }
  if (!st.ok()) {
    FreeBuffer(*buffer);
    *status = st.WithContext(Where());
    return nullptr;
  }
  buffers_made_.fetch_add(1, std::memory_order_relaxed);
  return buffer;
}

Status DeviceStage::Copy(DeviceBuffer& buffer, const BatchSlot& slot) {
  const auto& api = cuda_->api();
  // The consumer may still be reading this buffer on its stream: wait there.
  if (buffer.release_recorded) {
    STOKER_RETURN_IF_ERROR(
        cuda_->Check(api.cudaStreamWaitEvent(stream_, buffer.released, 0), "cudaStreamWaitEvent"));
    buffer.release_recorded = false;
  }
  const auto data = slot.data();
  STOKER_RETURN_IF_ERROR(
      cuda_->Check(api.cudaMemcpyAsync(buffer.data, data.data(), data.size(),
                                       CudaRuntime::kMemcpyHostToDevice, stream_),
                   "cudaMemcpyAsync"));
  STOKER_RETURN_IF_ERROR(
      cuda_->Check(api.cudaEventRecord(buffer.copied, stream_), "cudaEventRecord"));
  return Status::Ok();
}

void DeviceStage::ReturnBuffer(std::unique_ptr<DeviceBuffer> buffer, bool prefetched) {
  MutexLock lock(mu_);
  if (prefetched) --prefetched_;
  // Enough for a full prefetch window plus a few the consumer holds.
  if (free_.size() < static_cast<size_t>(max_prefetched_) + 4) {
    free_.push_back(std::move(buffer));
    return;
  }
  MutexUnlock unlock(mu_);
  CudaDeviceGuard guard(*cuda_, device_);
  FreeBuffer(*buffer);
}

void DeviceStage::FreeBuffer(DeviceBuffer& b) {
  const auto& api = cuda_->api();
  if (b.release_recorded) api.cudaEventSynchronize(b.released);
  if (b.copied != nullptr) api.cudaEventDestroy(b.copied);
  if (b.released != nullptr) api.cudaEventDestroy(b.released);
  if (b.data != nullptr) api.cudaFree(b.data);
}

DeviceStageMetrics DeviceStage::Metrics() const {
  DeviceStageMetrics m;
  m.copies_at_delivery = copies_at_delivery_.load(std::memory_order_relaxed);
  m.buffers_made = buffers_made_.load(std::memory_order_relaxed);
  m.max_prefetched = max_prefetched_;
  m.budget_bytes = budget_bytes_;
  MutexLock lock(mu_);
  // Under the lock that a prefetch's copy is counted in: the two agree.
  m.copies = copies_.load(std::memory_order_relaxed);
  m.prefetched = prefetched_ - reserving_;
  m.prefetched_peak = prefetched_peak_;
  return m;
}

}  // namespace stoker
