// A fake CUDA runtime for tests: the calls stoker's CudaRuntime binds, with
// the ordering rules of the real one and none of its hardware. "Device
// memory" is host memory; each stream is a thread that runs its operations
// in order; an event completes when its stream reaches it. It counts what
// tests check (registrations, copies, copies whose source changed before
// they ran) and can be told to fail (fake_cudart_set, below).
//
// Built as a shared library only for tests, loaded by dlopen through
// STOKER_CUDART; a test reaches its counters with dlsym on the same handle.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace {

// cudaError_t values.
constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kMemoryAllocation = 2;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;
constexpr int kNotReady = 600;
constexpr int kAlreadyRegistered = 712;
constexpr int kNotRegistered = 713;
constexpr int kNotPermitted = 800;

// Settings (fake_cudart_set) and counters (fake_cudart_get), by name.
struct Knobs {
  std::atomic<int64_t> devices{1};
  std::atomic<int64_t> refuse_register{0};   // 1: cudaHostRegister fails; > 1: with that code
  std::atomic<int64_t> malloc_budget{-1};    // cudaMalloc calls left; -1: no limit
  std::atomic<int64_t> copy_delay_us{0};     // each copy waits this long on its stream
  std::atomic<int64_t> free_bytes{1 << 30};  // cudaMemGetInfo's free
  // Counters.
  std::atomic<int64_t> registrations{0};
  std::atomic<int64_t> unregistrations{0};
  std::atomic<int64_t> double_registrations{0};
  std::atomic<int64_t> mallocs{0};
  std::atomic<int64_t> frees{0};
  std::atomic<int64_t> copies{0};
  std::atomic<int64_t> pageable_copies{0};  // from memory not registered
  std::atomic<int64_t> torn_copies{0};      // source changed between enqueue and run
};
Knobs g;

std::atomic<int64_t>* Knob(const std::string& name) {
  static const std::map<std::string, std::atomic<int64_t>*> knobs = {
      {"devices", &g.devices},
      {"refuse_register", &g.refuse_register},
      {"malloc_budget", &g.malloc_budget},
      {"copy_delay_us", &g.copy_delay_us},
      {"free_bytes", &g.free_bytes},
      {"registrations", &g.registrations},
      {"unregistrations", &g.unregistrations},
      {"double_registrations", &g.double_registrations},
      {"mallocs", &g.mallocs},
      {"frees", &g.frees},
      {"copies", &g.copies},
      {"pageable_copies", &g.pageable_copies},
      {"torn_copies", &g.torn_copies},
  };
  auto it = knobs.find(name);
  return it == knobs.end() ? nullptr : it->second;
}

std::mutex g_registered_mu;
std::map<const std::byte*, size_t> g_registered;  // page-locked ranges by start

bool Registered(const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard lock(g_registered_mu);
  auto it = g_registered.upper_bound(b);
  if (it == g_registered.begin()) return false;
  --it;
  return b + n <= it->first + it->second;
}

uint64_t Hash(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

thread_local int t_device = 0;

}  // namespace

struct CUevent_st {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records asked
  uint64_t completed = 0;  // records reached by their stream
};

// A stream: one thread running queued operations in order.
struct CUstream_st {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  bool stopping = false;
  std::thread thread;

  CUstream_st() : thread([this] { Run(); }) {}
  ~CUstream_st() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    thread.join();
  }
  void Push(std::function<void()> op) {
    {
      std::lock_guard lock(mu);
      ops.push_back(std::move(op));
    }
    cv.notify_all();
  }
  void Run() {
    std::unique_lock lock(mu);
    while (true) {
      cv.wait(lock, [this] { return stopping || !ops.empty(); });
      if (ops.empty()) return;  // stopping, all done
      auto op = std::move(ops.front());
      ops.pop_front();
      lock.unlock();
      op();
      lock.lock();
    }
  }
};

namespace {

// The null stream runs its operations on the caller, at once.
void Enqueue(CUstream_st* stream, std::function<void()> op) {
  if (stream == nullptr) {
    op();
  } else {
    stream->Push(std::move(op));
  }
}

}  // namespace

