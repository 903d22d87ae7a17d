#include "stoker/gpu_sampler.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace stoker {
namespace {

// Sets an environment variable for the length of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(GpuSamplerTest, ReadsEveryGpuFromNvml) {
  ScopedEnv env("STOKER_NVML", STOKER_FAKE_NVML);
  auto sampler = GpuSampler::Open();
  ASSERT_TRUE(sampler.ok()) << sampler.status().ToString();
  const auto gpus = (*sampler)->Sample(/*pcie=*/true);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].utilization_percent, 31);
  EXPECT_EQ(gpus[1].memory_used_bytes, int64_t{2} << 30);
  EXPECT_EQ(gpus[1].memory_total_bytes, int64_t{8} << 30);
  EXPECT_DOUBLE_EQ(gpus[1].pcie_rx_bytes_per_s, 2000 * 1024.0);
  EXPECT_DOUBLE_EQ(gpus[1].pcie_tx_bytes_per_s, 1000 * 1024.0);
  // Without PCIe (it takes NVML ~20 ms a direction), those stay unknown.
  const auto quick = (*sampler)->Sample(/*pcie=*/false);
  EXPECT_EQ(quick[0].utilization_percent, 30);
  EXPECT_EQ(quick[0].pcie_rx_bytes_per_s, -1);
}

TEST(GpuSamplerTest, NoNvmlSaysSo) {
  ScopedEnv env("STOKER_NVML", "/nonexistent/libnvidia-ml.so.1");
  auto sampler = GpuSampler::Open();
  ASSERT_FALSE(sampler.ok());
  EXPECT_EQ(sampler.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(sampler.status().message().rfind("no GPU (NVML not found: ", 0), 0u)
      << sampler.status().ToString();
}

}  // namespace
}  // namespace stoker
