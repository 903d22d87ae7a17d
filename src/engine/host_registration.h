#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "stoker/status.h"

// What the engine exports for page-locking host memory that it did not
// allocate (pin_memory over a worker process's shared-memory segment): load
// the CUDA runtime once, then register each range. The runtime's calls stay
// the engine's (engine/cuda_runtime.h); here it is an opaque handle.

namespace stoker {

class CudaRuntime;

/// The CUDA runtime that HostRegistration::Make registers with, loaded as the
/// loader loads it for pin_memory ($STOKER_CUDART, else libcudart);
/// kUnavailable naming every library tried when none loads. Thread-safe.
Result<std::shared_ptr<const CudaRuntime>> LoadCudaRuntime();

/// A host range page-locked with cudaHostRegister (pin_memory), unregistered
/// when destroyed; held by pointer (neither copied nor moved).
class HostRegistration {
 public:
  /// Registers `bytes` at `addr`; `what` names the range in errors, which
  /// also name option 'pin_memory' and the runtime's cause.
  static Result<std::unique_ptr<HostRegistration>> Make(std::shared_ptr<const CudaRuntime> cuda,
                                                        void* addr, size_t bytes,
                                                        const std::string& what);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  HostRegistration(std::shared_ptr<const CudaRuntime> cuda, void* addr)
      : cuda_(std::move(cuda)), addr_(addr) {}
  std::shared_ptr<const CudaRuntime> cuda_;
  void* addr_;
};

}  // namespace stoker
