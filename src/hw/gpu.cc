#include <dlfcn.h>

#include <array>

#include "hw/fact_readers.h"

namespace stoker::hw {
namespace {

// The few NVML declarations the probe needs, so that the build does not
// depend on CUDA: NVML is loaded at run time when the driver provides it.
// These match nvml.h's ABI (the _v2 entry points exist since driver 325).
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
constexpr NvmlReturn kNvmlSuccess = 0;
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*;  // nvmlDevice_t
struct NvmlMemory {                    // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlUtilization {  // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
constexpr unsigned int kNvmlNameBufferSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

struct Nvml {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  NvmlReturn (*get_count)(unsigned int*);
  NvmlReturn (*get_handle)(unsigned int, NvmlDevice*);
  NvmlReturn (*get_name)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*get_memory)(NvmlDevice, NvmlMemory*);
  NvmlReturn (*get_utilization)(NvmlDevice, NvmlUtilization*);
};

template <typename Fn>
bool Bind(void* library, const char* name, Fn*& fn) {
  fn = reinterpret_cast<Fn*>(::dlsym(library, name));
  return fn != nullptr;
}

// Owns the dlopen handle for one probe; NVML keeps its own reference count
// for init/shutdown, so concurrent probes do not disturb each other.
class NvmlLibrary {
 public:
  NvmlLibrary() : handle_(::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {}
  ~NvmlLibrary() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  void* handle() const { return handle_; }

 private:
  void* handle_;
};

}  // namespace

std::vector<MachineFacts::Gpu> ReadGpuFacts(Notes& notes) {
  std::vector<MachineFacts::Gpu> gpus;
  NvmlLibrary library;
  if (library.handle() == nullptr) return gpus;  // no NVIDIA driver: no GPUs to report
  Nvml nvml{};
  if (!Bind(library.handle(), "nvmlInit_v2", nvml.init) ||
      !Bind(library.handle(), "nvmlShutdown", nvml.shutdown) ||
      !Bind(library.handle(), "nvmlDeviceGetCount_v2", nvml.get_count) ||
      !Bind(library.handle(), "nvmlDeviceGetHandleByIndex_v2", nvml.get_handle) ||
      !Bind(library.handle(), "nvmlDeviceGetName", nvml.get_name) ||
      !Bind(library.handle(), "nvmlDeviceGetMemoryInfo", nvml.get_memory) ||
      !Bind(library.handle(), "nvmlDeviceGetUtilizationRates", nvml.get_utilization)) {
    notes.push_back("libnvidia-ml.so.1: a required NVML function is missing");
    return gpus;
  }
  if (NvmlReturn rc = nvml.init(); rc != kNvmlSuccess) {
    notes.push_back("libnvidia-ml.so.1: nvmlInit_v2 failed with code " + std::to_string(rc));
    return gpus;
  }
  unsigned int count = 0;
  if (NvmlReturn rc = nvml.get_count(&count); rc != kNvmlSuccess) {
    notes.push_back("NVML: nvmlDeviceGetCount_v2 failed with code " + std::to_string(rc));
    count = 0;
  }
  for (unsigned int i = 0; i < count; ++i) {
    MachineFacts::Gpu gpu;
    gpu.index = static_cast<int>(i);
    NvmlDevice device = nullptr;
    if (nvml.get_handle(i, &device) == kNvmlSuccess) {
      std::array<char, kNvmlNameBufferSize> name{};
      if (nvml.get_name(device, name.data(), kNvmlNameBufferSize) == kNvmlSuccess) {
        name.back() = '\0';
        gpu.name = std::string(name.data());
      }
      NvmlMemory memory{};
      if (nvml.get_memory(device, &memory) == kNvmlSuccess) {
        gpu.memory_total_bytes = memory.total;
        gpu.memory_used_bytes = memory.used;
      }
      NvmlUtilization utilization{};
      if (nvml.get_utilization(device, &utilization) == kNvmlSuccess) {
        gpu.utilization_percent = static_cast<int>(utilization.gpu);
      }
    }
    gpus.push_back(std::move(gpu));
  }
  nvml.shutdown();
  return gpus;
}

}  // namespace stoker::hw
