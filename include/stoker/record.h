#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace stoker {

/// One sample as a source hands it out. `bytes` points into the ReadBuffer
/// passed to Read, or into memory the source owns for its whole life; it is
/// valid until the next Read with the same buffer.
struct Record {
  std::span<const std::byte> bytes;
  int64_t label = 0;
  /// The epoch the sample is read for; set by the engine before the
  /// transform runs (sources leave it alone).
  int64_t epoch = 0;
};

}  // namespace stoker
