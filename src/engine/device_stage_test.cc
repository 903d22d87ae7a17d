// The device path against the fake CUDA runtime (tests/testing/fake_cudart.cc):
// page-locking once per buffer, copies that match the host batch across
// resizes, no host or device buffer reused before the device is done with
// it, the device prefetch bound, and the error of each failure.

#include "engine/device_stage.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "stoker/loader.h"
#include "testing/fake_cudart.h"
#include "testing/loader_harness.h"
#include "testing/untuned_loader.h"

namespace stoker {
namespace {

using testing::BatchCopy;
using testing::FakeCudart;

LoaderOptions DeviceOptions(int workers) {
  auto o = testing::SyntheticLoaderOptions(/*size=*/300, /*batch_size=*/8, /*sample_bytes=*/512);
  o.workers = workers;
  o.seed = 7;
  o.device = 0;
  return o;
}

// The batch's device bytes, once its copy is done.
std::vector<std::byte> DeviceBytes(FakeCudart& cuda, const Batch& b) {
  EXPECT_EQ(cuda.event_synchronize(b.ready_event()), 0);
  const auto* p = static_cast<const std::byte*>(b.device_data());
  return {p, p + b.data().size()};
}

TEST(DeviceStageTest, PinsEachBatchBufferOnceAndUnpinsItWhenFreed) {
  FakeCudart cuda;
  const int64_t registered = cuda.Get("registrations");
  const int64_t unregistered = cuda.Get("unregistrations");
  auto o = DeviceOptions(/*workers=*/3);
  o.device = LoaderOptions::kNoDevice;
  o.pin_memory = true;
  int64_t pinned = 0;
  {
    auto loader = testing::MakeUntunedLoader(o);
    ASSERT_NE(loader, nullptr);
    for (int epoch = 0; epoch < 3; ++epoch) EXPECT_EQ(testing::DrainEpoch(*loader).size(), 38u);
    pinned = loader->Metrics().pinned_buffers;
    EXPECT_GT(pinned, 0);
    // Three epochs of 38 batches went through far fewer buffers, each
    // registered once.
    EXPECT_LT(pinned, 38);
    EXPECT_EQ(cuda.Get("registrations") - registered, pinned);
  }
  EXPECT_EQ(cuda.Get("double_registrations"), 0);
  EXPECT_EQ(cuda.Get("unregistrations") - unregistered, pinned);
}

TEST(DeviceStageTest, DeviceCopiesMatchTheHostBatchesAcrossResizes) {
  FakeCudart cuda;
  cuda.Set("copy_delay_us", 300);  // copies lag behind the workers
  auto reference_options = DeviceOptions(/*workers=*/0);
  reference_options.device = LoaderOptions::kNoDevice;
  auto reference = testing::MakeUntunedLoader(reference_options);
  ASSERT_NE(reference, nullptr);
  const auto expected = testing::DrainEpoch(*reference);

  const int64_t pageable = cuda.Get("pageable_copies");
  const int64_t torn = cuda.Get("torn_copies");
  auto loader = testing::MakeUntunedLoader(DeviceOptions(/*workers=*/1));
  ASSERT_NE(loader, nullptr);
  const int schedule[] = {4, 0, 2, 7, 1, 3};
  std::map<int64_t, BatchCopy> got;
  int64_t n = 0;
  while (true) {
    if (n % 5 == 0) {
      ASSERT_TRUE(loader->Resize(schedule[(n / 5) % 6]).ok());
    }
    auto r = loader->Next();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!r->has_value()) break;
    const Batch& b = **r;
    EXPECT_EQ(b.index(), n) << "out of order";
    ASSERT_NE(b.device_data(), nullptr);
    EXPECT_EQ(DeviceBytes(cuda, b), std::vector<std::byte>(b.data().begin(), b.data().end()))
        << "batch " << b.index();
    EXPECT_TRUE(got.emplace(b.index(), testing::Copy(b)).second)
        << "batch " << b.index() << " twice";
    ++n;
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(cuda.Get("torn_copies"), torn);
  EXPECT_EQ(cuda.Get("pageable_copies"), pageable);  // every copy was from a pinned buffer
  const LoaderMetrics m = loader->Metrics();         // the next epoch may be copied ahead
  EXPECT_EQ(m.device_copies - m.device_prefetched, n);
}

// A consumer that drops each batch at once, without waiting for its copy:
// the host buffer goes back to the pool and is refilled by a worker, which
// must not happen before the (delayed) copy has read it. So must abandoning
// an epoch whose batches were copied ahead.
TEST(DeviceStageTest, AHostBufferIsNotReusedBeforeItsCopyHasRun) {
  FakeCudart cuda;
  cuda.Set("copy_delay_us", 2000);
  auto o = DeviceOptions(/*workers=*/3);
  o.prefetch_batches = 2;  // few buffers: each is reused often
  auto loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  const int64_t copies = cuda.Get("copies");
  const int64_t torn = cuda.Get("torn_copies");
  int64_t delivered = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    while (true) {
      auto r = loader->Next();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      ++delivered;
    }
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader->Next().ok());
  ASSERT_TRUE(loader->SetEpoch(5).ok());  // drops batches copied ahead
  ASSERT_TRUE(loader->Next().ok());
  loader.reset();
  EXPECT_GE(cuda.Get("copies") - copies, delivered);
  EXPECT_EQ(cuda.Get("torn_copies"), torn);
}

// The consumer's stream still reads a released batch's device buffer (a
// delayed copy out of it stands for a kernel): the loader must not write the
// next batch into that buffer before the consumer's stream is done with it.
TEST(DeviceStageTest, AReleasedDeviceBufferIsRewrittenOnlyAfterTheConsumersStream) {
  FakeCudart cuda;
  cuda.Set("copy_delay_us", 1000);
  auto o = DeviceOptions(/*workers=*/2);
  o.device_prefetch_bytes = 1;  // no copies ahead: each device buffer is reused at once
  auto loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  void* stream = nullptr;
  ASSERT_EQ(cuda.stream_create(&stream, 1), 0);
  std::vector<std::vector<std::byte>> seen;     // what the consumer's stream read
  std::vector<std::vector<std::byte>> batches;  // what it should have read
  for (int i = 0; i < 12; ++i) {
    auto r = loader->Next();
    ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
    Batch b = std::move(**r);
    ASSERT_TRUE(b.WaitOn(stream).ok());
    batches.emplace_back(b.data().begin(), b.data().end());
    seen.emplace_back(b.data().size());
    ASSERT_EQ(cuda.memcpy_async(seen.back().data(), b.device_data(), b.data().size(), 1, stream),
              0);
  }  // each Batch is released here, its read still queued on `stream`
  ASSERT_EQ(cuda.stream_synchronize(stream), 0);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_TRUE(seen[i] == batches[i]) << "batch " << i;
  EXPECT_LE(loader->Metrics().device_copies_at_delivery, 12);
  loader.reset();
  cuda.stream_destroy(stream);
}

TEST(DeviceStageTest, TheDeviceBudgetBoundsCopiesAhead) {
  FakeCudart cuda;
  auto o = DeviceOptions(/*workers=*/4);
  o.prefetch_batches = 8;
  o.device_prefetch_bytes = 2 * 8 * 512;  // two batches
  auto loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  const int64_t mallocs = cuda.Get("mallocs");
  int64_t n = 0;
  while (true) {
    ASSERT_TRUE(loader->WaitReady(std::chrono::seconds(30)));
    const LoaderMetrics m = loader->Metrics();
    EXPECT_EQ(m.device_prefetch_batches, 2);
    EXPECT_LE(m.device_prefetched, 2);
    auto r = loader->Next();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!r->has_value()) break;
    ++n;
  }
  // Two ahead, one held, and one in hand while the next is copied.
  EXPECT_LE(cuda.Get("mallocs") - mallocs, 4);
  const LoaderMetrics m = loader->Metrics();  // the next epoch may be copied ahead
  EXPECT_EQ(m.device_copies - m.device_prefetched, n);

