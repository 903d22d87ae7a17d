#include "native_batch_kind.h"

#include <cassert>
#include <cstring>
#include <utility>

#include "engine/sample_kind.h"
#include "process_workers.h"
#include "worker_protocol.h"

namespace stoker::python {
namespace {

using protocol::NativeBatchWord;

size_t AlignUp(size_t n) {
  return (n + protocol::kDataAlign - 1) / protocol::kDataAlign * protocol::kDataAlign;
}

class NativeBatchWorker : public KindWorker {
 public:
  NativeBatchWorker(const Source& source, const Transform& transform, EpochBatches& batches,
                    const NativeBatchKind& kind, int64_t max_batch, const SampleCap& cap)
      : source_(source),
        batches_(batches),
        max_batch_(max_batch),
        labels_offset_(kind.labels_offset()),
        images_offset_(kind.images_offset()),
        sample_bytes_(transform.spec().bytes()),
        sample_(source, transform, 0, cap) {}

  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
    STOKER_ASSIGN_OR_RETURN(EpochBatches::Batch batch, batches_.Get(epoch, item));
    const int64_t planned = static_cast<int64_t>(batch.indices.size());
    if (planned > max_batch_) {
      return InvalidArgument("the batch sampler gave a batch of " + std::to_string(planned) +
                             " samples, more than the batch_size of " + std::to_string(max_batch_) +
                             " that the native pipeline holds");
    }
    auto* labels = reinterpret_cast<int64_t*>(out.data() + labels_offset_);
    std::byte* images = out.data() + images_offset_;
    const uint64_t seed = static_cast<uint64_t>(batch.seed);
    int64_t made = 0;
    // Each sample draws by its place in the batch under the batch's seed, so
    // that a key picked twice (a sampler with replacement, repeated
    // augmentation) gets two crops, as under torch, whichever worker runs it.
    uint64_t place = 0;
    for (int64_t key : batch.indices) {
      const uint64_t stream = place++;
      // As a Python list (ImageFolder.samples) is indexed: -1 is the last.
      const int64_t index = key < 0 ? key + source_.size() : key;
      if (index < 0 || index >= source_.size()) {
        outcome->failures.push_back(
            Failed(key, OutOfRange("index " + std::to_string(key) + " is out of range [-" +
                                   std::to_string(source_.size()) + ", " +
                                   std::to_string(source_.size()) + ")")));
        continue;
      }
      ItemOutcome one;
      Status st = sample_.RunSeeded(
          seed, epoch, index, stream,
          {images + static_cast<size_t>(made) * sample_bytes_, sample_bytes_}, &one);
      if (!st.ok()) {
        outcome->failures.push_back(Failed(index, std::move(st)));
        continue;
      }
      labels[made++] = one.label;
    }
    int64_t header[NativeBatchWord::kCount];
    header[NativeBatchWord::kMagic] = protocol::kNativeMagic;
    header[NativeBatchWord::kSamples] = made;
    header[NativeBatchWord::kAsked] = planned;
    header[NativeBatchWord::kEpoch] = epoch;
    header[NativeBatchWord::kBatch] = item;
    header[NativeBatchWord::kLabelsOffset] = static_cast<int64_t>(labels_offset_);
    header[NativeBatchWord::kImagesOffset] = static_cast<int64_t>(images_offset_);
    std::memcpy(out.data(), header, sizeof header);
    outcome->samples = made;
    return Status::Ok();
  }

  WorkerCost cost() const override { return sample_.cost(); }

 private:
  // Sample `index`'s failure, naming its file; its Python exception is a
  // DataError with the sample's index and key (python/stoker/_errors.py).
  SampleFailure Failed(int64_t index, Status status) const {
    auto detail = std::make_shared<SampleErrorDetail>();
    detail->index = index;
    if (index >= 0 && index < source_.size()) detail->key = source_.Key(index);
    SampleFailure failure{index, detail->key, std::move(status)};
    failure.status = failure.status.WithDetail(std::move(detail));
    return failure;
  }

  const Source& source_;
  EpochBatches& batches_;
  const int64_t max_batch_;
  const size_t labels_offset_;
  const size_t images_offset_;
  const size_t sample_bytes_;
  SampleWorker sample_;
};

}  // namespace

NativeBatchKind::NativeBatchKind(std::shared_ptr<const Source> source,
                                 std::shared_ptr<const Transform> transform,
                                 std::shared_ptr<EpochBatches> batches, int64_t max_batch)
    : source_(std::move(source)),
      transform_(std::move(transform)),
      batches_(std::move(batches)),
      max_batch_(max_batch),
      labels_offset_(AlignUp(NativeBatchWord::kCount * sizeof(int64_t))),
      images_offset_(AlignUp(labels_offset_ + static_cast<size_t>(max_batch) * sizeof(int64_t))),
      bytes_(images_offset_ + static_cast<size_t>(max_batch) * transform_->spec().bytes()) {
  assert(max_batch >= 1);
}

std::unique_ptr<KindWorker> NativeBatchKind::NewWorker(WorkerPlace, const SampleCap& cap) const {
  return std::make_unique<NativeBatchWorker>(*source_, *transform_, *batches_, *this, max_batch_,
                                             cap);
}

}  // namespace stoker::python
