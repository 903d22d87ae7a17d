#include "remote_slots.h"

#include <algorithm>

namespace stoker::python {

void RemoteSlots::set_capacity(int slots) {
  MutexLock lock(mu_);
  capacity_ = std::max(0, slots);
}

void RemoteSlots::set_task_bytes(size_t bytes) {
  MutexLock lock(mu_);
  task_bytes_ = bytes;
}

size_t RemoteSlots::task_bytes() const {
  MutexLock lock(mu_);
  return task_bytes_;
}

int RemoteSlots::capacity() const {
  MutexLock lock(mu_);
  return capacity_;
}

void RemoteSlots::Resized(int workers, int remote) {
  MutexLock lock(mu_);
  workers_ = std::max(0, workers);
  remote_ = std::clamp(remote, 0, workers_);
}

int RemoteSlots::remote_target() const {
  MutexLock lock(mu_);
  return remote_;
}

bool RemoteSlots::Take(bool was_remote) {
  MutexLock lock(mu_);
  const bool local_room = local_busy_ < local_target();
  const bool remote_room = remote_busy_ < remote_;
  // Mid-resize both may be full: the batch is made here, as without a cluster.
  const bool remote = remote_room && (was_remote || !local_room);
  if (remote) {
    peak_ = std::max(peak_, ++remote_busy_);
  } else {
    ++local_busy_;
  }
  return remote;
}

void RemoteSlots::Done(bool remote) {
  MutexLock lock(mu_);
  --(remote ? remote_busy_ : local_busy_);
}

bool RemoteSlots::ClaimLocal() {
  MutexLock lock(mu_);
  if (local_claimed_ >= std::max(1, local_target())) return false;
  ++local_claimed_;
  return true;
}

void RemoteSlots::ReleaseLocal() {
  MutexLock lock(mu_);
  --local_claimed_;
}

int RemoteSlots::remote_busy() const {
  MutexLock lock(mu_);
  return remote_busy_;
}

int RemoteSlots::peak() const {
  MutexLock lock(mu_);
  return peak_;
}

}  // namespace stoker::python
