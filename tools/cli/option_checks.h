#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace stoker::cli {

// CLI11 checks for numeric flags. Each rejects garbage, out-of-range values,
// NaN and infinities at parse time; CLI11 puts the flag's name in front of
// the message ("--batch-size: expected an integer from 1 to 1048576, got
// '0'"), and the command exits with a usage error. The bounds keep every
// value inside what its target type holds and what the run can allocate or
// wait for; the help text shows them.

// The bounds, one place for every command. Past them a run cannot mean
// anything on one machine, or would overflow its arithmetic.
inline constexpr uint64_t kMaxBatchSize = uint64_t{1} << 20;
inline constexpr uint64_t kMaxImageSide = 8192;       // --size: a float32 sample is then 768 MiB
inline constexpr uint64_t kMaxPrefetch = 1024;        // batches
inline constexpr double kMaxLatencyMs = 60'000;       // --read-latency-ms: a minute per read
inline constexpr uint64_t kMaxReadSlots = 1'000'000;  // --read-slots
inline constexpr double kMaxMemoryBudgetMib = double(uint64_t{1} << 30);  // 1 PiB
inline constexpr double kMaxSyntheticCpuUs = 1e6;                         // a second per sample
inline constexpr uint64_t kMaxSyntheticSize = 100'000'000;  // its plan alone is 800 MB
inline constexpr double kMaxStepMs = 60'000;                // a minute per batch
inline constexpr double kMaxSeconds = 7 * 24 * 3600.0;      // --seconds etc.: a week
inline constexpr uint64_t kMaxEpochs = 1'000'000'000;
inline constexpr uint64_t kMaxSampleBytes = uint64_t{1} << 40;  // advise --sample-bytes: 1 TiB
inline constexpr uint64_t kMaxImages = 10'000'000;              // make-dataset

/// A decimal integer in [lo, hi] (digits only: no sign, no spaces).
CLI::Validator CountIn(uint64_t lo, uint64_t hi);

/// A finite decimal number in [lo, hi].
CLI::Validator NumberIn(double lo, double hi);

/// A path that is not empty: `--data "$DATA"` with DATA unset must not run
/// on the default data set without a word.
CLI::Validator PathGiven();

/// PathGiven, and a path that exists, or a brace pattern whose folder does
/// (for commands that look at the storage holding it: a typo must not
/// describe some other mount).
CLI::Validator ExistingPlace();

}  // namespace stoker::cli
