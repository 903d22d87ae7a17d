#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "stoker/source.h"
#include "stoker/transform.h"
#include "stoker/worker_kind.h"

namespace stoker {

/// The engine's own worker kind: each item is sample `index` of a Source,
/// read and put through a Transform on the engine's thread, with randomness
/// from (seed, epoch, index). Every worker keeps a read buffer and a
/// transform scratch, both within its per-sample cap.
class SampleKind : public WorkerKind {
 public:
  SampleKind(std::shared_ptr<const Source> source, std::shared_ptr<const Transform> transform,
             uint64_t seed);

  SampleSpec spec() const override { return spec_; }
  int64_t items() const override { return source_->size(); }
  std::string Key(int64_t item) const override { return source_->Key(item); }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;

 private:
  const std::shared_ptr<const Source> source_;
  const std::shared_ptr<const Transform> transform_;
  const uint64_t seed_;
  const SampleSpec spec_;
};

}  // namespace stoker
