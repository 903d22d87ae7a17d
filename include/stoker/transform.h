#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/record.h"
#include "stoker/rng.h"
#include "stoker/sample_cap.h"
#include "stoker/sample_spec.h"
#include "stoker/status.h"

namespace stoker {

/// Per-worker scratch memory a transform may keep between samples (decode
/// buffers, resize tables). Created once per worker, never shared.
class TransformScratch {
 public:
  virtual ~TransformScratch() = default;
  /// Bytes this scratch holds now (for the memory budget): the engine makes
  /// a fresh one when these and the read buffer pass the per-sample cap.
  virtual size_t bytes() const { return 0; }

  /// The most this scratch may hold for one sample, with the record's bytes
  /// (set by the loader from its memory budget when it makes the scratch;
  /// unlimited by default). A transform that would need more refuses the
  /// sample with cap().Refuse() before allocating.
  const SampleCap& cap() const { return cap_; }
  void set_cap(const SampleCap& cap) { cap_ = cap; }

 private:
  SampleCap cap_;
};

/// Turns one record into one output sample, written in place into the
/// sample's slot of a batch buffer.
///
/// Immutable after construction and shared by every worker: Apply and
/// NewScratch are safe for concurrent use from many threads. All randomness
/// must come from the `rng` passed in, never from worker identity or time,
/// so that output depends only on (record, seed, epoch, sample index).
class Transform {
 public:
  virtual ~Transform() = default;

  /// The shape every output sample has.
  virtual SampleSpec spec() const = 0;

  /// Scratch for one worker; nullptr when the transform needs none.
  virtual std::unique_ptr<TransformScratch> NewScratch() const { return nullptr; }

  /// Writes the sample for `record` into `out` (exactly spec().bytes() long).
  /// Errors say what is wrong with the bytes; the engine adds the sample
  /// index and source key. On error `out` may hold partial output.
  virtual Status Apply(const Record& record, SampleRng& rng, std::span<std::byte> out,
                       TransformScratch* scratch) const = 0;
};

}  // namespace stoker
