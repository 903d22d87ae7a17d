#pragma once

// stoker.DataLoader's native path (python/stoker/_native.py): a torchvision
// ImageFolder whose Compose stoker recognised runs as stoker's own source and
// transform on the engine's threads, with no Python. The engine's items are
// the user's batches, as for the Python kinds: each worker looks up its
// batch's dataset indices (torch's sampler's, in EpochBatches) and writes the
// whole collated batch into the item's output (protocol NATIVE_BATCH: a
// header, the labels, the samples), which the consumer views without a copy.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "epoch_batches.h"
#include "stoker/source.h"
#include "stoker/transform.h"
#include "stoker/worker_kind.h"

namespace stoker::python {

/// Immutable after construction; its const methods are safe from many threads.
class NativeBatchKind : public WorkerKind {
 public:
  /// `max_batch` (>= 1): the most samples one batch holds (the loader's
  /// batch_size); each item's output has room for that many.
  NativeBatchKind(std::shared_ptr<const Source> source, std::shared_ptr<const Transform> transform,
                  std::shared_ptr<EpochBatches> batches, int64_t max_batch);

  SampleSpec spec() const override { return {{static_cast<int64_t>(bytes_)}, DType::kUInt8}; }
  int64_t items() const override { return batches_->first_batches(); }
  /// Empty: the engine names the batch itself; a failed sample names its file.
  std::string Key(int64_t) const override { return ""; }
  std::string item_name() const override { return "batch"; }
  /// A worker that reads and transforms its batch's samples one by one on
  /// its own thread, seeded by (the batch's seed, epoch, sample index): the
  /// same bytes for any worker count. A sample that fails is left out of
  /// its batch and reported (its index and file) in the outcome; a batch
  /// larger than `max_batch` fails whole (InvalidArgument).
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override;
  /// Wakes workers waiting for a batch list.
  void Cancel() const override { batches_->Shutdown(); }

  size_t labels_offset() const { return labels_offset_; }
  size_t images_offset() const { return images_offset_; }

 private:
  const std::shared_ptr<const Source> source_;
  const std::shared_ptr<const Transform> transform_;
  const std::shared_ptr<EpochBatches> batches_;
  const int64_t max_batch_;
  const size_t labels_offset_;
  const size_t images_offset_;
  const size_t bytes_;
};

}  // namespace stoker::python
