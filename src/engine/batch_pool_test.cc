#include "engine/batch_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace stoker {
namespace {

TEST(BatchPoolTest, SlotsAreAlignedAndRecycled) {
  BatchPool pool({{3, 5}, DType::kFloat32}, 16);
  EXPECT_EQ(pool.batch_bytes(), 3u * 5 * 4 * 16);
  auto a = pool.Acquire();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->buffer()) % 4096, 0u);
  EXPECT_GE(a->buffer_bytes(), pool.batch_bytes());
  BatchSlot* raw = a.get();
  pool.Release(std::move(a));
  auto b = pool.Acquire();
  EXPECT_EQ(b.get(), raw);  // reused, not reallocated
  EXPECT_EQ(pool.slots_made(), 1);
}

TEST(BatchPoolTest, ARecyclingPoolHandsBackEveryPositionThenZeroesIt) {
  std::vector<int64_t> seen;
  BatchPool pool({{1}, DType::kInt64}, 3, [&](std::span<std::byte> sample) {
    int64_t v;
    std::memcpy(&v, sample.data(), sizeof v);
    seen.push_back(v);
  });
  auto s = pool.Acquire();
  s->Open(0, 0, 3);
  for (int p = 0; p < 3; ++p) EXPECT_EQ(s->sample(p)[0], std::byte{0});  // starts zeroed
  const int64_t written = 42;
  std::memcpy(s->sample(1).data(), &written, sizeof written);  // position 2 never written
  pool.Release(std::move(s));
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 42, 0}));
  auto again = pool.Acquire();
  again->Open(0, 1, 3);
  EXPECT_EQ(again->sample(1)[0], std::byte{0});
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

TEST(BatchPoolTest, AKeyTheCauseSaysAlreadyIsNamedOnce) {
  struct Marked : StatusDetail {};
  const auto detail = std::make_shared<Marked>();
  const Status cause = NotFound("/d/a.jpg: open: No such file or directory").WithDetail(detail);
  const BatchSlot::Failure failure{5, "/d/a.jpg", cause, ""};
  const Status named = failure.Named();
  EXPECT_EQ(named.message(), "sample 5 (/d/a.jpg): open: No such file or directory");
  EXPECT_EQ(named.code(), StatusCode::kNotFound);
  EXPECT_EQ(named.detail(), detail);
  // A key that only begins another name is no repeat.
  const BatchSlot::Failure other{5, "/d/a", cause, ""};
  EXPECT_EQ(other.Named().message(), "sample 5 (/d/a): " + cause.message());
  const BatchSlot::Failure item{-1, "/d/a.jpg", cause, ""};
  EXPECT_EQ(item.Named().message(), cause.message());
}

TEST(BatchPoolTest, DropFailuresKeepsOrderOfSurvivors) {
  BatchPool pool({{4}, DType::kUInt8}, 5);
  auto s = pool.Acquire();
  s->Open(0, 0, 5);
  for (int p = 0; p < 5; ++p) {
    std::memset(s->sample(p).data(), p + 1, 4);
    if (p == 1 || p == 3) {
      s->Fail(p, p + 100, "k" + std::to_string(p), DataError("bad " + std::to_string(p)));
    } else {
      s->Put(p, p + 100, p * 10);
    }
  }
  ASSERT_TRUE(s->failed());
  auto failures = s->Failures();
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].index, 101);
  EXPECT_EQ(failures[1].status.message(), "bad 3");
  EXPECT_EQ(failures[1].key, "k3");
  EXPECT_EQ(failures[1].Named().message(), "sample 103 (k3): bad 3");
  s->DropFailures([](int64_t, const Status&) { return true; });
  ASSERT_EQ(s->count(), 3);
  EXPECT_FALSE(s->failed());
  EXPECT_EQ(static_cast<int>(s->data()[4]), 3);
  EXPECT_EQ(s->labels()[2], 40);
  EXPECT_EQ(s->indices()[0], 100);
  // Reopened, the slot forgets its failures.
  s->Open(0, 1, 2);
  EXPECT_FALSE(s->failed());
  EXPECT_TRUE(s->Failures().empty());
}

TEST(BatchPoolTest, DropsOnlyTheFailuresAskedForAndKeepsTheRestInPlace) {
  BatchPool pool({{1}, DType::kUInt8}, 5);
  auto s = pool.Acquire();
  s->Open(0, 0, 5);
  s->Put(0, 100, 0);
  s->Fail(1, 101, "k1", DataError("corrupt"));
  s->Fail(2, 102, "k2", Unavailable("EMFILE"));
  s->Put(3, 103, 3);
  s->Fail(4, 104, "k4", DataError("truncated"));
  s->DropFailures([](int64_t, const Status& st) { return IsSampleError(st); });
  ASSERT_EQ(s->count(), 3);
  EXPECT_TRUE(s->failed());
  auto left = s->Failures();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].index, 102);
  EXPECT_EQ(left[0].key, "k2");  // moved with its sample
  EXPECT_EQ(s->indices()[1], 102);
  s->DropFailures([](int64_t, const Status&) { return true; });
  ASSERT_EQ(s->count(), 2);
  EXPECT_FALSE(s->failed());
  EXPECT_EQ(s->indices()[1], 103);
}

TEST(BatchPoolTest, DoneIsTrueForTheCallThatCompletesTheBatch) {
  BatchPool pool({{1}, DType::kUInt8}, 8);
  auto s = pool.Acquire();
  s->Open(0, 0, 8);
  EXPECT_FALSE(s->Done(3));
  EXPECT_FALSE(s->Done(4));
  EXPECT_TRUE(s->Done(1));
}

}  // namespace
}  // namespace stoker
