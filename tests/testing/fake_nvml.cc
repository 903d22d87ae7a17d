// A fake NVML for tests: two GPUs with fixed figures, loaded by
// GpuSampler::Open through STOKER_NVML. GPU i reports utilisation 30 + i %,
// i + 1 GiB used of 8 GiB, PCIe rx (i + 1) * 1000 KB/s and tx (i + 1) * 500.

#include <cstdint>

namespace {
struct Memory {
  unsigned long long total, free, used;
};
struct Utilization {
  unsigned int gpu, memory;
};
constexpr unsigned kGpus = 2;
constexpr unsigned long long kGiB = 1ull << 30;
int g_inits = 0;
}  // namespace

extern "C" {
int nvmlInit_v2() { return ++g_inits > 0 ? 0 : 1; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = kGpus;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** device) {
  if (i >= kGpus) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = reinterpret_cast<void*>(static_cast<uintptr_t>(i + 1));
  return 0;
}
static unsigned IndexOf(void* device) {
  return static_cast<unsigned>(reinterpret_cast<uintptr_t>(device)) - 1;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  m->total = 8 * kGiB;
  m->used = (IndexOf(device) + 1) * kGiB;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  u->gpu = 30 + IndexOf(device);
  u->memory = 0;
  return 0;
}
int nvmlDeviceGetPcieThroughput(void* device, int counter, unsigned* kb_per_s) {
  *kb_per_s = (IndexOf(device) + 1) * (counter == 1 ? 1000 : 500);
  return 0;
}
}  // extern "C"
