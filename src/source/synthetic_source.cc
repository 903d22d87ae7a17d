#include "source/synthetic_source.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "core/clock.h"
#include "core/thread_annotations.h"
#include "source/service_slots.h"

namespace stoker {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Spins until this thread has used `cost` of CPU time. CPU time, not wall
// time, so that contention from other threads stretches the wall time the
// way it stretches a real decode.
void BurnCpu(std::chrono::nanoseconds cost) {
  const int64_t end = ThreadCpuNanos() + cost.count();
  volatile uint64_t sink = 0;
  uint64_t x = 1;
  while (ThreadCpuNanos() < end) {
    for (int i = 0; i < 256; ++i) x = SplitMix(x);
    sink = x;
  }
  (void)sink;
}

}  // namespace

SyntheticSource::SyntheticSource(SyntheticOptions options)
    : options_(std::move(options)), fail_sorted_(options_.fail_indices) {
  std::sort(fail_sorted_.begin(), fail_sorted_.end());
}

void SyntheticSource::Fill(int64_t index, std::span<std::byte> out) const {
  uint64_t state = SplitMix(options_.content_seed ^ SplitMix(static_cast<uint64_t>(index)));
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t word = SplitMix(state + i);
    std::memcpy(out.data() + i, &word, 8);
  }
  if (i < out.size()) {
    uint64_t word = SplitMix(state + i);
    std::memcpy(out.data() + i, &word, out.size() - i);
  }
}

Status SyntheticSource::Read(int64_t index, ReadBuffer& buffer, Record* record) const {
  if (options_.read_latency.count() > 0) std::this_thread::sleep_for(options_.read_latency);
  if (options_.cpu_cost.count() > 0) BurnCpu(options_.cpu_cost);
  if (std::binary_search(fail_sorted_.begin(), fail_sorted_.end(), index)) {
    return DataError(Key(index) + ": injected failure");
  }
  if (!buffer.cap.Allows(options_.sample_bytes)) {
    return buffer.cap.Refuse(Key(index) + ": a sample of this size", options_.sample_bytes,
                             "filling it");
  }
  if (buffer.bytes.size() < options_.sample_bytes) buffer.bytes.resize(options_.sample_bytes);
  std::span<std::byte> out(buffer.bytes.data(), options_.sample_bytes);
  Fill(index, out);
  record->bytes = out;
  record->label = options_.num_classes > 0 ? index % options_.num_classes : 0;
  return Status::Ok();
}

std::string SyntheticSource::Key(int64_t index) const {
  return "synthetic:" + std::to_string(index);
}

struct SlowSource::Waits {
  Mutex mu;
  CondVar cancelled_cv;
  bool cancelled GUARDED_BY(mu) = false;
};

SlowSource::SlowSource(std::shared_ptr<const Source> inner, std::chrono::nanoseconds latency,
                       int slots)
    : inner_(std::move(inner)),
      latency_ns_(latency.count()),
      slots_(std::make_unique<ServiceSlots>(slots)),
      waits_(std::make_unique<Waits>()) {}

SlowSource::~SlowSource() = default;

void SlowSource::set_slots(int slots) { slots_->Resize(slots); }

void SlowSource::set_shape(const StoreShape& shape) { slots_->SetShape(shape); }

void SlowSource::Cancel() {
  {
    MutexLock lock(waits_->mu);
    waits_->cancelled = true;
  }
  waits_->cancelled_cv.NotifyAll();
}

Status SlowSource::Read(int64_t index, ReadBuffer& buffer, Record* record) const {
  const int64_t ns = latency_ns_.load(std::memory_order_relaxed);
  if (ns > 0) {
    // An absolute end (SteadyNanos is steady_clock's): a thread preempted
    // after booking still ends when its read does, not later.
    const std::chrono::steady_clock::time_point end(
        std::chrono::nanoseconds(slots_->ReserveNow(ns)));
    MutexLock lock(waits_->mu);
    while (!waits_->cancelled && std::chrono::steady_clock::now() < end) {
      waits_->cancelled_cv.WaitUntil(waits_->mu, end);
    }
    if (waits_->cancelled) {
      return Cancelled("slow-storage read of " + inner_->Key(index) + " cancelled");
    }
  }
  return inner_->Read(index, buffer, record);
}

Result<std::shared_ptr<const Source>> MakeSyntheticSource(const SyntheticOptions& options) {
  if (options.size <= 0) {
    return InvalidArgument("synthetic size must be at least 1, got " +
                           std::to_string(options.size));
  }
  if (options.num_classes < 0) {
    return InvalidArgument("synthetic num_classes must be >= 0, got " +
                           std::to_string(options.num_classes));
  }
  if (options.cpu_cost.count() < 0 || options.read_latency.count() < 0) {
    return InvalidArgument("synthetic cpu_cost and read_latency must be >= 0");
  }
  for (int64_t i : options.fail_indices) {
    if (i < 0 || i >= options.size) {  // it would never fail
      return InvalidArgument("synthetic fail index " + std::to_string(i) + " is not in [0, " +
                             std::to_string(options.size) + ")");
    }
  }
  return std::shared_ptr<const Source>(std::make_shared<SyntheticSource>(options));
}

}  // namespace stoker