extern "C" {

// Test control: set a knob (0; -1 for an unknown name) / read a knob or
// counter (-1 for an unknown name).
__attribute__((visibility("default"))) int64_t fake_cudart_set(const char* name, int64_t value) {
  auto* k = Knob(name);
  if (k == nullptr) return -1;
  k->store(value);
  return 0;
}
__attribute__((visibility("default"))) int64_t fake_cudart_get(const char* name) {
  auto* k = Knob(name);
  return k == nullptr ? -1 : k->load();
}

int cudaGetDeviceCount(int* count) {
  *count = static_cast<int>(g.devices.load());
  return *count == 0 ? kNoDevice : kSuccess;
}
int cudaGetDevice(int* device) {
  *device = t_device;
  return kSuccess;
}
int cudaSetDevice(int device) {
  if (device < 0 || device >= g.devices.load()) return kInvalidDevice;
  t_device = device;
  return kSuccess;
}

int cudaHostRegister(void* p, size_t n, unsigned) {
  if (const int64_t refuse = g.refuse_register.load(); refuse != 0) {
    return refuse == 1 ? kNotPermitted : static_cast<int>(refuse);
  }
  std::lock_guard lock(g_registered_mu);
  if (!g_registered.emplace(static_cast<std::byte*>(p), n).second) {
    g.double_registrations.fetch_add(1);
    return kAlreadyRegistered;
  }
  g.registrations.fetch_add(1);
  return kSuccess;
}
int cudaHostUnregister(void* p) {
  std::lock_guard lock(g_registered_mu);
  if (g_registered.erase(static_cast<std::byte*>(p)) == 0) return kNotRegistered;
  g.unregistrations.fetch_add(1);
  return kSuccess;
}

int cudaMalloc(void** p, size_t n) {
  int64_t left = g.malloc_budget.load();
  while (left >= 0) {
    if (left == 0) return kMemoryAllocation;
    if (g.malloc_budget.compare_exchange_weak(left, left - 1)) break;
  }
  *p = std::malloc(std::max<size_t>(n, 1));
  if (*p == nullptr) return kMemoryAllocation;
  g.mallocs.fetch_add(1);
  return kSuccess;
}
int cudaFree(void* p) {
  if (p != nullptr) g.frees.fetch_add(1);
  std::free(p);
  return kSuccess;
}
int cudaMemGetInfo(size_t* free, size_t* total) {
  *free = static_cast<size_t>(g.free_bytes.load());
  *total = *free * 2;
  return kSuccess;
}

int cudaStreamCreateWithFlags(CUstream_st** stream, unsigned) {
  *stream = new CUstream_st();
  return kSuccess;
}
int cudaStreamDestroy(CUstream_st* stream) {
  delete stream;  // runs what was queued first
  return kSuccess;
}
int cudaStreamSynchronize(CUstream_st* stream) {
  if (stream == nullptr) return kSuccess;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  stream->Push([&] {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  return kSuccess;
}

int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, CUstream_st* stream) {
  if (kind != 1) return kInvalidValue;  // host to device only
  // A page-locked source is a batch buffer, final when its copy is asked
  // for: what the copy reads later must be the same bytes. (Another source,
  // such as a test reading "device memory" back, may still be being written
  // by an earlier operation: it is read only when the copy runs.)
  const bool pinned = Registered(src, n);
  if (!pinned) g.pageable_copies.fetch_add(1);
  const uint64_t expected = pinned ? Hash(src, n) : 0;
  Enqueue(stream, [dst, src, n, expected, pinned] {
    if (int64_t us = g.copy_delay_us.load(); us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
    std::memcpy(dst, src, n);
    if (pinned && Hash(dst, n) != expected) g.torn_copies.fetch_add(1);
    g.copies.fetch_add(1);
  });
  return kSuccess;
}

int cudaEventCreateWithFlags(CUevent_st** event, unsigned) {
  *event = new CUevent_st();
  return kSuccess;
}
int cudaEventDestroy(CUevent_st* event) {
  delete event;
  return kSuccess;
}
int cudaEventRecord(CUevent_st* event, CUstream_st* stream) {
  uint64_t target = 0;
  {
    std::lock_guard lock(event->mu);
    target = ++event->recorded;
  }
  Enqueue(stream, [event, target] {
    std::lock_guard lock(event->mu);
    event->completed = std::max(event->completed, target);
    event->cv.notify_all();
  });
  return kSuccess;
}
int cudaEventQuery(CUevent_st* event) {
  std::lock_guard lock(event->mu);
  return event->completed >= event->recorded ? kSuccess : kNotReady;
}
int cudaEventSynchronize(CUevent_st* event) {
  std::unique_lock lock(event->mu);
  const uint64_t target = event->recorded;
  event->cv.wait(lock, [&] { return event->completed >= target; });
  return kSuccess;
}
int cudaStreamWaitEvent(CUstream_st* stream, CUevent_st* event, unsigned) {
  uint64_t target = 0;
  {
    std::lock_guard lock(event->mu);
    target = event->recorded;
  }
  Enqueue(stream, [event, target] {
    std::unique_lock lock(event->mu);
    event->cv.wait(lock, [&] { return event->completed >= target; });
  });
  return kSuccess;
}

const char* cudaGetErrorString(int rc) {
  switch (rc) {
    case kSuccess:
      return "no error";
    case kInvalidValue:
      return "invalid argument";
    case kMemoryAllocation:
      return "out of memory";
    case kNoDevice:
      return "no CUDA-capable device is detected";
    case kInvalidDevice:
      return "invalid device ordinal";
    case kNotReady:
      return "device not ready";
    case kAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case kNotRegistered:
      return "pointer does not correspond to a registered memory region";
    case kNotPermitted:
      return "operation not permitted";
    default:
      return "unknown error";
  }
}

}  // extern "C"
