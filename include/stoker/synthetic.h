#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/sample_spec.h"
#include "stoker/source.h"
#include "stoker/status.h"
#include "stoker/transform.h"

namespace stoker {

/// A source that makes its records instead of reading them: for tests and
/// benchmarks. Record i holds `sample_bytes` bytes that are a pure function of
/// (content_seed, i); its label is i % num_classes.
struct SyntheticOptions {
  int64_t size = 1024;
  size_t sample_bytes = 64;
  int64_t num_classes = 10;
  uint64_t content_seed = 0;
  /// Busy CPU work per read, measured in this thread's CPU time (like decode).
  std::chrono::nanoseconds cpu_cost{0};
  /// Wall-clock sleep per read (like remote storage latency).
  std::chrono::nanoseconds read_latency{0};
  /// Indices whose read fails with a data error (for error-path tests).
  std::vector<int64_t> fail_indices;
};

/// Checks `options` and makes the source; errors name the option.
Result<std::shared_ptr<const Source>> MakeSyntheticSource(const SyntheticOptions& options);

class ServiceSlots;  // src/source/service_slots.h
struct StoreShape;   // stoker/store_shape.h

/// A slow-storage wrapper: every Read of `inner` first waits for the current
/// latency (like a remote or network file system). With `slots` > 0 the
/// store serves at most that many reads at once, like an NFS or FUSE server,
/// an object-store gateway or a disk: a read takes the slot that frees first
/// (first come, first served), holds it for the latency (its service time),
/// and its wall time is its wait for a slot plus that service. With 0 slots
/// every read is served at once, however many wait. Latency and slots may
/// be changed while workers read (a benchmark's "storage got slower"
/// phase); everything else is `inner`'s. Read is safe from many threads.
class SlowSource final : public Source {
 public:
  SlowSource(std::shared_ptr<const Source> inner, std::chrono::nanoseconds latency, int slots = 0);
  ~SlowSource() override;
  int64_t size() const override { return inner_->size(); }
  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override;
  std::string Key(int64_t index) const override { return inner_->Key(index); }
  std::vector<std::string> ClassNames() const override { return inner_->ClassNames(); }
  /// Safe from any thread.
  void set_latency(std::chrono::nanoseconds latency) { latency_ns_.store(latency.count()); }
  /// At most `slots` reads served at once; 0: any number. Reads already
  /// waiting keep their turn. REQUIRES: slots >= 0. Safe from any thread.
  void set_slots(int slots);
  /// The store's shape past its slots, over time, and in its tail (see
  /// StoreShape); reads already booked keep their times. REQUIRES:
  /// shape.Valid(). Safe from any thread.
  void set_shape(const StoreShape& shape);
  /// Ends at once, with kCancelled, every read waiting out its latency, now
  /// and from now on (the wrapped source is not read): for a loop that has ended,
  /// whose loader would otherwise wait for its workers' reads to end before
  /// it can be destroyed (ten seconds each with a ten-second latency). For
  /// good. Safe from any thread.
  void Cancel();

 private:
  struct Waits;  // the reads waiting out their latency, and Cancel's mark
  std::shared_ptr<const Source> inner_;
  std::atomic<int64_t> latency_ns_;
  const std::unique_ptr<ServiceSlots> slots_;  // the store's queue
  const std::unique_ptr<Waits> waits_;
};

/// Copies each record's bytes unchanged into a sample of `spec` (the record
/// must be exactly spec.bytes() long). With `mix_rng`, XORs each 8-byte word
/// with the sample's random stream, so output depends on (seed, epoch, index):
/// the cheapest transform that still exercises per-sample randomness.
Result<std::shared_ptr<const Transform>> MakeRawTransform(SampleSpec spec, bool mix_rng = false);

}  // namespace stoker
