#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker {

/// A decoded rectangle of an image: 8-bit RGB, interleaved, rows `stride`
/// bytes apart. (x0, y0) is its top-left corner in the coordinates of the
/// (possibly DCT-scaled) image it came from. `pixels` points into a buffer
/// the caller owns.
struct DecodedRegion {
  const uint8_t* pixels = nullptr;
  int x0 = 0;
  int y0 = 0;
  int width = 0;
  int height = 0;
  size_t stride = 0;
};

/// Grows `buffer` to at least `bytes` and returns its data. Never shrinks, so
/// a buffer reused across samples stops allocating once it has seen the
/// largest one.
inline uint8_t* GrowBuffer(std::vector<uint8_t>& buffer, size_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

}  // namespace stoker
