// Loader::Make's memory budget: one budget resolved for every loader, a batch
// that cannot fit refused at Make naming the options, and each worker's share
// of it handed to the sources and transforms as their per-sample cap.

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "stoker/defaults.h"
#include "stoker/loader.h"
#include "testing/loader_harness.h"

namespace stoker {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LoaderFactoryTest, ABatchThatCannotFitTwiceIsRefusedAtMakeNamingTheOptions) {
  for (int workers : {0, 2, kAutoWorkers}) {
    auto o = testing::SyntheticLoaderOptions(100, 10, 8);  // 80-byte batches
    o.workers = workers;
    // One delivered and one being written need 160, and a worker's sample 8 more.
    o.tuner.memory_budget_bytes = 167;
    auto loader = Loader::Make(o);
    ASSERT_FALSE(loader.ok()) << "workers " << workers;
    const Status& st = loader.status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    for (const char* part :
         {"option 'batch_size' = 10", "80 B", "samples, 8 B each", "memory budget of 167 B",
          "tuner option 'memory_budget_bytes' = 167"}) {
      EXPECT_TRUE(Has(st.message(), part)) << part << " in " << st.message();
    }
    o.tuner.memory_budget_bytes = 168;
    auto fits = Loader::Make(o);
    EXPECT_TRUE(fits.ok()) << fits.status().ToString();
  }
}

TEST(LoaderFactoryTest, TheDefaultBudgetIsResolvedForFixedWorkersToo) {
  // 1000 samples of 1 GiB: a TiB a batch, past any machine's default share.
  auto o = testing::SyntheticLoaderOptions(2000, 1000, size_t{1} << 30);
  o.workers = 2;
  auto loader = Loader::Make(o);
  ASSERT_FALSE(loader.ok());
  EXPECT_EQ(loader.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(loader.status().message(),
                  "% of available memory, the default of tuner option "
                  "'memory_budget_bytes'"))
      << loader.status().message();
}

// Sample 5 is 1 MiB, the others 16 bytes; Read refuses what its buffer's cap
// does not allow, as the real sources do.
class SizedSource final : public Source {
 public:
  int64_t size() const override { return 16; }
  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override {
    const size_t bytes = index == 5 ? size_t{1} << 20 : 16;
    if (!buffer.cap.Allows(bytes)) return buffer.cap.Refuse(Key(index) + ": a record", bytes, "");
    if (buffer.bytes.size() < bytes) buffer.bytes.resize(bytes);
    std::memset(buffer.bytes.data(), static_cast<int>(index), bytes);
    record->bytes = {buffer.bytes.data(), bytes};
    record->label = index;
    return Status::Ok();
  }
  std::string Key(int64_t index) const override { return "sized:" + std::to_string(index); }
};

LoaderOptions SizedOptions(ErrorPolicy policy) {
  LoaderOptions o;
  o.source = std::make_shared<SizedSource>();
  o.transform = *MakeRawTransform({{16}, DType::kUInt8});
  o.batch_size = 4;
  o.shuffle = false;
  o.workers = 2;
  o.on_error = policy;
  // 64-byte batches: the workers share about 256 KiB each.
  o.tuner.memory_budget_bytes = 512u << 10;
  return o;
}

TEST(LoaderFactoryTest, ASampleOverTheWorkersShareIsSkippedWithTheCapAsItsReason) {
  auto loader = testing::MakeLoader(SizedOptions(ErrorPolicy::kSkip));
  ASSERT_NE(loader, nullptr);
  auto batches = testing::DrainEpoch(*loader);
  int64_t delivered = 0;
  for (const auto& [index, b] : batches) delivered += static_cast<int64_t>(b.samples.size());
  EXPECT_EQ(delivered, 15);
  const auto skipped = loader->Skipped();
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].index, 5);
  EXPECT_EQ(skipped[0].key, "sized:5");
  EXPECT_TRUE(Has(skipped[0].reason, "per-sample cap")) << skipped[0].reason;
  EXPECT_TRUE(Has(skipped[0].reason, "memory budget of 512.0 KiB")) << skipped[0].reason;
  EXPECT_TRUE(Has(skipped[0].reason, "1.0 MiB")) << skipped[0].reason;
}

TEST(LoaderFactoryTest, UnderRaiseTheRefusalNamesTheSample) {
  auto loader = testing::MakeLoader(SizedOptions(ErrorPolicy::kRaise));
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->Next().ok());  // batch 0: samples 0-3
  auto r = loader->Next();           // batch 1 holds sample 5
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(r.status().message(), "sample 5 (sized:5)")) << r.status().message();
  EXPECT_TRUE(Has(r.status().message(), "per-sample cap")) << r.status().message();
}

}  // namespace
}  // namespace stoker
