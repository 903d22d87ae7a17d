#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "stoker/sample_spec.h"
#include "stoker/source.h"
#include "stoker/status.h"
#include "stoker/transform.h"

namespace stoker {

/// A source that makes its records instead of reading them: for tests and
/// benchmarks. Record i holds `sample_bytes` bytes that are a pure function of
/// (content_seed, i); its label is i % num_classes.
struct SyntheticOptions {
  int64_t size = 1024;
  size_t sample_bytes = 64;
  int64_t num_classes = 10;
  uint64_t content_seed = 0;
  /// Busy CPU work per read, measured in this thread's CPU time (like decode).
  std::chrono::nanoseconds cpu_cost{0};
  /// Wall-clock sleep per read (like remote storage latency).
  std::chrono::nanoseconds read_latency{0};
  /// Indices whose read fails with a data error (for error-path tests).
  std::vector<int64_t> fail_indices;
};

/// Checks `options` and makes the source; errors name the option.
Result<std::shared_ptr<const Source>> MakeSyntheticSource(const SyntheticOptions& options);

/// Copies each record's bytes unchanged into a sample of `spec` (the record
/// must be exactly spec.bytes() long). With `mix_rng`, XORs each 8-byte word
/// with the sample's random stream, so output depends on (seed, epoch, index):
/// the cheapest transform that still exercises per-sample randomness.
Result<std::shared_ptr<const Transform>> MakeRawTransform(SampleSpec spec, bool mix_rng = false);

}  // namespace stoker
