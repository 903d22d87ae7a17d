#pragma once

// Shared helpers for loader tests: build a loader over a synthetic source and
// drain epochs into comparable values.

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "stoker/loader.h"
#include "stoker/synthetic.h"

namespace stoker::testing {

/// A delivered batch, copied out so that it can be compared after the fact.
struct BatchCopy {
  int64_t index = 0;
  std::vector<std::byte> data;
  std::vector<int64_t> labels;
  std::vector<int64_t> samples;
  bool operator==(const BatchCopy&) const = default;
};

inline BatchCopy Copy(const Batch& b) {
  return {b.index(),
          {b.data().begin(), b.data().end()},
          {b.labels().begin(), b.labels().end()},
          {b.sample_indices().begin(), b.sample_indices().end()}};
}

inline LoaderOptions SyntheticLoaderOptions(int64_t size, int64_t batch_size, size_t sample_bytes,
                                            SyntheticOptions extra = {}) {
  extra.size = size;
  extra.sample_bytes = sample_bytes;
  LoaderOptions o;
  o.source = *MakeSyntheticSource(extra);
  o.transform = *MakeRawTransform({{static_cast<int64_t>(sample_bytes)}, DType::kUInt8},
                                  /*mix_rng=*/true);
  o.batch_size = batch_size;
  return o;
}

/// `made`'s loader; null, with a failed expectation, when making it failed.
inline std::unique_ptr<Loader> Checked(Result<std::unique_ptr<Loader>> made) {
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return made.ok() ? std::move(made).value() : nullptr;
}

inline std::unique_ptr<Loader> MakeLoader(const LoaderOptions& o) {
  return Checked(Loader::Make(o));
}

/// Drains the current epoch; `between` runs before each Next() call with the
/// number of batches delivered so far. Batches keyed by their index.
template <typename F>
std::map<int64_t, BatchCopy> DrainEpoch(Loader& loader, F between) {
  std::map<int64_t, BatchCopy> out;
  int64_t n = 0;
  while (true) {
    between(n);
    auto r = loader.Next();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || !r->has_value()) break;
    const Batch& b = **r;
    EXPECT_TRUE(out.emplace(b.index(), Copy(b)).second) << "batch " << b.index() << " twice";
    ++n;
  }
  return out;
}

inline std::map<int64_t, BatchCopy> DrainEpoch(Loader& loader) {
  return DrainEpoch(loader, [](int64_t) {});
}

}  // namespace stoker::testing
