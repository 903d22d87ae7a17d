#include "stoker/gpu_sampler.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace stoker {

// NVML's ABI for the calls used here (nvml.h), so that the build needs no
// CUDA: nvmlReturn_t is an int (0: success), nvmlDevice_t a pointer.
struct GpuSampler::Api {
  struct Memory {  // nvmlMemory_t
    unsigned long long total, free, used;
  };
  struct Utilization {  // nvmlUtilization_t
    unsigned int gpu, memory;
  };
  using Device = void*;
  int (*init)();
  int (*shutdown)();
  int (*get_count)(unsigned*);
  int (*get_handle)(unsigned, Device*);
  int (*get_memory)(Device, Memory*);
  int (*get_utilization)(Device, Utilization*);
  int (*get_pcie_throughput)(Device, int, unsigned*);  // KB/s
};

namespace {

constexpr int kPcieTxBytes = 0;  // NVML_PCIE_UTIL_TX_BYTES
constexpr int kPcieRxBytes = 1;  // NVML_PCIE_UTIL_RX_BYTES

template <typename Fn>
bool Bind(void* library, const char* name, Fn*& fn) {
  fn = reinterpret_cast<Fn*>(::dlsym(library, name));
  return fn != nullptr;
}

}  // namespace

Result<std::unique_ptr<GpuSampler>> GpuSampler::Open() {
  const char* forced = std::getenv("STOKER_NVML");
  const std::string name = forced != nullptr && *forced != '\0' ? forced : "libnvidia-ml.so.1";
  void* library = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    return Unavailable("no GPU (NVML not found: " + (why != nullptr ? std::string(why) : name) +
                       ")");
  }
  auto api = std::make_unique<Api>();
  if (!Bind(library, "nvmlInit_v2", api->init) || !Bind(library, "nvmlShutdown", api->shutdown) ||
      !Bind(library, "nvmlDeviceGetCount_v2", api->get_count) ||
      !Bind(library, "nvmlDeviceGetHandleByIndex_v2", api->get_handle) ||
      !Bind(library, "nvmlDeviceGetMemoryInfo", api->get_memory) ||
      !Bind(library, "nvmlDeviceGetUtilizationRates", api->get_utilization) ||
      !Bind(library, "nvmlDeviceGetPcieThroughput", api->get_pcie_throughput)) {
    ::dlclose(library);
    return Unavailable("no GPU (NVML in " + name + " lacks a call stoker uses)");
  }
  if (int rc = api->init(); rc != 0) {
    ::dlclose(library);
    return Unavailable("no GPU (nvmlInit_v2 failed with NVML error " + std::to_string(rc) + ")");
  }
  unsigned count = 0;
  if (api->get_count(&count) != 0 || count == 0) {
    api->shutdown();
    ::dlclose(library);
    return Unavailable("no GPU (NVML reports none)");
  }
  return std::unique_ptr<GpuSampler>(new GpuSampler(library, std::move(api), count));
}

GpuSampler::GpuSampler(void* library, std::unique_ptr<Api> api, unsigned count)
    : library_(library), api_(std::move(api)), count_(count) {}

GpuSampler::~GpuSampler() {
  api_->shutdown();
  ::dlclose(library_);
}

std::vector<GpuUsage> GpuSampler::Sample(bool pcie) const {
  std::vector<GpuUsage> out;
  for (unsigned i = 0; i < count_; ++i) {
    GpuUsage u;
    u.index = static_cast<int>(i);
    Api::Device device = nullptr;
    if (api_->get_handle(i, &device) == 0) {
      Api::Utilization util{};
      if (api_->get_utilization(device, &util) == 0) {
        u.utilization_percent = static_cast<int>(util.gpu);
      }
      Api::Memory memory{};
      if (api_->get_memory(device, &memory) == 0) {
        u.memory_used_bytes = static_cast<int64_t>(memory.used);
        u.memory_total_bytes = static_cast<int64_t>(memory.total);
      }
      unsigned kb_per_s = 0;
      if (pcie && api_->get_pcie_throughput(device, kPcieRxBytes, &kb_per_s) == 0) {
        u.pcie_rx_bytes_per_s = kb_per_s * 1024.0;
      }
      if (pcie && api_->get_pcie_throughput(device, kPcieTxBytes, &kb_per_s) == 0) {
        u.pcie_tx_bytes_per_s = kb_per_s * 1024.0;
      }
    }
    out.push_back(u);
  }
  return out;
}

}  // namespace stoker
