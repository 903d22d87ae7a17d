#pragma once

// Drives the fake CUDA runtime (fake_cudart.cc) from a test: points
// STOKER_CUDART at it, loads it (the same handle the loader will get) and
// reaches its knobs, counters and calls.

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <string>

namespace stoker::testing {

class FakeCudart {
 public:
  /// Points STOKER_CUDART at the fake and resets its knobs to one device,
  /// registration allowed, cudaMalloc unlimited, no copy delay.
  FakeCudart() {
    setenv("STOKER_CUDART", STOKER_FAKE_CUDART, 1);
    handle_ = dlopen(STOKER_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle_, nullptr) << dlerror();
    set_ = reinterpret_cast<SetFn>(Sym("fake_cudart_set"));
    get_ = reinterpret_cast<GetFn>(Sym("fake_cudart_get"));
    event_synchronize = reinterpret_cast<int (*)(void*)>(Sym("cudaEventSynchronize"));
    stream_create = reinterpret_cast<int (*)(void**, unsigned)>(Sym("cudaStreamCreateWithFlags"));
    stream_destroy = reinterpret_cast<int (*)(void*)>(Sym("cudaStreamDestroy"));
    stream_synchronize = reinterpret_cast<int (*)(void*)>(Sym("cudaStreamSynchronize"));
    memcpy_async =
        reinterpret_cast<int (*)(void*, const void*, size_t, int, void*)>(Sym("cudaMemcpyAsync"));
    Set("devices", 1);
    Set("refuse_register", 0);
    Set("malloc_budget", -1);
    Set("copy_delay_us", 0);
    Set("free_bytes", int64_t{1} << 30);
  }
  ~FakeCudart() { unsetenv("STOKER_CUDART"); }  // the library stays loaded, as the loader's does
  FakeCudart(const FakeCudart&) = delete;
  FakeCudart& operator=(const FakeCudart&) = delete;

  void Set(const std::string& knob, int64_t value) {
    EXPECT_GE(set_(knob.c_str(), value), 0) << "no knob " << knob;
  }
  int64_t Get(const std::string& counter) const { return get_(counter.c_str()); }

  // Calls of the fake runtime, for a test that plays the consumer's stream.
  int (*event_synchronize)(void* event) = nullptr;
  int (*stream_create)(void** stream, unsigned flags) = nullptr;
  int (*stream_destroy)(void* stream) = nullptr;
  int (*stream_synchronize)(void* stream) = nullptr;
  int (*memcpy_async)(void* dst, const void* src, size_t n, int kind, void* stream) = nullptr;

 private:
  using SetFn = int64_t (*)(const char*, int64_t);
  using GetFn = int64_t (*)(const char*);
  void* Sym(const char* name) {
    void* p = handle_ != nullptr ? dlsym(handle_, name) : nullptr;
    EXPECT_NE(p, nullptr) << name;
    return p;
  }
  void* handle_ = nullptr;
  SetFn set_ = nullptr;
  GetFn get_ = nullptr;
};

}  // namespace stoker::testing
