#include "engine/sample_kind.h"

#include <utility>

namespace stoker {

SampleWorker::SampleWorker(const Source& source, const Transform& transform, uint64_t seed,
                           const SampleCap& cap)
    : source_(source), transform_(transform), seed_(seed) {
  read_.cap = cap;
  scratch_ = transform.NewScratch();
  if (scratch_) scratch_->set_cap(cap);
}

WorkerCost SampleWorker::cost() const {
  const size_t bytes = read_.bytes.capacity() + (scratch_ ? scratch_->bytes() : 0);
  return {.bytes = bytes, .trimmable_bytes = bytes};
}

SampleKind::SampleKind(std::shared_ptr<const Source> source,
                       std::shared_ptr<const Transform> transform, uint64_t seed)
    : source_(std::move(source)),
      transform_(std::move(transform)),
      seed_(seed),
      spec_(transform_->spec()) {}

std::unique_ptr<KindWorker> SampleKind::NewWorker(WorkerPlace, const SampleCap& cap) const {
  return std::make_unique<SampleWorker>(*source_, *transform_, seed_, cap);
}

}  // namespace stoker
