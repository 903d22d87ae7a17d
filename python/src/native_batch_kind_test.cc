#include "native_batch_kind.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/sample_kind.h"
#include "process_workers.h"
#include "stoker/synthetic.h"
#include "worker_protocol.h"

namespace stoker::python {
namespace {

using protocol::NativeBatchWord;

struct Fixture {
  Fixture() {
    SyntheticOptions o;
    o.size = 20;
    o.sample_bytes = 16;
    o.num_classes = 3;
    o.fail_indices = {7};
    source = MakeSyntheticSource(o).value();
    transform = MakeRawTransform({{16}, DType::kUInt8}, /*mix_rng=*/true).value();
    batches = std::make_shared<EpochBatches>(2);
  }
  std::shared_ptr<const Source> source;
  std::shared_ptr<const Transform> transform;
  std::shared_ptr<EpochBatches> batches;
};

int64_t Word(const std::vector<std::byte>& out, int word) {
  int64_t v;
  std::memcpy(&v, out.data() + word * sizeof(int64_t), sizeof v);
  return v;
}

TEST(NativeBatchKindTest, WritesTheBatchsSamplesAndLeavesOutFailures) {
  Fixture f;
  // Batch 0: indices 3, 7 (fails), 12; batch 1: index 5.
  ASSERT_TRUE(f.batches->Set(4, {3, 7, 12, 5}, {0, 3, 4}, 99).ok());
  NativeBatchKind kind(f.source, f.transform, f.batches, 3);
  EXPECT_EQ(kind.items(), 2);
  EXPECT_EQ(kind.labels_offset() % protocol::kDataAlign, 0u);
  EXPECT_EQ(kind.images_offset() % protocol::kDataAlign, 0u);
  std::vector<std::byte> out(kind.spec().bytes());
  auto worker = kind.NewWorker(WorkerPlace::kWorkerThread, SampleCap{});
  ItemOutcome outcome;
  ASSERT_TRUE(worker->Run(4, 0, out, &outcome).ok());
  EXPECT_EQ(Word(out, NativeBatchWord::kMagic), protocol::kNativeMagic);
  ASSERT_EQ(Word(out, NativeBatchWord::kSamples), 2);
  EXPECT_EQ(Word(out, NativeBatchWord::kAsked), 3);
  EXPECT_EQ(Word(out, NativeBatchWord::kEpoch), 4);
  EXPECT_EQ(Word(out, NativeBatchWord::kBatch), 0);
  EXPECT_EQ(outcome.samples, 2);
  ASSERT_EQ(outcome.failures.size(), 1u);
  EXPECT_EQ(outcome.failures[0].index, 7);
  EXPECT_EQ(outcome.failures[0].key, f.source->Key(7));
  const auto* detail =
      dynamic_cast<const SampleErrorDetail*>(outcome.failures[0].status.detail().get());
  ASSERT_NE(detail, nullptr);
  EXPECT_EQ(detail->index, 7);
  // Each sample as the engine's own worker makes it under the batch's seed.
  SampleWorker reference(*f.source, *f.transform, 0, SampleCap{});
  const uint64_t seed = static_cast<uint64_t>(f.batches->Get(4, 0).value().seed);
  const int64_t kept[] = {3, 12};
  const uint64_t place[] = {0, 2};  // their places in the batch {3, 7, 12}
  for (int k = 0; k < 2; ++k) {
    std::vector<std::byte> one(16);
    ItemOutcome o;
    ASSERT_TRUE(reference.RunSeeded(seed, 4, kept[k], place[k], one, &o).ok());
    EXPECT_EQ(Word(out, static_cast<int>(kind.labels_offset() / 8) + k), kept[k] % 3);
    EXPECT_EQ(std::memcmp(out.data() + kind.images_offset() + k * 16, one.data(), 16), 0);
  }
}

TEST(NativeBatchKindTest, AKeyPickedTwiceInABatchDrawsAgain) {
  // A sampler with replacement (or repeated augmentation) picks index 3
  // three times: three draws, not one copied; the same again when rerun.
  Fixture f;
  ASSERT_TRUE(f.batches->Set(0, {3, 3, 3}, {0, 3}, 5).ok());
  NativeBatchKind kind(f.source, f.transform, f.batches, 3);
  std::vector<std::byte> out(kind.spec().bytes()), again(kind.spec().bytes());
  ItemOutcome outcome, outcome_again;
  ASSERT_TRUE(
      kind.NewWorker(WorkerPlace::kWorkerThread, SampleCap{})->Run(0, 0, out, &outcome).ok());
  ASSERT_TRUE(kind.NewWorker(WorkerPlace::kWorkerThread, SampleCap{})
                  ->Run(0, 0, again, &outcome_again)
                  .ok());
  ASSERT_EQ(outcome.samples, 3);
  EXPECT_EQ(out, again);
  const std::byte* images = out.data() + kind.images_offset();
  for (int a = 0; a < 3; ++a) {
    for (int b = a + 1; b < 3; ++b) {
      EXPECT_NE(std::memcmp(images + a * 16, images + b * 16, 16), 0) << a << " and " << b;
    }
  }
}

TEST(NativeBatchKindTest, ABatchOverItsRoomFailsWhole) {
  Fixture f;
  ASSERT_TRUE(f.batches->Set(0, {1, 2, 3, 4}, {0, 4}, 1).ok());
  NativeBatchKind kind(f.source, f.transform, f.batches, 3);
  std::vector<std::byte> out(kind.spec().bytes());
  ItemOutcome outcome;
  Status st = kind.NewWorker(WorkerPlace::kConsumer, SampleCap{})->Run(0, 0, out, &outcome);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("batch_size of 3"), std::string::npos) << st.message();
}

TEST(NativeBatchKindTest, CancelWakesAWorkerWaitingForItsBatchList) {
  Fixture f;
  NativeBatchKind kind(f.source, f.transform, f.batches, 3);
  kind.Cancel();
  std::vector<std::byte> out(kind.spec().bytes());
  ItemOutcome outcome;
  Status st = kind.NewWorker(WorkerPlace::kWorkerThread, SampleCap{})->Run(0, 0, out, &outcome);
  EXPECT_EQ(st.code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace stoker::python
