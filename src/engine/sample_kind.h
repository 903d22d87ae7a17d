#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "stoker/rng.h"
#include "stoker/source.h"
#include "stoker/transform.h"
#include "stoker/worker_kind.h"

namespace stoker {

/// A SampleKind's worker: a read buffer and a transform scratch, both within
/// its per-sample cap. Final, with Run inline, so that the engine's hot loop
/// calls it directly for its own sources (no call through KindWorker).
class SampleWorker final : public KindWorker {
 public:
  SampleWorker(const Source& source, const Transform& transform, uint64_t seed,
               const SampleCap& cap);

  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
    return RunSeeded(seed_, epoch, item, static_cast<uint64_t>(item), out, outcome);
  }

  /// Run under `seed` instead of the kind's, its draws from the random
  /// stream `stream`: for a kind whose seed changes by batch
  /// (stoker.DataLoader's native path, seeded from torch's base seed), where
  /// a sampler may pick one item twice in a batch and each pick is its own
  /// draw. REQUIRES: 0 <= item < the source's size.
  Status RunSeeded(uint64_t seed, int64_t epoch, int64_t item, uint64_t stream,
                   std::span<std::byte> out, ItemOutcome* outcome) {
    SampleRng rng(seed, static_cast<uint64_t>(epoch), stream);
    Record record;
    STOKER_RETURN_IF_ERROR(source_.Read(item, read_, &record));
    record.epoch = epoch;
    outcome->label = record.label;  // read only when Apply succeeds
    return transform_.Apply(record, rng, out, scratch_.get());
  }

  WorkerCost cost() const override;

 private:
  const Source& source_;
  const Transform& transform_;
  const uint64_t seed_;
  ReadBuffer read_;
  std::unique_ptr<TransformScratch> scratch_;
};

/// The engine's own worker kind: each item is sample `index` of a Source,
/// read and put through a Transform on the engine's thread, with randomness
/// from (seed, epoch, index).
class SampleKind : public WorkerKind {
 public:
  SampleKind(std::shared_ptr<const Source> source, std::shared_ptr<const Transform> transform,
             uint64_t seed);

  SampleSpec spec() const override { return spec_; }
  int64_t items() const override { return source_->size(); }
  std::string Key(int64_t item) const override { return source_->Key(item); }
  std::string item_name() const override { return "sample"; }
  bool items_are_samples() const override { return true; }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;

 private:
  const std::shared_ptr<const Source> source_;
  const std::shared_ptr<const Transform> transform_;
  const uint64_t seed_;
  const SampleSpec spec_;
};

}  // namespace stoker
