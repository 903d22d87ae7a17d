#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stoker/status.h"

namespace stoker {

/// One GPU's use at one moment, from NVML. A figure NVML does not give is -1.
struct GpuUsage {
  int index = 0;
  int utilization_percent = -1;  // kernels running, over NVML's last sample period
  int64_t memory_used_bytes = -1;
  int64_t memory_total_bytes = -1;
  double pcie_rx_bytes_per_s = -1;  // host to device
  double pcie_tx_bytes_per_s = -1;  // device to host
};

/// Samples every GPU's utilisation, memory and PCIe throughput through NVML,
/// loaded at run time (libnvidia-ml.so.1, or the path in $STOKER_NVML).
/// Shown next to the consumer's stall (live view, stats, the tuner's trace);
/// never an input of the tuner's decisions. Safe from any thread.
class GpuSampler {
 public:
  /// kUnavailable "no GPU (NVML not found: <reason>)" where the driver's
  /// library is missing or reports no GPU; a caller shows that once.
  static Result<std::unique_ptr<GpuSampler>> Open();
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  /// Every GPU now. `pcie`: also PCIe throughput, which NVML measures over
  /// about 20 ms per direction and GPU (this call blocks that long).
  std::vector<GpuUsage> Sample(bool pcie) const;

  struct Api;  // the bound NVML calls (gpu_sampler.cc)

 private:
  GpuSampler(void* library, std::unique_ptr<Api> api, unsigned count);
  void* library_;
  std::unique_ptr<Api> api_;
  unsigned count_;
};

}  // namespace stoker
