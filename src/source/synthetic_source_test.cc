#include "source/synthetic_source.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace stoker {
namespace {

TEST(SyntheticSourceTest, RecordsArePureFunctionsOfIndex) {
  SyntheticOptions o;
  o.size = 100;
  o.sample_bytes = 37;
  o.num_classes = 7;
  auto src = MakeSyntheticSource(o);
  ASSERT_TRUE(src.ok());
  ReadBuffer b1, b2;
  Record r1, r2;
  ASSERT_TRUE((*src)->Read(42, b1, &r1).ok());
  std::vector<std::byte> first(r1.bytes.begin(), r1.bytes.end());
  ASSERT_TRUE((*src)->Read(43, b2, &r2).ok());
  ASSERT_TRUE((*src)->Read(42, b2, &r2).ok());
  EXPECT_EQ(r2.bytes.size(), 37u);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), r2.bytes.begin()));
  EXPECT_EQ(r2.label, 42 % 7);
  EXPECT_EQ((*src)->Key(42), "synthetic:42");
}

// A read waiting out an hour's latency ends at Cancel, as do the reads
// after it: a stopped run need not wait for them.
TEST(SyntheticSourceTest, CancelEndsTheSlowReadsWaitingAndTheOnesAfter) {
  SyntheticOptions o;
  o.size = 10;
  auto inner = MakeSyntheticSource(o);
  ASSERT_TRUE(inner.ok());
  SlowSource slow(*inner, std::chrono::hours(1));
  Status waiting;
  std::thread reader([&] {
    ReadBuffer b;
    Record r;
    waiting = slow.Read(3, b, &r);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // most likely waiting by now
  slow.Cancel();
  reader.join();
  EXPECT_EQ(waiting.code(), StatusCode::kCancelled) << waiting.ToString();
  EXPECT_NE(waiting.message().find("synthetic:3"), std::string::npos) << waiting.ToString();
  ReadBuffer b;
  Record r;
  EXPECT_EQ(slow.Read(4, b, &r).code(), StatusCode::kCancelled);
}

TEST(SyntheticSourceTest, InjectedFailureNamesTheKey) {
  SyntheticOptions o;
  o.size = 10;
  o.fail_indices = {3};
  auto src = MakeSyntheticSource(o);
  ReadBuffer b;
  Record r;
  Status s = (*src)->Read(3, b, &r);
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("synthetic:3"), std::string::npos);
  EXPECT_TRUE((*src)->Read(4, b, &r).ok());
}

TEST(SyntheticSourceTest, SampleOverTheReadCapIsRefusedBeforeFilling) {
  SyntheticOptions o;
  o.size = 10;
  o.sample_bytes = 4096;
  auto src = MakeSyntheticSource(o);
  ASSERT_TRUE(src.ok());
  ReadBuffer b;
  b.cap.bytes = 4095;
  Record r;
  Status s = (*src)->Read(3, b, &r);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("synthetic:3"), std::string::npos) << s.message();
  EXPECT_EQ(b.bytes.capacity(), 0u);
  b.cap.bytes = 4096;
  EXPECT_TRUE((*src)->Read(3, b, &r).ok());
}

TEST(SyntheticSourceTest, RejectsBadOptions) {
  SyntheticOptions o;
  o.size = 0;
  auto src = MakeSyntheticSource(o);
  ASSERT_FALSE(src.ok());
  EXPECT_NE(src.status().message().find("size"), std::string::npos);
}

}  // namespace
}  // namespace stoker
