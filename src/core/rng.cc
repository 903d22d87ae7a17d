#include "stoker/rng.h"

#include <cassert>

namespace stoker {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

// Sample streams use the counter's top word as 0; epoch-level streams use this
// tag there, which no sample index below 2^32 * 2^32 can produce.
constexpr uint32_t kEpochStreamTag = 0xE90C0000u;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kMul0, c[0], &hi0, &lo0);
    MulHiLo(kMul1, c[2], &hi1, &lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

SampleRng::SampleRng(uint64_t seed, uint64_t epoch, uint64_t sample_index)
    : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
      // counter = (draw, epoch, index lo, index hi ^ epoch hi): the first word
      // counts blocks drawn within this sample's stream.
      counter_{0u, static_cast<uint32_t>(epoch), static_cast<uint32_t>(sample_index),
               static_cast<uint32_t>(sample_index >> 32) ^
                   (static_cast<uint32_t>(epoch >> 32) * 0x85EBCA6Bu)} {}

void SampleRng::Refill() {
  block_ = Philox4x32(counter_, key_);
  ++counter_[0];
  used_ = 0;
}

uint32_t SampleRng::NextU32() {
  if (used_ == 4) Refill();
  return block_[used_++];
}

uint64_t SampleRng::NextU64() {
  uint64_t hi = NextU32();
  return (hi << 32) | NextU32();
}

double SampleRng::Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

uint64_t SampleRng::Below(uint64_t n) {
  assert(n > 0);
  // Lemire's nearly-divisionless method with rejection: unbiased.
  unsigned __int128 m = static_cast<unsigned __int128>(NextU64()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(NextU64()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

SampleRng EpochRng(uint64_t seed, uint64_t epoch) {
  // Sample index with the tag in its high word: disjoint from real samples,
  // whose indices stay below 2^63.
  return SampleRng(seed, epoch, (static_cast<uint64_t>(kEpochStreamTag) << 32) | 0xFFFFFFFFull);
}

}  // namespace stoker
