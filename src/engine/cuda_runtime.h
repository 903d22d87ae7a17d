#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "stoker/status.h"

namespace stoker {

// Opaque CUDA handles, spelled as the runtime's ABI has them (cudaStream_t,
// cudaEvent_t), so that the build needs no CUDA headers.
using CudaStream = struct CUstream_st*;
using CudaEvent = struct CUevent_st*;

/// The handful of CUDA runtime calls the loader uses, bound at run time from
/// libcudart (dlopen), so that one build runs with or without a GPU or driver.
/// Immutable once loaded; safe for concurrent use (the runtime is).
class CudaRuntime {
 public:
  // cudaError_t values the loader tells apart.
  static constexpr int kSuccess = 0;
  static constexpr int kErrorMemoryAllocation = 2;
  static constexpr int kErrorInsufficientDriver = 35;  // also: no driver at all
  static constexpr int kErrorNoDevice = 100;
  static constexpr int kErrorNotReady = 600;
  // Flags.
  static constexpr unsigned kStreamNonBlocking = 1;   // cudaStreamNonBlocking
  static constexpr unsigned kEventDisableTiming = 2;  // cudaEventDisableTiming
  static constexpr int kMemcpyHostToDevice = 1;       // cudaMemcpyHostToDevice

  /// Loads the runtime: the path in $STOKER_CUDART when set (and only it),
  /// else the first of libcudart.so, .so.13, .so.12, .so.11 that loads (one
  /// already in the process, such as PyTorch's, is found by its soname).
  /// kUnavailable naming every name tried and the loader's reason when none
  /// loads or a call is missing. The library stays loaded for the process's
  /// life: unloading it under a runtime's own threads would be unsafe.
  static Result<std::shared_ptr<const CudaRuntime>> Load();

  /// Ok for kSuccess; otherwise kUnavailable (kResourceExhausted for out of
  /// memory) "<call>: <cudaGetErrorString> (error <rc>)".
  Status Check(int rc, const std::string& call) const;
  /// The CUDA devices this process sees (0: none); an error when the runtime
  /// cannot count them (no driver), naming the library.
  Result<int> Devices() const;
  const std::string& path() const { return path_; }

  // The bound entry points, named after the calls (see the CUDA runtime API).
  struct Api {
    int (*cudaGetDeviceCount)(int*);
    int (*cudaGetDevice)(int*);
    int (*cudaSetDevice)(int);
    int (*cudaHostRegister)(void*, size_t, unsigned);
    int (*cudaHostUnregister)(void*);
    int (*cudaMalloc)(void**, size_t);
    int (*cudaFree)(void*);
    int (*cudaMemGetInfo)(size_t*, size_t*);
    int (*cudaStreamCreateWithFlags)(CudaStream*, unsigned);
    int (*cudaStreamDestroy)(CudaStream);
    int (*cudaStreamSynchronize)(CudaStream);
    int (*cudaStreamWaitEvent)(CudaStream, CudaEvent, unsigned);
    int (*cudaMemcpyAsync)(void*, const void*, size_t, int, CudaStream);
    int (*cudaEventCreateWithFlags)(CudaEvent*, unsigned);
    int (*cudaEventDestroy)(CudaEvent);
    int (*cudaEventRecord)(CudaEvent, CudaStream);
    int (*cudaEventQuery)(CudaEvent);
    int (*cudaEventSynchronize)(CudaEvent);
    const char* (*cudaGetErrorString)(int);
  };
  const Api& api() const { return api_; }

 private:
  CudaRuntime() = default;
  Api api_{};
  std::string path_;
};

/// Makes `device` current on this thread for its lifetime, then restores the
/// previous one, so that a consumer's thread (PyTorch's) keeps its device.
class CudaDeviceGuard {
 public:
  CudaDeviceGuard(const CudaRuntime& cuda, int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  /// The result of cudaSetDevice.
  const Status& status() const { return status_; }

 private:
  const CudaRuntime& cuda_;
  int previous_ = -1;
  Status status_;
};

}  // namespace stoker
