#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stoker/record.h"
#include "stoker/sample_cap.h"
#include "stoker/status.h"

namespace stoker {

/// Reusable bytes a worker lends to Source::Read. Owned by one worker (or the
/// consumer's thread when it does the work); grows to the largest record seen
/// and is then reused, so reading allocates nothing per sample once warm.
struct ReadBuffer {
  std::vector<std::byte> bytes;
  /// The most one record may take (set by the loader from its memory budget;
  /// unlimited by default). A source that would hold more for a sample, in
  /// `bytes` or elsewhere, refuses it with cap.Refuse() — a ResourceExhausted
  /// naming the size and the cap — before reading it, so `bytes` never grows
  /// past the cap.
  SampleCap cap;
};

/// Maps a sample index in [0, size()) to a record.
///
/// A source is immutable after it is opened and shared by every worker: all
/// const methods are safe for concurrent use from many threads without
/// external synchronisation. Implementations must not keep per-worker state.
class Source {
 public:
  virtual ~Source() = default;

  /// Number of samples. Constant for the source's life.
  virtual int64_t size() const = 0;

  /// Reads sample `index` into `*record`, using `buffer` for storage when the
  /// bytes are not already in memory.
  /// REQUIRES: 0 <= index < size().
  /// Errors name the sample's key and the cause (missing file, short read,
  /// ResourceExhausted for a record larger than buffer.cap...).
  virtual Status Read(int64_t index, ReadBuffer& buffer, Record* record) const = 0;

  /// A human-readable key for sample `index`: a file path, "shard.tar:member",
  /// "synthetic:17". Used in error messages and skip records; may allocate.
  virtual std::string Key(int64_t index) const = 0;

  /// Class names by label, where the source has them (image folders); empty
  /// otherwise.
  virtual std::vector<std::string> ClassNames() const { return {}; }
};

}  // namespace stoker
