#include "stoker/sample_cap.h"

#include <gtest/gtest.h>

#include <string>

namespace stoker {
namespace {

TEST(SampleCapTest, DefaultAllowsEverything) {
  SampleCap cap;
  EXPECT_TRUE(cap.Allows(uint64_t{1} << 62));
}

TEST(SampleCapTest, RefusalNamesTheSizeTheCapAndTheBudget) {
  SampleCap cap{.bytes = 16u << 20, .budget_bytes = 64u << 20, .workers = 2};
  EXPECT_TRUE(cap.Allows(16u << 20));
  EXPECT_FALSE(cap.Allows((16u << 20) + 1));
  Status st = cap.Refuse("a file of this size", 3u << 30, "reading it");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsSampleError(st));
  const std::string& m = st.message();
  for (const char* part : {"a file of this size", "3.0 GiB", "3221225472 bytes", "16.0 MiB",
                           "memory budget of 64.0 MiB", "2 workers", "refused before reading it"}) {
    EXPECT_NE(m.find(part), std::string::npos) << part << " in " << m;
  }
}

}  // namespace
}  // namespace stoker
