// Invariants 1 and 2 of DESIGN.md under random resize schedules: every
// planned sample exactly once per epoch, and batches bit-identical to a
// single-worker run, whatever the worker count does meanwhile.

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "testing/loader_harness.h"

namespace stoker {
namespace {

using testing::BatchCopy;
using testing::DrainEpoch;
using testing::MakeLoader;
using testing::SyntheticLoaderOptions;

struct Case {
  int64_t size;
  int64_t batch;
  size_t sample_bytes;
  bool ordered;
  bool drop_last;
  int prefetch;
};

Case RandomCase(std::mt19937& g) {
  std::uniform_int_distribution<int64_t> size(1, 400), batch(1, 40);
  std::uniform_int_distribution<int> bytes(1, 48), prefetch(1, 6), coin(0, 1);
  Case c{size(g), batch(g), static_cast<size_t>(bytes(g)), coin(g) == 1, coin(g) == 1, prefetch(g)};
  if (c.drop_last && c.size < c.batch) c.drop_last = false;
  return c;
}

LoaderOptions OptionsFor(const Case& c, uint64_t seed) {
  auto o = SyntheticLoaderOptions(c.size, c.batch, c.sample_bytes);
  o.seed = seed;
  o.ordered = c.ordered;
  o.drop_last = c.drop_last;
  o.prefetch_batches = c.prefetch;
  return o;
}

void ExpectExactlyOnce(const std::map<int64_t, BatchCopy>& epoch, const Loader& loader) {
  std::vector<int> count(static_cast<size_t>(loader.batches_per_epoch() * 64 + 1000), 0);
  int64_t total = 0;
  for (auto& [i, b] : epoch) {
    for (int64_t s : b.samples) {
      ++count.at(static_cast<size_t>(s));
      ++total;
    }
  }
  EXPECT_EQ(total, loader.samples_per_epoch());
  for (int c : count) ASSERT_LE(c, 1);
}

TEST(LoaderPropertyTest, RandomResizeSchedulesChangeNothing) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    std::mt19937 g(static_cast<uint32_t>(seed));
    Case c = RandomCase(g);
    SCOPED_TRACE("seed " + std::to_string(seed) + " size " + std::to_string(c.size) + " batch " +
                 std::to_string(c.batch) + (c.ordered ? " ordered" : " unordered"));
    auto ref_options = OptionsFor(c, seed);
    ref_options.workers = 1;
    auto ref_loader = MakeLoader(ref_options);
    auto ref0 = DrainEpoch(*ref_loader);
    auto ref1 = DrainEpoch(*ref_loader);

    auto o = OptionsFor(c, seed);
    std::uniform_int_distribution<int> workers(0, 6);
    o.workers = workers(g);
    auto loader = MakeLoader(o);
    // Resizes from the consumer's thread between batches, including at the
    // epoch boundary (n == 0 happens right after the previous end).
    std::uniform_int_distribution<int> chance(0, 2);
    auto schedule = [&](int64_t) {
      if (chance(g) == 0) {
        EXPECT_TRUE(loader->Resize(workers(g)).ok());
      }
    };
    auto e0 = DrainEpoch(*loader, schedule);
    EXPECT_TRUE(loader->Resize(workers(g)).ok());
    auto e1 = DrainEpoch(*loader, schedule);
    ExpectExactlyOnce(e0, *loader);
    ExpectExactlyOnce(e1, *loader);
    EXPECT_EQ(e0, ref0);
    EXPECT_EQ(e1, ref1);
  }
}

TEST(LoaderPropertyTest, ResizesFromAnotherThreadChangeNothing) {
  for (uint64_t seed = 100; seed < 110; ++seed) {
    std::mt19937 g(static_cast<uint32_t>(seed));
    Case c = RandomCase(g);
    c.size = std::max<int64_t>(c.size, 200);
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto ref_options = OptionsFor(c, seed);
    ref_options.workers = 1;
    auto ref = DrainEpoch(*MakeLoader(ref_options));

    auto o = OptionsFor(c, seed);
    o.workers = 2;
    auto loader = MakeLoader(o);
    std::atomic<bool> done{false};
    std::thread resizer([&, s = seed] {
      std::mt19937 rg(static_cast<uint32_t>(s * 7));
      // 0 <-> many swings, as fast as they come.
      const int pattern[] = {0, 8, 1, 0, 5, 2, 0, 3, 7, 0};
      for (int i = 0; !done.load(); ++i) {
        EXPECT_TRUE(loader->Resize(pattern[(i + static_cast<int>(rg() % 3)) % 10]).ok());
        std::this_thread::yield();
      }
    });
    auto epoch = DrainEpoch(*loader);
    done = true;
    resizer.join();
    ExpectExactlyOnce(epoch, *loader);
    EXPECT_EQ(epoch, ref);
  }
}

TEST(LoaderPropertyTest, SlowSamplesWithManyWorkersAndSmallWindows) {
  SyntheticOptions so;
  so.read_latency = std::chrono::microseconds(200);
  auto o = SyntheticLoaderOptions(300, 25, 16, so);
  o.workers = 12;  // far more workers than batches in the window: chunks split batches
  o.prefetch_batches = 2;
  auto loader = MakeLoader(o);
  auto epoch = DrainEpoch(*loader);
  o.workers = 1;
  o.source = *MakeSyntheticSource({.size = 300, .sample_bytes = 16});
  EXPECT_EQ(epoch, DrainEpoch(*MakeLoader(o)));
}

}  // namespace
}  // namespace stoker
