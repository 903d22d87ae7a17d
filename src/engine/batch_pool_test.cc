#include "engine/batch_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace stoker {
namespace {

TEST(BatchPoolTest, SlotsAreAlignedAndRecycled) {
  BatchPool pool({{3, 5}, DType::kFloat32}, 16);
  EXPECT_EQ(pool.batch_bytes(), 3u * 5 * 4 * 16);
  auto a = pool.Acquire();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
  EXPECT_GE(a->buffer_bytes(), pool.batch_bytes());
  BatchSlot* raw = a.get();
  pool.Release(std::move(a));
  auto b = pool.Acquire();
  EXPECT_EQ(b.get(), raw);  // reused, not reallocated
  EXPECT_EQ(pool.slots_made(), 1);
}

TEST(BatchPoolTest, KeepsAtMostMaxFree) {
  BatchPool pool({{4}, DType::kUInt8}, 2);
  pool.set_max_free(1);
  auto a = pool.Acquire();
  auto b = pool.Acquire();
  pool.Release(std::move(a));
  pool.Release(std::move(b));  // freed: over the cap
  auto c = pool.Acquire();
  auto d = pool.Acquire();
  EXPECT_EQ(pool.slots_made(), 3);
}

TEST(BatchPoolTest, CompactKeepsOrderOfSurvivors) {
  BatchPool pool({{4}, DType::kUInt8}, 5);
  auto s = pool.Acquire();
  s->Reset(0, 0, 1, 5);
  for (int p = 0; p < 5; ++p) {
    std::memset(s->sample(p), p + 1, 4);
    s->labels[static_cast<size_t>(p)] = p * 10;
    s->indices[static_cast<size_t>(p)] = p + 100;
  }
  s->outcomes[1] = DataError("bad");
  s->outcomes[3] = DataError("bad");
  s->CompactFailures();
  ASSERT_EQ(s->count, 3);
  EXPECT_EQ(static_cast<int>(s->sample(1)[0]), 3);
  EXPECT_EQ(s->labels[2], 40);
  EXPECT_EQ(s->indices[0], 100);
}

}  // namespace
}  // namespace stoker
