#pragma once

#include <array>
#include <cstdint>

namespace stoker {

/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
/// SC'11): a counter-based generator. Output is a pure function of
/// (key, counter), so any thread may compute any sample's numbers in any order.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

/// The random stream of one sample: keyed by (seed, epoch, sample index), never
/// by worker identity or scheduling, so the same sample gets the same numbers
/// whatever worker count produced it. Cheap to construct; not thread-safe
/// (each sample's work owns its own).
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t sample_index);

  /// The next 32 random bits of this sample's stream.
  uint32_t NextU32();
  /// The next 64 random bits.
  uint64_t NextU64();
  /// Uniform in [0, 1), 53 bits of precision.
  double Uniform();
  /// Uniform in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  /// Uniform integer in [0, n). REQUIRES: n > 0.
  uint64_t Below(uint64_t n);

 private:
  void Refill();

  std::array<uint32_t, 2> key_;
  std::array<uint32_t, 4> counter_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

/// A generator for whole-epoch decisions (the shuffle), keyed by (seed, epoch)
/// and a purpose tag so that it never collides with a sample's stream.
SampleRng EpochRng(uint64_t seed, uint64_t epoch);

}  // namespace stoker
