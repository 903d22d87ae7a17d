#include "epoch_batches.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace stoker::python {
namespace {

// Indices that fit in 32 bits are kept in 4 bytes each; any other epoch
// keeps its 8-byte indices. Either way a batch comes back as it was set.
TEST(EpochBatchesTest, BatchesComeBackAsSetWhateverTheIndicesWidth) {
  EpochBatches batches(2);
  const std::vector<int64_t> narrow{5, 0, INT32_MAX, 3};
  const std::vector<int64_t> wide{int64_t{1} << 40, 2, -1, INT32_MAX + int64_t{1}};
  ASSERT_TRUE(batches.Set(0, narrow, {0, 1, 4}, 11).ok());
  ASSERT_TRUE(batches.Set(1, wide, {0, 3, 4}, 11).ok());
  const auto b0 = batches.Get(0, 1);
  ASSERT_TRUE(b0.ok());
  EXPECT_EQ(b0->indices, (std::vector<int64_t>{0, INT32_MAX, 3}));
  EXPECT_EQ(b0->base_seed, 11);  // the epoch's, for the worker's get_worker_info().seed
  const auto w0 = batches.Get(1, 0);
  const auto w1 = batches.Get(1, 1);
  ASSERT_TRUE(w0.ok() && w1.ok());
  EXPECT_EQ(w0->indices, (std::vector<int64_t>{int64_t{1} << 40, 2, -1}));
  EXPECT_EQ(w1->indices, (std::vector<int64_t>{INT32_MAX + int64_t{1}}));
  ASSERT_TRUE(batches.Set(2, {}, {0, 0}, 11).ok());  // an epoch of one empty batch
  const auto empty = batches.Get(2, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->indices.empty());
}

}  // namespace
}  // namespace stoker::python