  // No room ahead: every copy is made at delivery.
  o.device_prefetch_bytes = 1;
  loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(testing::DrainEpoch(*loader).size(), 38u);
  EXPECT_EQ(loader->Metrics().device_copies_at_delivery, 38);
}

TEST(DeviceStageTest, PinMemoryWithoutAUsableDevicePinsNothingAndSaysWhy) {
  // As torch's DataLoader: without a GPU, nothing would copy the batches to
  // one. It was an error, so a script written for a GPU failed on a laptop.
  FakeCudart cuda;
  auto o = DeviceOptions(/*workers=*/1);
  o.device = LoaderOptions::kNoDevice;
  o.pin_memory = true;
  const int64_t before = cuda.Get("registrations");
  setenv("STOKER_CUDART", "/nonexistent/libcudart.so", 1);
  auto loader = testing::MakeUntunedLoader(o);
  setenv("STOKER_CUDART", STOKER_FAKE_CUDART, 1);
  ASSERT_NE(loader, nullptr);
  EXPECT_NE(loader->pin_skipped().find("/nonexistent/libcudart.so"), std::string::npos);
  EXPECT_EQ(testing::DrainEpoch(*loader).size(), 38u);
  EXPECT_EQ(loader->Metrics().pinned_buffers, 0);

  cuda.Set("devices", 0);
  loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  EXPECT_NE(loader->pin_skipped().find("no CUDA-capable device"), std::string::npos)
      << loader->pin_skipped();
  EXPECT_EQ(testing::DrainEpoch(*loader).size(), 38u);
  EXPECT_EQ(cuda.Get("registrations"), before);

  cuda.Set("devices", 1);
  loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->pin_skipped(), "");
  EXPECT_EQ(testing::DrainEpoch(*loader).size(), 38u);
  EXPECT_GT(cuda.Get("registrations"), before);
}

