#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "stoker/status.h"

namespace stoker {

/// The most memory one sample may take on one worker: the record's bytes a
/// source reads and the buffers a transform decodes it into. A loader derives
/// it from its memory budget (docs/engine.md, "Memory budget") and hands it
/// to each worker's ReadBuffer and TransformScratch; a source or transform
/// that would need more refuses the sample with Refuse() before reading or
/// allocating. The default allows everything. A plain value.
struct SampleCap {
  size_t bytes = std::numeric_limits<size_t>::max();
  /// Where it came from, for messages: the loader's memory budget and the
  /// workers sharing what its batch buffers leave.
  size_t budget_bytes = 0;
  int workers = 0;

  bool Allows(uint64_t need) const { return need <= bytes; }

  /// ResourceExhausted: "<what> is <need>, more than the per-sample cap of
  /// <bytes> (memory budget <budget> ...); refused before <before>". `what`
  /// names the thing ("file of 3.0 GiB"); callers add the sample's key.
  Status Refuse(const std::string& what, uint64_t need, const std::string& before) const;
};

}  // namespace stoker
