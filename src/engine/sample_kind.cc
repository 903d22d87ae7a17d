#include "engine/sample_kind.h"

#include <utility>

#include "stoker/rng.h"

namespace stoker {
namespace {

class SampleWorker : public KindWorker {
 public:
  SampleWorker(const Source& source, const Transform& transform, uint64_t seed,
               const SampleCap& cap)
      : source_(source), transform_(transform), seed_(seed) {
    read_.cap = cap;
    scratch_ = transform.NewScratch();
    if (scratch_) scratch_->set_cap(cap);
  }

  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
    SampleRng rng(seed_, static_cast<uint64_t>(epoch), static_cast<uint64_t>(item));
    Record record;
    STOKER_RETURN_IF_ERROR(source_.Read(item, read_, &record));
    record.epoch = epoch;
    STOKER_RETURN_IF_ERROR(transform_.Apply(record, rng, out, scratch_.get()));
    outcome->label = record.label;
    return Status::Ok();
  }

  WorkerCost cost() const override {
    const size_t bytes = read_.bytes.capacity() + (scratch_ ? scratch_->bytes() : 0);
    return {.bytes = bytes, .trimmable_bytes = bytes};
  }

 private:
  const Source& source_;
  const Transform& transform_;
  const uint64_t seed_;
  ReadBuffer read_;
  std::unique_ptr<TransformScratch> scratch_;
};

}  // namespace

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