TEST(DeviceStageTest, DefaultBudgetIsAQuarterOfFreeDeviceMemory) {
  FakeCudart cuda;
  cuda.Set("free_bytes", 4 * 10 * 8 * 512);
  auto loader = testing::MakeUntunedLoader(DeviceOptions(/*workers=*/1));
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->Metrics().device_prefetch_batches, 10);
}

Status MakeError(const LoaderOptions& o) {
  auto made = testing::MakeUntuned(o);
  return made.ok() ? Status::Ok() : made.status();
}

TEST(DeviceStageTest, ErrorsNameTheOptionAndTheCause) {
  FakeCudart cuda;
  auto o = DeviceOptions(/*workers=*/1);

  setenv("STOKER_CUDART", "/nonexistent/libcudart.so", 1);
  Status st = MakeError(o);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("option 'device' = 0"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("/nonexistent/libcudart.so"), std::string::npos) << st.ToString();
  setenv("STOKER_CUDART", STOKER_FAKE_CUDART, 1);

  cuda.Set("devices", 0);
  st = MakeError(o);
  EXPECT_NE(st.message().find("option 'device' = 0: no"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("no CUDA-capable device"), std::string::npos) << st.ToString();
  cuda.Set("devices", 2);
  o.device = 2;
  st = MakeError(o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("option 'device' = 2 is out of range"), std::string::npos)
      << st.ToString();
  o.device = -2;
  EXPECT_NE(MakeError(o).message().find("option 'device'"), std::string::npos);
  o.device = 1;
  EXPECT_TRUE(MakeError(o).ok());

  cuda.Set("refuse_register", 1);
  st = MakeError(o);
  EXPECT_NE(st.message().find("option 'pin_memory'"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("cudaHostRegister"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("operation not permitted"), std::string::npos) << st.ToString();
  cuda.Set("refuse_register", 0);

  // Out of device memory: the batch cannot be delivered, and the loader says
  // so on every call after.
  cuda.Set("malloc_budget", 0);
  auto loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  for (int i = 0; i < 2; ++i) {
    auto r = loader->Next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(r.status().message().find("option 'device' = 1: out of device memory"),
              std::string::npos)
        << r.status().ToString();
    EXPECT_NE(r.status().message().find("cudaMalloc: out of memory"), std::string::npos)
        << r.status().ToString();
  }
}

TEST(DeviceStageTest, HostOnlyBatchesHaveNoDeviceSide) {
  auto o = DeviceOptions(/*workers=*/1);
  o.device = LoaderOptions::kNoDevice;
  auto loader = testing::MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  auto r = loader->Next();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((**r).device_data(), nullptr);
  EXPECT_EQ((**r).ready_event(), nullptr);
  EXPECT_EQ((**r).WaitOn(nullptr).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace stoker
